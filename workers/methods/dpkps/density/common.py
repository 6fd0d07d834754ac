"""What every density estimator shares: contribution bounds, clipping and the release.

Noise: the planned release of :mod:`workers.methods.dpkps.plan` — Laplace (pure ε, L1
sensitivities) or Gaussian ((ε, δ), L2 sensitivities: contributions are clipped in L2 to
``c·√I`` instead of L1 to ``c·I``, and the exact kernel's sensitivity is its largest
column norm instead of its largest column sum). One unit (a document, or a patient's
pooled documents) contributes one vector, so everything here holds per unit.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numpy.typing import NDArray

from workers.errors import ConfigError
from workers.methods.dpkps.noise import release_vector
from workers.privacy.events import PrivacyEvent

CHUNK = 2048  # rows (units, or phrases of Ṽ) computed at a time

MAX_BOUND = math.sqrt(2.0)  # |f_k| ≤ √2: a bound of √2·I clips nothing


def check_bound(bound: float) -> float:
    """The contribution bound ``c`` must lie in (0, √2]."""
    if isinstance(bound, bool) or not isinstance(bound, (int, float)):
        raise ConfigError("must be a number", field="contribution_bound")
    if not (math.isfinite(bound) and 0 < bound <= MAX_BOUND):
        raise ConfigError(f"must be in (0, {MAX_BOUND:.4f}]", field="contribution_bound")
    return float(bound)


def kde_sensitivity(num_features: int, bound: float = MAX_BOUND, norm: str = "l1") -> float:
    """Sensitivity of ``Σ_j φ_j`` under add/remove of one unit: ``c·I`` (L1), ``c·√I`` (L2).

    Every ``φ_j`` is clipped to ``‖φ_j‖₁ ≤ c·I`` or ``‖φ_j‖₂ ≤ c·√I`` (:func:`clip_rows`);
    with ``c = √2`` both are implied by the box ``[−√2, √2]^I`` and nothing is clipped
    (``‖φ‖₂ ≤ √I·‖φ‖∞``). The L2 bound is smaller by √I: the Gaussian mechanism's
    advantage for this release.
    """
    scale = num_features if norm == "l1" else math.sqrt(num_features)
    return check_bound(bound) * scale


def clip_rows(rows: torch.Tensor, limit: float, norm: str = "l1") -> torch.Tensor:
    """Scale each row down to norm ≤ ``limit`` (rows already within it are unchanged)."""
    if norm == "l1":
        norms = rows.abs().sum(dim=1, keepdim=True)
    else:
        norms = rows.pow(2).sum(dim=1, keepdim=True).sqrt()
    factor = torch.clamp(limit / norms.clamp_min(1e-300), max=1.0)
    return rows * factor


def class_release(
    raw: NDArray[np.float64], sensitivity: float, planned: PrivacyEvent, label: str, kind: str
) -> tuple[NDArray[np.float64], PrivacyEvent]:
    """One class's KDE release with the planned noise, named for the ledger."""
    return release_vector(
        raw, planned, sensitivity=sensitivity, name=f"kde[label={label},{kind}]", partition=label
    )


def within_unit_ball(rows: NDArray[np.float64]) -> NDArray[np.float64]:
    """Rows scaled down to L2 norm ≤ 1 (rows already within it unchanged): the bound the
    sensitivity rests on is enforced, not assumed, and nothing branches on the data."""
    data = np.asarray(rows, dtype=np.float64)
    if data.ndim != 2:
        raise ConfigError("one row per unit", field="kde_method")
    norms = np.linalg.norm(data, axis=1, keepdims=True)
    out: NDArray[np.float64] = data / np.maximum(norms, 1.0)
    return out


def signal_norm(noisy: NDArray[np.float64], sigma: float) -> float:
    """‖x‖ estimated from ``x + N(0, σ²)^d``: √max(0, ‖x̃‖² − dσ²) (post-processing)."""
    energy = float(noisy @ noisy) - noisy.size * sigma**2
    return math.sqrt(max(0.0, energy))
