"""Random Fourier features (DP-KDE): one noisy feature sum per structure (method.md, step 4).

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

Per class, an ensemble of structures shares ``ε_kde`` equally: the logarithmic ensemble
(paper App. B.2) has block counts ``1, 2, 4, …`` capped at ``L``; the linear ensemble has
``1, 2, …, L``. Classes are disjoint, so each class may spend the whole ``ε_kde``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from numpy.typing import NDArray

from workers.errors import ConfigError
from workers.methods.dpkps.config import MODES, ensemble_block_counts
from workers.methods.dpkps.density.common import (
    CHUNK,
    MAX_BOUND,
    class_release,
    clip_rows,
    kde_sensitivity,
)
from workers.methods.dpkps.features import RandomFourierFeatures, feature_map
from workers.privacy.events import PrivacyEvent


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
    for first in range(0, len(docs), CHUNK):
        last = min(first + CHUNK, len(docs))
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
    for start in range(0, len(docs), CHUNK):
        chunk = docs[start : start + CHUNK]
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
    noisy, event = class_release(
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
