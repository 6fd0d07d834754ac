"""The exact Gaussian kernel density on the finite query set Ṽ (independent mode).

Independent sequences only ever query the density at the phrases of Ṽ, a finite public
set. The Gaussian kernel density at every one of them can then be released directly:
``s = K w`` with ``K[v, u] = exp(−‖e_v − e_u‖²/σ²)`` over Ṽ and ``w`` the share-weighted
phrase counts of one class (a document adds ``1/n_j`` to each of its ``n_j ≤ M``
distinct phrases). Adding or removing document ``j`` moves ``s`` by ``K w_j`` with
``w_j ≥ 0`` summing to 1, and ``K ≥ 0``, so the L1 sensitivity is the largest column sum
of ``K``: a public number (Ṽ is a DP release, the embeddings are public), about 1 at a
narrow bandwidth. The random-feature structure of the same density
(:mod:`workers.methods.dpkps.density.random_features`) has sensitivity ``c·I`` and adds
feature noise of that scale to every score, besides the random-feature error of each
kernel value; this release has neither.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from numpy.typing import NDArray

from workers.errors import ConfigError
from workers.methods.dpkps.config import EXACT_KERNEL_LIMIT
from workers.methods.dpkps.density.common import CHUNK, class_release
from workers.methods.dpkps.noise import noise_std
from workers.privacy.events import PrivacyEvent

SPECTRAL_EXACT_LIMIT = 4000  # |Ṽ| up to which λ_max(K) is computed (a |Ṽ|² matrix)
POWER_STEPS = 3  # above it: passes over K for the Collatz–Wielandt bound on λ_max
WEIGHTINGS = ("l1", "l2")  # a document's weights: sum 1 (share), or L2 norm 1


class ExactKernel:
    """The Gaussian kernel over the phrases of Ṽ, and its sensitivity, computed once a run.

    Public: Ṽ is a DP release and the embeddings come from a public model. The kernel is
    never held whole; it is computed in blocks of rows (|Ṽ| ≤ ``EXACT_KERNEL_LIMIT``).
    """

    def __init__(self, embeddings: torch.Tensor, bandwidth: float) -> None:
        if not (math.isfinite(bandwidth) and bandwidth > 0):
            raise ConfigError("must be finite and > 0", field="bandwidth")
        if embeddings.shape[0] > EXACT_KERNEL_LIMIT:
            raise ConfigError(
                f"the exact kernel holds at most {EXACT_KERNEL_LIMIT:,} phrases "
                f"(got {embeddings.shape[0]:,}); use kde_method random_features",
                field="vocabulary_size",
            )
        self.embeddings = embeddings.to(torch.float64)
        self.bandwidth = float(bandwidth)
        # Sensitivity of K w (w ≥ 0 summing to 1 per unit, so K w_j is a convex combination
        # of columns): L1, the largest column sum; L2, the largest column norm (K is
        # symmetric: rows). Both public: functions of Ṽ and the public embeddings.
        l1, l2 = 0.0, 0.0
        for block in self._blocks():
            l1 = max(l1, float(block.sum(dim=1).max()))
            l2 = max(l2, float(block.pow(2).sum(dim=1).sqrt().max()))
        self.sensitivities = {"l1": l1, "l2": l2}
        self.sensitivity = l1
        self._spectral: float | None = None

    @property
    def spectral_norm(self) -> float:
        """λ_max(K), an upper bound on ‖K x‖₂ for every ‖x‖₂ ≤ 1: the sensitivity of the
        density under L2-normalised document weights (:func:`phrase_weights`, ``"l2"``).

        K is symmetric positive semi-definite (a Gaussian kernel matrix), so its operator
        norm is its largest eigenvalue; computed exactly up to ``SPECTRAL_EXACT_LIMIT``
        phrases (plus a relative margin for the solver). Above it, the Collatz–Wielandt
        bound: K ≥ 0 entrywise, so λ_max ≤ max_i (K x)_i / x_i for every x > 0; with x a
        few power-iteration steps from the all-ones vector (the first step is the largest
        row sum, Gershgorin) the bound is close to λ_max. Public: a function of Ṽ and the
        embeddings.
        """
        if self._spectral is None:
            if self.size <= SPECTRAL_EXACT_LIMIT:
                matrix = torch.cat(list(self._blocks()))
                top = float(torch.linalg.eigvalsh(matrix)[-1])
            else:
                x = torch.ones(self.size, dtype=torch.float64, device=self.embeddings.device)
                top = math.inf
                for _ in range(POWER_STEPS):
                    y = torch.cat([k @ x for k in self._blocks()])
                    top = min(top, float((y / x).max()))  # each step's bound is valid
                    x = y / y.max()  # stays > 0: K has a unit diagonal and no negative entry
            self._spectral = top * (1.0 + 1e-9) + 1e-12
        return self._spectral

    @property
    def size(self) -> int:
        return int(self.embeddings.shape[0])

    def _blocks(self) -> Iterator[torch.Tensor]:
        e = self.embeddings
        for start in range(0, self.size, CHUNK):
            dist2 = (2.0 - 2.0 * e[start : start + CHUNK] @ e.T).clamp_min(0.0)  # unit rows
            yield torch.exp(-dist2 / (self.bandwidth * self.bandwidth))

    def density(self, weights: NDArray[np.float64]) -> NDArray[np.float64]:
        """``K w``: the (unnormalised) Gaussian kernel density at every phrase of Ṽ."""
        w = torch.as_tensor(weights, dtype=torch.float64, device=self.embeddings.device)
        out: NDArray[np.float64] = torch.cat([k @ w for k in self._blocks()]).cpu().numpy()
        return out


def phrase_weights(
    doc_phrases: Sequence[Sequence[int]], size: int, *, max_phrases: int, weighting: str = "l1"
) -> NDArray[np.float64]:
    """``w[v] = Σ_j 1/n_j`` over the documents holding ``v`` among their first ``M`` phrases
    (``weighting="l1"``: a document's weights sum to 1), or ``Σ_j 1/√n_j`` (``"l2"``: a
    document's weight vector has L2 norm 1)."""
    if weighting not in WEIGHTINGS:
        raise ConfigError(f"must be one of {', '.join(WEIGHTINGS)}", field="kde_weighting")
    power = 1.0 if weighting == "l1" else 0.5
    weights = np.zeros(size, dtype=np.float64)
    for phrases in doc_phrases:
        kept = list(dict.fromkeys(phrases))[:max_phrases]
        if kept:
            np.add.at(weights, np.asarray(kept, dtype=np.int64), len(kept) ** -power)
    return weights


@dataclass(frozen=True)
class ExactKDE:
    """One class's released density at every phrase of Ṽ, and what it cost."""

    label: str
    noisy_density: NDArray[np.float64]
    event: PrivacyEvent

    @property
    def noise_std(self) -> float:
        """Standard deviation of the noise on one score (Laplace ``√2·b``, Gaussian σ)."""
        return noise_std(self.event)


def build_exact_structures(
    classes: Sequence[tuple[str, Sequence[Sequence[int]]]],
    kernel: ExactKernel,
    *,
    planned: PrivacyEvent,
    max_phrases: int,
    weighting: str = "l1",
) -> list[ExactKDE]:
    """:func:`build_exact_structure` for every (label, units) of ``classes``, the densities
    of all classes computed in one pass over the kernel (same releases, same noise)."""
    if weighting == "l2" and planned.norm != "l2":
        raise ConfigError("L2 document weights need Gaussian noise", field="kde_weighting")
    if not classes:
        return []
    weights = np.stack(
        [
            phrase_weights(docs, kernel.size, max_phrases=max_phrases, weighting=weighting)
            for _, docs in classes
        ],
        axis=1,
    )
    raw = kernel.density(weights)
    del weights
    sensitivity = kernel.spectral_norm if weighting == "l2" else kernel.sensitivities[planned.norm]
    out = []
    for n, (label, _) in enumerate(classes):
        noisy, event = class_release(
            np.ascontiguousarray(raw[:, n]), sensitivity, planned, label, "exact"
        )
        out.append(ExactKDE(label=label, noisy_density=noisy, event=event))
    del raw  # raw densities never outlive the structures' construction
    return out


def build_exact_structure(
    doc_phrases: Sequence[Sequence[int]],
    kernel: ExactKernel,
    *,
    label: str,
    planned: PrivacyEvent,
    max_phrases: int,
    weighting: str = "l1",
) -> ExactKDE:
    """The exact Gaussian kernel density of one class at every phrase of Ṽ, plus noise.

    ``weighting="l1"`` (each document's weights sum to 1): sensitivity the largest column
    sum (Laplace) or column norm (Gaussian) of K, since K·x_j is a convex combination of
    columns. ``"l2"`` (weights 1/√n_j, ‖x_j‖₂ = 1; Gaussian noise only): ‖K x_j‖₂ ≤
    λ_max(K)·‖x_j‖₂ = λ_max(K) (:attr:`ExactKernel.spectral_norm`). With K close to the
    identity (a narrow kernel) both sensitivities are about 1, while a document of n
    phrases gives each √n times the weight: the density's signal grows √n-fold against
    the same noise.
    """
    if weighting == "l2" and planned.norm != "l2":
        raise ConfigError("L2 document weights need Gaussian noise", field="kde_weighting")
    weights = phrase_weights(doc_phrases, kernel.size, max_phrases=max_phrases, weighting=weighting)
    raw = kernel.density(weights)
    del weights
    sensitivity = kernel.spectral_norm if weighting == "l2" else kernel.sensitivities[planned.norm]
    noisy, event = class_release(raw, sensitivity, planned, label, "exact")
    del raw  # raw densities never outlive the structure's construction
    return ExactKDE(label=label, noisy_density=noisy, event=event)
