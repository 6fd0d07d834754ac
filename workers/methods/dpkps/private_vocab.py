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

* Thresholded Gaussian (ε, δ), :func:`select_thresholded_vocabulary`: the same distinct
  histogram, but noise is added only to the phrases that occur (count ≥ 1) and only the
  noisy counts above a threshold ``T`` are kept (Korolova et al. 2009, Gopi et al. 2020,
  Wilson et al. 2020). Histogram noise over every public phrase makes the largest noise
  among the never-seen ones grow with √(2 ln |V|) — about 4.5σ for the 300,000 phrases of
  ``english`` — and at a small ε it buries the real phrases in the top N; the threshold
  admits (almost) nothing that does not occur, so Ṽ is smaller but clean. Privacy, for a
  corpus D and D' = D plus one unit u: (a) on the phrases of D the release is the
  Gaussian mechanism with L2 Δ = √S, then a threshold (post-processing), composed by the
  accountant like the histogram; (b) a phrase that only u holds has count exactly 1 in D'
  and never appears on D; u holds at most S of them, so the chance that any crosses T is
  at most ``S·Φ̄((T − 1)/σ) = δ_thr`` when ``T = 1 + σ·Φ̄⁻¹(δ_thr/S)``. Let Z be the event
  that none crosses (p = P[Z] ≥ 1 − δ_thr; it depends on those phrases' noise alone).
  Outputs with one of u's own phrases occur on D' only, off Z; on every other output x
  of the whole run (this release and all that follow it), M(D') has density p·g'(x),
  with g' the density of the same run where u's own phrases are never noised — the
  Gaussian mechanism G on D's phrases and the later releases, which the accountant
  composes. So, for g the density on D (= that of G's run on D):
  D' against D: δ(ε) ≤ P[not Z] + p·δ_G(ε); D against D': ∫ (g − e^ε·p·g')₊ ≤
  ∫ (g − e^ε·g')₊ + (1 − p)·∫ g (pointwise, on either side of g = e^ε·g'). Either way
  δ(ε) ≤ δ_G(ε) + δ_thr: the whole run is (ε_G(δ − δ_thr), δ)-DP, which is how the
  accountant composes the event's ``delta`` = δ_thr (:mod:`workers.privacy.events`),
  with no ε of its own for the threshold. :func:`workers.methods.dpkps.plan.plan` puts
  δ_thr on the planned event; the release here carries it to the realised one.

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
from scipy.stats import norm

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
    """Ṽ: indices into the public vocabulary, by decreasing noisy count (``event`` None:
    chosen from public data alone, :func:`public_vocabulary`)."""

    indices: NDArray[np.int64]
    noisy_counts: NDArray[Any]
    event: PrivacyEvent | None


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


# OpenDP rounds real noise to the lattice 2^-40: a count may land that much above the
# continuous draw. The threshold carries a margin far above it.
THRESHOLD_MARGIN = 2.0**-20


def vocabulary_threshold(*, scale: float, max_per_document: int, threshold_delta: float) -> float:
    """``T`` such that ``S`` phrases of count 1, each plus N(0, scale²), all stay ≤ T
    except with probability at most ``threshold_delta`` (union bound).

    >>> t = vocabulary_threshold(scale=10.0, max_per_document=10, threshold_delta=1e-6)
    >>> round(t, 2), float(10 * norm.sf((t - 1) / 10.0)) <= 1e-6
    (52.99, True)
    """
    if not 0 < threshold_delta < 1:
        raise ConfigError("must be in (0, 1)", field="delta")
    if max_per_document < 1:
        raise ConfigError("must be ≥ 1", field="max_matches_per_document")
    if not (math.isfinite(scale) and scale > 0):
        raise ConfigError("must be finite and > 0", field="scale")
    z = float(norm.isf(threshold_delta / max_per_document))
    return 1.0 + scale * z + THRESHOLD_MARGIN * max(1.0, scale)


def select_thresholded_vocabulary(
    doc_matches: Sequence[Sequence[int]],
    *,
    vocabulary_size: int,
    size: int,
    planned: PrivacyEvent,
    max_per_document: int,
    threshold_delta: float,
) -> PrivateVocabulary:
    """At most ``size`` phrases whose noisy count (Gaussian, on occurring phrases only)
    clears the threshold of :func:`vocabulary_threshold`, by decreasing noisy count.

    Each unit contributes its first ``max_per_document`` distinct phrases once (L2 Δ =
    √S). Ṽ may hold fewer than ``size`` phrases, or none: its size is part of the DP
    release. The event is the Gaussian part with the threshold's δ as its ``delta``
    (the planned event's, which a plan sets to ``threshold_delta``).
    """
    if size < 1:
        raise ConfigError("must be ≥ 1", field="vocabulary_size")
    if planned.noise != "gaussian":
        raise ConfigError("the thresholded vocabulary takes Gaussian noise", field="noise")
    if planned.delta is not None and float(planned.delta) != threshold_delta:
        raise ConfigError("the threshold's δ differs from the planned release's", field="delta")
    counts = phrase_histogram(
        doc_matches,
        vocabulary_size=vocabulary_size,
        max_per_document=max_per_document,
        distinct=True,
    )
    support = np.flatnonzero(counts)
    noisy, event = release(
        counts[support], planned, sensitivity=math.sqrt(max_per_document), name="vocabulary"
    )
    del counts  # the raw histogram and its support live no longer than this call
    threshold = vocabulary_threshold(
        scale=event.scale, max_per_document=max_per_document, threshold_delta=threshold_delta
    )
    above = np.flatnonzero(noisy > threshold)
    kept, kept_noisy = support[above], np.asarray(noisy)[above]
    del support, noisy
    tiebreak = np.random.default_rng().permutation(kept.size)
    order = np.lexsort((tiebreak, -kept_noisy))[:size]
    return PrivateVocabulary(
        indices=kept[order].astype(np.int64), noisy_counts=kept_noisy[order], event=event
    )


def public_vocabulary(*, vocabulary_size: int, size: int) -> PrivateVocabulary:
    """Ṽ without a private read: the first ``size`` phrases of the public vocabulary, in
    its own order (the built-in ``english`` is sorted by word frequency in general
    English, so these are its most common content words). No release, no budget: the
    per-class densities over Ṽ, all of them DP releases, decide which phrases a class
    uses. Better than a noisy histogram when ε or the corpus is small, since the
    histogram's threshold or its noise over never-seen phrases leaves few real ones.
    """
    if not 1 <= size <= vocabulary_size:
        raise ConfigError(f"must be between 1 and {vocabulary_size}", field="vocabulary_size")
    return PrivateVocabulary(
        indices=np.arange(size, dtype=np.int64), noisy_counts=np.zeros(size), event=None
    )
