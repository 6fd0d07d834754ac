"""Cells: a mixture of directions per class, in two releases (class centroids only).

One centroid per class draws every sequence around one direction; a class's documents
take several (AG's Sports: football, tennis, golf). With a budget large next to the
noise, the class sum F̃_c (first release) places K_c cells among the phrases it scores
highest (spherical k-means of their public embeddings: post-processing), each unit joins
its nearest cell, and each cell's sum is released (second release, L2 Δ = 1: a unit is in
one cell of one class, parallel composition; K_max·384 coordinates per class, the unused
cells carry noise only). K_c comes from the first release too: as many cells as keep each
cell's expected sum κ times above its noise norm σ₂√d. With K_c = 1 the cell is the class
sum measured twice, and the two releases combine (inverse-variance weights) into one as
precise as a single release of the whole budget would have been.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from workers.errors import ConfigError
from workers.methods.dpkps.density.centroid import CentroidKDE
from workers.methods.dpkps.density.common import class_release, signal_norm, within_unit_ball
from workers.privacy.events import PrivacyEvent

CELL_CANDIDATES = 2000  # phrases nearest the class direction, among which cells are placed
CELL_ITERATIONS = 20  # spherical k-means steps on those phrases (public, post-processing)


@dataclass(frozen=True)
class CellMixture:
    """One class's mixture: cell directions, their weights, the combined class sum, and
    what the second release cost. Everything here is a DP release or post-processing."""

    label: str
    directions: NDArray[np.float64]  # K_c × d
    weights: NDArray[np.float64]  # K_c, summing to 1
    total: NDArray[np.float64]  # the class sum, both releases combined
    event: PrivacyEvent
    total_scale: float  # the combined class sum's noise σ per coordinate


def cell_count(
    noisy_sum: NDArray[np.float64],
    sigma_first: float,
    sigma_cells: float,
    *,
    max_cells: int,
    kappa: float,
) -> int:
    """K_c = ⌊ŝ / (κ·σ₂·√d)⌋ clipped to [1, max_cells], ŝ the class sum's norm from the
    first release: each cell's expected sum stays κ noise norms above its noise.

    >>> cell_count(np.full(4, 10.0), 0.0, 1.0, max_cells=8, kappa=2.0)
    5
    >>> cell_count(np.zeros(4), 1.0, 1.0, max_cells=8, kappa=1.0)
    1
    """
    d = noisy_sum.size
    cells = math.floor(signal_norm(noisy_sum, sigma_first) / (kappa * sigma_cells * math.sqrt(d)))
    return int(min(max(cells, 1), max_cells))


def cell_centres(
    direction: NDArray[np.float64],
    phrase_embeddings: NDArray[np.float64],
    count: int,
    *,
    seed: int,
    candidates: int = CELL_CANDIDATES,
) -> NDArray[np.float64]:
    """``count`` unit centres: spherical k-means of the ``candidates`` phrases whose public
    embeddings are nearest ``direction`` (a released class sum), seeded (public)."""
    unit = direction / max(float(np.linalg.norm(direction)), 1e-300)
    if count == 1:
        return unit[None, :]
    cos = phrase_embeddings @ unit
    near = phrase_embeddings[np.argsort(-cos, kind="stable")[: max(candidates, count)]]
    rng = np.random.default_rng(seed)
    centres = near[rng.choice(len(near), count, replace=False)]
    for _ in range(CELL_ITERATIONS):
        nearest = (near @ centres.T).argmax(axis=1)
        moved = np.stack(
            [
                near[nearest == k].sum(axis=0) if (nearest == k).any() else centres[k]
                for k in range(count)
            ]
        )
        centres = moved / np.maximum(np.linalg.norm(moved, axis=1, keepdims=True), 1e-300)
    return np.asarray(centres, dtype=np.float64)


def inverse_variance_weights(
    sigma_first: float, sigma_cells: float, cells: int
) -> tuple[float, float]:
    """The weights of a class sum's two measures: the first release (σ ``sigma_first``) and
    the sum of its ``cells`` cell sums (each of σ ``sigma_cells``)."""
    return sigma_first**-2, 1.0 / (cells * sigma_cells**2)


def combined_scale(sigma_first: float, sigma_cells: float, cells: int) -> float:
    """σ on each coordinate of a class sum measured by both releases with
    :func:`inverse_variance_weights`."""
    return float(sum(inverse_variance_weights(sigma_first, sigma_cells, cells)) ** -0.5)


def place_cells(
    first: Sequence[CentroidKDE],
    phrase_embeddings: NDArray[np.float64],
    *,
    planned: PrivacyEvent,
    max_cells: int,
    kappa: float,
    seed: int,
) -> list[NDArray[np.float64]]:
    """USES ONLY DP OUTPUTS AND PUBLIC INPUTS: each class's cell centres (K_c × d), placed
    by its first release among the public phrases (post-processing, seeded)."""
    if planned.norm != "l2":
        raise ConfigError("cells take Gaussian noise", field="centroid_cells")
    sigma_cells = planned.scale / planned.sensitivity  # the cells' noise at Δ = 1
    out = []
    for n, released in enumerate(first):
        count = cell_count(
            released.noisy_sum, released.event.scale, sigma_cells, max_cells=max_cells, kappa=kappa
        )
        out.append(cell_centres(released.noisy_sum, phrase_embeddings, count, seed=seed + n))
    return out


def nearest_cells(rows: NDArray[np.float64], centres: NDArray[np.float64]) -> NDArray[np.int64]:
    """RAW: the cell of each row (scaled into the unit ball): its nearest centre."""
    out: NDArray[np.int64] = (within_unit_ball(rows) @ centres.T).argmax(axis=1).astype(np.int64)
    return out


def cell_sums(
    rows: NDArray[np.float64], centres: NDArray[np.float64], max_cells: int
) -> NDArray[np.float64]:
    """RAW: one class's units' sums in its cells (max_cells × d; the unused cells zero)."""
    clipped = within_unit_ball(rows)
    raw = np.zeros((max_cells, centres.shape[1]))  # an empty class adds nothing: no branch
    np.add.at(raw, nearest_cells(clipped, centres), clipped)
    return raw


def release_cells(
    raws: Sequence[NDArray[np.float64]],
    first: Sequence[CentroidKDE],
    centres: Sequence[NDArray[np.float64]],
    *,
    planned: PrivacyEvent,
) -> list[CellMixture]:
    """READS each class's RAW cell sums (:func:`cell_sums`, max_cells × d; or the exact
    sum of the shards' fixed-point ones); returns their DP release (L2 Δ = 1), combined
    with the first release ``first`` into each class's mixture."""
    if planned.norm != "l2":
        raise ConfigError("cells take Gaussian noise", field="centroid_cells")
    out = []
    for raw, released, placed in zip(raws, first, centres, strict=True):
        label, count = released.label, len(placed)
        max_cells, d = raw.shape
        sigma_first = released.event.scale
        noisy, event = class_release(raw.ravel(), 1.0, planned, label, "cells")
        cells = noisy.reshape(max_cells, d)[:count]
        # both releases measure the class sum: inverse-variance weights
        w_first, w_cells = inverse_variance_weights(sigma_first, event.scale, count)
        total = (released.noisy_sum * w_first + cells.sum(axis=0) * w_cells) / (w_first + w_cells)
        total_scale = combined_scale(sigma_first, event.scale, count)
        if count == 1:
            directions, weights = total[None, :], np.ones(1)
        else:
            norms = np.array([signal_norm(c, event.scale) for c in cells])
            weights = norms / norms.sum() if norms.sum() > 0 else np.full(count, 1.0 / count)
            directions = cells
        out.append(CellMixture(label, directions, weights, total, event, total_scale))
    return out


def build_cell_structures(
    classes: Sequence[tuple[str, NDArray[np.float64]]],
    first: Sequence[CentroidKDE],
    phrase_embeddings: NDArray[np.float64],
    *,
    planned: PrivacyEvent,
    max_cells: int,
    kappa: float,
    seed: int,
) -> list[CellMixture]:
    """The second release of each class: its units' sums in the cells placed by the first
    release ``first`` (same order as ``classes``), plus Gaussian noise (L2 Δ = 1)."""
    if planned.norm != "l2":
        raise ConfigError("cells take Gaussian noise", field="centroid_cells")
    for (label, _), released in zip(classes, first, strict=True):
        if released.label != label:
            raise ConfigError("the first release is of another class", field="centroid_cells")
    centres = place_cells(
        first, phrase_embeddings, planned=planned, max_cells=max_cells, kappa=kappa, seed=seed
    )
    raws = [
        cell_sums(given, placed, max_cells)
        for (_, given), placed in zip(classes, centres, strict=True)
    ]
    return release_cells(raws, first, centres, planned=planned)
