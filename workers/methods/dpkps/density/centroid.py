"""Class centroids of document embeddings (a linear kernel), and their first two moments.

Each unit contributes ONE vector: the mean of its documents' sentence embeddings (unit
rows of the public model), so its L2 norm is at most 1 (the norm of a mean of unit
vectors). A class releases ``F̃_c = Σ_j x_j + N(0, σ²)^d``: adding or removing a unit
moves the sum by x_j, L2 Δ = 1 whatever the unit's length, and classes are disjoint
(parallel composition). The score of a phrase v is ``e_vᵀ F̃_c``, the linear-kernel
density of the class at v; its noise is σ·‖e_v‖ = σ for every phrase, against a signal
that grows with the class size — in 384 coordinates, not one per phrase of Ṽ.

With a total Gaussian budget, independent mode defaults to these centroids;
:func:`build_moment_structures` adds the second moment (a degree-2 polynomial kernel).
Their noise lives in 384 (or 74,304) coordinates whatever |Ṽ| is, which is what keeps
them useful at ε ≤ 1.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from workers.errors import ConfigError
from workers.methods.dpkps.density.common import class_release, within_unit_ball
from workers.privacy.events import PrivacyEvent
from workers.text.embeddings import Embedder, encode_in_chunks

CENTROID_SCALE = 0.05  # cosine units per e-fold of a phrase's centroid score (τ = 1)


@dataclass(frozen=True)
class CentroidKDE:
    """One class's released embedding sum, and what it cost."""

    label: str
    noisy_sum: NDArray[np.float64]
    event: PrivacyEvent


def unit_vectors(
    units: Sequence[Sequence[int]],
    document_embeddings: NDArray[np.floating[Any]],
) -> NDArray[np.float64]:
    """One row per unit: the mean of its documents' (unit-norm) embeddings, norm ≤ 1."""
    emb = np.asarray(document_embeddings, dtype=np.float64)
    norms = np.linalg.norm(emb, axis=1, keepdims=True)
    emb = emb / np.maximum(norms, 1.0)  # already unit rows; never above 1 in any case
    out = np.zeros((len(units), emb.shape[1]))
    for i, docs in enumerate(units):
        if len(docs):
            out[i] = emb[list(docs)].mean(axis=0)
    return out


EMBED_BATCH = 4096  # documents embedded at a time by :func:`embed_units`


def embed_units(
    embedder: Embedder,
    documents: Sequence[str],
    units: Sequence[Sequence[int]],
    *,
    batch: int = EMBED_BATCH,
    tick: Callable[[], None] | None = None,
) -> NDArray[np.float64]:
    """:func:`unit_vectors` of ``units`` (each a tuple of indices into ``documents``),
    embedding only their documents, about ``batch`` at a time: the documents' embeddings
    are never held whole, only one float64 row per unit given (a sample's, when sampled).
    ``tick`` (a cancel check) is passed on to :func:`encode_in_chunks`."""
    out = np.zeros((len(units), embedder.dim))
    start = 0
    while start < len(units):
        stop, size = start, 0
        while stop < len(units) and (size == 0 or size + len(units[stop]) <= batch):
            size += len(units[stop])
            stop += 1
        chunk = units[start:stop]
        texts = [documents[d] for docs in chunk for d in docs]
        encoded = encode_in_chunks(embedder, texts, tick=tick)
        first, local = 0, []
        for docs in chunk:
            local.append(range(first, first + len(docs)))
            first += len(docs)
        out[start:stop] = unit_vectors(local, encoded)
        del texts, encoded
        start = stop
    return out


def class_sum(rows: NDArray[np.float64], dimension: int) -> NDArray[np.float64]:
    """RAW: ``Σ_j x_j`` of one class's rows, each scaled into the unit ball first."""
    clipped = within_unit_ball(rows)
    return clipped.sum(axis=0) if len(clipped) else np.zeros(dimension)


def release_class_sums(
    raws: Sequence[tuple[str, NDArray[np.float64]]], *, planned: PrivacyEvent, moments: bool
) -> list[CentroidKDE]:
    """READS each class's RAW sum (of rows of L2 norm ≤ 1: :func:`class_sum`, or
    :func:`class_moments`; or the exact sum of the shards' fixed-point sums); returns
    their DP releases: the planned Gaussian at L2 Δ = 1 (sums) or √2 (moments)."""
    if planned.norm != "l2":
        raise ConfigError(
            "moments take Gaussian noise" if moments else "class centroids take Gaussian noise",
            field="kde_method",
        )
    sensitivity, kind = (math.sqrt(2.0), "moments") if moments else (1.0, "centroid")
    out = []
    for label, raw in raws:
        noisy, event = class_release(raw, sensitivity, planned, label, kind)
        out.append(CentroidKDE(label=label, noisy_sum=noisy, event=event))
    return out


def build_centroid_structures(
    classes: Sequence[tuple[str, NDArray[np.float64]]], *, planned: PrivacyEvent
) -> list[CentroidKDE]:
    """``Σ_j x_j`` of each class (rows ``x_j``, each of L2 norm ≤ 1) plus Gaussian noise
    (:func:`release_class_sums` refuses any other)."""
    return release_class_sums(
        [(label, class_sum(given, planned.dimension)) for label, given in classes],
        planned=planned,
        moments=False,
    )


def centroid_scores(kde: CentroidKDE, embeddings: torch.Tensor, *, scale: float) -> torch.Tensor:
    """``exp((cos(e_v, F̃_c) − max_v cos) / scale)`` for every phrase: positive scores for
    :func:`~workers.methods.dpkps.sampling.sample_from_scores` (post-processing)."""
    direction = torch.as_tensor(kde.noisy_sum, dtype=torch.float64, device=embeddings.device)
    direction = direction / direction.norm().clamp_min(1e-300)
    cos = embeddings.to(torch.float64) @ direction
    return torch.exp((cos - cos.max()) / scale)


# --- First two moments (a degree-2 polynomial kernel) ---------------------------------
#
# Each unit's vector x_j (norm ≤ 1, :func:`unit_vectors`) contributes x_j and the upper
# triangle of x_j x_jᵀ, as one vector: its squared L2 norm is ‖x‖² + Σ_{i≤k} x_i² x_k² ≤
# ‖x‖² + ‖x‖⁴ ≤ 2, so L2 Δ = √2 for the d + d(d+1)/2 coordinates of one class. A phrase's
# score is the polynomial-kernel density Σ_j (1 + e_vᵀx_j)² − n = 2·e_vᵀF̃ + e_vᵀM̃e_v:
# the quadratic term sees every direction the class's documents take, not their mean
# only; its noise e_vᵀZe_v has standard deviation about √2·σ for a unit e_v.


def _upper(d: int) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    rows, cols = np.triu_indices(d)
    return rows.astype(np.int64), cols.astype(np.int64)


def moment_rows(rows: NDArray[np.float64]) -> NDArray[np.float64]:
    """RAW: each unit's contribution to the moments, one row each: ``x_j`` (scaled into
    the unit ball) and the upper triangle of ``x_j x_jᵀ`` (squared L2 norm ≤ 2)."""
    clipped = within_unit_ball(rows)
    i, k = _upper(clipped.shape[1])
    out: NDArray[np.float64] = np.concatenate([clipped, clipped[:, i] * clipped[:, k]], axis=1)
    return out


def class_moments(rows: NDArray[np.float64]) -> NDArray[np.float64]:
    """RAW: ``(Σ_j x_j, triu(Σ_j x_j x_jᵀ))`` of one class's rows (scaled into the ball)."""
    clipped = within_unit_ball(rows)
    d = clipped.shape[1]
    i, k = _upper(d)
    second = clipped.T @ clipped if len(clipped) else np.zeros((d, d))
    first = clipped.sum(axis=0) if len(clipped) else np.zeros(d)
    return np.concatenate([first, second[i, k]])


def build_moment_structures(
    classes: Sequence[tuple[str, NDArray[np.float64]]], *, planned: PrivacyEvent
) -> list[CentroidKDE]:
    """``(Σ_j x_j, triu(Σ_j x_j x_jᵀ))`` of each class plus Gaussian noise (L2 Δ = √2;
    :func:`release_class_sums` refuses any other)."""
    return release_class_sums(
        [(label, class_moments(given)) for label, given in classes], planned=planned, moments=True
    )


def moment_scores(kde: CentroidKDE, embeddings: torch.Tensor, *, scale: float) -> torch.Tensor:
    """``exp((k(v) − max k) / scale)`` with ``k(v) = (2·e_vᵀF̃ + e_vᵀM̃e_v) / tr(M̃)``, the
    polynomial-kernel density per unit (tr M̃ ≈ the class's size); post-processing."""
    e = embeddings.to(torch.float64)
    d = e.shape[1]
    released = torch.as_tensor(kde.noisy_sum, dtype=torch.float64, device=e.device)
    first, upper = released[:d], released[d:]
    i, k = _upper(d)
    m = torch.zeros(d, d, dtype=torch.float64, device=e.device)
    m[torch.as_tensor(i), torch.as_tensor(k)] = upper
    m = m + m.T - torch.diag(torch.diagonal(m))
    size = torch.clamp(torch.trace(m), min=1.0)
    value = (2.0 * (e @ first) + ((e @ m) * e).sum(dim=1)) / size
    return torch.exp((value - value.max()) / scale)
