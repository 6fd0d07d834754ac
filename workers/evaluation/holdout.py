"""A DP-measured utility figure: accuracy on a held-out slice of the private corpus.

A job may hold out a slice of the private units from generation; once the synthetic
corpus is released, a classifier trained on it (public data) labels one document of
every unit in the slice, and the count of correct predictions per class is released
with noise. The derivation (docs/utility.md has the same in prose):

**The slice.** ``key`` is a public, per-job random string (recorded in the job's spec
and manifest) and ``fraction`` a public number in (0, 1). A unit's score is
``HMAC-SHA256(key, "unit" ‖ unit id)`` read as a number in [0, 1); the unit is in the
slice iff its score < ``fraction`` (:func:`in_slice`). The unit id is the unit column's
value, or — without one, where a unit is one document — the document's text (the upload
refuses or drops repeated texts). The choice is a function of the unit's own id and
public inputs, so adding or removing a unit moves no other unit across, a unit's
documents all lie on one side, and the split is public: anyone holding the key can say
on which side a given id lies. Generation reads only the ``rest`` side
(:func:`Selection.rest`); the evaluation reads only the slice.

**One document per unit.** With a unit column a unit may hold several documents. Each
slice unit contributes exactly one: among its documents of the class it is assigned to
(:func:`workers.privacy.units.pool`, the rule every mechanism uses), the one with the
smallest ``HMAC-SHA256(key, "document" ‖ text)`` — a function of the unit's own data.

**The release.** With K declared labels, the evaluation makes the vector of 2K counts
``(correct_1 … correct_K, wrong_1 … wrong_K)``: correct_c is how many slice units whose
evaluated document carries label c the classifier labels c, wrong_c how many it labels
otherwise. Every unit falls in exactly one of the 2K cells (its document has one label
and one prediction), so adding or removing one unit changes the vector by exactly 1 in
one cell: L1 sensitivity 1, whatever K. The release adds discrete Laplace noise of scale
1/ε_eval to every cell (OpenDP, :func:`workers.privacy.noise.discrete_laplace_noise`):
ε_eval-DP, pure. The per-class totals and the slice's size are sums of cells
(post-processing): no second release and no split of ε_eval is needed, and the classifier
is trained on the released corpus alone (a DP output), so it is a fixed function here.

**Composition.** The generation's releases read the rest side, the evaluation's the
slice; a unit lies on one side, so the two compose in parallel: the job costs the worse
of the two, not their sum (:mod:`workers.privacy.accountant`, "Splits"). With ε_eval ≤
the generation's ε the job costs exactly what the generation alone costs. The events
carry ``split`` (:func:`split_name`: a digest of key and fraction) and ``side``.

**The figure and its interval.** From the noisy cells, C̃ = Σ correct̃_c and W̃ = Σ wrong̃_c;
the accuracy is C̃ / (C̃ + W̃) (negative sums clipped at 0). The noise on C̃ is a sum of K
independent discrete Laplace variables, as is that on W̃. Let q be the smallest integer
with P(|Z_K| > q) ≤ α/2 for Z_K such a sum (:func:`noise_quantile`: the exact
distribution of the sum, by FFT of the one-cell distribution truncated at a tail mass
that is added to the error). Then C ∈ [C̃ − q, C̃ + q] and W ∈ [W̃ − q, W̃ + q] together with
probability ≥ 1 − α, and the accuracy C/(C + W) rises with C and falls with W, so

    low = (C̃ − q)⁺ / ((C̃ − q)⁺ + W̃ + q),   high = (C̃ + q) / (C̃ + q + (W̃ − q)⁺)

is a (conservative) 1 − α interval for the slice's exact accuracy (:func:`interval`).
It covers the noise only: the slice is a sample of the corpus, and its sampling error is
a separate matter. A class's accuracy is the same with K = 1 (one cell each side): it is
shown where its interval is at most ±PER_CLASS_HALF_WIDTH wide, else the report says why.

**Off where too small.** The interval's width scales like q / n for a slice of n units:
:func:`expected_half_width` is what the figure would give on a slice of n units (an
accuracy of one half, the widest case), the dry run's test of whether a holdout is worth
the units it takes from generation (USEFUL_HALF_WIDTH).
"""

from __future__ import annotations

import hashlib
import hmac
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from workers.errors import ConfigError
from workers.privacy.events import PrivacyEvent, exact_decimal
from workers.privacy.noise import discrete_laplace_noise, release_event
from workers.privacy.units import pool

MECHANISM = "holdout_accuracy"
DEFAULT_FRACTION = 0.1
CONFIDENCE = 0.95  # of the published intervals
USEFUL_HALF_WIDTH = 0.05  # the figure is worth a holdout when its interval is within ±5 points
PER_CLASS_HALF_WIDTH = 0.10  # a class's accuracy is shown when within ±10 points
TAIL_MASS = 1e-12  # one cell's distribution is truncated where this much mass is left
MAX_FRACTION = 0.5


def _key(key: str) -> bytes:
    if not isinstance(key, str) or not key:
        raise ConfigError("must be a non-empty string", field="holdout.key")
    return key.encode("utf-8")


def _check_fraction(fraction: float) -> float:
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
        raise ConfigError("must be a number", field="holdout.fraction")
    if not 0 < fraction <= MAX_FRACTION:
        raise ConfigError(f"must be in (0, {MAX_FRACTION:g}]", field="holdout.fraction")
    return float(fraction)


def split_name(key: str, fraction: float) -> str:
    """The split's public name in the ledger: a digest of its key and fraction (two jobs
    with the same key and fraction hold out the same units, and share the name)."""
    digest = hashlib.sha256(_key(key) + b"\0" + repr(_check_fraction(fraction)).encode())
    return "holdout:" + digest.hexdigest()[:16]


def _score(key: bytes, what: bytes, value: str) -> int:
    return int.from_bytes(
        hmac.new(key, what + b"\0" + value.encode("utf-8"), hashlib.sha256).digest()[:8], "big"
    )


def unit_score(key: str, unit: str) -> float:
    """The unit's keyed hash as a number in [0, 1)."""
    return _score(_key(key), b"unit", unit) / 2.0**64


def in_slice(key: str, unit: str, fraction: float) -> bool:
    """Whether the unit ``unit`` lies in the held-out slice (module docstring)."""
    return unit_score(key, unit) < _check_fraction(fraction)


@dataclass(frozen=True)
class Selection:
    """Which documents generation reads (``rest``) and which one document of every slice
    unit the evaluation reads (``evaluated``), as indices into the corpus, in row order."""

    rest: tuple[int, ...]
    evaluated: tuple[int, ...]


def select(
    texts: Sequence[str],
    labels: Sequence[str],
    units: Sequence[str] | None,
    *,
    key: str,
    fraction: float,
    label_set: Sequence[str],
) -> Selection:
    """Split a corpus into the generation's side and the slice's evaluated documents."""
    if len(texts) != len(labels):
        raise ConfigError("texts and labels differ in length", field="labels")
    secret = _key(key)
    fraction = _check_fraction(fraction)
    ids = list(units) if units is not None else list(texts)
    held = [_score(secret, b"unit", unit) / 2.0**64 < fraction for unit in ids]
    rest = tuple(i for i, h in enumerate(held) if not h)
    evaluated: list[int] = []
    for unit in pool(labels, units, label_set=label_set):
        if unit.documents and held[unit.documents[0]]:
            chosen = min(unit.documents, key=lambda i: (_score(secret, b"document", texts[i]), i))
            evaluated.append(chosen)
    return Selection(rest=rest, evaluated=tuple(sorted(evaluated)))


# ------------------------------------------------------------------ the release


def planned_event(*, epsilon: float, classes: int, split: str) -> PrivacyEvent:
    """The evaluation's release as planned: discrete Laplace of scale 1/ε on 2K cells,
    L1 sensitivity 1, on the slice side of ``split``."""
    eps = exact_decimal(epsilon, field="holdout.epsilon")
    return PrivacyEvent(
        mechanism=MECHANISM,
        name="accuracy on the held-out slice",
        noise="discrete_laplace",
        scale=1.0 / float(eps),
        sensitivity=1.0,
        norm="l1",
        dimension=2 * classes,
        epsilon=eps,
        split=split,
        side="slice",
    )


def on_rest(events: Sequence[PrivacyEvent], split: str) -> tuple[PrivacyEvent, ...]:
    """The generation's events, marked as reading only the rest side of ``split``."""
    return tuple(replace(e, split=split, side="rest") for e in events)


def cell_counts(
    truth: Sequence[str], predicted: Sequence[str], label_set: Sequence[str]
) -> NDArray[np.int64]:
    """The 2K cells (correct per class, then wrong per class) of the evaluated documents."""
    if len(truth) != len(predicted):
        raise ConfigError("one prediction per evaluated document", field="predicted")
    position = {label: i for i, label in enumerate(label_set)}
    k = len(label_set)
    cells = np.zeros(2 * k, dtype=np.int64)
    for label, guess in zip(truth, predicted, strict=True):
        c = position[label]
        cells[c if guess == label else k + c] += 1
    return cells


def release(
    cells: NDArray[np.int64], *, epsilon: float, split: str
) -> tuple[NDArray[np.int64], PrivacyEvent]:
    """The noisy cells and the event OpenDP's map certifies for them (on the slice side)."""
    scale = 1.0 / float(exact_decimal(epsilon, field="holdout.epsilon"))
    noisy = discrete_laplace_noise(np.asarray(cells, dtype=np.int64), scale=scale)
    event = release_event(
        mechanism=MECHANISM,
        name="accuracy on the held-out slice",
        noise="discrete_laplace",
        scale=scale,
        sensitivity=1.0,
        dimension=int(cells.size),
    )
    return noisy, replace(event, split=split, side="slice")


# ------------------------------------------------------------------ the interval


def _one_cell(scale: float) -> tuple[NDArray[np.float64], float]:
    """The discrete Laplace distribution of parameter ``scale`` on [−m, m] and the mass
    left outside it."""
    p = math.exp(-1.0 / scale)
    m = max(1, math.ceil(scale * math.log(1.0 / TAIL_MASS)) + 1)
    x = np.arange(-m, m + 1)
    pmf = (1 - p) / (1 + p) * p ** np.abs(x)
    outside = 2 * p ** (m + 1) / (1 + p)
    return pmf, float(outside)


def noise_quantile(*, scale: float, terms: int, alpha: float) -> int:
    """The smallest integer q with P(|Z| > q) ≤ α for Z a sum of ``terms`` independent
    discrete Laplace variables of parameter ``scale`` (exact, by FFT; the mass truncated
    from each variable counts as error)."""
    if terms < 1 or not 0 < alpha < 1:
        raise ConfigError("needs terms ≥ 1 and α in (0, 1)", field="alpha")
    pmf, outside = _one_cell(scale)
    m = (pmf.size - 1) // 2
    size = terms * 2 * m + 1
    n = 1 << (size - 1).bit_length()
    total = np.fft.irfft(np.fft.rfft(pmf, n) ** terms, n)[:size]
    total = np.clip(total, 0.0, None)
    budget = alpha - terms * outside
    if budget <= 0:
        raise ConfigError("α too small for the truncation", field="alpha")
    centre = terms * m  # index of 0
    # P(|Z| > q) = 1 − Σ_{|z| ≤ q} P(z); walk q up until within budget
    cumulative = total[centre]
    q = 0
    while 1.0 - cumulative > budget and q < terms * m:
        q += 1
        cumulative += total[centre + q] + total[centre - q]
    return q


def interval(correct: float, wrong: float, q: float) -> tuple[float, float]:
    """The conservative interval on C / (C + W) given noisy sums and their bound q."""
    c_low, w_low = max(correct - q, 0.0), max(wrong - q, 0.0)
    c_high, w_high = max(correct + q, 0.0), max(wrong + q, 0.0)
    low = c_low / (c_low + w_high) if c_low + w_high > 0 else 0.0
    high = c_high / (c_high + w_low) if c_high + w_low > 0 else 1.0
    return float(min(max(low, 0.0), 1.0)), float(min(max(high, 0.0), 1.0))


def expected_half_width(*, slice_units: float, epsilon: float, classes: int) -> float:
    """Half the width of the interval the figure would have on a slice of ``slice_units``
    units at an accuracy of one half (the widest case), from public inputs and that size."""
    q = noise_quantile(scale=1.0 / epsilon, terms=classes, alpha=(1 - CONFIDENCE) / 2)
    half = slice_units / 2
    low, high = interval(half, half, q)
    return (high - low) / 2


@dataclass(frozen=True)
class Figure:
    """What the evaluation publishes: DP outputs and public inputs only."""

    accuracy: float | None
    low: float
    high: float
    slice_units: int  # the noisy slice size, Σ of the cells (clipped at 0)
    noise_bound: int  # q: each of the noisy sums is within it with probability 1 − α/2
    per_class: dict[str, dict[str, Any]]
    epsilon: float
    confidence: float = CONFIDENCE

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    @property
    def useful(self) -> bool:
        return bool(self.half_width <= USEFUL_HALF_WIDTH)

    def to_dict(self) -> dict[str, Any]:
        return {
            "accuracy": self.accuracy,
            "interval": [self.low, self.high],
            "confidence": self.confidence,
            "half_width": self.half_width,
            "useful": self.useful,
            "slice_units": self.slice_units,
            "noise_bound": self.noise_bound,
            "epsilon": self.epsilon,
            "per_class": self.per_class,
        }


def _ratio(correct: float, wrong: float) -> float | None:
    c, w = max(float(correct), 0.0), max(float(wrong), 0.0)
    return c / (c + w) if c + w > 0 else None


def figure(noisy: NDArray[np.int64], *, epsilon: float, label_set: Sequence[str]) -> Figure:
    """The published figure from the noisy cells alone (post-processing)."""
    k = len(label_set)
    if noisy.size != 2 * k:
        raise ConfigError(f"expected {2 * k} cells", field="cells")
    scale = 1.0 / epsilon
    alpha = 1 - CONFIDENCE
    correct, wrong = noisy[:k].astype(float), noisy[k:].astype(float)
    q = noise_quantile(scale=scale, terms=k, alpha=alpha / 2)
    low, high = interval(correct.sum(), wrong.sum(), q)
    q1 = noise_quantile(scale=scale, terms=1, alpha=alpha / 2)
    per_class: dict[str, dict[str, Any]] = {}
    for c, label in enumerate(label_set):
        c_low, c_high = interval(correct[c], wrong[c], q1)
        shown = bool((c_high - c_low) / 2 <= PER_CLASS_HALF_WIDTH)
        per_class[label] = {
            "accuracy": _ratio(correct[c], wrong[c]) if shown else None,
            "interval": [c_low, c_high] if shown else None,
            "units": max(int(correct[c] + wrong[c]), 0),
            "shown": shown,
            "why_not": None
            if shown
            else f"its interval would be ±{(c_high - c_low) / 2:.2f}, wider than "
            f"±{PER_CLASS_HALF_WIDTH:.2f}: too few of its units in the slice for the noise",
        }
    return Figure(
        accuracy=_ratio(correct.sum(), wrong.sum()),
        low=low,
        high=high,
        slice_units=max(int(noisy.sum()), 0),
        noise_bound=q,
        per_class=per_class,
        epsilon=float(epsilon),
    )


def predict(
    train_texts: Sequence[str],
    train_labels: Sequence[str],
    test_texts: Sequence[str],
    *,
    seed: int = 0,
) -> list[str]:
    """The classifier trained on the released corpus (public), applied to ``test_texts``:
    the TF-IDF classifier of :mod:`workers.evaluation.classifier`; a released corpus with
    one label predicts it everywhere, one without words its most frequent label, an
    empty one nothing right."""
    from workers.evaluation.classifier import tfidf_predict

    if not test_texts:
        return []
    distinct = sorted(set(train_labels))
    if not distinct:
        return [""] * len(test_texts)
    if len(distinct) == 1:
        return [distinct[0]] * len(test_texts)
    try:
        return tfidf_predict(train_texts, train_labels, test_texts, seed=seed)
    except ValueError:  # no word in the released texts (an empty vocabulary): the
        # released corpus's most frequent label, a function of public data as well
        counts = {label: list(train_labels).count(label) for label in distinct}
        return [max(distinct, key=lambda label: counts[label])] * len(test_texts)
