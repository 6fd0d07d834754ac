"""The Gaussian EDA update (dp-eda.md §4 fix 2): public post-processing of DP-selected parents.

Parents are given in the DP order of LimitedDomain (best first, ⊥ dropped, filtered):

* μ = mean of all N parents, σ_d their per-dimension standard deviation;
* ē = mean of the top-R parents by rank (R ≤ N);
* μ̂ = (1 − α)·μ + α·(e_rank[0] + e_rank[1] − e_rank[−1]);
* σ̂_d = (1 − α)·σ_d + α·sqrt(mean_r (e_rank[r],d − ē_d)²) over the top R;
* N_cld offspring ~ N(μ̂, diag(σ̂²)), re-normalised to unit length (fix 4).

>>> parents = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
>>> mean, std = eda_gaussian(parents, alpha=0.0, top_r=2)
>>> mean.round(3).tolist(), std.round(3).tolist()
([0.667, 0.667], [0.471, 0.471])
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from workers.errors import ConfigError


def eda_gaussian(
    parents: NDArray[np.floating], *, alpha: float, top_r: int
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """(μ̂, σ̂) of the next population's diagonal Gaussian (module docstring)."""
    e = np.asarray(parents, dtype=np.float64)
    n = e.shape[0]
    if n < 2:
        raise ConfigError("the EDA needs at least two parents", field="parents")
    r = min(top_r, n)
    mu = e.mean(axis=0)
    sigma = np.sqrt(((e - mu) ** 2).mean(axis=0))
    best = e[:r]
    e_bar = best.mean(axis=0)
    spread = np.sqrt(((best - e_bar) ** 2).mean(axis=0))
    mean = (1 - alpha) * mu + alpha * (e[0] + e[1] - e[-1])
    std = (1 - alpha) * sigma + alpha * spread
    return mean, std


def normalise(rows: NDArray[np.floating]) -> NDArray[np.float32]:
    x = np.asarray(rows, dtype=np.float64)
    out: NDArray[np.float32] = (
        x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    ).astype(np.float32)
    return out


def offspring(
    parents: NDArray[np.floating],
    *,
    count: int,
    alpha: float,
    top_r: int,
    rng: np.random.Generator,
) -> NDArray[np.float32]:
    """``count`` unit-length samples of the EDA Gaussian fitted to ``parents``."""
    mean, std = eda_gaussian(parents, alpha=alpha, top_r=top_r)
    return normalise(rng.normal(mean, std, size=(count, mean.shape[0])))
