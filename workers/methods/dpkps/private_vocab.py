"""Private vocabulary (method.md, step 2): a noisy histogram over the public vocabulary.

Noise is added to the count of EVERY phrase of the public vocabulary, zeros included
(noising only the phrases that occur would reveal which ones occur), and the ``N``
largest noisy counts form the private vocabulary Ṽ. Picking the top ``N`` is
post-processing. Two histograms, by the planned noise (:mod:`workers.methods.dpkps.plan`):

* Laplace (pure ε): each unit contributes its first ``S`` matched phrases, repeats
  included, so adding or removing one unit moves the histogram by at most ``S`` in L1;
  discrete Laplace noise of scale ``S/ε_voc``.
* Gaussian (ε, δ): each unit contributes each of its first ``S`` DISTINCT phrases once,
  so one unit moves at most ``S`` counts by exactly 1: the L2 sensitivity is ``√S``
  (against ``S`` in L1), and Gaussian noise of σ = z·√S — the noise per count grows with
  √S instead of S, which is what makes a small ε affordable. The noise is the continuous
  Gaussian on the counts taken as reals: the accountant composes it exactly and at once,
  where S discrete Gaussian coordinates at a small ε cost it minutes and gigabytes.

A unit is one document, or the pooled documents of one patient when the dataset has a
unit column (``units``): its matches are concatenated in document order before the
bound ``S`` is applied, so a patient with many notes still moves at most ``S`` counts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from workers.errors import ConfigError
from workers.methods.dpkps.noise import release
from workers.privacy.events import PrivacyEvent


def phrase_histogram(
    doc_matches: Sequence[Sequence[int]],
    *,
    vocabulary_size: int,
    max_per_document: int,
    distinct: bool = False,
) -> NDArray[np.int64]:
    """Counts of each vocabulary entry among each unit's first ``max_per_document``
    matches (``distinct``: its first distinct ones, each counted once)."""
    if max_per_document < 1:
        raise ConfigError("must be ≥ 1", field="max_matches_per_document")
    if distinct:
        doc_matches = [list(dict.fromkeys(m)) for m in doc_matches]
    clipped = [m[:max_per_document] for m in doc_matches if len(m)]
    if not clipped:
        return np.zeros(vocabulary_size, dtype=np.int64)
    flat = np.concatenate([np.asarray(m, dtype=np.int64) for m in clipped])
    return np.bincount(flat, minlength=vocabulary_size).astype(np.int64)


@dataclass(frozen=True)
class PrivateVocabulary:
    """Ṽ: indices into the public vocabulary, by decreasing noisy count."""

    indices: NDArray[np.int64]
    noisy_counts: NDArray[Any]
    event: PrivacyEvent


def select_private_vocabulary(
    doc_matches: Sequence[Sequence[int]],
    *,
    vocabulary_size: int,
    size: int,
    planned: PrivacyEvent,
    max_per_document: int,
) -> PrivateVocabulary:
    """Top-``size`` phrases by the planned noisy histogram (one list of matches per unit)."""
    if size < 1:
        raise ConfigError("must be ≥ 1", field="vocabulary_size")
    if size > vocabulary_size:
        raise ConfigError(
            f"asks for {size} phrases but the public vocabulary has {vocabulary_size}",
            field="vocabulary_size",
        )
    gaussian = planned.noise in ("gaussian", "discrete_gaussian")
    counts = phrase_histogram(
        doc_matches,
        vocabulary_size=vocabulary_size,
        max_per_document=max_per_document,
        distinct=gaussian,
    )
    sensitivity = math.sqrt(max_per_document) if gaussian else float(max_per_document)
    noisy, event = release(counts, planned, sensitivity=sensitivity, name="vocabulary")
    del counts  # the raw histogram lives no longer than this call
    # Largest noisy counts first; ties broken by a fresh random permutation so the order
    # of the public vocabulary does not decide them.
    tiebreak = np.random.default_rng().permutation(vocabulary_size)
    order = np.lexsort((tiebreak, -noisy))[:size]
    return PrivateVocabulary(indices=order.astype(np.int64), noisy_counts=noisy[order], event=event)
