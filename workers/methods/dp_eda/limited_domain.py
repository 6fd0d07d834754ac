"""The one place DP-EDA reads private data: nearest-member votes and LimitedDomain.

Votes (dp-eda.md §4, §5). Each privacy unit casts one vote: a document votes for the
population member nearest to its embedding (cosine); a unit with several documents
votes once, for the member nearest to the normalised mean of its documents'
embeddings. One added unit raises one count by 1: ℓ0-sensitivity Δ = 1,
ℓ∞-sensitivity Δ_∞ = 1, and the counts only rise (monotonic).

LimitedDomain (Durfee & Rogers 2019, Alg. "limited domain"; dp-eda.md §5). With the
counts sorted h_(1) ≥ h_(2) ≥ …, the K largest form the domain and

    h_⊥ = h_(K+1) + 1 + c·ln(min{Δ, K, d − K}/δ)/ε_s

is the threshold bin; Gumbel noise of scale b is added to the K domain counts and to
h_⊥, and the indices sorted by noisy value are returned up to ⊥ (⊥ dropped) or up to k.

=============  ==  ===  =========================  ============================
adjacency      Δ   c    Gumbel scale b             OpenDP metric
=============  ==  ===  =========================  ============================
add_remove     1   1    Δ_∞/ε_s                    L∞, monotonic
replace_one    2   2    2·Δ_∞/ε_s                  L∞, not monotonic
=============  ==  ===  =========================  ============================

The noise is OpenDP's Gumbel top-k (:func:`workers.privacy.noise.noisy_top_k`) on the
K + 1 scores (domain counts and h_⊥): the order of the first k noisy values is exactly
what the algorithm needs, so the sort "up to ⊥" is a truncation of OpenDP's answer.
Each of the k peels is ε_s-DP (OpenDP's map certifies k·ε_s for the call); the
restriction to the top K costs δ (Durfee & Rogers, Thm. 4/5).

The clean counts stay local to :func:`select_parents`; only the selection leaves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from workers.errors import ConfigError
from workers.privacy.noise import noisy_top_k

L0 = {"add_remove": 1, "replace_one": 2}
FACTOR = {"add_remove": 1.0, "replace_one": 2.0}
LINF = 1.0  # one vote per unit


@dataclass(frozen=True)
class Calibration:
    """ε_s, δ_LD and the adjacency of one LimitedDomain call (all public)."""

    epsilon: float  # ε_s, per selection (peel)
    delta: float  # δ_LD, the domain restriction's δ
    adjacency: str
    domain: int  # K
    parents: int  # k

    def __post_init__(self) -> None:
        if self.adjacency not in L0:
            raise ConfigError(f"must be one of {', '.join(L0)}", field="adjacency")
        if not (math.isfinite(self.epsilon) and self.epsilon > 0):
            raise ConfigError("must be finite and > 0", field="epsilon")
        if not 0 < self.delta < 1:
            raise ConfigError("must be in (0, 1)", field="delta")

    @property
    def scale(self) -> float:
        """Gumbel scale b: Δ_∞/ε_s (add/remove) or 2Δ_∞/ε_s (replace-one)."""
        return FACTOR[self.adjacency] * LINF / self.epsilon

    @property
    def monotonic(self) -> bool:
        return self.adjacency == "add_remove"

    def gap(self, size: int) -> float:
        """h_⊥ − h_(K+1): 1 + c·ln(min{Δ, K, d − K}/δ)/ε_s, for a population of ``size``."""
        if size < self.domain + 1:
            raise ConfigError(
                f"the population ({size}) must exceed the limited domain K = {self.domain}",
                field="domain",
            )
        smallest = min(L0[self.adjacency], self.domain, size - self.domain)
        return 1.0 + FACTOR[self.adjacency] * math.log(smallest / self.delta) / self.epsilon


def nearest_members(
    private: NDArray[np.float32], population: NDArray[np.float32]
) -> NDArray[np.int64]:
    """For each private row, the population member of largest cosine similarity."""
    if private.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    x = private / np.maximum(np.linalg.norm(private, axis=1, keepdims=True), 1e-12)
    y = population / np.maximum(np.linalg.norm(population, axis=1, keepdims=True), 1e-12)
    return np.asarray(np.argmax(x @ y.T, axis=1), dtype=np.int64)


def unit_means(embeddings: NDArray[np.float32], units: NDArray[np.int64]) -> NDArray[np.float32]:
    """One row per unit (in order of first appearance of its id): the mean embedding."""
    _, first, inverse = np.unique(units, return_index=True, return_inverse=True)
    sums = np.zeros((len(first), embeddings.shape[1]), dtype=np.float64)
    np.add.at(sums, inverse, embeddings)
    sums /= np.bincount(inverse, minlength=len(first))[:, None]
    order = np.argsort(first, kind="stable")
    return sums[order].astype(np.float32)


def vote_counts(voters: NDArray[np.float32], population: NDArray[np.float32]) -> NDArray[np.int64]:
    """How many voters (one row per unit) have each member as nearest: the histogram."""
    return np.bincount(nearest_members(voters, population), minlength=population.shape[0])


def limited_domain(counts: NDArray[np.int64], calibration: Calibration) -> list[int]:
    """Durfee & Rogers's LimitedDomain on ``counts``: member indices in noisy order.

    Returns at most k indices; fewer (possibly none) when ⊥ comes first (module docstring).
    """
    size = counts.shape[0]
    gap = calibration.gap(size)
    domain = calibration.domain
    order = np.argsort(-counts, kind="stable")  # ties: the lower index first
    top = order[:domain]
    bottom = float(counts[order[domain]]) + gap
    scores = np.concatenate([counts[top].astype(np.float64), [bottom]])
    picked = noisy_top_k(
        scores,
        k=calibration.parents,
        scale=calibration.scale,
        noise="gumbel_top_k",
        monotonic=calibration.monotonic,
    )
    chosen: list[int] = []
    for position in picked.tolist():
        if position == domain:  # ⊥
            break
        chosen.append(int(top[position]))
    return chosen


def select_parents(
    voters: NDArray[np.float32], population: NDArray[np.float32], calibration: Calibration
) -> list[int]:
    """Votes of the units (one row each) then LimitedDomain; the counts never leave."""
    counts = vote_counts(voters, population)
    chosen = limited_domain(counts, calibration)
    del counts
    return chosen
