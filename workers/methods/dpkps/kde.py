"""DP kernel density estimates over keyphrase embeddings (method.md, step 4; Wagner et al. 2023).

Noise: the planned release of :mod:`workers.methods.dpkps.plan` — Laplace (pure ε, L1
sensitivities below) or Gaussian ((ε, δ), L2 sensitivities: contributions are clipped in
L2 to ``c·√I`` instead of L1 to ``c·I``, and the exact kernel's sensitivity is its largest
column norm instead of its largest column sum). One unit (a document, or a patient's
pooled documents) contributes one vector, so everything below holds per unit.

A structure releases ``F̃ = Σ_j φ_j + Laplace(b)^I`` where ``φ_j ∈ [−√2, √2]^I`` is the
ONE feature vector document ``j`` contributes, however long it is. Under add/remove-one
adjacency the sum moves by ``φ_j`` alone, so its L1 sensitivity is ``√2 · I`` and the
Laplace scale is ``b = √2 · I / ε``. (The paper's ``2√2·I/ε`` is for a mean under
replace-one adjacency; keyseed's ledger counts documents added or removed.)

Two shapes of contribution:

* bag (independent mode, ``blocks = 0``): ``φ_j`` is the mean of ``f(e_v)`` over the
  document's first ``M`` distinct keyphrases. The sum over documents equals
  ``Σ_v c_v f(e_v)`` with ``c_v`` the share-weighted count of phrase ``v``, so the cost is
  one product over distinct phrases, whatever the number of documents.
* sequence (``blocks = B ≥ 1``): ``φ_j = f(x_j)`` where ``x_j`` concatenates the embeddings
  of the document's first ``B`` distinct keyphrases, zero-padded to ``B`` blocks, each
  block scaled by ``1/√B`` (so a full ``x_j`` has unit norm). ``ω_bᵀ e_v`` depends only on
  the phrase, so each distinct phrase is projected once per block and gathered.

The document's keyphrases are its matches against the private vocabulary Ṽ (itself a
DP release), so a structure is a function of the corpus and of Ṽ: adaptive sequential
composition charges ``ε_voc + ε_kde``.

Independent sequences only query the density at the phrases of Ṽ, so by default that
mode releases the exact Gaussian kernel density there instead (:func:`build_exact_structure`,
at the end of this module): its sensitivity is about 1 rather than ``c·I``.

With a total Gaussian budget, independent mode defaults to class centroids instead
(:func:`build_centroid_structures`, end of this module): one sum of document embeddings
per class, L2 Δ = 1, and a phrase's score its cosine with that sum; :func:`build_moment_
structures` adds the second moment (a degree-2 polynomial kernel). Their noise lives in
384 (or 74,304) coordinates whatever |Ṽ| is, which is what keeps them useful at ε ≤ 1.

Per class, an ensemble of structures shares ``ε_kde`` equally: the logarithmic ensemble
(paper App. B.2) has block counts ``1, 2, 4, …`` capped at ``L``; the linear ensemble has
``1, 2, …, L``. Classes are disjoint, so each class may spend the whole ``ε_kde``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from workers.errors import ConfigError
from workers.methods.dpkps.config import EXACT_KERNEL_LIMIT, MODES, ensemble_block_counts
from workers.methods.dpkps.features import RandomFourierFeatures, feature_map
from workers.methods.dpkps.noise import noise_std, release_vector
from workers.privacy.events import PrivacyEvent
from workers.text.embeddings import Embedder, encode_documents

_DOC_CHUNK = 2048
SPECTRAL_EXACT_LIMIT = 4000  # |Ṽ| up to which λ_max(K) is computed (a |Ṽ|² matrix)
POWER_STEPS = 3  # above it: passes over K for the Collatz–Wielandt bound on λ_max
WEIGHTINGS = ("l1", "l2")  # a document's weights: sum 1 (share), or L2 norm 1


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


def bag_sum(
    doc_phrases: Sequence[Sequence[int]],
    embeddings: torch.Tensor,
    rff: RandomFourierFeatures,
    *,
    num_features: int,
    max_phrases: int,
    bound: float = MAX_BOUND,
    norm: str = "l1",
) -> NDArray[np.float64]:
    """Raw ``Σ_j clip(mean_{v ∈ doc j} f(e_v))``.

    Each distinct phrase is featurised once (``U × I``); a chunk of documents is a sparse
    ``docs × U`` matrix of weights ``1/len``, so its rows ``φ_j`` are one product, and
    clipping needs each of them. Without clipping (``bound = √2``) the sum collapses to
    ``Σ_v c_v f(e_v)``, a weighted histogram over distinct phrases.
    """
    limit = kde_sensitivity(num_features, bound, norm)
    docs = [list(p[:max_phrases]) for p in doc_phrases if len(p)]
    if not docs:
        return np.zeros(num_features, dtype=np.float64)
    used, inverse = np.unique(np.concatenate(docs).astype(np.int64), return_inverse=True)
    rows = torch.as_tensor(used, device=embeddings.device)
    phase = rff.project(embeddings[rows], 0, num_features)
    feats = feature_map(phase, rff.phases(num_features)).to(torch.float64)
    lengths = np.array([len(d) for d in docs])
    owner = np.repeat(np.arange(len(docs)), lengths)
    weight = np.repeat(1.0 / lengths, lengths)
    if bound >= MAX_BOUND:
        hist = np.zeros(used.size)
        np.add.at(hist, inverse, weight)
        w = torch.as_tensor(hist, dtype=torch.float64, device=feats.device)
        out: NDArray[np.float64] = (w @ feats).cpu().numpy()
        return out
    total = torch.zeros(num_features, dtype=torch.float64, device=feats.device)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    for first in range(0, len(docs), _DOC_CHUNK):
        last = min(first + _DOC_CHUNK, len(docs))
        span = slice(starts[first], starts[last])
        index = torch.as_tensor(np.stack([owner[span] - first, inverse[span]]))
        matrix = torch.sparse_coo_tensor(
            index,
            torch.as_tensor(weight[span]),
            (last - first, used.size),
            check_invariants=False,
        ).to(feats.device)
        phi = torch.sparse.mm(matrix, feats)  # repeated phrases are summed: coalesced
        total += clip_rows(phi, limit, norm).sum(dim=0)
    result: NDArray[np.float64] = total.cpu().numpy()
    return result


def sequence_sum(
    doc_phrases: Sequence[Sequence[int]],
    embeddings: torch.Tensor,
    rff: RandomFourierFeatures,
    *,
    num_features: int,
    blocks: int,
    bound: float = MAX_BOUND,
    norm: str = "l1",
) -> NDArray[np.float64]:
    """Raw ``Σ_j clip(f(x_j))`` with ``x_j`` the first ``blocks`` phrases of doc ``j``."""
    limit = kde_sensitivity(num_features, bound, norm)
    docs = [list(p[:blocks]) for p in doc_phrases if len(p)]
    total = torch.zeros(num_features, dtype=torch.float64, device=embeddings.device)
    if not docs:
        return total.cpu().numpy()
    projections = [rff.project(embeddings, b, num_features) for b in range(blocks)]
    beta, scale = rff.phases(num_features), 1.0 / math.sqrt(blocks)
    for start in range(0, len(docs), _DOC_CHUNK):
        chunk = docs[start : start + _DOC_CHUNK]
        phase = torch.zeros(
            len(chunk), num_features, dtype=projections[0].dtype, device=total.device
        )
        for b in range(blocks):
            rows = [i for i, d in enumerate(chunk) if len(d) > b]
            if not rows:
                break
            idx = torch.as_tensor([chunk[i][b] for i in rows], device=total.device)
            phase[torch.as_tensor(rows, device=total.device)] += projections[b][idx]
        phi = feature_map(scale * phase, beta).to(torch.float64)
        total += clip_rows(phi, limit, norm).sum(dim=0)
    out: NDArray[np.float64] = total.cpu().numpy()
    return out


def _release(
    raw: NDArray[np.float64], sensitivity: float, planned: PrivacyEvent, label: str, kind: str
) -> tuple[NDArray[np.float64], PrivacyEvent]:
    """One class's KDE release with the planned noise, named for the ledger."""
    return release_vector(
        raw, planned, sensitivity=sensitivity, name=f"kde[label={label},{kind}]", partition=label
    )


@dataclass(frozen=True)
class DPKDE:
    """One released structure: the noisy feature sum and what it cost."""

    label: str
    blocks: int  # 0: bag structure of the independent mode
    num_features: int
    noisy_sum: NDArray[np.float64]
    event: PrivacyEvent


def build_structure(
    doc_phrases: Sequence[Sequence[int]],
    embeddings: torch.Tensor,
    rff: RandomFourierFeatures,
    *,
    label: str,
    blocks: int,
    num_features: int,
    planned: PrivacyEvent,
    max_phrases: int = 32,
    bound: float = MAX_BOUND,
) -> DPKDE:
    """Build one DP-KDE structure for the units of one class."""
    norm = planned.norm
    if not 1 <= num_features <= rff.num_features:
        raise ConfigError(f"must be in [1, {rff.num_features}]", field="num_features")
    if blocks == 0:
        raw = bag_sum(
            doc_phrases,
            embeddings,
            rff,
            num_features=num_features,
            max_phrases=max_phrases,
            bound=bound,
            norm=norm,
        )
    else:
        raw = sequence_sum(
            doc_phrases,
            embeddings,
            rff,
            num_features=num_features,
            blocks=blocks,
            bound=bound,
            norm=norm,
        )
    noisy, event = _release(
        raw, kde_sensitivity(num_features, bound, norm), planned, label, f"blocks={blocks}"
    )
    del raw  # raw sums never outlive the structure's construction
    return DPKDE(
        label=label, blocks=blocks, num_features=num_features, noisy_sum=noisy, event=event
    )


def build_class_ensemble(
    doc_phrases: Sequence[Sequence[int]],
    embeddings: torch.Tensor,
    rff: RandomFourierFeatures,
    *,
    label: str,
    mode: str,
    ensemble: str,
    length: int,
    planned: PrivacyEvent,
    num_features: int,
    max_phrases: int = 32,
    bound: float = MAX_BOUND,
) -> list[DPKDE]:
    """The structures one class needs: one bag, or one per ensemble block count.

    ``planned`` is one structure's release: the plan already divided the class's budget
    among the ensemble (its ``count``)."""
    if mode == "independent":
        block_counts = [0]
    elif mode == "iterative":
        block_counts = ensemble_block_counts(ensemble, length)
    else:
        raise ConfigError(f"must be one of {MODES}", field="mode")
    if planned.count != len(block_counts):
        raise ConfigError("the plan does not match the ensemble", field="ensemble")
    return [
        build_structure(
            doc_phrases,
            embeddings,
            rff,
            label=label,
            blocks=b,
            num_features=num_features,
            planned=planned,
            max_phrases=max_phrases,
            bound=bound,
        )
        for b in block_counts
    ]


# --- The exact kernel on the finite query set Ṽ (independent mode) -------------------
#
# Independent sequences only ever query the density at the phrases of Ṽ, a finite public
# set. The Gaussian kernel density at every one of them can then be released directly:
# ``s = K w`` with ``K[v, u] = exp(−‖e_v − e_u‖²/σ²)`` over Ṽ and ``w`` the share-weighted
# phrase counts of one class (a document adds ``1/n_j`` to each of its ``n_j ≤ M``
# distinct phrases). Adding or removing document ``j`` moves ``s`` by ``K w_j`` with
# ``w_j ≥ 0`` summing to 1, and ``K ≥ 0``, so the L1 sensitivity is the largest column sum
# of ``K``: a public number (Ṽ is a DP release, the embeddings are public), about 1 at a
# narrow bandwidth. The random-feature structure of the same density has sensitivity
# ``c·I`` and adds feature noise of that scale to every score, besides the random-feature
# error of each kernel value; this release has neither.


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
        for start in range(0, self.size, _DOC_CHUNK):
            dist2 = (2.0 - 2.0 * e[start : start + _DOC_CHUNK] @ e.T).clamp_min(0.0)  # unit rows
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
        noisy, event = _release(
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
    noisy, event = _release(raw, sensitivity, planned, label, "exact")
    del raw  # raw densities never outlive the structure's construction
    return ExactKDE(label=label, noisy_density=noisy, event=event)


# --- Class centroids of document embeddings (a linear kernel) -------------------------
#
# Each unit contributes ONE vector: the mean of its documents' sentence embeddings (unit
# rows of the public model), so its L2 norm is at most 1 (the norm of a mean of unit
# vectors). A class releases ``F̃_c = Σ_j x_j + N(0, σ²)^d``: adding or removing a unit
# moves the sum by x_j, L2 Δ = 1 whatever the unit's length, and classes are disjoint
# (parallel composition). The score of a phrase v is ``e_vᵀ F̃_c``, the linear-kernel
# density of the class at v; its noise is σ·‖e_v‖ = σ for every phrase, against a signal
# that grows with the class size — in 384 coordinates, not one per phrase of Ṽ.


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
    window: int,
    batch: int = EMBED_BATCH,
    tick: Callable[[], None] | None = None,
) -> NDArray[np.float64]:
    """:func:`unit_vectors` of ``units`` (each a tuple of indices into ``documents``),
    embedding only their documents, about ``batch`` at a time: the documents' embeddings
    are never held whole, only one float64 row per unit given (a sample's, when sampled).
    ``tick`` (a cancel check) is passed on to :func:`encode_documents`."""
    out = np.zeros((len(units), embedder.dim))
    start = 0
    while start < len(units):
        stop, size = start, 0
        while stop < len(units) and (size == 0 or size + len(units[stop]) <= batch):
            size += len(units[stop])
            stop += 1
        chunk = units[start:stop]
        texts = [documents[d] for docs in chunk for d in docs]
        encoded = encode_documents(embedder, texts, window=window, tick=tick)
        first, local = 0, []
        for docs in chunk:
            local.append(range(first, first + len(docs)))
            first += len(docs)
        out[start:stop] = unit_vectors(local, encoded)
        del texts, encoded
        start = stop
    return out


def _within_unit_ball(rows: NDArray[np.float64]) -> NDArray[np.float64]:
    """Rows scaled down to L2 norm ≤ 1 (rows already within it unchanged): the bound the
    sensitivity rests on is enforced, not assumed, and nothing branches on the data."""
    data = np.asarray(rows, dtype=np.float64)
    if data.ndim != 2:
        raise ConfigError("one row per unit", field="kde_method")
    norms = np.linalg.norm(data, axis=1, keepdims=True)
    out: NDArray[np.float64] = data / np.maximum(norms, 1.0)
    return out


def build_centroid_structures(
    classes: Sequence[tuple[str, NDArray[np.float64]]], *, planned: PrivacyEvent
) -> list[CentroidKDE]:
    """``Σ_j x_j`` of each class (rows ``x_j``, each of L2 norm ≤ 1) plus Gaussian noise."""
    if planned.norm != "l2":
        raise ConfigError("class centroids take Gaussian noise", field="kde_method")
    out = []
    for label, given in classes:
        rows = _within_unit_ball(given)
        raw = rows.sum(axis=0) if len(rows) else np.zeros(planned.dimension)
        noisy, event = _release(raw, 1.0, planned, label, "centroid")
        del raw
        out.append(CentroidKDE(label=label, noisy_sum=noisy, event=event))
    return out


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


def build_moment_structures(
    classes: Sequence[tuple[str, NDArray[np.float64]]], *, planned: PrivacyEvent
) -> list[CentroidKDE]:
    """``(Σ_j x_j, triu(Σ_j x_j x_jᵀ))`` of each class plus Gaussian noise (L2 Δ = √2)."""
    if planned.norm != "l2":
        raise ConfigError("moments take Gaussian noise", field="kde_method")
    out = []
    for label, given in classes:
        rows = _within_unit_ball(given)
        d = rows.shape[1]
        i, k = _upper(d)
        second = rows.T @ rows if len(rows) else np.zeros((d, d))
        raw = np.concatenate([rows.sum(axis=0) if len(rows) else np.zeros(d), second[i, k]])
        del second
        noisy, event = _release(raw, math.sqrt(2.0), planned, label, "moments")
        del raw
        out.append(CentroidKDE(label=label, noisy_sum=noisy, event=event))
    return out


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


# --- Cells: a mixture of directions per class, in two releases ---------------------------
#
# One centroid per class draws every sequence around one direction; a class's documents
# take several (AG's Sports: football, tennis, golf). With a budget large next to the
# noise, the class sum F̃_c (first release) places K_c cells among the phrases it scores
# highest (spherical k-means of their public embeddings: post-processing), each unit joins
# its nearest cell, and each cell's sum is released (second release, L2 Δ = 1: a unit is in
# one cell of one class, parallel composition; K_max·384 coordinates per class, the unused
# cells carry noise only). K_c comes from the first release too: as many cells as keep each
# cell's expected sum κ times above its noise norm σ₂√d. With K_c = 1 the cell is the class
# sum measured twice, and the two releases combine (inverse-variance weights) into one as
# precise as a single release of the whole budget would have been.

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


def signal_norm(noisy: NDArray[np.float64], sigma: float) -> float:
    """‖x‖ estimated from ``x + N(0, σ²)^d``: √max(0, ‖x̃‖² − dσ²) (post-processing)."""
    energy = float(noisy @ noisy) - noisy.size * sigma**2
    return math.sqrt(max(0.0, energy))


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
    sigma_cells = planned.scale / planned.sensitivity  # the cells' noise at Δ = 1
    out = []
    for n, ((label, given), released) in enumerate(zip(classes, first, strict=True)):
        if released.label != label:
            raise ConfigError("the first release is of another class", field="centroid_cells")
        rows = _within_unit_ball(given)
        d = released.noisy_sum.size
        sigma_first = released.event.scale
        count = cell_count(
            released.noisy_sum, sigma_first, sigma_cells, max_cells=max_cells, kappa=kappa
        )
        centres = cell_centres(released.noisy_sum, phrase_embeddings, count, seed=seed + n)
        raw = np.zeros((max_cells, d))  # an empty class adds nothing: no branch on its size
        np.add.at(raw, (rows @ centres.T).argmax(axis=1), rows)
        noisy, event = _release(raw.ravel(), 1.0, planned, label, "cells")
        del raw, rows
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


# --- The declared label names as a prior (post-processing) --------------------------------
#
# At small ε a class of a few dozen documents releases a sum that is mostly noise (σ ≈ 4.4
# per coordinate at ε = 1 against a 40-document class's ≈ 1 per coordinate). The declared
# label set is public, and so is the embedding model: each name's embedding u_c points
# where the class's documents are likely to be. As the posterior mean of a class's mean
# under a prior centred on its name, the class's direction becomes F̃_c + w_c·u_c with
# w_c = κ·g·σ²·d / ŝ_c (ŝ_c the released sum's norm with the noise removed): the name
# weighs in as the noise does against the signal — heavily for a few dozen documents at
# ε ≤ 1, hardly at all for hundreds. g ∈ [0, 1] is how far the released sums agree with
# the names beyond their noise, z = Σ_c ⟨F̃_c − F̄, u_c − ū⟩ / (σ·√Σ_c ‖u_c − ū‖²) (noise
# alone gives z ~ N(0, 1)), g = clip(z / 2, 0, 1): names that carry nothing about the
# classes (codes, numbers) get no weight. Where the class counts are released, the gate also
# knows how much z could tell: were the names informative, z would be about
# μ₁ = b·Σ_c n_c‖u_c − ū‖ / (σ·√Σ_c ‖u_c − ū‖²) (n_c the shrunk released counts, b a
# document's typical agreement with its name), so g is at least the posterior probability that
# the names are informative, π₀ a priori, after seeing z: logistic(μ₁·z − μ₁²/2 + logit π₀).
# Where μ₁ is large (hundreds of documents a class, or ε ≥ 1 for a few dozen) that floor is a
# test as sharp as the gate's and changes nothing; where it is small (a few dozen documents at
# ε ≤ 0.5) z cannot tell informative names from codes, and the names keep most of π₀ instead of
# a coin toss's weight. It reads the releases, σ and public inputs only.

PRIOR_AGREEMENT_Z = 2.0  # z at which the names get their full weight
PRIOR_FLOOR = 0.1  # ŝ is floored at this many noise norms (a class whose sum is all noise)
# b: a document's agreement with its own name's centred embedding, Σ_c ⟨S_c − S̄, u_c − ū⟩ /
# Σ_c n_c‖u_c − ū‖ with the exact sums, on the tuning splits (AG tune 0.086, Yelp hospital
# tune 0.084, Yelp small tune 0.18, Yelp tune 0.19): the smallest, so μ₁ errs low (towards π₀)
PRIOR_ALIGNMENT = 0.08
PRIOR_INFORMATIVE = 0.8  # π₀: declared label names are meant to say what a class is
# The names' lead (``label_prior_lead`` = L, off by default): where the releases agree with
# the names by z ≥ PRIOR_AGREEMENT_Z, the names take the lead, strength L; it grows from nothing
# at z = PRIOR_LEAD_FROM_Z (names that say nothing pass 16 % of the time in part, 2.3 % wholly).
PRIOR_LEAD_FROM_Z = 1.0


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


def prior_strength(
    kappa: float, agreement: float, power: float | None = None, lead: float = 0.0
) -> float:
    """κ·g: how much of the noise-matched weight the names get. g = clip(z / 2, 0, 1), or,
    given the power μ₁ (:func:`agreement_power`), at least the posterior probability that
    the names are informative: logistic(μ₁·z − μ₁²/2 + logit π₀). Given a lead L, at least
    L·clip(z − 1, 0, 1): the agreement alone, with no prior, decides how far the names lead.

    >>> prior_strength(0.5, 4.0), prior_strength(0.5, 1.0), prior_strength(0.5, -3.0)
    (0.5, 0.25, 0.0)
    >>> round(prior_strength(0.5, -3.0, power=0.0), 3)  # z can tell nothing: π₀
    0.4
    >>> prior_strength(0.5, -3.0, power=8.0) < 1e-6 < prior_strength(0.5, 4.0, power=8.0)
    True
    >>> [prior_strength(0.5, z, power=0.0, lead=32.0) for z in (0.5, 1.5, 2.0, 9.0)]
    [0.4, 16.0, 32.0, 32.0]
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
    span = PRIOR_AGREEMENT_Z - PRIOR_LEAD_FROM_Z
    led = lead * min(max((agreement - PRIOR_LEAD_FROM_Z) / span, 0.0), 1.0)
    return max(kappa * gate, led)


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
    lead: float = 0.0,
) -> tuple[list[CentroidKDE], list[CellMixture]]:
    """Every class's released direction (its cells and combined sum when there are cells)
    pulled towards its name's unit embedding (``names``, one row per class, same order), by
    a strength gated on how far the first releases agree with the names and, given the
    released class counts (shrunk, same order), how much that agreement could tell; with a
    ``lead``, at least that far as the agreement grows past z = 1 (:func:`prior_strength`):
    post-processing."""
    sigma_first = centroids[0].event.scale
    power = None if counts is None else agreement_power(counts, names, sigma_first)
    strength = prior_strength(
        kappa,
        name_agreement(np.stack([c.noisy_sum for c in centroids]), names, sigma_first),
        power,
        lead,
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
