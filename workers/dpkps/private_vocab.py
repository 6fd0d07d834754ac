"""Private vocabulary (method.md, step 2): a Laplace histogram over the public vocabulary.

Each document contributes its first ``S`` matched phrases (repeats included), so adding
or removing one document moves the histogram by at most ``S`` in L1. Discrete Laplace
noise of scale ``S/ε_voc`` is added to the count of EVERY phrase of the public
vocabulary, zeros included (noising only the phrases that occur would reveal which
ones occur), and the ``N`` largest noisy counts form the private vocabulary Ṽ. Picking
the top ``N`` is post-processing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from workers.dpkps.accounting import MechanismSpend
from workers.dpkps.errors import ConfigError
from workers.dpkps.noise import discrete_laplace_counts


def phrase_histogram(
    doc_matches: Sequence[Sequence[int]], *, vocabulary_size: int, max_per_document: int
) -> NDArray[np.int64]:
    """Counts of each vocabulary entry among the first ``max_per_document`` matches."""
    if max_per_document < 1:
        raise ConfigError("must be ≥ 1", field="max_matches_per_document")
    clipped = [m[:max_per_document] for m in doc_matches if len(m)]
    if not clipped:
        return np.zeros(vocabulary_size, dtype=np.int64)
    flat = np.concatenate([np.asarray(m, dtype=np.int64) for m in clipped])
    return np.bincount(flat, minlength=vocabulary_size).astype(np.int64)


@dataclass(frozen=True)
class PrivateVocabulary:
    """Ṽ: indices into the public vocabulary, by decreasing noisy count."""

    indices: NDArray[np.int64]
    noisy_counts: NDArray[np.int64]
    spend: MechanismSpend


def select_private_vocabulary(
    doc_matches: Sequence[Sequence[int]],
    *,
    vocabulary_size: int,
    size: int,
    epsilon: float,
    max_per_document: int,
) -> PrivateVocabulary:
    """Top-``size`` phrases by a discrete-Laplace histogram with sensitivity ``S``."""
    if size < 1:
        raise ConfigError("must be ≥ 1", field="vocabulary_size")
    if size > vocabulary_size:
        raise ConfigError(
            f"asks for {size} phrases but the public vocabulary has {vocabulary_size}",
            field="vocabulary_size",
        )
    counts = phrase_histogram(
        doc_matches, vocabulary_size=vocabulary_size, max_per_document=max_per_document
    )
    noisy, spend = discrete_laplace_counts(
        counts,
        sensitivity=max_per_document,
        epsilon=epsilon,
        mechanism="vocabulary",
        name="vocabulary",
    )
    del counts  # the raw histogram lives no longer than this call
    # Largest noisy counts first; ties broken by a fresh random permutation so the order
    # of the public vocabulary does not decide them.
    tiebreak = np.random.default_rng().permutation(vocabulary_size)
    order = np.lexsort((tiebreak, -noisy))[:size]
    return PrivateVocabulary(indices=order.astype(np.int64), noisy_counts=noisy[order], spend=spend)
