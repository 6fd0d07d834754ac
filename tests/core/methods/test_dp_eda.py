"""DP-EDA (workers/methods/dp_eda): LimitedDomain's calibration against Durfee & Rogers,
a stochastic check on neighbouring corpora, the composed (ε, δ), the EDA, resumption
from checkpoints and a tiny end-to-end run against the fake OpenAI-compatible server.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from decimal import Decimal
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from tests.core.methods import news
from tests.fake_llm import FakeLLM, Topical
from workers.errors import ConfigError
from workers.methods.checkpoints import MemoryCheckpoints
from workers.methods.dp_eda import DPEDAParams, plan_dp_eda, run_dp_eda
from workers.methods.dp_eda import limited_domain as ld
from workers.methods.dp_eda.accounting import noise_plan, selection_event
from workers.methods.dp_eda.decoding import CharBigramPerplexity
from workers.methods.dp_eda.evolution import eda_gaussian, offspring
from workers.methods.dp_eda.limited_domain import Calibration, limited_domain, unit_means
from workers.privacy.accountant import compose
from workers.text.embeddings import SentenceEmbedder
from workers.text.vocabulary import Vocabulary


def params(**overrides: Any) -> DPEDAParams:
    values: dict[str, Any] = {"document_type": "news article", "epsilon": 2.0, "delta": 1e-6}
    values.update(overrides)
    return DPEDAParams(**values)


# ---------------------------------------------------------------- LimitedDomain


def test_threshold_and_scale_follow_durfee_rogers_and_the_printed_factor_two() -> None:
    eps, delta = 0.5, 1e-6
    add = Calibration(epsilon=eps, delta=delta, adjacency="add_remove", domain=300, parents=30)
    # add/remove: h⊥ − h(K+1) = 1 + ln(min{1, K, d − K}/δ)/ε, Gumbel(Δ∞/ε)
    assert add.gap(3000) == pytest.approx(1 + math.log(1 / delta) / eps, rel=1e-12)
    assert add.scale == pytest.approx(1 / eps) and add.monotonic
    rep = Calibration(epsilon=eps, delta=delta, adjacency="replace_one", domain=300, parents=30)
    # replace-one (printed): 1 + 2·ln(min{2, K, d − K}/δ)/ε, Gumbel(2Δ∞/ε)
    assert rep.gap(3000) == pytest.approx(1 + 2 * math.log(2 / delta) / eps, rel=1e-12)
    assert rep.scale == pytest.approx(2 / eps) and not rep.monotonic
    # d − K = 1 is the smallest term of the min
    tight = Calibration(epsilon=eps, delta=delta, adjacency="replace_one", domain=4, parents=2)
    assert tight.gap(5) == pytest.approx(1 + 2 * math.log(1 / delta) / eps, rel=1e-12)
    with pytest.raises(Exception, match="must exceed"):
        tight.gap(4)  # population ≤ K: no h(K+1)
    # OpenDP certifies k·ε_s for the call under both calibrations
    for cal in (add, rep):
        event = selection_event(cal, 1, "a")
        assert float(event.epsilon or 0) == pytest.approx(30 * eps, rel=1e-9)
        assert event.dimension == 301 and event.noise == "gumbel_top_k"


def test_limited_domain_returns_top_parents_in_noisy_order_or_stops_at_bottom() -> None:
    cal = Calibration(epsilon=1.0, delta=1e-6, adjacency="add_remove", domain=5, parents=3)
    counts = np.array([0, 500, 0, 400, 0, 300, 0, 0], dtype=np.int64)
    assert limited_domain(counts, cal) == [1, 3, 5]  # gaps of 100 votes: the true order
    flat = np.full(8, 7, dtype=np.int64)  # h⊥ = 7 + 14.8: ⊥ comes first
    assert limited_domain(flat, cal) == []
    one = np.array([100, 0, 0, 0, 0, 0, 0, 0], dtype=np.int64)  # only one above ⊥
    assert limited_domain(one, cal) == [0]


def _first_choice(counts: np.ndarray, cal: Calibration, draws: int) -> np.ndarray:
    return np.array([(limited_domain(counts, cal) or [-1])[0] for _ in range(draws)])


@pytest.mark.slow
def test_selection_on_neighbouring_corpora_stays_within_epsilon_and_half_noise_does_not() -> None:
    """One record added to bin 0 of ten tied bins. Exact loss of {first = 0} for the
    exponential mechanism: ln(e^ε·10/(e^ε + 9)) = 0.84 at ε = 1; with half the Gumbel
    scale it is 1.51 > ε."""
    draws = 10_000
    base = np.array([40] * 10 + [0] * 10, dtype=np.int64)
    added = base.copy()
    added[0] += 1

    def loss(cal: Calibration) -> float:
        p = np.mean(_first_choice(base, cal, draws) == 0)
        q = np.mean(_first_choice(added, cal, draws) == 0)
        return float(abs(math.log(q / p)))

    right = Calibration(epsilon=1.0, delta=1e-6, adjacency="add_remove", domain=10, parents=1)
    half = Calibration(epsilon=2.0, delta=1e-6, adjacency="add_remove", domain=10, parents=1)
    assert half.scale == right.scale / 2
    assert loss(right) <= 1.0 + 0.05
    assert loss(half) > 1.0 + 0.2


# ---------------------------------------------------------------- accounting


def test_composed_epsilon_delta_over_t_iterations_through_the_accountant() -> None:
    p = params(epsilon=2.0, delta=1e-6, iterations=4, domain=10, parents=3,
               initial_population=20, offspring=20)  # fmt: skip
    plan = noise_plan(p, ["a", "b"])
    assert len(plan.events) == 8  # T × classes, parallel over the classes
    assert [(e.name, e.partition) for e in plan.events[:2]] == [
        ("limited-domain[t=1]", "a"),
        ("limited-domain[t=1]", "b"),
    ]
    eps_s = plan.calibration.epsilon
    # pure Gumbel peels: basic composition of T·k = 12 peels is what the accountant gives
    assert eps_s == pytest.approx(2.0 / 12, rel=1e-6)
    assert plan.calibration.scale == pytest.approx(1 / eps_s)
    # every call spends δ_LD outright: half of δ over the T restrictions of a class
    assert plan.calibration.delta == pytest.approx(0.5e-6 / 4)
    assert {e.delta for e in plan.events} == {Decimal(repr(plan.calibration.delta))}
    composition = compose(plan.events)
    assert composition.spends_delta == 4 * Fraction(plan.events[0].delta or 0)  # T·δ_LD
    assert plan.domain_delta == pytest.approx(0.5e-6) and plan.delta == p.delta
    # the events compose at the job's δ (the ledger's) to at most the job's ε
    spent = float(composition.epsilon(p.delta))
    assert 0.999 * p.epsilon < spent <= p.epsilon
    # 1 % less noise overshoots
    louder = Calibration(epsilon=eps_s * 1.01, delta=plan.calibration.delta,
                         adjacency="add_remove", domain=10, parents=3)  # fmt: skip
    events = [selection_event(louder, t, c) for t in range(1, 5) for c in "ab"]
    assert float(compose(events).epsilon(p.delta)) > p.epsilon
    assert plan_dp_eda(p, ["a", "b"]) == list(plan.events)


def test_the_domain_restrictions_delta_counts_against_the_jobs_delta() -> None:
    """At a δ below T·δ_LD no finite ε holds for the plan, where the same releases
    without their δ would pass as pure: ignoring δ_LD would let a dataset whose δ cap
    is smaller than what LimitedDomain spends take the job."""
    p = params(epsilon=2.0, delta=1e-6, iterations=4, domain=10, parents=3,
               initial_population=20, offspring=20)  # fmt: skip
    plan = noise_plan(p, ["a", "b"])
    tight = Decimal("4e-7")  # below T·δ_LD = 5e-7
    assert compose(plan.events).epsilon(tight).is_infinite()
    without = [replace(e, delta=None) for e in plan.events]
    assert compose(without).epsilon(tight) <= Decimal(p.epsilon)
    # at the job's δ the pure part is the exact sum either way: within ε
    assert compose(plan.events).epsilon(p.delta) <= Decimal(p.epsilon)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"parents": 400}, "parents"),
        ({"offspring": 300}, "offspring"),
        ({"initial_population": 100}, "initial_population"),
        ({"delta": 0.01}, "delta"),
        ({"adjacency": "swap"}, "adjacency"),
        ({"decoder": "vec2text"}, "decoder"),
    ],
)
def test_bad_parameters_name_their_field(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        params(**overrides)
    assert caught.value.errors()[0]["loc"] == (field,)


# ---------------------------------------------------------------- EDA, votes, filter


def test_eda_follows_the_corrected_formulas() -> None:
    e = np.array([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0], [1.0, 3.0]])
    alpha, r = 0.2, 2
    mean, std = eda_gaussian(e, alpha=alpha, top_r=r)
    mu, sigma = e.mean(0), e.std(0)
    spread = e[:2].std(0)
    assert np.allclose(mean, (1 - alpha) * mu + alpha * (e[0] + e[1] - e[3]))
    assert np.allclose(std, (1 - alpha) * sigma + alpha * spread)
    kids = offspring(e, count=50, alpha=alpha, top_r=r, rng=np.random.default_rng(0))
    assert kids.shape == (50, 2) and np.allclose(np.linalg.norm(kids, axis=1), 1.0, atol=1e-6)


def test_a_unit_votes_once_with_the_mean_of_its_documents() -> None:
    emb = np.array([[1, 0], [0, 1], [1, 1], [3, 3]], dtype=np.float32)
    means = unit_means(emb, np.array([5, 2, 5, 2]))
    assert np.allclose(means, [[1, 0.5], [1.5, 2]])
    population = np.array([[1, 0], [0, 1]], dtype=np.float32)
    assert ld.vote_counts(means, population).tolist() == [1, 1]


def test_perplexity_filter_keeps_prose_and_drops_symbol_noise() -> None:
    public = [
        "The market rose as bank shares gained.", "Shares fell after the bank report.",
        "The team won the match with a late goal.", "Rates rose and the market cooled.",
        "The coach praised the players after the game.", "Profits at the bank beat forecasts.",
        "The striker scored in the second half.", "Investors sold shares as rates climbed.",
    ] * 2  # fmt: skip
    model = CharBigramPerplexity(public, percentile=100.0)
    assert model.readable("The bank shares rose as the market gained.")
    assert not model.readable("£ £ £ «» »® ~~ ## @@")


# ---------------------------------------------------------------- end to end

LABEL_SET = news.LABEL_SET
CANARY = "zx-canary-7781"
DOCUMENTS = [f"The striker scored twice in the cup final {CANARY} {i}" for i in range(12)] + [
    f"Bank profits rose and shares climbed on the stock market {i}" for i in range(12)
]
LABELS = ["Sports"] * 12 + ["Business"] * 12
TINY: dict[str, Any] = {
    "epsilon": 60.0,
    "delta": 1e-5,
    "iterations": 2,
    "domain": 3,
    "parents": 2,
    "initial_population": 6,
    "offspring": 8,
    "top_r": 2,
    "nearest_phrases": 3,
    "candidates": 2,
    "rounds": 1,
    "perplexity_percentile": 100.0,
    "concurrency": 4,
}
VOCABULARY = Vocabulary.from_phrases(
    "test",
    ["football match", "late goal", "bank profits", "stock market", "share price",
     "team coach", "interest rates", "league table"],
)  # fmt: skip


@pytest.fixture(scope="module")
def topical() -> Topical:
    return Topical(
        "The team won the match with a late goal in game {n}.",
        "Bank profits and shares moved the stock market on day {n}.",
    )


run = news.NewsRun(run_dp_eda, params, TINY, DOCUMENTS, LABELS, inputs={"vocabulary": VOCABULARY})


def test_end_to_end_records_the_planned_events_and_keeps_private_text_out(
    llm: FakeLLM, embedder: SentenceEmbedder
) -> None:
    store = MemoryCheckpoints()
    result = run(llm, embedder, store)
    p = params(**TINY)
    assert result.events == plan_dp_eda(p, LABEL_SET)
    assert result.records and {label for label, _ in result.records} <= set(LABEL_SET)
    for label, text in result.records:
        assert text.startswith("The team" if label == "Sports" else "Bank profits")
    for request in llm.chat_requests:
        assert CANARY not in request.prompt_text
        assert not any(doc in request.prompt_text for doc in DOCUMENTS)
    manifest = result.manifest
    text = json.dumps(manifest)
    assert CANARY not in text and not any(doc in text for doc in DOCUMENTS)
    assert manifest["method"] == "dp-eda" and manifest["decoder"]["name"] == "llm_reconstruction"
    assert "character-bigram" in manifest["filter"]["name"]
    assert float(manifest["privacy"]["epsilon"]) <= p.epsilon
    assert manifest["privacy"]["delta"] == p.delta  # δ_LD included
    assert manifest["privacy"]["domain_delta"] == pytest.approx(p.delta * p.ld_delta_share)
    assert result.llm_costs.calls == len(llm.chat_requests) > 0
    # the run's requests, counted from what it selected: N_pb per class, then per
    # selected parent c candidates in each of r rounds; the public bound holds them
    selected = [
        len(json.loads(store.items[f"dp-eda-select-{c}-{t}"])["selected"])
        for c in range(len(LABEL_SET))
        for t in range(1, p.iterations + 1)
        if f"dp-eda-select-{c}-{t}" in store.items
    ]
    made = len(LABEL_SET) * p.initial_population + sum(selected) * p.candidates * p.rounds
    assert len(llm.chat_requests) == made <= p.planned_calls(len(LABEL_SET))
    if sum(selected) == len(LABEL_SET) * p.iterations * p.parents:  # nothing stopped early
        assert made == p.planned_calls(len(LABEL_SET))
    assert len(result.records) <= p.max_released(len(LABEL_SET))


def test_planned_calls_and_max_released_bound_a_run() -> None:
    p = params()  # the paper's sizes: N_pb = 1000, T = 7, k = 30; c = 4, r = 2
    assert p.planned_calls(3) == 3 * (1000 + 7 * 30 * 4 * 2)
    assert params(population_source="vocabulary").planned_calls(3) == 3 * 7 * 30 * 4 * 2
    assert params(decoder="retrieval").planned_calls(3) == 3 * 1000
    assert params(decoder="retrieval", population_source="vocabulary").planned_calls(2) == 0
    assert p.max_released(3) == 90
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ConfigError) as refused:
            p.planned_calls(bad)  # type: ignore[arg-type]
        assert refused.value.field == "labels"
        with pytest.raises(ConfigError):
            p.max_released(bad)  # type: ignore[arg-type]


def test_retrieval_decoder_releases_public_pool_texts(
    llm: FakeLLM, embedder: SentenceEmbedder
) -> None:
    result = run(llm, embedder, MemoryCheckpoints(), decoder="retrieval",
                 population_source="vocabulary", initial_population=4, offspring=4)  # fmt: skip
    assert result.manifest["decoder"]["name"] == "retrieval"
    assert all(text in VOCABULARY.phrases for _, text in result.records)
    assert not llm.chat_requests  # vocabulary population + retrieval: no LLM at all
    assert params(**TINY, decoder="retrieval", population_source="vocabulary").planned_calls(2) == 0


class Crash(Exception):
    pass


class CrashingStore(MemoryCheckpoints):
    def __init__(self, crash_on: str) -> None:
        super().__init__()
        self.crash_on = crash_on

    def save(self, key: str, data: bytes) -> None:
        if key == self.crash_on:
            raise Crash(key)
        super().save(key, data)


@pytest.mark.slow
def test_a_crashed_run_resumes_without_drawing_noise_again(
    llm: FakeLLM, embedder: SentenceEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    draws: list[int] = []
    real = ld.noisy_top_k  # type: ignore[attr-defined]

    def counting(*args: Any, **kwargs: Any) -> Any:
        draws.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(ld, "noisy_top_k", counting)
    store = CrashingStore("dp-eda-decode-1-1")  # after class 1's first selection is saved
    with pytest.raises(Crash):
        run(llm, embedder, store)
    before = len(draws)
    saved = {k for k in store.items if k.startswith("dp-eda-select-")}
    assert before == len(saved) and "dp-eda-select-1-1" in saved
    store.crash_on = ""
    result = run(llm, embedder, store)
    selections = {k for k in store.items if k.startswith("dp-eda-select-")}
    assert len(draws) - before == len(selections - saved)  # no selection drawn twice
    assert result.events == plan_dp_eda(params(**TINY), LABEL_SET)  # each event once
    again = run(llm, embedder, store)  # everything checkpointed: no draw at all
    assert len(draws) - before == len(selections - saved)
    assert again.records == result.records


def test_defaults_are_checked_against_a_small_domain() -> None:
    """A domain K below the defaults of parents (30), initial_population and offspring is
    refused naming the default that no longer fits (it was a 500 when the fuzzer sent
    ``domain: 8``: the defaults were first checked when the engine's params were built)."""
    with pytest.raises(ValidationError) as refused:
        params(domain=8)
    assert [e["loc"] for e in refused.value.errors()] == [("parents",)]
    assert params(domain=8, parents=8).parents == 8
    with pytest.raises(ValidationError) as refused:
        params(domain=2000, initial_population=1000, offspring=3000)
    assert {e["loc"] for e in refused.value.errors()} == {("initial_population",)}
