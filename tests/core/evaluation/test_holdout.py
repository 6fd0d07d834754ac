"""The held-out slice and its DP accuracy figure (issue 66, item 2; docs/utility.md):
the keyed selection, the release's privacy on neighbouring corpora (a unit moved in and
out of the slice), its interval, and the accountant's parallel composition of the slice
with the generation."""

from __future__ import annotations

from decimal import Decimal

import numpy as np
import pytest

from tests.privacy_audit import estimate_privacy_loss
from workers.errors import ConfigError
from workers.evaluation import holdout
from workers.methods.dpkps.config import GenerationConfig
from workers.methods.dpkps.plan import plan
from workers.privacy.accountant import MAX_SPLIT_CHOICES, compose, compose_jobs
from workers.privacy.events import PrivacyEvent
from workers.privacy.units import pool

LABELS = ("cardio", "ortho")
KEY = "test-key-0001"


def _corpus(n: int) -> tuple[list[str], list[str]]:
    texts = [f"note {i} about {'heart failure' if i % 2 else 'a fracture'}" for i in range(n)]
    labels = ["cardio" if i % 2 else "ortho" for i in range(n)]
    return texts, labels


# ------------------------------------------------------------------ the selection


def test_the_slice_is_a_keyed_public_choice_of_about_the_fraction() -> None:
    texts, labels = _corpus(4000)
    one = holdout.select(texts, labels, None, key=KEY, fraction=0.1, label_set=LABELS)
    again = holdout.select(texts, labels, None, key=KEY, fraction=0.1, label_set=LABELS)
    other = holdout.select(texts, labels, None, key="another-key", fraction=0.1, label_set=LABELS)
    assert one == again  # deterministic: anyone with the key finds the same slice
    assert one.evaluated != other.evaluated  # the key decides it
    assert 0.08 < len(one.evaluated) / len(texts) < 0.12
    assert set(one.rest).isdisjoint(one.evaluated)
    assert sorted((*one.rest, *one.evaluated)) == list(range(len(texts)))  # one doc per unit
    # each side is what in_slice says of each unit, and nothing else decides it
    assert all(holdout.in_slice(KEY, texts[i], 0.1) for i in one.evaluated)
    assert not any(holdout.in_slice(KEY, texts[i], 0.1) for i in one.rest)
    # a larger fraction holds out a superset (the same scores, a higher threshold)
    wider = holdout.select(texts, labels, None, key=KEY, fraction=0.3, label_set=LABELS)
    assert set(one.evaluated) <= set(wider.evaluated)


def test_a_unit_lies_wholly_on_one_side_and_gives_the_evaluation_one_document() -> None:
    # 300 patients of 1 to 4 notes each, notes interleaved in the upload
    rng = np.random.default_rng(0)
    units = [f"patient-{p}" for p in range(300) for _ in range(1 + p % 4)]
    order = rng.permutation(len(units))
    units = [units[i] for i in order]
    texts = [f"note {i} of {u}" for i, u in enumerate(units)]
    labels = [LABELS[int(i) % 2] for i in range(len(units))]
    found = holdout.select(texts, labels, units, key=KEY, fraction=0.25, label_set=LABELS)
    rest_units = {units[i] for i in found.rest}
    slice_units = [units[i] for i in found.evaluated]
    assert rest_units.isdisjoint(slice_units)  # no patient on both sides
    assert len(slice_units) == len(set(slice_units))  # one document per patient
    assert rest_units | set(slice_units) == set(units)
    assert {u for u in units if holdout.in_slice(KEY, u, 0.25)} == set(slice_units)
    # the evaluated document is of the class the patient is pooled into
    pooled = {u.documents: u.label for u in pool(labels, units, label_set=LABELS)}
    of_document = {d: label for docs, label in pooled.items() for d in docs}
    assert all(labels[i] == of_document[i] for i in found.evaluated)


def test_adding_a_unit_moves_no_other_unit_across() -> None:
    texts, labels = _corpus(500)
    base = holdout.select(texts, labels, None, key=KEY, fraction=0.2, label_set=LABELS)
    for added in ("a new note on knee arthritis", "another new note on chest pain"):
        grown = holdout.select(
            [added, *texts], ["ortho", *labels], None, key=KEY, fraction=0.2, label_set=LABELS
        )
        shift = {i + 1 for i in base.evaluated}
        assert set(grown.evaluated) - {0} == shift
        assert set(grown.rest) - {0} == {i + 1 for i in base.rest}


def test_bad_holdout_options_name_their_field() -> None:
    texts, labels = _corpus(4)
    with pytest.raises(ConfigError, match="fraction"):
        holdout.select(texts, labels, None, key=KEY, fraction=0.9, label_set=LABELS)
    with pytest.raises(ConfigError) as found:
        holdout.select(texts, labels, None, key="", fraction=0.1, label_set=LABELS)
    assert found.value.field == "holdout.key"


# ------------------------------------------------------------------ the release


def test_the_cells_put_each_unit_in_exactly_one_place() -> None:
    cells = holdout.cell_counts(
        ["cardio", "cardio", "ortho", "ortho", "ortho"],
        ["cardio", "ortho", "ortho", "cardio", ""],
        LABELS,
    )
    assert cells.tolist() == [1, 1, 1, 2]  # correct cardio, ortho; wrong cardio, ortho
    assert int(cells.sum()) == 5


RUNS = 6000


@pytest.mark.slow
def test_the_release_stays_within_epsilon_when_a_unit_moves_into_the_slice() -> None:
    """Neighbouring corpora: D, and D with one unit more that the key puts in the slice
    (the worst case for the evaluation: its whole contribution lands in one cell). The
    generation's side is the same on both; the release differs in one cell by one. The
    estimated privacy loss is about ε, and about 2ε at half the noise scale (control)."""
    epsilon = 1.0
    texts, labels = _corpus(60)
    synthetic = [("cardio", "heart failure"), ("ortho", "a fracture")] * 5
    added = next(
        t for t in (f"heart failure case {i}" for i in range(1000)) if holdout.in_slice(KEY, t, 0.3)
    )
    neighbour_texts, neighbour_labels = [*texts, added], [*labels, "cardio"]

    def cells(xs: list[str], ys: list[str]) -> np.ndarray:
        chosen = holdout.select(xs, ys, None, key=KEY, fraction=0.3, label_set=LABELS)
        predicted = holdout.predict(
            [t for _, t in synthetic],
            [label for label, _ in synthetic],
            [xs[i] for i in chosen.evaluated],
        )
        return holdout.cell_counts([ys[i] for i in chosen.evaluated], predicted, LABELS)

    one, other = cells(texts, labels), cells(neighbour_texts, neighbour_labels)
    moved = np.flatnonzero(one != other)
    assert moved.size == 1 and int(np.abs(one - other).sum()) == 1
    # the generation reads the same documents from both corpora
    rest = holdout.select(texts, labels, None, key=KEY, fraction=0.3, label_set=LABELS).rest
    rest2 = holdout.select(
        neighbour_texts, neighbour_labels, None, key=KEY, fraction=0.3, label_set=LABELS
    ).rest
    assert [texts[i] for i in rest] == [neighbour_texts[i] for i in rest2]

    cell = int(moved[0])
    split = holdout.split_name(KEY, 0.3)

    def sample(counts: np.ndarray, eps: float) -> np.ndarray:
        return np.array(
            [holdout.release(counts, epsilon=eps, split=split)[0][cell] for _ in range(RUNS)],
            dtype=float,
        )

    loss = estimate_privacy_loss(sample(one, epsilon), sample(other, epsilon))
    assert 0.75 * epsilon < loss <= 1.3 * epsilon
    # the control: a noise scale 2x too small (ε doubled) is caught
    broken = estimate_privacy_loss(sample(one, 2 * epsilon), sample(other, 2 * epsilon))
    assert broken > 1.6 * epsilon


def test_the_event_is_the_planned_one_on_the_slice_side() -> None:
    split = holdout.split_name(KEY, 0.1)
    noisy, event = holdout.release(np.array([3, 4, 1, 0]), epsilon=0.5, split=split)
    planned = holdout.planned_event(epsilon=0.5, classes=2, split=split)
    assert noisy.shape == (4,) and noisy.dtype == np.int64
    assert (event.split, event.side, event.dimension) == (split, "slice", 4)
    assert (planned.split, planned.side, planned.epsilon) == (split, "slice", Decimal("0.5"))
    assert float(event.epsilon) == pytest.approx(0.5, rel=1e-9)
    assert PrivacyEvent.from_dict(planned.to_dict()) == planned
    assert (
        "split"
        not in PrivacyEvent.from_dict(
            {k: v for k, v in planned.to_dict().items() if k not in ("split", "side")}
        ).to_dict()
    )


# ------------------------------------------------------------------ the interval


def test_the_noise_bound_is_the_exact_quantile_of_the_sum() -> None:
    rng = np.random.default_rng(1)
    scale = 2.0
    p = np.exp(-1 / scale)
    for terms in (1, 4):
        q = holdout.noise_quantile(scale=scale, terms=terms, alpha=0.05)
        # discrete Laplace = difference of two geometric variables
        draws = rng.geometric(1 - p, (200_000, terms)) - rng.geometric(1 - p, (200_000, terms))
        tail = np.abs(draws.sum(axis=1))
        assert np.mean(tail > q) <= 0.05 + 0.003
        assert np.mean(tail > q - 1) > 0.05 - 0.003  # the smallest such q


def test_the_interval_covers_the_exact_accuracy_at_its_confidence() -> None:
    """The figure's interval, over the noise, holds the slice's exact accuracy at least
    95 % of the time (it is conservative: it holds more often)."""
    truth = np.array([40, 25, 10, 25])  # 65 correct of 100
    exact = 65 / 100
    split = holdout.split_name(KEY, 0.1)
    held = 0
    runs = 400
    for _ in range(runs):
        noisy, _ = holdout.release(truth, epsilon=0.5, split=split)
        found = holdout.figure(noisy, epsilon=0.5, label_set=LABELS)
        held += found.low <= exact <= found.high
    assert held / runs >= 0.95


def test_per_class_accuracy_is_shown_only_where_the_noise_allows() -> None:
    noisy = np.array([900, 3, 100, 2])  # cardio 1000 units; ortho 5
    found = holdout.figure(noisy, epsilon=1.0, label_set=LABELS)
    assert found.per_class["cardio"]["shown"] and found.per_class["cardio"]["accuracy"] == 0.9
    assert not found.per_class["ortho"]["shown"]
    assert found.per_class["ortho"]["accuracy"] is None
    assert "too few" in found.per_class["ortho"]["why_not"]
    assert found.accuracy == pytest.approx(903 / 1005)
    assert found.low < found.accuracy < found.high


def test_the_expected_width_says_when_a_corpus_is_too_small() -> None:
    small = holdout.expected_half_width(slice_units=20, epsilon=1.0, classes=4)
    large = holdout.expected_half_width(slice_units=2000, epsilon=1.0, classes=4)
    assert small > holdout.USEFUL_HALF_WIDTH > large
    assert holdout.expected_half_width(slice_units=2000, epsilon=0.1, classes=4) > large


# ------------------------------------------------------------------ the accountant


def _generation(**config: object) -> tuple[tuple[PrivacyEvent, ...], Decimal, float]:
    found = plan(GenerationConfig(**config).validate(), list(LABELS), 50)  # type: ignore[arg-type]
    return found.events, found.epsilon, found.delta


@pytest.mark.parametrize(
    "config",
    [
        {"epsilon": 1.0, "vocabulary_size": 20},  # Laplace: exact sum
        {"epsilon": 2.0, "delta": 1e-6, "noise": "gaussian", "vocabulary_size": 20},  # PLD
    ],
)
def test_the_slice_and_the_generation_compose_in_parallel(config: dict[str, object]) -> None:
    events, generation, delta = _generation(**config)
    split = holdout.split_name(KEY, 0.1)
    rest = holdout.on_rest(events, split)
    for eps in (float(generation) / 2, float(generation)):
        job = compose([*rest, holdout.planned_event(epsilon=eps, classes=2, split=split)])
        assert job.epsilon(delta) == generation  # exactly what the generation alone costs
    # a costlier evaluation is what the job costs (the worse side), never the sum
    dearer = compose([*rest, holdout.planned_event(epsilon=5.0, classes=2, split=split)])
    assert dearer.epsilon(delta) == Decimal(5)
    # a generation not marked as reading the rest side reads the slice too: the sum
    untagged = compose([*events, holdout.planned_event(epsilon=1.0, classes=2, split=split)])
    assert untagged.epsilon(delta) > generation


def _llm_method_plan(method: str, **params: object) -> tuple[list[PrivacyEvent], Decimal, float]:
    """The planned events of an LLM method's run (its registry entry) on LABELS."""
    from workers.methods.registry import METHODS

    entry = METHODS[method]
    found = entry.params.model_validate({"document_type": "news article", "delta": 1e-5, **params})
    events = entry.plan(found, list(LABELS))
    return events, compose(events).epsilon(found.delta), found.delta  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("aug-pe", {"epsilon": 1.0, "iterations": 3}),  # Gaussian counts and histograms
        ("pate-tutor", {"epsilon": 2.0}),  # Gaussian votes and tutor counts
        ("dp-eda", {"epsilon": 1.0, "iterations": 3}),  # LimitedDomain selections
    ],
)
def test_an_llm_method_s_generation_and_the_slice_compose_in_parallel(
    method: str, params: dict[str, object]
) -> None:
    """The same accounting for the LLM methods (their registry entries take a holdout):
    their generation reads the rest side, the evaluation the slice, the job costs the
    worse side."""
    events, generation, delta = _llm_method_plan(method, **params)
    split = holdout.split_name(KEY, 0.2)
    rest = holdout.on_rest(events, split)
    assert all(e.split == split and e.side == "rest" for e in rest)
    for eps in (float(generation) / 2, float(generation)):
        job = compose([*rest, holdout.planned_event(epsilon=eps, classes=2, split=split)])
        assert float(job.epsilon(delta)) == pytest.approx(float(generation), rel=1e-12)
    dearer = compose([*rest, holdout.planned_event(epsilon=5.0, classes=2, split=split)])
    assert float(dearer.epsilon(delta)) == pytest.approx(5.0, rel=1e-12)
    untagged = compose([*events, holdout.planned_event(epsilon=1.0, classes=2, split=split)])
    assert untagged.epsilon(delta) > generation


def test_two_jobs_compose_by_their_splits() -> None:
    events, generation, _ = _generation(epsilon=1.0, vocabulary_size=20)
    a, b = holdout.split_name(KEY, 0.1), holdout.split_name("other-key-01", 0.1)
    job_a = [*holdout.on_rest(events, a), holdout.planned_event(epsilon=1.0, classes=2, split=a)]
    job_b = [*holdout.on_rest(events, b), holdout.planned_event(epsilon=1.0, classes=2, split=b)]
    # a unit may be in a's slice and b's rest: every pair of sides costs 2 here
    assert compose_jobs([job_a, job_b]).epsilon(0) == 2 * generation
    # with the same key and fraction the slices coincide: the evaluations meet the same
    # units, and so do the generations
    job_a2 = [*holdout.on_rest(events, a), holdout.planned_event(epsilon=3.0, classes=2, split=a)]
    assert compose_jobs([job_a, job_a2]).epsilon(0) == Decimal(4)  # slice: 1 + 3
    assert compose_jobs([job_a, job_a]).epsilon(0) == 2 * generation


def test_beyond_the_choice_limit_splits_compose_sequentially() -> None:
    jobs = []
    for i in range(7):  # 2^7 choices > MAX_SPLIT_CHOICES
        split = holdout.split_name(f"key-number-{i}", 0.1)
        jobs.append([holdout.planned_event(epsilon=1.0, classes=2, split=split)])
    assert MAX_SPLIT_CHOICES < 2**7
    assert compose_jobs(jobs).epsilon(0) == Decimal(7)  # an upper bound: the sum
    assert compose_jobs(jobs[:3]).epsilon(0) == Decimal(3)  # each unit can be in all slices


def test_the_classifier_copes_with_degenerate_released_corpora() -> None:
    tests = ["heart failure again", "a fracture"]
    assert holdout.predict([], [], tests) == ["", ""]  # nothing released: nothing right
    assert holdout.predict(["x", "y"], ["ortho", "ortho"], tests) == ["ortho", "ortho"]
    # no word the vectoriser keeps: the released corpus's most frequent label
    assert holdout.predict(["", " ", ""], ["ortho", "cardio", "cardio"], tests) == ["cardio"] * 2
    trained = holdout.predict(
        ["heart failure", "chest pain heart", "fracture femur", "knee fracture"],
        ["cardio", "cardio", "ortho", "ortho"],
        tests,
    )
    assert trained == ["cardio", "ortho"]
