"""How a total of released items is split among the declared classes (method.md,
"Optional — class proportions"); shared by every method that splits by noisy class counts.

A method releases noisy counts of units per declared label (its own release, charged in
the ledger); the split itself is post-processing. Before it, the counts are pulled towards
their mean by the positive-part James–Stein rule (:func:`shrunk_counts`): in a corpus of a
few dozen documents a class, the counts' noise at a small ε (σ ≈ 14 at ε = 1, δ = 1e-6) is
as large as the counts, and split as released it would give some classes nothing and
others double; where the counts differ by far more than the noise (one large class among
small ones), the rule leaves them almost as released. Raw counts are never used.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from workers.errors import ConfigError


def split_by_counts(total: int, noisy: Mapping[str, float], noise_std: float) -> dict[str, int]:
    """``total`` split by the released counts ``noisy`` (noise of standard deviation
    ``noise_std``, public) once shrunk: :func:`allocate` of :func:`shrunk_counts`.

    >>> split_by_counts(100, {"a": 24.0, "b": 9.0, "c": 22.0, "d": 18.0, "e": 30.0}, 14.0)
    {'a': 20, 'b': 20, 'c': 20, 'd': 20, 'e': 20}
    >>> split_by_counts(100, {"a": 240.0, "b": 9.0, "c": 22.0, "d": 18.0, "e": 30.0}, 14.0)
    {'a': 75, 'b': 3, 'c': 7, 'd': 6, 'e': 9}
    """
    return allocate(total, shrunk_counts(noisy, noise_std))


def shrunk_counts(noisy: Mapping[str, float], noise_std: float) -> dict[str, float]:
    """The noisy counts pulled towards their mean by the positive-part James–Stein rule.

    With ``C`` counts ``ñ_c = n_c + z_c``, ``z_c`` of standard deviation ``s``
    (``noise_std``, public) and ``m`` their mean, each becomes ``m + b·(ñ_c − m)``, with
    ``b = max(0, 1 − (C − 3)·s² / Σ_c (ñ_c − m)²)``: ``b`` is near 0 when the spread of the
    counts is what the noise alone would give (balanced classes: equal shares), near 1
    when the counts differ by far more than the noise. For ``C ≥ 4`` the rule has a
    smaller expected squared error than the released counts whatever the true ones
    (James & Stein 1961); below 4 counts they are returned unchanged. It reads only the
    released counts and their public noise scale: post-processing.

    >>> shrunk_counts({"a": 12.0, "b": 28.0, "c": 20.0, "d": 20.0, "e": 20.0}, 10.0)
    {'a': 20.0, 'b': 20.0, 'c': 20.0, 'd': 20.0, 'e': 20.0}
    >>> round(shrunk_counts({"a": 500.0, "b": 10.0, "c": 20.0, "d": 30.0}, 10.0)["a"], 1)
    499.8
    """
    if not (math.isfinite(noise_std) and noise_std >= 0):
        raise ConfigError("must be finite and ≥ 0", field="noise_std")
    if len(noisy) < 4:
        return {k: float(n) for k, n in noisy.items()}
    mean = float(np.mean(list(noisy.values())))
    spread = sum((float(n) - mean) ** 2 for n in noisy.values())
    # equal counts (spread 0) stay at their mean whatever the factor
    factor = max(0.0, 1.0 - (len(noisy) - 3) * noise_std**2 / spread) if spread > 0 else 0.0
    return {k: mean + factor * (float(n) - mean) for k, n in noisy.items()}


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
