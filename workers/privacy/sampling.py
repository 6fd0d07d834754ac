"""Poisson sampling of privacy units: each unit kept independently with probability q.

Used where a release needs far fewer units than a large corpus holds (class centroids
embed a sample of units: ``workers/methods/dpkps``, ``embed_sample``), so that the work
is bounded by the sample, not by the corpus.

**The sampling.** A run draws a fresh secret key (32 bytes from the OS, never stored,
logged or returned); a unit with id ``u`` is kept iff ``H_key(u) / 2⁶⁴ < q`` with ``H``
keyed BLAKE2b truncated to 64 bits. Distinct ids under a secret random key give
independent uniform draws (a pseudo-random function), so every unit is kept with
probability q independently of every other unit and of the data; the decision is
stateless (one unit's documents may arrive in any order, in any shard, and are kept or
dropped together) and never reproducible by whoever knows the run's public seed. A
*public* seed would not do: with row units the i-th draw of a seeded stream belongs to
the i-th row, so adding one row shifts which rows the later draws keep, and the sums of
two neighbouring corpora could differ by many units.

**Why a sampled release is at least as private as the unsampled one** (add/remove
adjacency, ``D' = D ∪ {x}``). Let M be a mechanism on a set of units and S_q Poisson
sampling. The units of D are sampled identically in both worlds (same independent coins),
so conditioning on the sample T ⊆ D: M(S_q(D)) = M(T), and M(S_q(D')) is M(T ∪ {x}) with
probability q and M(T) otherwise, i.e. the mixture (1 − q)·M(T) + q·M(T ∪ {x}). The
hockey-stick divergence H_{e^ε} is jointly convex, so for either direction

    H_{e^ε}((1 − q)·M(T) + q·M(T ∪ {x}) ‖ M(T)) ≤ q·H_{e^ε}(M(T ∪ {x}) ‖ M(T)) ≤ q·δ_M(ε)

and the same with the arguments swapped; averaging over T (convexity again) gives
δ(ε) ≤ q·δ_M(ε) ≤ δ_M(ε). So any (ε, δ) M satisfies on every pair of neighbouring
corpora, M∘S_q satisfies too: the ledger may charge the sampled release as M itself, which
is what keyseed does. This is amplification by subsampling read conservatively.

**Why no amplification is claimed.** The tighter curve of the subsampled Gaussian
(dp-accounting's ``from_gaussian_mechanism(σ, sampling_prob=q)``) holds for a q fixed
before the data are read; the plan the ledger reserves must know it. A q that bounds the
work is m/n, and n is private: keyseed sets q from a DP count (``sampling_rate``), a q
that no plan knows, and any q ≤ 1 is dominated by q = 1 — the unsampled Gaussian. A spec
that declared q itself (public) could take the amplified curve; that needs an event field
for q and the accountant's subsampled PLD, and is left for later (issue 65).
"""

from __future__ import annotations

import hashlib
import math
import secrets
from collections.abc import Iterable, Mapping

import numpy as np
from numpy.typing import NDArray

from workers.errors import ConfigError

KEY_BYTES = 32
_SCALE = float(2**64)


def sampling_rate(expected: int, released_count: float) -> float:
    """q = min(1, m / ñ): about ``expected`` (m) units kept from a set whose released (DP)
    count is ``released_count`` (ñ); 1 where ñ ≤ m (negative counts included), so a set no
    larger than m is kept whole. A function of a DP output and a public m only.

    >>> sampling_rate(1000, 4000.0), sampling_rate(1000, 800.0), sampling_rate(1000, -3.0)
    (0.25, 1.0, 1.0)
    """
    if isinstance(expected, bool) or not isinstance(expected, int) or expected < 1:
        raise ConfigError("must be an integer ≥ 1", field="embed_sample")
    if not math.isfinite(released_count) or released_count <= expected:
        return 1.0
    return expected / released_count


class PoissonSample:
    """Poisson sampling of units with a secret key drawn at construction (module
    docstring): :meth:`keeps` says whether a unit is in the sample at rate ``q``."""

    def __init__(self, key: bytes | None = None) -> None:
        # ``key`` is for tests only; a run draws its own and keeps it in memory
        self._key = secrets.token_bytes(KEY_BYTES) if key is None else bytes(key)
        if len(self._key) != KEY_BYTES:
            raise ConfigError(f"the key must be {KEY_BYTES} bytes", field="key")

    def __repr__(self) -> str:  # the key stays out of every log and traceback
        return "PoissonSample(<secret key>)"

    def uniform(self, unit: str) -> float:
        """The unit's uniform draw in [0, 1) (a keyed hash of its id)."""
        digest = hashlib.blake2b(unit.encode("utf-8"), key=self._key, digest_size=8).digest()
        return int.from_bytes(digest, "big") / _SCALE

    def keeps(self, unit: str, rate: float) -> bool:
        """Whether the unit ``unit`` is in the sample at rate ``rate`` ∈ [0, 1]."""
        if not 0.0 <= rate <= 1.0:
            raise ConfigError("must be in [0, 1]", field="sampling_rate")
        return rate >= 1.0 or self.uniform(unit) < rate

    def mask(
        self, units: Iterable[str], classes: Iterable[str], rates: Mapping[str, float]
    ) -> NDArray[np.bool_]:
        """Which of ``units`` (ids, one class each) are kept, each at its class's rate."""
        return np.fromiter(
            (self.keeps(u, rates[c]) for u, c in zip(units, classes, strict=True)), dtype=bool
        )
