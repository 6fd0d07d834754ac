"""A Poisson sample of units embedded for the class sums (issue 65, ``embed_sample``).

Each unit is kept independently with probability q_c = min(1, m / ñ_c), ñ_c the class's
released count, by a keyed hash under a secret key (workers/privacy/sampling.py); the
class sums of the kept units get the planned Gaussian (L2 Δ = 1), charged as the unsampled
release. Fast tests: the sampler, the rate, the plan and its exact accounting (the ledger's
figure bounds dp-accounting's subsampled-Gaussian curve at every q), a run that embeds only
its sample; the ``slow`` one is the stochastic check on neighbouring corpora of
``test_neighbouring.py`` for the sampled release, with a control at half the noise.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from tests.core.dpkps import LABELS, config
from tests.core.privacy.test_neighbouring import DELTA, EPSILON, SIGMA_1, projected
from tests.privacy_audit import estimate_epsilon_at_delta, planned
from workers.errors import ConfigError
from workers.methods.dpkps import stages
from workers.methods.dpkps.config import (
    DEFAULT_EMBED_SAMPLE,
    SAMPLE_COUNT_SHARE,
    method_description,
)
from workers.methods.dpkps.density.centroid import (
    build_centroid_structures,
    embed_units,
    unit_vectors,
)
from workers.methods.dpkps.plan import CLASS_COUNTS, KDE, plan
from workers.privacy.accountant import compose
from workers.privacy.noise import gaussian_noise
from workers.privacy.sampling import KEY_BYTES, PoissonSample, sampling_rate

# ------------------------------------------------------------------ the sampler


def test_each_unit_is_kept_independently_at_its_rate() -> None:
    sample = PoissonSample()
    ids = [str(i) for i in range(20_000)]
    kept = sample.mask(ids, ["a"] * len(ids), {"a": 0.1})
    # Binomial(20000, 0.1): mean 2000, sd 42; 5 sd either side
    assert 1790 < kept.sum() < 2210
    assert not sample.mask(ids[:500], ["a"] * 500, {"a": 0.0}).any()
    assert sample.mask(ids[:500], ["a"] * 500, {"a": 1.0}).all()
    # a unit's decision is its own: the same in any order, any shard, any call
    order = np.random.default_rng(0).permutation(len(ids))
    again = sample.mask([ids[i] for i in order], ["a"] * len(ids), {"a": 0.1})
    assert (again == kept[order]).all()
    # nested: a unit kept at a rate is kept at every larger rate (one uniform per unit)
    assert (kept <= sample.mask(ids, ["a"] * len(ids), {"a": 0.3})).all()


def test_the_key_is_secret_fresh_and_never_shown() -> None:
    ids = [str(i) for i in range(4000)]
    one, two = PoissonSample(), PoissonSample()
    a = one.mask(ids, ["a"] * len(ids), {"a": 0.5})
    b = two.mask(ids, ["a"] * len(ids), {"a": 0.5})
    # two runs draw independent samples: they agree on about half the units
    assert 0.44 < float((a == b).mean()) < 0.56
    key = b"k" * KEY_BYTES
    fixed = PoissonSample(key).mask(ids, ["a"] * len(ids), {"a": 0.5})
    assert (fixed == PoissonSample(key).mask(ids, ["a"] * len(ids), {"a": 0.5})).all()
    assert "k" * 8 not in repr(PoissonSample(key)) and "secret" in repr(one)
    with pytest.raises(ConfigError):
        PoissonSample(b"short")
    with pytest.raises(ConfigError):
        one.keeps("x", 1.5)


def test_the_rate_is_min_of_one_and_m_over_the_released_count() -> None:
    assert sampling_rate(2000, 8000.0) == 0.25
    assert sampling_rate(2000, 2000.0) == sampling_rate(2000, 150.0) == 1.0
    assert sampling_rate(2000, -40.0) == sampling_rate(2000, float("nan")) == 1.0
    for bad in (0, -1, True, 2.5):
        with pytest.raises(ConfigError):
            sampling_rate(bad, 100.0)  # type: ignore[arg-type]


# ------------------------------------------------------------------ plan and accounting


def test_sampling_releases_the_class_counts_and_keeps_the_budget() -> None:
    plain = plan(config(embed_sample=0), LABELS, 1000)
    sampled_cfg = config(embed_sample=2000)
    sampled = plan(sampled_cfg, LABELS, 1000)
    assert {e.mechanism for e in plain.events} == {KDE}
    counts = [e for e in sampled.events if e.mechanism == CLASS_COUNTS]
    sums = [e for e in sampled.events if e.mechanism == KDE]
    assert len(counts) == 1 and counts[0].partition is None and counts[0].dimension == 3
    assert len(sums) == 3 and all(e.sensitivity == 1 for e in sums)
    # the counts take SAMPLE_COUNT_SHARE of μ², the class sums the rest
    mu2_counts, mu2_sum = counts[0].scale ** -2, sums[0].scale ** -2
    assert mu2_counts / mu2_sum == pytest.approx(SAMPLE_COUNT_SHARE, rel=1e-6)
    # the class sums' σ grows by √(1 + share) only
    assert sums[0].scale / plain.events[0].scale == pytest.approx(
        (1 + SAMPLE_COUNT_SHARE) ** 0.5, rel=1e-3
    )
    for p in (plain, sampled):
        assert compose(p.events).epsilon(1e-6) == p.epsilon <= Decimal("1")
        assert float(p.epsilon) == pytest.approx(1.0, rel=1e-3)
    # with a total the counts are released anyway, at share_count: one release, not two
    total = plan(config(embed_sample=2000, total=300, per_class=None), LABELS, 1000)
    assert [e.mechanism for e in total.events].count(CLASS_COUNTS) == 1
    assert [e.mechanism for e in total.events] == [
        e.mechanism for e in plan(config(total=300, per_class=None), LABELS, 1000).events
    ]
    assert "Poisson sample of about 2,000 units" in method_description(sampled_cfg)


def test_the_default_samples_4000_units_a_class_and_0_keeps_every_unit() -> None:
    # class centroids (the default) and moments embed a sample of about 4,000 units a
    # class by default; the plan is the one of embed_sample = 4,000, with the counts
    # released for the rate; 0 embeds every unit, as every job stored before it recorded
    default = config()
    assert default.embed_sample is None and default.sample_size == DEFAULT_EMBED_SAMPLE == 4000
    assert default.samples_units and default.to_dict()["embed_sample"] == 4000
    assert plan(default, LABELS, 1000) == plan(config(embed_sample=4000), LABELS, 1000)
    assert config(kde_method="moments").samples_units
    assert not config(embed_sample=0).samples_units
    for other in (config(kde_method="exact"), config(noise="laplace", delta=0.0)):
        assert other.sample_size == 0 and not other.samples_units  # nothing embedded
    # a class no larger than the sample is embedded whole (rate 1)
    counts = stages.counts_from_release(
        {"a": 3_062.0, "b": 532.0, "c": 4_000.0},
        next(e for e in plan(default, LABELS, 1000).events if e.mechanism == CLASS_COUNTS),
        label_set=LABELS,
        config=default,
    )
    assert counts.rates == {"a": 1.0, "b": 1.0, "c": 1.0}


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"embed_sample": -1}, "embed_sample"),
        ({"embed_sample": 10**8}, "embed_sample"),
        ({"embed_sample": 1.5}, "embed_sample"),
        ({"embed_sample": 100, "kde_method": "exact"}, "embed_sample"),
    ],
)
def test_bad_sample_sizes_name_the_field(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config(**overrides)
    assert caught.value.field == field


@pytest.mark.parametrize("q", [0.001, 0.05, 0.5, 1.0])
def test_the_ledger_charge_bounds_the_subsampled_gaussian(q: float) -> None:
    # The ledger charges a sampled class sum as the unsampled Gaussian (σ/Δ the planned
    # multiplier). dp-accounting's PLD of the Poisson-subsampled Gaussian (add/remove) at
    # the same σ is never above it, and equals it (to the PLD's discretisation) at q = 1.
    cfg = config(embed_sample=2000)
    p = plan(cfg, LABELS, 1000)
    (counts,) = [e for e in p.events if e.mechanism == CLASS_COUNTS]
    kde = next(e for e in p.events if e.mechanism == KDE)
    charged = float(compose([counts, kde]).epsilon(1e-6))
    subsampled = pld_lib.from_gaussian_mechanism(
        kde.scale / kde.sensitivity, sampling_prob=q, value_discretization_interval=1e-4
    ).compose(pld_lib.from_gaussian_mechanism(counts.scale, value_discretization_interval=1e-4))
    truth = float(subsampled.get_epsilon_for_delta(1e-6))
    assert truth <= charged + 1e-3
    if q == 1.0:
        assert truth == pytest.approx(charged, abs=2e-3)
    else:
        assert truth < charged


# ------------------------------------------------------------------ a run


class CountingEmbedder:
    """The packaged sentence model, counting the texts it embeds."""

    def __init__(self) -> None:
        from workers.text.embeddings import SentenceEmbedder

        self.inner = SentenceEmbedder()
        self.name, self.dim, self.texts = self.inner.name, self.inner.dim, 0

    def encode(self, texts: Any, batch_size: int = 256) -> Any:
        self.texts += len(texts)
        return self.inner.encode(texts, batch_size=batch_size)


def test_embed_units_equals_the_whole_matrix_at_any_batch() -> None:
    embedder = CountingEmbedder()
    texts = [f"note {i} about {w}" for i, w in enumerate(["heart", "skin", "brain"] * 7)]
    units = [(0, 3), (1,), (2, 4, 5), (6,), (7, 8, 9, 10)]
    whole = unit_vectors(units, embedder.encode(texts))
    embedder.texts = 0
    for batch in (1, 2, 5, 4096):
        got = embed_units(embedder, texts, units, batch=batch)
        np.testing.assert_allclose(got, whole, atol=1e-6)
    assert embedder.texts == 4 * 11  # only the units' documents, never the 10 others


def test_a_sampled_run_embeds_about_m_units_a_class_and_makes_the_planned_releases() -> None:
    from tests.core.dpkps.test_pipeline import TOPICS, corpus
    from workers.methods.dpkps.pipeline import generate_sequences
    from workers.text.vocabulary import Vocabulary

    phrases = [w for words in TOPICS.values() for w in words] + ["zz unrelated"]
    vocabulary = Vocabulary.from_phrases("t", phrases)
    texts, labels = corpus(per_class=300)
    cfg = config(epsilon=6.0, public_vocabulary_size=16, sequence_length=3, embed_sample=20)
    counted = CountingEmbedder()
    result = generate_sequences(
        texts, labels, label_set=list(TOPICS), vocabulary=vocabulary, config=cfg,
        embedder=counted,
    )  # fmt: skip
    assert result.report.as_planned and float(result.report.epsilon) <= 6.0
    assert [e.mechanism for e in result.report.events].count(CLASS_COUNTS) == 1
    # 3 classes × about 20 units (a count's noise at ε = 6 is a few units), besides the
    # phrases, label names and sequences the run embeds whatever the corpus (≤ 16 + 3 + 30)
    documents = counted.texts - (16 + 3 + len(result.sequences) + 30)
    assert documents <= 3 * 20 + 40 and counted.texts >= 20
    assert counted.texts < 300  # the 900 documents were not embedded
    by_label: dict[str, list[str]] = {label: [] for label in TOPICS}
    for s in result.sequences:
        by_label[s.label].extend(s.keyphrases)
    # about 20 units a class still find the class's phrases at ε = 6
    for label, words in TOPICS.items():
        assert by_label[label]
        own = sum(p in words for p in by_label[label]) / len(by_label[label])
        assert own > 0.5, (label, own)


# ------------------------------------------------------- stochastic, neighbouring corpora

RUNS = 40_000  # the mixture's tails need the control's sharper estimate


def sampled_sums(rows: np.ndarray, rate: float, runs: int) -> np.ndarray:
    """``runs`` class sums (clipped rows, as the product sums them) over fresh Poisson
    samples of ``rows``, each by a new :class:`PoissonSample` (a run's fresh key)."""
    ids = [str(i) for i in range(len(rows))]
    clipped = rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1.0)
    out = np.empty((runs, rows.shape[1]))
    for r in range(runs):
        out[r] = clipped[PoissonSample().mask(ids, ["a"] * len(ids), {"a": rate})].sum(axis=0)
    return out


def test_a_sampled_class_sum_is_released_with_the_planned_noise() -> None:
    # the builder on a sample's rows: the planned σ at Δ = 1, whatever was kept
    rows = np.eye(4)
    event = planned("gaussian", 1.0, multiplier=SIGMA_1, dimension=4, mechanism=KDE)
    kept = rows[PoissonSample().mask(["0", "1", "2", "3"], ["a"] * 4, {"a": 0.5})]
    (released,) = build_centroid_structures([("a", kept)], planned=event)
    assert released.event.scale == pytest.approx(SIGMA_1, rel=1e-5)
    assert released.event.sensitivity == pytest.approx(1.0, rel=1e-5)


@pytest.mark.slow
def test_the_sampled_release_on_neighbouring_corpora_within_epsilon_delta() -> None:
    # D and D plus one unit of norm 1, each unit (the added one included) kept at q by the
    # product's sampler; the statistic is the projection on the added unit's direction
    # (isotropic noise). D's units are orthogonal to the added one: their own sampling adds
    # nothing along it (the worst case; otherwise it would hide the added unit).
    rate = 0.9
    rng = np.random.default_rng(5)
    rows = np.hstack([rng.normal(size=(30, 2)), np.zeros((30, 1))])
    added = np.array([[0.0, 0.0, 1.0]])
    raw, raw2 = np.zeros(3), added[0]  # the shift the added unit makes when kept
    without = sampled_sums(rows, rate, RUNS)
    with_added = sampled_sums(np.vstack([rows, added]), rate, RUNS)
    assert np.isclose(with_added[:, 2], 1.0).mean() == pytest.approx(rate, abs=0.01)

    def loss(sigma: float) -> float:
        x = gaussian_noise(without.ravel(), scale=sigma).reshape(without.shape)
        y = gaussian_noise(with_added.ravel(), scale=sigma).reshape(with_added.shape)
        return estimate_epsilon_at_delta(
            projected(list(x), raw, raw2), projected(list(y), raw, raw2), delta=DELTA
        )

    # the subsampled Gaussian's own curve at this q (dp-accounting) is below the ε the
    # ledger charges; the estimate reads about it, and not above ε
    truth = pld_lib.from_gaussian_mechanism(
        SIGMA_1, sampling_prob=rate, value_discretization_interval=1e-4
    ).get_epsilon_for_delta(DELTA)
    assert 0.85 * EPSILON < truth < EPSILON
    assert 0.7 * EPSILON < loss(SIGMA_1) <= 1.3 * EPSILON
    # the same sampled release with half the noise is caught (its curve: ε ≈ 2.4)
    assert loss(SIGMA_1 / 2) > 1.6 * EPSILON


def test_with_a_unit_column_a_unit_is_kept_or_dropped_whole(monkeypatch: Any) -> None:
    from tests.core.dpkps.test_pipeline import TOPICS, corpus
    from workers.methods.dpkps import pipeline, stages
    from workers.text.embeddings import SentenceEmbedder
    from workers.text.vocabulary import Vocabulary

    seen: list[tuple[int, ...]] = []
    real = embed_units  # the one the stages import from density.centroid

    def recording(embedder: Any, documents: Any, units: Any, **kwargs: Any) -> Any:
        seen.extend(tuple(u) for u in units)
        return real(embedder, documents, units, **kwargs)

    monkeypatch.setattr(stages, "embed_units", recording)
    texts, labels = corpus(per_class=120)
    # three documents a patient, in input order: 40 patients a class
    patients = [f"p{i // 3}" for i in range(len(texts))]
    phrases = [w for words in TOPICS.values() for w in words]
    cfg = config(epsilon=6.0, public_vocabulary_size=15, sequence_length=3, embed_sample=8)
    result = pipeline.generate_sequences(
        texts, labels, label_set=list(TOPICS), vocabulary=Vocabulary.from_phrases("t", phrases),
        config=cfg, embedder=SentenceEmbedder(), units=patients,
    )  # fmt: skip
    assert result.report.as_planned
    assert result.owner_diagnostics.units == 120
    assert all(len(u) == 3 and u[2] - u[0] == 2 for u in seen)  # whole patients only
    assert 3 <= len(seen) <= 3 * 8 + 20  # about 8 of each class's 40 patients
