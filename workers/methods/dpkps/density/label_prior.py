"""The declared label names as a prior on the class centroids (post-processing).

At small ε a class of a few dozen documents releases a sum that is mostly noise (σ ≈ 4.4
per coordinate at ε = 1 against a 40-document class's ≈ 1 per coordinate). The declared
label set is public, and so is the embedding model: each name's embedding u_c points
where the class's documents are likely to be. As the posterior mean of a class's mean
under a prior centred on its name, the class's direction becomes F̃_c + w_c·u_c with
w_c = κ·g·σ²·d / ŝ_c (ŝ_c the released sum's norm with the noise removed): the name
weighs in as the noise does against the signal — heavily for a few dozen documents at
ε ≤ 1, hardly at all for hundreds. g ∈ [0, 1] is how far the released sums agree with
the names beyond their noise, z = Σ_c ⟨F̃_c − F̄, u_c − ū⟩ / (σ·√Σ_c ‖u_c − ū‖²) (noise
alone gives z ~ N(0, 1)), g = clip(z / 2, 0, 1): names that carry nothing about the
classes (codes, numbers) get no weight. Where the class counts are released, the gate also
knows how much z could tell: were the names informative, z would be about
μ₁ = b·Σ_c n_c‖u_c − ū‖ / (σ·√Σ_c ‖u_c − ū‖²) (n_c the shrunk released counts, b a
document's typical agreement with its name), so g is at least the posterior probability that
the names are informative, π₀ a priori, after seeing z: logistic(μ₁·z − μ₁²/2 + logit π₀).
Where μ₁ is large (hundreds of documents a class, or ε ≥ 1 for a few dozen) that floor is a
test as sharp as the gate's and changes nothing; where it is small (a few dozen documents at
ε ≤ 0.5) z cannot tell informative names from codes, and the names keep most of π₀ instead of
a coin toss's weight. It reads the releases, σ and public inputs only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from workers.methods.dpkps.density.cells import CellMixture
from workers.methods.dpkps.density.centroid import CentroidKDE
from workers.methods.dpkps.density.common import signal_norm

PRIOR_AGREEMENT_Z = 2.0  # z at which the names get their full weight
PRIOR_FLOOR = 0.1  # ŝ is floored at this many noise norms (a class whose sum is all noise)
# b: a document's agreement with its own name's centred embedding, Σ_c ⟨S_c − S̄, u_c − ū⟩ /
# Σ_c n_c‖u_c − ū‖ with the exact sums, on the tuning splits (AG tune 0.086, Yelp hospital
# tune 0.084, Yelp small tune 0.18, Yelp tune 0.19): the smallest, so μ₁ errs low (towards π₀)
PRIOR_ALIGNMENT = 0.08
PRIOR_INFORMATIVE = 0.8  # π₀: declared label names are meant to say what a class is


def name_directions(embedded: NDArray[np.floating[Any]]) -> NDArray[np.float64]:
    """The label names' embeddings as unit rows (public: the schema and the model)."""
    rows = np.asarray(embedded, dtype=np.float64)
    out: NDArray[np.float64] = rows / np.maximum(
        np.linalg.norm(rows, axis=1, keepdims=True), 1e-300
    )
    return out


def _centred_names(names: NDArray[np.float64]) -> tuple[NDArray[np.float64], float]:
    """The names' embeddings less their mean, and the root of their summed squares (0 when
    every name is the same: they cannot tell classes apart)."""
    centred: NDArray[np.float64] = names - names.mean(axis=0)
    return centred, float(np.sqrt((centred**2).sum()))


def name_agreement(
    noisy_sums: NDArray[np.float64], names: NDArray[np.float64], sigma: float
) -> float:
    """z: the released class sums' covariance with their names' embeddings over its noise
    standard deviation (``N(0, 1)`` when the sums are noise alone); post-processing.

    >>> names = np.eye(3)
    >>> round(name_agreement(10 * names, names, 1.0), 2)
    14.14
    >>> name_agreement(np.zeros((3, 3)), np.ones((3, 3)) / 3**0.5, 1.0)
    0.0
    """
    centred_names, spread = _centred_names(names)
    if spread < 1e-9 or sigma <= 0.0:  # every name the same: they cannot tell classes apart
        return 0.0
    centred_sums = noisy_sums - noisy_sums.mean(axis=0)
    return float((centred_sums * centred_names).sum() / (sigma * spread))


def agreement_power(counts: Sequence[float], names: NDArray[np.float64], sigma: float) -> float:
    """μ₁: the agreement z's expected value were the names informative, from the released
    class counts (shrunk, one per name, same order; negative ones read as 0), the names and
    σ: ``b·Σ_c n_c‖u_c − ū‖ / (σ·√Σ_c ‖u_c − ū‖²)``; post-processing.

    >>> names = np.eye(4)
    >>> round(agreement_power([40.0] * 4, names, 4.4), 3)
    1.455
    >>> agreement_power([40.0] * 4, np.ones((4, 4)) / 2, 4.4)
    0.0
    """
    if len(counts) != len(names):
        raise ValueError("one count per name")
    centred, spread = _centred_names(names)
    if spread < 1e-9 or sigma <= 0.0:
        return 0.0
    lengths = np.sqrt((centred**2).sum(axis=1))
    sizes = np.maximum(np.asarray(counts, dtype=np.float64), 0.0)
    return PRIOR_ALIGNMENT * float(sizes @ lengths) / (sigma * spread)


def prior_strength(kappa: float, agreement: float, power: float | None = None) -> float:
    """κ·g: how much of the noise-matched weight the names get. g = clip(z / 2, 0, 1), or,
    given the power μ₁ (:func:`agreement_power`), at least the posterior probability that
    the names are informative: logistic(μ₁·z − μ₁²/2 + logit π₀).

    >>> prior_strength(0.5, 4.0), prior_strength(0.5, 1.0), prior_strength(0.5, -3.0)
    (0.5, 0.25, 0.0)
    >>> round(prior_strength(0.5, -3.0, power=0.0), 3)  # z can tell nothing: π₀
    0.4
    >>> prior_strength(0.5, -3.0, power=8.0) < 1e-6 < prior_strength(0.5, 4.0, power=8.0)
    True
    """
    gate = min(max(agreement / PRIOR_AGREEMENT_Z, 0.0), 1.0)
    if power is not None:
        logit = (
            power * agreement
            - power**2 / 2
            + math.log(PRIOR_INFORMATIVE / (1.0 - PRIOR_INFORMATIVE))
        )
        posterior = 0.5 * (1.0 + math.tanh(logit / 2))  # logistic(logit), no overflow
        gate = max(gate, posterior)
    return kappa * gate


def with_label_prior(
    direction: NDArray[np.float64], name: NDArray[np.float64], sigma: float, strength: float
) -> NDArray[np.float64]:
    """``F̃ + strength·σ²·d/ŝ · u``: a released sum (noise σ per coordinate) pulled towards
    its label name's unit embedding ``u`` as far as its noise outweighs its signal.

    >>> with_label_prior(np.array([3.0, 4.0]), np.array([0.0, 1.0]), 0.0, 1.0).tolist()
    [3.0, 4.0]
    """
    if strength <= 0.0 or sigma <= 0.0:
        return direction
    d = direction.size
    signal = max(signal_norm(direction, sigma), PRIOR_FLOOR * sigma * math.sqrt(d))
    out: NDArray[np.float64] = direction + (strength * sigma**2 * d / signal) * name
    return out


def cells_with_label_prior(
    mixture: CellMixture, name: NDArray[np.float64], strength: float
) -> CellMixture:
    """A class's cells and combined sum, each pulled towards its name by its own noise:
    the cells by the second release's σ₂, the class sum by both releases' combined σ."""
    total = with_label_prior(mixture.total, name, mixture.total_scale, strength)
    if len(mixture.directions) == 1:  # the one cell is the class sum
        directions = total[None, :]
    else:
        directions = np.stack(
            [with_label_prior(c, name, mixture.event.scale, strength) for c in mixture.directions]
        )
    return replace(mixture, directions=directions, total=total)


def apply_label_prior(
    centroids: Sequence[CentroidKDE],
    mixtures: Sequence[CellMixture],
    names: NDArray[np.float64],
    *,
    kappa: float,
    counts: Sequence[float] | None = None,
) -> tuple[list[CentroidKDE], list[CellMixture]]:
    """Every class's released direction (its cells and combined sum when there are cells)
    pulled towards its name's unit embedding (``names``, one row per class, same order), by
    a strength gated on how far the first releases agree with the names and, given the
    released class counts (shrunk, same order), how much that agreement could tell
    (:func:`prior_strength`): post-processing."""
    sigma_first = centroids[0].event.scale
    power = None if counts is None else agreement_power(counts, names, sigma_first)
    strength = prior_strength(
        kappa,
        name_agreement(np.stack([c.noisy_sum for c in centroids]), names, sigma_first),
        power,
    )
    if mixtures:
        return list(centroids), [
            cells_with_label_prior(m, names[n], strength) for n, m in enumerate(mixtures)
        ]
    pulled = [
        replace(c, noisy_sum=with_label_prior(c.noisy_sum, names[n], sigma_first, strength))
        for n, c in enumerate(centroids)
    ]
    return pulled, []
