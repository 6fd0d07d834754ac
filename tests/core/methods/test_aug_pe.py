"""Aug-PE (workers/methods/aug_pe): accounting, the vote-histogram mechanism, checkpoints,
resumption and end-to-end runs against a real OpenAI-compatible server.

The stochastic checks follow tests/core/privacy/test_privacy_noise.py: ``estimate_epsilon_at_delta``
at δ = 1e-2 on 40,000 releases per corpus, projected on the direction the added unit
moves the histogram; a noise scale half as large is run as a control.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from tests.core.methods import news
from tests.fake_llm import FakeLLM, Topical
from tests.privacy_audit import estimate_epsilon_at_delta
from workers.errors import ConfigError, InputDataError, LLMError
from workers.llm.attestation import MemoryPromptLog, recording, verify
from workers.methods.aug_pe import run_aug_pe, runner
from workers.methods.aug_pe.accounting import (
    COUNTS,
    HISTOGRAM,
    histogram_release,
    noise_plan,
    plan_aug_pe,
)
from workers.methods.aug_pe.mechanism import (
    VOTE_SCALE,
    nearest_candidates,
    post_process,
    release_histogram,
    select,
    unit_votes,
    vote_histogram,
)
from workers.methods.aug_pe.params import AugPEParams
from workers.methods.aug_pe.prompts import blank, tokens, variation_messages
from workers.methods.checkpoints import DirectoryCheckpoints, MemoryCheckpoints
from workers.methods.proportions import allocate, split_by_counts
from workers.privacy.accountant import compose
from workers.privacy.units import group_units
from workers.text.embeddings import SentenceEmbedder

RELEASES = 40_000
AUDIT_DELTA = 1e-2


def params(**overrides: object) -> AugPEParams:
    values: dict[str, object] = {"document_type": "news article", "epsilon": 1.0, "delta": 1e-5}
    values.update(overrides)
    return AugPEParams(**values)  # type: ignore[arg-type]


def paper_delta(n: int) -> float:
    return 1.0 / (n * math.log(n))


# ---------------------------------------------------------------- accounting


@pytest.mark.parametrize(
    ("n", "published"),
    [(75_316, 13.26), (8_396, 11.60)],  # PubMed, OpenReview: ε = 1, T = 10 (aug-pe.md §3)
)
def test_sigma_reproduces_the_published_noise_multipliers(n: int, published: float) -> None:
    plan = noise_plan(params(epsilon=1.0, delta=paper_delta(n), iterations=10), ["all"])
    assert plan.count_sigma is None and plan.count_event() is None  # one class: no counts
    assert published - 0.01 < plan.histogram_sigma <= published
    assert math.ceil(plan.histogram_sigma * 100) / 100 == published
    events = list(plan.events)
    assert len(events) == 10
    assert float(compose(events).epsilon(paper_delta(n))) <= 1.0


def test_sigma_meets_the_target_under_the_accountant_and_no_less_noise_would() -> None:
    p = params(epsilon=2.0, delta=1e-6, iterations=4, count_share=0.2)
    labels = ["World", "Sports", "Business"]
    plan = noise_plan(p, labels)
    spent = float(compose(plan.events).epsilon(p.delta))
    assert 0.999 * p.epsilon < spent <= p.epsilon
    # 1 % less noise on every release overshoots the target
    thinner = [
        histogram_release(plan.histogram_sigma * 0.99, e.dimension, 1, e.partition or "")
        if e.mechanism == HISTOGRAM
        else e
        for e in plan.events
    ]
    assert float(compose(thinner).epsilon(p.delta)) > p.epsilon
    # the counts get their share of μ²: σ_c = z/√s, σ = z·√(T/(1 − s))
    assert plan.count_sigma is not None
    ratio = (plan.histogram_sigma / plan.count_sigma) ** 2
    assert ratio == pytest.approx(p.iterations * p.count_share / (1 - p.count_share), rel=1e-6)


def test_plan_lists_counts_then_every_iteration_of_every_class() -> None:
    p = params(iterations=3, population=10, initial_variation_folds=2, variation_folds=3)
    events = plan_aug_pe(p, ["a", "b"])
    counts, histograms = events[0], events[1:]
    assert counts.mechanism == COUNTS and counts.noise == "gaussian"
    assert (
        counts.dimension == 2
        and counts.sensitivity == pytest.approx(1.0, rel=1e-9)
        and counts.partition is None
    )
    assert [(e.name, e.partition, e.dimension) for e in histograms] == [
        ("vote-histogram[t=1]", "a", 30),
        ("vote-histogram[t=1]", "b", 30),
        ("vote-histogram[t=2]", "a", 40),
        ("vote-histogram[t=2]", "b", 40),
        ("vote-histogram[t=3]", "a", 40),
        ("vote-histogram[t=3]", "b", 40),
    ]
    assert all(e.noise == "gaussian" and e.count == 1 for e in histograms)
    assert all(1.0 <= e.sensitivity < 1.0 + 1e-9 for e in histograms)  # OpenDP's lattice
    assert len({e.scale for e in histograms}) == 1


def test_plan_refuses_a_bad_label_set() -> None:
    for bad in ([], ["a", "a"], ["a", ""]):
        with pytest.raises(ConfigError) as caught:
            plan_aug_pe(params(), bad)
        assert caught.value.field == "labels"


# ---------------------------------------------------------------- parameters


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"epsilon": 0.0}, "epsilon"),
        ({"epsilon": 101.0}, "epsilon"),
        ({"epsilon": True}, "epsilon"),
        ({"delta": 0.0}, "delta"),
        ({"delta": 0.01}, "delta"),
        ({"iterations": 0}, "iterations"),
        ({"count_share": 1.0}, "count_share"),
        ({"selection": "best"}, "selection"),
        ({"document_type": "  "}, "document_type"),
        ({"document_type": "two\nlines"}, "document_type"),
        ({"variation_folds": 0, "keep_selected": False}, "keep_selected"),
        ({"num_released": 401}, "num_released"),  # 100 × (3 + 1) candidates
        ({"population": 100_000, "iterations": 100}, "population"),  # too many LLM calls
        ({"sigma": 3.0}, "sigma"),  # never a parameter (caveat A4)
    ],
)
def test_bad_parameters_name_their_field(overrides: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        params(**overrides)
    assert [e["loc"] for e in caught.value.errors()] == [(field,)]


def test_planned_calls_follow_the_design_note_formula() -> None:
    # the library's openreview example without the unused last variations: 2000·4 + 9·3·2000
    p = params(population=2000, num_released=2000)
    assert p.planned_calls() == 2000 * 4 + 9 * 3 * 2000
    looking = params(population=10, num_released=10, iterations=2, lookahead_degree=2)
    assert looking.planned_calls() == 10 * 4 + 2 * (40 + 40) + 1 * 3 * 10


# ---------------------------------------------------------------- votes


def test_a_document_votes_one_over_root_k_for_each_of_its_k_neighbours() -> None:
    neighbours = np.array([[0, 2, 3, 5]])
    _, candidate, votes = unit_votes(neighbours, np.array([0]))
    assert candidate.tolist() == [0, 2, 3, 5]
    assert votes.tolist() == [VOTE_SCALE // 2] * 4
    single = unit_votes(np.array([[7]]), np.array([0]))[2]
    assert single.tolist() == [VOTE_SCALE]  # k = 1: exactly one vote


def test_unit_votes_have_l2_norm_at_most_one_exactly() -> None:
    rng = np.random.default_rng(3)
    for _ in range(200):
        k = int(rng.integers(1, 6))
        docs = int(rng.integers(1, 40))
        neighbours = np.stack([rng.choice(12, size=k, replace=False) for _ in range(docs)])
        units = rng.integers(0, 5, size=docs)
        unit, _, votes = unit_votes(neighbours, units)
        for u in np.unique(unit):
            squared = sum(int(v) ** 2 for v in votes[unit == u])  # exact integers
            assert squared <= VOTE_SCALE**2
            assert squared > (VOTE_SCALE - 2 * k * docs) ** 2  # and nearly 1: no vote lost


def test_units_are_assigned_to_their_most_frequent_class_and_vote_there_only() -> None:
    labels = ["b", "a", "b", "a", "b", "c"]
    units = ["p1", "p1", "p1", "p2", "p2", "p3"]
    unit_of, class_of_unit, votes = group_units(labels, units, ["a", "b", "c"])
    assert unit_of.tolist() == [0, 0, 0, 1, 1, 2]
    assert class_of_unit.tolist() == [1, 0, 2]  # p1 → b (2 of 3), p2 → tie → a (declared first)
    assert votes.tolist() == [True, False, True, True, False, True]
    unit_of, class_of_unit, votes = group_units(labels, None, ["a", "b", "c"])
    assert unit_of.tolist() == list(range(6)) and votes.all()
    assert class_of_unit.tolist() == [1, 0, 1, 0, 1, 2]


def test_nearest_candidates_by_each_distance() -> None:
    candidates = np.array([[1.0, 0.0], [0.0, 1.0], [3.0, 3.0]], dtype=np.float32)
    private = np.array([[0.9, 0.1], [2.0, 2.5]], dtype=np.float32)
    assert nearest_candidates(private, candidates, k=1, distance="l2")[:, 0].tolist() == [0, 2]
    assert nearest_candidates(private, candidates, k=1, distance="inner_product")[
        :, 0
    ].tolist() == [
        2,
        2,
    ]
    cosine = nearest_candidates(private, candidates, k=1, distance="cosine")[:, 0].tolist()
    assert cosine == [0, 2]
    both = nearest_candidates(private, candidates, k=2, distance="l2")
    assert sorted(both[0].tolist()) == [0, 1]
    assert nearest_candidates(private, candidates[:0], k=2).shape == (2, 0)


def _neighbouring_outputs(
    sigma: float, *, unit_level: bool
) -> tuple[np.ndarray, np.ndarray, float]:
    """The released histogram on D and on D plus one unit, projected on the difference."""
    rng = np.random.default_rng(11)
    size, k = 3, 2
    private = rng.normal(size=(30, 4)).astype(np.float32)
    candidates = rng.normal(size=(size, 4)).astype(np.float32)
    added = rng.normal(size=(3 if unit_level else 1, 4)).astype(np.float32)
    units = rng.integers(0, 10, size=30) if unit_level else np.arange(30)
    both = np.concatenate([private, added])
    both_units = np.concatenate([units, np.full(len(added), 99)])
    h = vote_histogram(nearest_candidates(private, candidates, k=k), units, size)
    h2 = vote_histogram(nearest_candidates(both, candidates, k=k), both_units, size)
    shift = (h2 - h).astype(np.float64) / VOTE_SCALE
    norm = float(np.linalg.norm(shift))
    direction = shift / norm
    x = release_histogram(np.tile(h, RELEASES), sigma=sigma).reshape(RELEASES, size) @ direction
    y = release_histogram(np.tile(h2, RELEASES), sigma=sigma).reshape(RELEASES, size) @ direction
    return x, y, norm


@pytest.mark.parametrize("unit_level", [False, True], ids=["document", "unit"])
def test_vote_histogram_on_neighbouring_corpora_within_epsilon_delta(unit_level: bool) -> None:
    p = params(epsilon=2.0, delta=1e-3, iterations=1, population=2, num_released=2)
    plan = noise_plan(p, ["all"])
    event = plan.events[0]
    target = float(compose([event]).epsilon(AUDIT_DELTA))  # what σ gives at the audit's δ
    x, y, shift = _neighbouring_outputs(plan.histogram_sigma, unit_level=unit_level)
    assert 0.99 < shift <= 1.0  # one unit moves the histogram by (almost exactly) 1
    loss = estimate_epsilon_at_delta(x, y, delta=AUDIT_DELTA)
    assert 0.75 * target < loss <= 1.25 * target
    x, y, _ = _neighbouring_outputs(plan.histogram_sigma / 2, unit_level=unit_level)
    assert estimate_epsilon_at_delta(x, y, delta=AUDIT_DELTA) > 1.6 * target


def test_released_histogram_has_noise_of_standard_deviation_sigma() -> None:
    histogram = np.full(20_000, 3 * VOTE_SCALE, dtype=np.int64)
    noisy = release_histogram(histogram, sigma=2.5)
    assert noisy.mean() == pytest.approx(3.0, abs=0.1)
    assert noisy.std() == pytest.approx(2.5, rel=0.03)


# ---------------------------------------------------------------- selection


def test_rank_selection_takes_the_largest_and_sample_selection_is_proportional() -> None:
    rng = np.random.default_rng(0)
    scores = np.array([0.5, 3.0, -1.0, 2.0])
    assert select(scores, 2, mode="rank", rng=rng).tolist() == [1, 3]
    assert select(scores, 9, mode="rank", rng=rng).tolist() == [1, 3, 0, 2]
    drawn = select(scores, 55_000, mode="sample", rng=rng)
    frequencies = np.bincount(drawn, minlength=4) / drawn.size
    assert frequencies == pytest.approx([0.5 / 5.5, 3 / 5.5, 0.0, 2 / 5.5], abs=0.01)
    flat = select(np.array([-1.0, -2.0]), 4000, mode="sample", rng=rng)
    assert np.bincount(flat).tolist() == pytest.approx([2000, 2000], abs=200)
    assert post_process(scores, 1.0).tolist() == [0.0, 2.0, 0.0, 1.0]
    assert post_process(scores, None) is scores


# ---------------------------------------------------------------- prompts


SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>", "</s>", "[INST]", "\x00"]


def test_blanking_accepts_any_text_and_keeps_what_it_does_not_blank() -> None:
    rng = np.random.default_rng(5)
    alphabet = [*SPECIALS, "a", "é", "東", "1", " ", "\n", "_", "'s", "\ud800", "\u0301", "🙂"]
    for _ in range(300):
        text = "".join(rng.choice(alphabet, size=int(rng.integers(0, 40))).tolist())
        assert "".join(tokens(text)) == text
        assert blank(text, 0.0, rng) == text
        out = blank(text, 0.5, rng)
        assert isinstance(out, str)
    assert blank("one two three four", 1.0 - 1e-12, rng) == "____"


def test_variation_prompts_carry_the_sample_label_and_length() -> None:
    rng = np.random.default_rng(1)
    fill = variation_messages(
        "The team won the match",
        document_type="news article",
        label="Sports",
        variation="fill_in_blanks",
        blank_probability=0.5,
        words=40,
        rng=rng,
    )
    user = fill[1]["content"]
    assert '"Sports"' in user and "news article" in user and "exactly 40 words" in user
    assert "_" in user
    para = variation_messages(
        "The team won the match",
        document_type="news article",
        label="Sports",
        variation="paraphrase",
        blank_probability=0.5,
        words=None,
        rng=rng,
    )
    assert "The team won the match" in para[1]["content"]
    assert "exactly" not in para[1]["content"]


# ---------------------------------------------------------------- checkpoints


def test_checkpoints_round_trip_and_refuse_keys_that_are_paths(tmp_path: Path) -> None:
    for store in (MemoryCheckpoints(), DirectoryCheckpoints(tmp_path / "ck")):
        assert store.load("counts") is None
        store.save("counts", b"one")
        store.save("counts", b"two")
        assert store.load("counts") == b"two"
        for bad in ("../escape", "a/b", ".hidden", "", "x" * 200):
            with pytest.raises(ConfigError):
                store.save(bad, b"")
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["counts"]  # no temporaries


# ---------------------------------------------------------------- runs


CANARY = "canary-7f3a"
DOCUMENTS, LABELS = news.corpus(CANARY, sports=5, business=4)
LABEL_SET = news.LABEL_SET
TINY = {
    "document_type": "news article",
    "epsilon": 4.0,
    "delta": 1e-5,
    "iterations": 3,
    "population": 4,
    "num_released": 4,
    "initial_variation_folds": 1,
    "variation_folds": 1,
    "concurrency": 4,
}


run = news.NewsRun(run_aug_pe, params, TINY, DOCUMENTS, LABELS)


def test_end_to_end_releases_planned_events_and_keeps_private_text_out_of_prompts(
    llm: FakeLLM, embedder: SentenceEmbedder
) -> None:
    stages: list[tuple[str, float]] = []
    result = run(llm, embedder, MemoryCheckpoints(), progress=lambda s, f: stages.append((s, f)))
    p = params(**TINY)
    assert len(result.records) == p.num_released
    assert {label for label, _ in result.records} <= set(LABEL_SET)
    assert all(text.startswith(("The team", "Shares")) for _, text in result.records)
    assert result.events == plan_aug_pe(p, LABEL_SET)
    assert result.llm_costs.calls == p.planned_calls() == len(llm.chat_requests)
    assert result.llm_costs.prompt_tokens > 0 and result.llm_costs.completion_tokens > 0
    for request in llm.chat_requests:
        assert CANARY not in request.prompt_text
        assert not any(doc in request.prompt_text for doc in DOCUMENTS)
    random_prompts = {r.user_text for r in llm.chat_requests if "Write one" in r.user_text}
    # only public words: the document type and a declared label (how many initial texts
    # a class gets follows the noisy class counts, so a class may get none)
    assert random_prompts and random_prompts <= {
        'Write one news article of the category "Sports".',
        'Write one news article of the category "Business".',
    }
    manifest = result.manifest
    text = json.dumps(manifest)
    assert CANARY not in text and not any(doc in text for doc in DOCUMENTS)
    assert manifest["method"] == "aug-pe" and manifest["released"] == p.num_released
    assert float(manifest["privacy"]["epsilon"]) <= p.epsilon
    assert manifest["llm_costs"]["calls"] == manifest["llm_costs"]["planned_calls"]
    assert manifest["models"]["embedding"] == embedder.name
    assert stages == [  # each stage's start, then its iterations or its end
        ("class_counts", 0.0),
        ("class_counts", 1.0),
        ("initial_population", 0.0),
        ("initial_population", 1.0),
        ("iteration", 0.0),
        ("iteration", 1 / 3),
        ("iteration", 2 / 3),
        ("iteration", 1.0),
        ("release", 0.0),
        ("release", 1.0),
    ]


def test_checkpoints_hold_only_the_allow_list_and_no_clean_histogram(
    llm: FakeLLM, embedder: SentenceEmbedder
) -> None:
    store = MemoryCheckpoints()
    run(llm, embedder, store)
    assert all(CANARY not in raw.decode() for raw in store.items.values())
    assert not any(doc in raw.decode() for raw in store.items.values() for doc in DOCUMENTS)
    fields = {
        "aug-pe-run": {"method", "fingerprint"},
        "aug-pe-counts": {"noisy", "event"},
        "aug-pe-llm-costs": {
            "calls",
            "prompt_tokens",
            "completion_tokens",
            "wall_seconds",
            "failed_requests",
        },
    }
    for key, raw in store.items.items():
        data = json.loads(raw)
        if key.startswith("aug-pe-histogram-"):
            assert set(data) == {"iteration", "noisy", "scores", "selected", "events"}
        elif key.startswith("aug-pe-population-"):
            assert set(data) == {"texts", "labels", "parents"}
        else:
            assert set(data) == fields[key]
    # The clean vote histogram of iteration 1, recomputed here, is stored nowhere.
    population = json.loads(store.items["aug-pe-population-0"])
    candidates = embedder.encode(population["texts"])
    noisy = json.loads(store.items["aug-pe-histogram-1"])["noisy"]
    for label in LABEL_SET:
        own = np.array(
            [i for i, x in enumerate(population["labels"]) if x == label], dtype=np.int64
        )
        if own.size == 0:  # the noisy counts gave this class no candidate
            continue
        rows = [d for d, x in zip(DOCUMENTS, LABELS, strict=True) if x == label]
        neighbours = nearest_candidates(embedder.encode(rows), candidates[own], k=1)
        units = np.arange(len(rows))
        clean = vote_histogram(neighbours, units, len(candidates), candidate_index=own)
        clean = clean / VOTE_SCALE
        assert clean.sum() == len(rows)
        assert np.all(np.asarray(noisy[label]) != clean)
        assert json.dumps(clean.tolist()) not in b"".join(store.items.values()).decode()


class Killed(Exception):
    """Stands for the worker dying between two iterations."""


def test_a_killed_run_resumes_without_drawing_noise_again(
    llm: FakeLLM,
    embedder: SentenceEmbedder,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    draws: list[str] = []

    def counted(name: str, draw: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
        def spy(*args: object, **kwargs: object) -> np.ndarray:
            draws.append(name)
            return draw(*args, **kwargs)

        return spy

    monkeypatch.setattr(runner, "release_histogram", counted("histogram", release_histogram))
    monkeypatch.setattr(runner, "gaussian_noise", counted("counts", runner.gaussian_noise))

    def die_after_first_iteration(stage: str, fraction: float) -> None:
        if stage == "iteration" and fraction > 0:  # not its start: its first iteration's end
            raise Killed

    store = DirectoryCheckpoints(tmp_path / "checkpoints")
    log = MemoryPromptLog()  # the job's prompt log, over both runs
    with recording(log), pytest.raises(Killed):
        run(llm, embedder, store, progress=die_after_first_iteration)
    assert draws == ["counts", "histogram", "histogram"]  # counts, then iteration 1's classes
    assert store.load("aug-pe-histogram-2") is None
    saved = {p.name: p.read_bytes() for p in store.root.iterdir()}
    calls_before = len(llm.chat_requests)

    with recording(log):
        result = run(llm, embedder, store)
    p = params(**TINY)
    # every prompt of both runs is recorded once, in one chain; the random ones render again
    verdict = verify(log.lines)
    assert verdict.ok, verdict.problems
    assert len(log.lines) == len(llm.chat_requests)
    recorded = sorted(json.dumps(line["content"]["messages"], sort_keys=True) for line in log.lines)
    assert recorded == sorted(json.dumps(r.messages, sort_keys=True) for r in llm.chat_requests)
    assert verdict.rederived == verdict.by_kind["random_document"] > 0
    assert set(verdict.by_kind) == {"random_document", "aug_pe.variation"}
    # iterations 2 and 3 only: no new class counts, no new noise for iteration 1
    assert draws[3:] == ["histogram"] * 4
    for key in (
        "aug-pe-counts",
        "aug-pe-histogram-1",
        "aug-pe-population-0",
        "aug-pe-population-1",
    ):
        assert store.load(key) == saved[key]
    assert result.events == plan_aug_pe(p, LABEL_SET)  # every release charged once
    # only population 2 was left to generate: N·f variations
    assert len(llm.chat_requests) - calls_before == p.population * p.variation_folds
    assert result.llm_costs.calls == p.planned_calls()  # costs add up across the two runs
    iteration_1 = json.loads(saved["aug-pe-histogram-1"])
    assert (
        json.loads(store.load("aug-pe-histogram-1") or b"")["selected"] == iteration_1["selected"]
    )


def test_checkpoints_of_another_run_and_bad_input_are_refused_before_any_read(
    llm: FakeLLM, embedder: SentenceEmbedder
) -> None:
    store = MemoryCheckpoints()
    run(llm, embedder, store, iterations=1, num_released=4)
    calls = len(llm.chat_requests)
    with pytest.raises(ConfigError) as caught:
        run(llm, embedder, store, iterations=2)
    assert caught.value.field == "checkpoints"
    with pytest.raises(InputDataError) as bad_units:
        run(llm, embedder, MemoryCheckpoints(), units=["p1"] * 3)
    assert bad_units.value.field == "units"
    with pytest.raises(InputDataError) as bad_label:
        run_aug_pe(
            DOCUMENTS,
            ["Sports"] * (len(DOCUMENTS) - 1) + ["Weather"],
            label_set=LABEL_SET,
            units=None,
            params=params(**TINY),
            llm=llm.endpoint(),
            embedder=embedder,
            checkpoints=MemoryCheckpoints(),
        )
    assert bad_label.value.field == "labels"
    assert CANARY not in str(bad_label.value)
    assert len(llm.chat_requests) == calls


def test_unit_level_run_states_its_adjacency(llm: FakeLLM, embedder: SentenceEmbedder) -> None:
    # patient p1 has notes in both classes: it votes in Sports only (3 of its 4 notes)
    units = ["p1", "p1", "p1", "p2", "p3", "p1", "p4", "p5", "p5"]
    result = run(llm, embedder, MemoryCheckpoints(), units=units)
    assert result.events == plan_aug_pe(params(**TINY), LABEL_SET)
    assert result.manifest["adjacency"].startswith("add/remove one unit")
    assert len(result.records) == TINY["num_released"]


def test_every_option_runs_as_planned_and_one_class_needs_no_counts(
    llm: FakeLLM, embedder: SentenceEmbedder
) -> None:
    options = {
        **TINY,
        "iterations": 2,
        "lookahead_degree": 1,
        "selection": "sample",
        "histogram_threshold": 0.5,
        "variation": "paraphrase",
        "word_count_std": None,
        "keep_selected": False,
        "nearest_neighbors": 2,
        "distance": "cosine",
    }
    p = params(**options)
    result = run_aug_pe(
        DOCUMENTS,
        ["news"] * len(DOCUMENTS),
        label_set=["news"],
        units=None,
        params=p,
        llm=llm.endpoint(),
        embedder=embedder,
        checkpoints=MemoryCheckpoints(),
    )
    assert result.events == plan_aug_pe(p, ["news"])
    assert all(e.mechanism == HISTOGRAM for e in result.events)  # one class: nothing to count
    assert result.llm_costs.calls == p.planned_calls() == len(llm.chat_requests)
    assert len(result.records) == p.num_released
    assert sum("Rephrase" in r.user_text for r in llm.chat_requests) == (
        p.population * p.initial_variation_folds
        + p.lookahead_degree * (p.candidates(1) + p.candidates(2))
        + p.population * p.variation_folds
    )


def test_seeds_and_releases_are_split_by_the_noisy_counts_shrunk_at_their_sigma(
    llm: FakeLLM, embedder: SentenceEmbedder
) -> None:
    """Five declared labels whose released counts spread no more than their noise (σ = 3.4
    here): the seeds and the released texts are split evenly, as DP-KPS splits a total
    (workers.methods.proportions), where the counts as released would give 4, 6, 2, 5, 3."""
    label_set = ["Sports", "Business", "Science", "Health", "Arts"]
    p = params(**{**TINY, "population": 20, "num_released": 10})
    plan = noise_plan(p, label_set)
    assert plan.count_sigma is not None and plan.count_event() is not None
    noisy = {"Sports": 5, "Business": 7, "Science": 2, "Health": 6, "Arts": 4}
    store = MemoryCheckpoints()  # the counts as a first run saved them: no noise drawn here
    store.save(
        runner.COUNTS_KEY,
        json.dumps({"noisy": noisy, "event": plan.count_event().to_dict()}).encode(),
    )
    result = run_aug_pe(
        DOCUMENTS, LABELS, label_set=label_set, units=None, params=p, llm=llm.endpoint(),
        embedder=embedder, checkpoints=store,
    )  # fmt: skip
    assert result.events == plan_aug_pe(p, label_set)
    seeds = {label: 0 for label in label_set}
    for request in llm.chat_requests:
        if request.user_text.startswith("Write one"):
            seeds[request.user_text.split('"')[1]] += 1
    assert seeds == split_by_counts(20, noisy, plan.count_sigma) == dict.fromkeys(label_set, 4)
    assert seeds != allocate(20, noisy)  # {4, 6, 2, 5, 3}: the counts as released
    released = {label: 0 for label in label_set}
    for label, _ in result.records:
        released[label] += 1
    assert released == dict.fromkeys(label_set, 2)


def test_failed_variations_keep_their_parent_and_failed_seeds_stop_the_run_resumably(
    llm: FakeLLM, embedder: SentenceEmbedder
) -> None:
    llm.script_for("Fill in the blanks", "400")  # a client error: not retried
    result = run(llm, embedder, MemoryCheckpoints())
    assert result.manifest["llm_costs"]["failed_requests"] == 1
    assert len(result.records) == TINY["num_released"]

    store = MemoryCheckpoints()
    with FakeLLM(default="400") as broken:
        with pytest.raises(LLMError) as caught:
            run_aug_pe(
                DOCUMENTS,
                LABELS,
                label_set=LABEL_SET,
                units=None,
                params=params(**TINY),
                llm=broken.endpoint(),
                embedder=embedder,
                checkpoints=store,
            )
        assert caught.value.field == "llm"
        assert len(broken.chat_requests) == 3 * TINY["population"]  # three rounds of seeds
    counts = store.load("aug-pe-counts")
    assert counts is not None  # the counts were released before the LLM failed
    result = run(llm, embedder, store)  # same checkpoints, a working endpoint: resumes
    assert store.load("aug-pe-counts") == counts
    assert result.events == plan_aug_pe(params(**TINY), LABEL_SET)


@pytest.mark.llm
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_aug_pe_with_the_packaged_local_llm(embedder: SentenceEmbedder) -> None:
    from workers.llm.local import LocalLLMServer

    p = params(**{**TINY, "iterations": 2, "population": 2, "num_released": 2, "max_tokens": 48})
    with LocalLLMServer(startup_timeout=180) as server:
        model = server.endpoint.model
        result = run_aug_pe(
            DOCUMENTS,
            LABELS,
            label_set=LABEL_SET,
            units=None,
            params=p,
            llm=server.endpoint,
            embedder=embedder,
            checkpoints=MemoryCheckpoints(),
        )
    assert len(result.records) == 2
    assert all(text.strip() for _, text in result.records)
    assert result.events == plan_aug_pe(p, LABEL_SET)
    assert result.llm_costs.calls >= p.planned_calls()
    assert result.manifest["models"]["llm"] == model


CHILD = """
import json, sys
from workers.text.embeddings import SentenceEmbedder
from workers.llm.client import LLMEndpoint
from workers.methods.aug_pe import AugPEParams, run_aug_pe
from workers.methods.checkpoints import DirectoryCheckpoints
base_url, model, folder, spec = sys.argv[1:5]
corpus = json.loads(spec)
run_aug_pe(
    corpus["documents"], corpus["labels"], label_set=corpus["label_set"], units=None,
    params=AugPEParams(**corpus["params"]), llm=LLMEndpoint(base_url=base_url, model=model),
    embedder=SentenceEmbedder(), checkpoints=DirectoryCheckpoints(folder),
)
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigkill_mid_iteration_resumes_with_each_release_drawn_once(
    embedder: SentenceEmbedder, topical: Topical, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    folder = tmp_path / "checkpoints"
    spec = {
        "documents": DOCUMENTS,
        "labels": LABELS,
        "label_set": LABEL_SET,
        "params": {**TINY, "concurrency": 1},
    }
    # Slow answers keep the child inside iteration 2's variations when it is killed.
    with FakeLLM(content_fn=topical, latency=0.4) as llm:
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, llm.base_url, llm.model, str(folder), json.dumps(spec)],
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            deadline = time.monotonic() + 240
            while not (folder / "aug-pe-histogram-2").exists():
                assert child.poll() is None, (
                    child.stderr.read().decode()[-2000:] if child.stderr else ""
                )
                assert time.monotonic() < deadline
                time.sleep(0.05)
            child.send_signal(signal.SIGKILL)
        finally:
            child.kill()
            child.wait()
            if child.stderr:
                child.stderr.close()
        assert child.returncode == -signal.SIGKILL
        assert not (folder / "aug-pe-population-2").exists()  # killed mid-iteration 2
        saved = {p.name: p.read_bytes() for p in folder.iterdir() if not p.name.startswith(".")}

        draws: list[int] = []

        def spy(histogram: np.ndarray, *, sigma: float) -> np.ndarray:
            draws.append(1)
            return release_histogram(histogram, sigma=sigma)

        monkeypatch.setattr(runner, "release_histogram", spy)
        result = run(llm, embedder, DirectoryCheckpoints(folder), concurrency=1)
    assert len(draws) == len(LABEL_SET)  # iteration 3 only
    for key in ("aug-pe-counts", "aug-pe-histogram-1", "aug-pe-histogram-2"):
        assert (folder / key).read_bytes() == saved[key]
    assert result.events == plan_aug_pe(params(**TINY), LABEL_SET)
    assert len(result.records) == TINY["num_released"]
