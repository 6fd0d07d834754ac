"""The class counts DP-KPS releases before it splits a total among the classes (method.md,
"Optional — class proportions").

Either a fixed number per class (what the paper does; costs nothing, but every class of
the declared label set gets the same share), or a total split in proportion to noisy
class counts (:func:`workers.methods.proportions.split_by_counts`). Each unit (a
document, or a patient with a unit column) lies in one class
(:func:`workers.methods.dpkps.units.pool`), so the count vector over the declared labels
moves by 1 in L1 and in L2 when one unit is added or removed: discrete Laplace noise of
scale ``1/ε_count`` (pure) or Gaussian noise (planned σ) protects it. Raw counts are never
used.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from workers.methods.dpkps.noise import release
from workers.privacy.events import PrivacyEvent


def noisy_class_counts(
    labels: Sequence[str], *, label_set: Sequence[str], planned: PrivacyEvent
) -> tuple[dict[str, float], PrivacyEvent]:
    """Noisy counts of every declared label (zeros included), one label per unit."""
    return released_class_counts(
        class_tally(labels, label_set), label_set=label_set, planned=planned
    )


def class_tally(labels: Sequence[str], label_set: Sequence[str]) -> NDArray[np.int64]:
    """RAW: how many of ``labels`` (one per unit) carry each declared label, in its order."""
    position = {label: i for i, label in enumerate(label_set)}
    counts = np.zeros(len(label_set), dtype=np.int64)
    for label in labels:
        counts[position[label]] += 1
    return counts


def released_class_counts(
    tally: NDArray[np.int64], *, label_set: Sequence[str], planned: PrivacyEvent
) -> tuple[dict[str, float], PrivacyEvent]:
    """READS the raw per-class unit counts ``tally`` (in label order; a sum of shards'
    tallies is the same vector); returns their DP release."""
    noisy, event = release(
        np.asarray(tally, dtype=np.int64), planned, sensitivity=1, name="class_counts"
    )
    return {label: float(noisy[i]) for i, label in enumerate(label_set)}, event
