"""The thresholded Gaussian vocabulary: a histogram over the phrases that occur, kept above
a threshold that bounds the δ of a phrase only the added unit holds.

Fast tests check the threshold, the support, the plan's split of (ε, δ) and a run end to
end; the ``slow`` ones are stochastic checks on neighbouring corpora, in the pattern of
``test_neighbouring.py``: (a) the Gaussian part on phrases both corpora hold stays
within (ε, δ), and a control with half the noise is caught; (b) a phrase of the added
unit alone crosses the threshold at most ``threshold_delta`` of the time, and a
threshold computed for half the noise scale is caught.
"""

from __future__ import annotations

import dataclasses
import math
from decimal import Decimal
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from scipy.stats import norm

from tests.core.privacy.test_neighbouring import SIGMA_1, check_gaussian
from tests.privacy_audit import planned
from workers.errors import ConfigError
from workers.methods.dpkps import private_vocab
from workers.methods.dpkps.config import LowEpsilonConfig
from workers.methods.dpkps.plan import THRESHOLD_DELTA_SHARE, VOCABULARY, matches, plan
from workers.methods.dpkps.private_vocab import (
    phrase_histogram,
    select_thresholded_vocabulary,
    vocabulary_threshold,
)
from workers.privacy.accountant import compose
from workers.privacy.events import PrivacyEvent


def gaussian_config(**overrides: Any) -> LowEpsilonConfig:
    base: dict[str, Any] = dict(
        epsilon=1.0, delta=1e-6, noise="gaussian", vocabulary_method="threshold"
    )
    base.update(overrides)
    return LowEpsilonConfig(**base)


@pytest.mark.parametrize(("s", "delta"), [(1, 1e-6), (10, 5e-7), (32, 1e-3)])
def test_threshold_bounds_the_chance_that_s_new_phrases_cross(s: int, delta: float) -> None:
    scale = 7.5
    t = vocabulary_threshold(scale=scale, max_per_document=s, threshold_delta=delta)
    # S phrases of count 1 each: union bound S·Φ̄((T − 1)/σ) ≤ δ, and not much below it
    tail = s * norm.sf((t - 1.0) / scale)
    assert 0.99 * delta < tail <= delta


def test_only_occurring_phrases_are_noised_and_can_be_kept() -> None:
    size = 300_000
    docs = [[5, 7, 9]] * 200 + [[11]] * 2
    plan_event = planned("gaussian", 2.0, multiplier=1.0, dimension=size)
    for _ in range(20):
        chosen = select_thresholded_vocabulary(
            docs,
            vocabulary_size=size,
            size=1000,
            planned=plan_event,
            max_per_document=4,
            threshold_delta=1e-6,
        )
        # 200 ≫ T ≈ 1 + 2·5.2: the frequent phrases always pass; phrase 11 (count 2)
        # never does; a phrase that occurs nowhere cannot be drawn at all
        assert sorted(chosen.indices.tolist()) == [5, 7, 9]
        assert np.all(chosen.noisy_counts > 100)
    assert chosen.event.dimension == size and chosen.event.noise == "gaussian"


def test_thresholded_histogram_counts_distinct_phrases_within_s() -> None:
    counts = phrase_histogram([[1, 1, 1, 2, 3, 4, 5]], vocabulary_size=8, max_per_document=3,
                              distinct=True)  # fmt: skip
    assert counts.tolist() == [0, 1, 1, 1, 0, 0, 0, 0]


def test_threshold_needs_gaussian_noise() -> None:
    with pytest.raises(ConfigError) as info:
        LowEpsilonConfig(
            epsilon_vocab=1.0, epsilon_kde=1.0, vocabulary_method="threshold"
        ).validate()
    assert info.value.field == "vocabulary_method"
    with pytest.raises(ConfigError) as info:
        gaussian_config(vocabulary_method="top").validate()
    assert info.value.field == "vocabulary_method"


@pytest.mark.parametrize("epsilon", [0.25, 1.0, 6.0])
def test_the_events_alone_compose_to_the_target_with_the_threshold_delta_once(
    epsilon: float,
) -> None:
    cfg = gaussian_config(epsilon=epsilon)
    p = plan(cfg, ["a", "b"], 300_000)
    assert p.delta == 1e-6
    # δ_thr is carried by the vocabulary release, and by it alone
    with_delta = [e for e in p.events if e.delta is not None]
    assert [e.mechanism for e in with_delta] == [VOCABULARY]
    assert with_delta[0].delta == Decimal("5E-7") and with_delta[0].count == 1
    assert p.threshold_delta == THRESHOLD_DELTA_SHARE * 1e-6
    composition = compose(p.events)
    assert composition.spends_delta == Fraction(5, 10_000_000)  # charged exactly once
    # what a ledger sees, composing the events alone at the run's δ, is the plan's ε ≤ ε
    assert composition.epsilon(1e-6) == p.epsilon <= Decimal(repr(epsilon))
    assert float(p.epsilon) == pytest.approx(epsilon, rel=1e-3)
    # the Gaussians are calibrated at δ − δ_thr: the same events without the δ spent
    # outright give that ε there, and a smaller one at the whole δ (not counted twice)
    core = [dataclasses.replace(e, delta=None) for e in p.events]
    assert compose(core).epsilon(1e-6 - 5e-7) == p.epsilon
    assert compose(core).epsilon(1e-6) < p.epsilon
    # and the events spend the whole δ: below δ_thr no finite ε holds
    assert composition.epsilon(4e-7).is_infinite()
    # the JSON the ledger stores reads back with its δ
    stored = [PrivacyEvent.from_dict(e.to_dict()) for e in p.events]
    assert compose(stored).epsilon(1e-6) == p.epsilon
    # the histogram variant of the same budget: no δ spent outright
    h = plan(gaussian_config(epsilon=epsilon, vocabulary_method="histogram"), ["a", "b"], 300_000)
    assert h.threshold_delta == 0 and all(e.delta is None for e in h.events)
    assert compose(h.events).epsilon(1e-6) == h.epsilon <= Decimal(repr(epsilon))


def test_a_run_whose_vocabulary_drops_the_threshold_delta_is_not_as_planned() -> None:
    p = plan(gaussian_config(), ["a", "b"], 1000)
    without = [dataclasses.replace(e, delta=None) for e in p.events]
    assert matches(p.events, p.events) and not matches(p.events, without)


def test_a_thresholded_run_meets_its_budget_and_pads_a_tiny_vocabulary() -> None:
    from tests.core.dpkps.test_pipeline import TOPICS, corpus
    from workers.methods.dpkps.pipeline import generate_sequences
    from workers.text.embeddings import SentenceEmbedder
    from workers.text.vocabulary import Vocabulary

    phrases = [p for words in TOPICS.values() for p in words]
    phrases += [f"unrelated term {i}" for i in range(200)]
    vocabulary = Vocabulary.from_phrases("test-clinical", phrases)
    texts, labels = corpus(per_class=40)
    embedder = SentenceEmbedder()
    for epsilon, enough in ((8.0, True), (0.05, False)):
        cfg = gaussian_config(
            epsilon=epsilon,
            per_class=20,
            vocabulary_size=30,
            max_matches_per_document=4,
            sequence_length=3,
            bandwidth=0.5,
        )
        result = generate_sequences(
            texts, labels, label_set=list(TOPICS), vocabulary=vocabulary, config=cfg,
            embedder=embedder,
        )  # fmt: skip
        report = result.report
        assert report.as_planned
        assert float(report.epsilon) <= epsilon and report.delta == 1e-6
        assert report.plan.threshold_delta == pytest.approx(5e-7)
        (vocab,) = [e for e in report.events if e.mechanism == VOCABULARY]
        assert vocab.delta == Decimal("5E-7")  # the realised release carries δ_thr
        assert report.epsilon == compose(report.events).epsilon(1e-6)
        # drawn as asked; the consistency filter (a default with centroids) keeps some
        assert result.manifest()["sequences_drawn"] == 20 * len(TOPICS)
        assert 0 < len(result.sequences) <= 20 * len(TOPICS)
        assert result.manifest()["parameters"]["vocabulary_method"] == "threshold"
        if enough:  # every topic phrase occurs in ~24 documents of 120: all clear T
            assert not any(p.startswith("unrelated") for p in result.private_vocabulary)
            assert len(result.private_vocabulary) == 15
        else:  # at ε = 0.05 nothing clears T: Ṽ is padded to L public phrases
            assert len(result.private_vocabulary) >= cfg.sequence_length


# ------------------------------------------------------- stochastic, neighbouring corpora

RUNS = 6000


@pytest.mark.slow
def test_thresholded_vocabulary_gaussian_part_within_epsilon_delta() -> None:
    # Phrases both corpora hold, far above T: the release is the Gaussian mechanism with
    # L2 Δ = √S (the added unit moves S counts by 1), and thresholding never bites.
    s, size = 4, 8
    corpus = [[0, 1, 2, 3]] * 150 + [[4, 5]] * 150
    neighbour = [*corpus, [0, 1, 4, 5, 5, 5]]
    plan_event = planned("gaussian", math.sqrt(s), multiplier=SIGMA_1, dimension=size)
    raw = phrase_histogram(corpus, vocabulary_size=size, max_per_document=s, distinct=True)
    raw2 = phrase_histogram(neighbour, vocabulary_size=size, max_per_document=s, distinct=True)
    assert np.linalg.norm(raw2 - raw) == pytest.approx(math.sqrt(s))

    def draw(add: bool) -> np.ndarray:
        chosen = select_thresholded_vocabulary(
            neighbour if add else corpus,
            vocabulary_size=size,
            size=size,
            planned=plan_event,
            max_per_document=s,
            threshold_delta=1e-3,
        )
        assert chosen.indices.size == 6  # all six occurring phrases, every time
        out = np.zeros(size)
        out[chosen.indices] = chosen.noisy_counts
        return out

    check_gaussian(draw, raw.astype(float), raw2.astype(float), SIGMA_1 * math.sqrt(s))


@pytest.mark.slow
def test_phrases_of_the_added_unit_cross_the_threshold_at_most_delta(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    s, size, delta = 4, 12, 0.05
    corpus = [[0, 1, 2, 3]] * 100
    neighbour = [*corpus, [8, 8, 9, 10, 11, 0]]  # four phrases nobody else holds
    plan_event = planned("gaussian", math.sqrt(s), multiplier=SIGMA_1, dimension=size)
    new = {8, 9, 10, 11}

    def crossing_rate(runs: int) -> float:
        hits = 0
        for _ in range(runs):
            chosen = select_thresholded_vocabulary(
                neighbour,
                vocabulary_size=size,
                size=size,
                planned=plan_event,
                max_per_document=s,
                threshold_delta=delta,
            )
            hits += bool(new & set(chosen.indices.tolist()))
        return hits / runs

    # exact chance 1 − (1 − δ/S)^S ≈ 0.981·δ; binomial sd over 8,000 runs ≈ 0.048·δ. The
    # binomial tails outside (0.75δ, 1.2δ] hold 5.5e-6 of runs (one in 180,000); the band
    # (0.8δ, 1.15δ] it replaced held 3.6e-4 (one in 2,800)
    rate = crossing_rate(8000)
    assert 0.75 * delta < rate <= 1.2 * delta

    # control: a threshold computed for half the noise scale lets far more through
    real = private_vocab.vocabulary_threshold

    def halved(*, scale: float, **kwargs: Any) -> float:
        return real(scale=scale / 2, **kwargs)

    monkeypatch.setattr(private_vocab, "vocabulary_threshold", halved)
    assert crossing_rate(2000) > 3 * delta


# ----------------------------------------- exact-kernel density with L2-normalised weights


def _two_phrase_kernel() -> Any:
    import torch

    from workers.methods.dpkps.density.exact import ExactKernel

    first = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    second = torch.tensor([[math.cos(0.74), math.sin(0.74)]], dtype=torch.float64)
    return ExactKernel(torch.cat([first, second]), 1.0)  # K = [[1, k], [k, 1]], k ≈ 0.6


def test_l2_weights_sensitivity_is_the_largest_eigenvalue_and_is_reached() -> None:
    import torch

    from workers.methods.dpkps.density.exact import ExactKernel, phrase_weights

    kernel = _two_phrase_kernel()
    k = float(torch.exp(-torch.tensor(2 - 2 * math.cos(0.74))))
    assert kernel.spectral_norm == pytest.approx(1 + k, rel=1e-8)
    # a document holding both phrases: x = (1, 1)/√2, the Perron vector: ‖K x‖₂ = 1 + k
    base = kernel.density(phrase_weights([[0], [1]], 2, max_phrases=8, weighting="l2"))
    more = kernel.density(phrase_weights([[0], [1], [0, 1]], 2, max_phrases=8, weighting="l2"))
    assert np.linalg.norm(more - base) == pytest.approx(kernel.spectral_norm, rel=1e-6)
    # many phrases: no document moves the density by more than λ_max in L2
    emb = torch.nn.functional.normalize(
        torch.randn(60, 16, generator=torch.Generator().manual_seed(1), dtype=torch.float64), dim=1
    )
    big = ExactKernel(emb, 0.8)
    rng = np.random.default_rng(0)
    corpus = [list(rng.choice(60, size=5, replace=False)) for _ in range(30)]
    ref = big.density(phrase_weights(corpus, 60, max_phrases=8, weighting="l2"))
    for n in (1, 2, 8, 20):
        doc = list(rng.choice(60, size=n, replace=False))
        moved = big.density(phrase_weights([*corpus, doc], 60, max_phrases=32, weighting="l2"))
        assert np.linalg.norm(moved - ref) <= big.spectral_norm * (1 + 1e-9)
    assert big.sensitivities["l2"] <= big.spectral_norm <= big.sensitivities["l1"] + 1e-9


def test_l2_weights_need_gaussian_noise() -> None:
    with pytest.raises(ConfigError) as info:
        LowEpsilonConfig(epsilon_vocab=1.0, epsilon_kde=1.0, kde_weighting="l2").validate()
    assert info.value.field == "kde_weighting"


@pytest.mark.slow
def test_l2_weighted_exact_kde_within_epsilon_delta() -> None:
    from workers.methods.dpkps.density.exact import build_exact_structure, phrase_weights

    kernel = _two_phrase_kernel()
    corpus = [[0], [1]]
    neighbour = [*corpus, [0, 1]]  # the Perron direction: the bound is reached
    raw = kernel.density(phrase_weights(corpus, 2, max_phrases=8, weighting="l2"))
    raw2 = kernel.density(phrase_weights(neighbour, 2, max_phrases=8, weighting="l2"))
    plan_event = planned("gaussian", 1.0, multiplier=SIGMA_1, dimension=2)

    def draw(add: bool) -> np.ndarray:
        return build_exact_structure(
            neighbour if add else corpus,
            kernel,
            label="a",
            planned=plan_event,
            max_phrases=8,
            weighting="l2",
        ).noisy_density

    check_gaussian(draw, raw, raw2, SIGMA_1 * kernel.spectral_norm)


def test_collatz_wielandt_bound_is_above_the_largest_eigenvalue_and_close(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch

    from workers.methods.dpkps.density import exact as kernels

    emb = torch.nn.functional.normalize(
        torch.randn(300, 8, generator=torch.Generator().manual_seed(2), dtype=torch.float64), dim=1
    )
    exact = kernels.ExactKernel(emb, 0.6).spectral_norm
    monkeypatch.setattr(kernels, "SPECTRAL_EXACT_LIMIT", 10)
    kernel = kernels.ExactKernel(emb, 0.6)
    bound = kernel.spectral_norm
    # a dense kernel (8 dimensions, wide bandwidth): three steps land within 10 %,
    # well inside Gershgorin's largest row sum
    assert exact <= bound <= 1.1 * exact < kernel.sensitivities["l1"]


def test_all_classes_in_one_pass_release_each_class_density() -> None:
    import torch

    from workers.methods.dpkps.density.exact import (
        ExactKernel,
        build_exact_structures,
        phrase_weights,
    )

    emb = torch.nn.functional.normalize(
        torch.randn(40, 8, generator=torch.Generator().manual_seed(3), dtype=torch.float64), dim=1
    )
    kernel = ExactKernel(emb, 0.5)
    rng = np.random.default_rng(1)
    classes = [(c, [list(rng.choice(40, size=4)) for _ in range(20)]) for c in "abc"]
    plan_event = planned("laplace", 1.0, epsilon=1e6, dimension=40)  # negligible noise
    released = build_exact_structures(classes, kernel, planned=plan_event, max_phrases=8)
    for (label, docs), kde in zip(classes, released, strict=True):
        raw = kernel.density(phrase_weights(docs, 40, max_phrases=8))
        assert kde.label == label and kde.event.partition == label
        assert np.allclose(kde.noisy_density, raw, atol=1e-3)
        assert kde.event.sensitivity == pytest.approx(kernel.sensitivity, rel=1e-5)


def test_a_public_vocabulary_is_no_release() -> None:
    from tests.core.dpkps.test_pipeline import TOPICS, run_on_topics

    cfg = gaussian_config(
        vocabulary_method="public",
        kde_method="exact",
        kde_weighting="l2",
        per_class=10,
        public_vocabulary_size=15,
        sequence_length=3,
        bandwidth=0.5,
    )
    p = plan(cfg, list(TOPICS), 1000)
    assert {e.mechanism for e in p.events} == {"kde"}
    assert p.threshold_delta == 0 and p.epsilon <= Decimal(1)
    result, vocabulary = run_on_topics(cfg, per_class=20)
    assert result.report.as_planned and float(result.report.epsilon) <= 1.0
    assert {e.mechanism for e in result.report.events} == {"kde"}
    assert result.private_vocabulary == list(vocabulary.phrases[:15])
    assert len(result.sequences) == 10 * len(TOPICS)


# ------------------------------------------------- class centroids of document embeddings


def test_a_unit_vector_has_norm_at_most_one_whatever_its_documents() -> None:
    from workers.methods.dpkps.density.centroid import unit_vectors

    rng = np.random.default_rng(4)
    emb = rng.normal(size=(10, 6))
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    rows = unit_vectors([[0], [1, 2, 3], list(range(10)), []], emb)
    norms = np.linalg.norm(rows, axis=1)
    assert norms[0] == pytest.approx(1.0) and np.all(norms <= 1 + 1e-12) and norms[3] == 0


def test_centroid_release_clips_rows_to_norm_one_and_refuses_pure_noise() -> None:
    from workers.methods.dpkps.density.centroid import build_centroid_structures

    plan_event = planned("gaussian", 1.0, multiplier=1e-9, dimension=3)
    # a row above norm 1 is scaled down to it: the sum moves by 1 at most
    clipped = build_centroid_structures([("a", np.array([[2.0, 0.0, 0.0]]))], planned=plan_event)
    assert clipped[0].noisy_sum == pytest.approx([1.0, 0.0, 0.0], abs=1e-6)
    with pytest.raises(ConfigError):
        build_centroid_structures(
            [("a", np.zeros((1, 3)))], planned=planned("laplace", 1.0, epsilon=1.0, dimension=3)
        )
    with pytest.raises(ConfigError) as info:
        gaussian_config(kde_method="centroid", mode="iterative").validate()
    assert info.value.field == "kde_method"


@pytest.mark.slow
def test_centroid_release_within_epsilon_delta() -> None:
    from workers.methods.dpkps.density.centroid import build_centroid_structures

    rows = np.array([[0.6, 0.8, 0.0], [0.0, 1.0, 0.0]])
    added = np.array([[0.0, 0.0, 1.0]])  # a unit vector: the sum moves by exactly 1
    plan_event = planned("gaussian", 1.0, multiplier=SIGMA_1, dimension=3)

    def draw(add: bool) -> np.ndarray:
        data = np.vstack([rows, added]) if add else rows
        return build_centroid_structures([("a", data)], planned=plan_event)[0].noisy_sum

    check_gaussian(draw, rows.sum(axis=0), rows.sum(axis=0) + added[0], SIGMA_1)


def test_moments_move_by_at_most_sqrt2_and_score_the_class_directions() -> None:
    import torch

    from workers.methods.dpkps.density.centroid import (
        CentroidKDE,
        build_moment_structures,
        moment_scores,
    )

    rng = np.random.default_rng(5)
    rows = rng.normal(size=(30, 6))
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    plan_event = planned("gaussian", math.sqrt(2.0), multiplier=1e-9, dimension=27)
    base = build_moment_structures([("a", rows)], planned=plan_event)[0].noisy_sum
    for x in (rows[0], rows[1] * 0.5, np.eye(6)[2]):
        more = build_moment_structures([("a", np.vstack([rows, x]))], planned=plan_event)
        moved = np.linalg.norm(more[0].noisy_sum - base)
        assert moved <= math.sqrt(2.0) + 1e-6
    unit = np.eye(6)[2]
    more = build_moment_structures([("a", np.vstack([rows, unit]))], planned=plan_event)
    assert np.linalg.norm(more[0].noisy_sum - base) == pytest.approx(math.sqrt(2.0), abs=1e-6)
    # two opposite clusters: the mean cancels, the second moment still finds both
    axis = np.eye(6)[0]
    two = np.vstack([np.tile(axis, (20, 1)), np.tile(-axis, (20, 1))])
    released = build_moment_structures([("a", two)], planned=plan_event)[0]
    emb = torch.as_tensor(np.vstack([axis, -axis, np.eye(6)[1]]))
    scores = moment_scores(CentroidKDE("a", released.noisy_sum, released.event), emb, scale=0.05)
    assert scores[0] == pytest.approx(1.0) and scores[1] == pytest.approx(1.0)
    assert scores[2] < 1e-6


@pytest.mark.slow
def test_moment_release_within_epsilon_delta() -> None:
    from workers.methods.dpkps.density.centroid import build_moment_structures

    rows = np.array([[0.6, 0.8, 0.0], [0.0, 1.0, 0.0]])
    added = np.array([[0.0, 0.0, 1.0]])  # moves the sum by 1 and one square by 1: √2
    plan_event = planned("gaussian", math.sqrt(2.0), multiplier=SIGMA_1, dimension=9)

    def raw(data: np.ndarray) -> np.ndarray:
        i, k = np.triu_indices(3)
        return np.concatenate([data.sum(axis=0), (data.T @ data)[i, k]])

    def draw(add: bool) -> np.ndarray:
        data = np.vstack([rows, added]) if add else rows
        return build_moment_structures([("a", data)], planned=plan_event)[0].noisy_sum

    base, moved = raw(rows), raw(np.vstack([rows, added]))
    assert np.linalg.norm(moved - base) == pytest.approx(math.sqrt(2.0))
    check_gaussian(draw, base, moved, SIGMA_1 * math.sqrt(2.0))
