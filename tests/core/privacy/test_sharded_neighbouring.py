"""The sharded run's release on neighbouring corpora (issue 65, workers/methods/dpkps/shards.py).

``D`` and ``D`` plus one unit (a patient with three notes alike, so one unit vector of norm 1:
the worst case for L2 Δ = 1), each split into shards in its own way (another key, another
number of shards), mapped once; then :meth:`ShardedRun.reduce` many times on each, each
drawing fresh OpenDP noise. As in ``test_neighbouring.py``, the statistic is the release's
projection on the shift between the two corpora's raw class sums (isotropic Gaussian
noise); ε is estimated at δ, and the same reduce planned with half the noise must be
caught. A deterministic stand-in embedder of the model's shape keeps it fast; the class
sums are released in a 2-dimensional public subspace (``subspace`` = 2), as few noise
draws a reduce as possible.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import numpy as np
import pytest

from tests.core.dpkps import config
from tests.core.privacy.test_neighbouring import DELTA, EPSILON, SIGMA_1, projected
from tests.privacy_audit import estimate_epsilon_at_delta, planned
from workers.methods.dpkps.config import EMBEDDING_DIMENSION
from workers.methods.dpkps.plan import KDE, Plan
from workers.methods.dpkps.shards import Row, ShardedRun, add_parts, decode, from_fixed, shard_of
from workers.text.vocabulary import Vocabulary

pytestmark = pytest.mark.slow
RUNS = 6000
CONTROL_RUNS = 12_000  # the control's tails need more draws: ε̂ reads about 1.85 there
LABELS = ["a"]
PHRASES = ["heart failure", "chest pain", "seizure", "migraine", "rash", "eczema", "stent"]


class HashEmbedder:
    """Unit vectors of 384 coordinates, a function of the text alone (tests only)."""

    name, dim = "hash-embedder", EMBEDDING_DIMENSION

    def encode(self, texts: Sequence[str], *, batch_size: int = 256) -> Any:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            seed = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")
            vector = np.random.default_rng(seed).normal(size=self.dim)
            out[i] = vector / np.linalg.norm(vector)
        return out


def the_plan(multiplier: float) -> Plan:
    """The planned class-sum release at noise ``multiplier`` (σ at L2 Δ = 1)."""
    event = planned("gaussian", 1.0, multiplier=multiplier, dimension=2, mechanism=KDE)
    return Plan(events=(event,), epsilon=Decimal(EPSILON), delta=DELTA, accountant="test")


def run(key: bytes, multiplier: float) -> ShardedRun:
    cfg = config(
        epsilon=1.0, delta=1e-6, subspace=2, centroid_cells=1, sequence_length=3, embed_sample=0
    )
    return ShardedRun(
        config=cfg, label_set=LABELS, vocabulary=Vocabulary.from_phrases("t", PHRASES),
        embedder=HashEmbedder(), cache=None, planned=the_plan(multiplier), key=key,
        unit_name="patient",
    )  # fmt: skip


def parts(key: bytes, rows: Sequence[Row], shards: int) -> list[bytes]:
    """The shards' parts of ``rows`` split in ``shards`` under ``key``."""
    sharded = run(key, SIGMA_1)
    split: list[list[Row]] = [[] for _ in range(shards)]
    for i, row in enumerate(rows):
        split[shard_of(row[2], i, key=key, shards=shards)].append(row)
    return [sharded.map("sums", iter(s), None) for s in split]


def test_the_sharded_release_on_neighbouring_corpora_within_epsilon_delta() -> None:
    rng = np.random.default_rng(3)
    corpus: list[Row] = [
        (f"note {i} on {rng.choice(PHRASES)}", "a", f"p{rng.integers(0, 12)}") for i in range(40)
    ]
    # one more patient: three notes alike, in class a (its vector of norm 1)
    neighbour = corpus + [("the new patient's note", "a", "new")] * 3
    one, other = bytes(range(32)), bytes(range(1, 33))
    d_parts = parts(one, corpus, 3)
    d2_parts = parts(other, neighbour, 2)
    raw = from_fixed(add_parts("sums", d_parts)["sums"][0])
    raw2 = from_fixed(add_parts("sums", d2_parts)["sums"][0])
    shift = float(np.linalg.norm(raw2 - raw))
    assert 0.999 < shift <= 1.0  # the added unit alone, of norm ≤ 1 (rounded towards zero)

    def releases(sharded: ShardedRun, mapped: list[bytes], runs: int) -> list[np.ndarray]:
        out = []
        for _ in range(runs):
            _, arrays = decode(sharded.reduce("sums", mapped, None))
            out.append(arrays["noisy_sums"][0])
        return out

    def loss(multiplier: float, runs: int) -> float:
        x = projected(releases(run(one, multiplier), d_parts, runs), raw, raw2)
        y = projected(releases(run(other, multiplier), d2_parts, runs), raw, raw2)
        return estimate_epsilon_at_delta(x, y, delta=DELTA)

    assert 0.7 * EPSILON < loss(SIGMA_1, RUNS) <= 1.3 * EPSILON
    # the same sharded reduce planned with half the noise is caught
    assert loss(SIGMA_1 / 2, CONTROL_RUNS) > 1.6 * EPSILON
