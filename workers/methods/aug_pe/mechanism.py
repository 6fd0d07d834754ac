"""The one place Aug-PE reads private data: nearest-neighbour vote histograms (aug-pe.md §2.3).

Each privacy unit of a class votes for the ``k`` candidates of that class nearest to its
documents' embeddings. A unit's votes are counted per candidate (c_j: how many of its
documents have candidate j among their k nearest) and normalised together to L2 norm 1,
w = c/‖c‖₂ — for a single document, 1/√k on each of its k neighbours, the library's
``vote_normalization_level="sample"``; for a patient with several documents, the
library's ``"client"`` level (caveat A7). Adding or removing one unit therefore moves the
histogram by at most 1 in L2.

Exactness. Votes are fixed-point integers, ⌊2²⁰·w_j⌋ computed in integer arithmetic
(⌊√(2⁴⁰c_j²/S)⌋ = isqrt(⌊2⁴⁰c_j²/S⌋), S = Σc²), so each unit's vector has norm ≤ 2²⁰
exactly, the histogram is an exact integer sum, and dividing by 2²⁰ (a power of two) is
exact in float64: two neighbouring histograms differ by at most 1 in L2 as computed, not
only in real arithmetic. The cost is < 2⁻²⁰ of a vote.

Nothing here returns or keeps the clean histogram beyond :func:`release_histogram`,
which adds OpenDP Gaussian noise to it before it leaves.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from workers.privacy.noise import gaussian_noise

VOTE_BITS = 20
VOTE_SCALE = 1 << VOTE_BITS
DISTANCES = ("l2", "cosine", "inner_product")
_BLOCK = 2048  # private rows per distance block


def nearest_candidates(
    private: NDArray[np.float32],
    candidates: NDArray[np.float32],
    *,
    k: int,
    distance: str = "l2",
) -> NDArray[np.int64]:
    """For each private row, the indices of its ``min(k, n)`` nearest candidate rows.

    ``distance``: ``"l2"`` (Euclidean), ``"cosine"`` (largest cosine similarity) or
    ``"inner_product"`` (largest inner product), as in the PE library.
    """
    if distance not in DISTANCES:
        raise ValueError(f"distance must be one of {', '.join(DISTANCES)}")
    rows, n = private.shape[0], candidates.shape[0]
    take = min(k, n)
    if rows == 0 or take == 0:
        return np.zeros((rows, take), dtype=np.int64)
    y = np.asarray(candidates, dtype=np.float32)
    if distance == "cosine":
        y = y / np.maximum(np.linalg.norm(y, axis=1, keepdims=True), 1e-12)
    bias = -0.5 * np.einsum("ij,ij->i", y, y) if distance == "l2" else None
    out = np.empty((rows, take), dtype=np.int64)
    for start in range(0, rows, _BLOCK):
        x = np.asarray(private[start : start + _BLOCK], dtype=np.float32)
        if distance == "cosine":
            x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
        # l2: argmin ‖x−y‖² = argmax (x·y − ‖y‖²/2)
        scores = x @ y.T
        if bias is not None:
            scores += bias
        if take < n:
            part = np.argpartition(-scores, take - 1, axis=1)[:, :take]
        else:
            part = np.broadcast_to(np.arange(n), (x.shape[0], n))
        out[start : start + x.shape[0]] = part
    return out


def unit_votes(
    neighbours: NDArray[np.int64], units: NDArray[np.int64]
) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
    """Fixed-point votes of every unit: ``(unit, candidate, vote)`` triples.

    ``neighbours[i]`` are the candidates document ``i`` votes for, ``units[i]`` the unit
    it belongs to. Each unit's votes have L2 norm ≤ ``VOTE_SCALE`` exactly.
    """
    rows, k = neighbours.shape
    if rows == 0 or k == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    span = int(neighbours.max()) + 1
    keys = np.repeat(np.asarray(units, dtype=np.int64), k) * span + neighbours.ravel()
    pairs, counts = np.unique(keys, return_counts=True)
    unit, candidate = pairs // span, pairs % span
    squares = np.bincount(unit, weights=counts.astype(np.float64) ** 2)
    totals = [int(s) for s in squares[unit]]  # exact: integer sums far below 2^53
    scale = VOTE_SCALE * VOTE_SCALE
    votes = np.fromiter(
        (math.isqrt(scale * c * c // s) for c, s in zip(counts.tolist(), totals, strict=True)),
        dtype=np.int64,
        count=len(totals),
    )
    return unit, candidate, votes


def vote_histogram(
    neighbours: NDArray[np.int64],
    units: NDArray[np.int64],
    size: int,
    *,
    candidate_index: NDArray[np.int64] | None = None,
) -> NDArray[np.int64]:
    """The fixed-point vote histogram over ``size`` bins (bin = candidate, or
    ``candidate_index[candidate]`` when neighbours index a subset of the bins)."""
    histogram = np.zeros(size, dtype=np.int64)
    _, candidate, votes = unit_votes(neighbours, units)
    bins = candidate if candidate_index is None else candidate_index[candidate]
    np.add.at(histogram, bins, votes)
    return histogram


def release_histogram(histogram: NDArray[np.int64], *, sigma: float) -> NDArray[np.float64]:
    """The histogram in votes plus N(0, σ²) on every bin (OpenDP), the only form that
    leaves the mechanism."""
    return gaussian_noise(histogram.astype(np.float64) / VOTE_SCALE, scale=sigma)


def post_process(noisy: NDArray[np.float64], threshold: float | None) -> NDArray[np.float64]:
    """``max(h̃ − H, 0)`` with the threshold H (aug-pe.md §2.3.4); unchanged without one."""
    if threshold is None:
        return noisy
    return np.maximum(noisy - threshold, 0.0)


def select(
    scores: NDArray[np.float64],
    count: int,
    *,
    mode: str,
    rng: np.random.Generator,
) -> NDArray[np.int64]:
    """Indices of the selected candidates (post-processing of the noisy histogram).

    ``"rank"``: the ``count`` largest scores (fewer when there are fewer candidates),
    ties to the lower index. ``"sample"``: ``count`` draws with replacement, with
    probability ∝ max(score, 0) (uniform when no score is positive: the library would
    divide by a non-positive sum).
    """
    size = len(scores)
    if size == 0 or count <= 0:
        return np.zeros(0, dtype=np.int64)
    if mode == "rank":
        return np.argsort(-scores, kind="stable")[:count].astype(np.int64)
    weights = np.maximum(scores, 0.0)
    total = weights.sum()
    p = weights / total if total > 0 else np.full(size, 1.0 / size)
    return rng.choice(size, size=count, replace=True, p=p).astype(np.int64)
