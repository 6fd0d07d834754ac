"""How many sequences each class gets (method.md, "Optional — class proportions").

Either a fixed number per class (what the paper does; costs nothing, but every class of
the declared label set gets the same share), or a total split in proportion to noisy
class counts. Each unit (a document, or a patient with a unit column) lies in one class
(:func:`workers.methods.dpkps.units.pool`), so the count vector over the declared labels moves
by 1 in L1 and in L2 when one unit is added or removed: discrete Laplace noise of scale
``1/ε_count`` (pure) or Gaussian noise (planned σ) protects it; the split itself
is post-processing. Raw counts are never used.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from workers.errors import ConfigError
from workers.methods.dpkps.noise import release
from workers.privacy.events import PrivacyEvent


def noisy_class_counts(
    labels: Sequence[str], *, label_set: Sequence[str], planned: PrivacyEvent
) -> tuple[dict[str, float], PrivacyEvent]:
    """Noisy counts of every declared label (zeros included), one label per unit."""
    position = {label: i for i, label in enumerate(label_set)}
    counts = np.zeros(len(label_set), dtype=np.int64)
    for label in labels:
        counts[position[label]] += 1
    noisy, event = release(counts, planned, sensitivity=1, name="class_counts")
    del counts
    return {label: float(noisy[i]) for i, label in enumerate(label_set)}, event


def allocate(total: int, weights: Mapping[str, float]) -> dict[str, int]:
    """Split ``total`` in proportion to ``max(weight, 0)`` by largest remainders.

    >>> allocate(10, {"a": 3, "b": 1, "c": -2})
    {'a': 8, 'b': 2, 'c': 0}
    >>> allocate(4, {"a": 0, "b": -1})
    {'a': 2, 'b': 2}
    """
    if total < 0:
        raise ConfigError("must be ≥ 0", field="total")
    labels = list(weights)
    if not labels:
        return {}
    w = np.array([max(float(weights[k]), 0.0) for k in labels])
    if w.sum() <= 0:  # nothing positive survived the noise: fall back to equal shares
        w = np.ones(len(labels))
    exact = total * w / w.sum()
    base = np.floor(exact).astype(np.int64)
    short = total - int(base.sum())
    order = np.argsort(-(exact - base), kind="stable")[:short]
    base[order] += 1
    return {k: int(base[i]) for i, k in enumerate(labels)}
