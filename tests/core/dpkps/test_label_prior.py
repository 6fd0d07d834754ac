"""The declared label names as a prior for class centroids (post-processing of the releases).

The prior reads the released class sums, their known noise σ and public inputs (the label
set, the embedding model) only, so it spends nothing: a run with it makes exactly the
releases of a run without it. What is checked here: the agreement statistic is N(0, 1) on
noise alone (so the gate's threshold means what it says), names that carry nothing get no
weight, the weight follows the noise against the signal, and on a small class at small ε
the names move the sequences towards the class's own phrases.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from tests.core.dpkps import invalid_field
from tests.privacy_audit import planned
from workers.methods.dpkps.config import DEFAULT_LABEL_PRIOR, GenerationConfig
from workers.methods.dpkps.density.cells import CellMixture
from workers.methods.dpkps.density.label_prior import (
    agreement_power,
    cells_with_label_prior,
    name_agreement,
    name_directions,
    prior_strength,
    with_label_prior,
)
from workers.methods.dpkps.plan import CELLS

D = 384


def unit_rows(rng: np.random.Generator, count: int) -> np.ndarray:
    return name_directions(rng.normal(size=(count, D)))


def test_the_agreement_is_standard_normal_on_noise_alone() -> None:
    rng = np.random.default_rng(0)
    names = unit_rows(rng, 20)
    sigma = 4.4
    z = np.array(
        [name_agreement(rng.normal(0.0, sigma, (20, D)), names, sigma) for _ in range(2000)]
    )
    # a σ misread by 2× would give a standard deviation of 0.5 or 2
    assert abs(z.mean()) < 0.1 and 0.9 < z.std() < 1.1


def test_names_the_sums_follow_get_full_weight_and_unrelated_names_none() -> None:
    rng = np.random.default_rng(1)
    means = unit_rows(rng, 20)  # each class's true direction
    sums = 40 * 0.5 * means + rng.normal(0.0, 4.4, (20, D))  # 40 units, ε ≈ 1
    informative = name_directions(means + 0.8 * unit_rows(rng, 20))
    unrelated = unit_rows(rng, 20)
    assert prior_strength(0.5, name_agreement(sums, informative, 4.4)) == 0.5
    agreements = [
        name_agreement(40 * 0.5 * means + rng.normal(0.0, 4.4, (20, D)), unrelated, 4.4)
        for _ in range(200)
    ]
    # unrelated names reach the full weight (z ≥ 2) about as rarely as noise does
    assert np.mean([prior_strength(0.5, z) == 0.5 for z in agreements]) < 0.06
    assert name_agreement(sums, np.tile(informative[:1], (20, 1)), 4.4) == 0.0  # one name


def strengths(
    rng: np.random.Generator,
    means: np.ndarray,
    names: np.ndarray,
    *,
    documents: int,
    sigma: float,
    power: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Over 300 noisy releases of classes of ``documents`` units (each adding half its
    class's direction ``means``), the names' strength (κ = 0.5) by the gate alone and by the
    gate that knows its ``power``."""
    z = [
        name_agreement(documents * 0.5 * means + rng.normal(0.0, sigma, means.shape), names, sigma)
        for _ in range(300)
    ]
    gated = np.array([prior_strength(0.5, a) for a in z])
    return gated, np.array([prior_strength(0.5, a, power) for a in z])


def test_the_gate_keeps_the_names_where_their_agreement_cannot_tell() -> None:
    # 20 classes of 20 documents at ε ≈ 0.25 (σ = 16): names as informative as the tuning
    # splits' (cosine about 0.3 with their class's direction), whose agreement z is then ≤ 0
    # in about a fifth of the runs
    rng = np.random.default_rng(2)
    means = unit_rows(rng, 20)
    names = name_directions(means + 3.0 * unit_rows(rng, 20))
    power = agreement_power([20.0] * 20, names, 16.0)
    assert power < 0.6  # the test cannot tell informative names from codes here
    gated, with_power = strengths(rng, means, names, documents=20, sigma=16.0, power=power)
    # the gate alone leaves the names nothing in a good share of the runs (here 20 %);
    # knowing its power, it keeps them at least half of κ in every run, near π₀·κ on the
    # average, and never gives less than the gate
    assert np.mean(gated == 0.0) > 0.1
    assert with_power.min() > 0.25 and with_power.mean() > 0.35
    assert np.all(with_power >= gated)


def test_where_the_agreement_can_tell_unrelated_names_stay_as_gated() -> None:
    # 20 classes of 40 documents at ε ≈ 1 (σ = 4.4): z has the power to tell, so names
    # unrelated to the classes get about what the gate alone gives them
    rng = np.random.default_rng(3)
    means, unrelated = unit_rows(rng, 20), unit_rows(rng, 20)
    power = agreement_power([40.0] * 20, unrelated, 4.4)
    assert power > 3.0
    gated, with_power = strengths(rng, means, unrelated, documents=40, sigma=4.4, power=power)
    assert with_power.mean() < gated.mean() + 0.02, (with_power.mean(), gated.mean())
    # the power grows with the released counts and shrinks with the noise
    assert agreement_power([80.0] * 20, unrelated, 4.4) == pytest.approx(2 * power)
    assert agreement_power([40.0] * 20, unrelated, 8.8) == pytest.approx(power / 2)
    assert agreement_power([-5.0] * 20, unrelated, 4.4) == 0.0  # negative counts: none
    with pytest.raises(ValueError):
        agreement_power([40.0] * 19, unrelated, 4.4)


def test_a_run_gates_the_names_by_its_released_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    import workers.methods.dpkps.stages as stages
    from tests.core.dpkps.test_pipeline import TOPICS, run_on_topics

    seen: list[Any] = []
    real = stages.apply_label_prior

    def recording(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs.get("counts"))
        return real(*args, **kwargs)

    monkeypatch.setattr(stages, "apply_label_prior", recording)
    common: dict[str, Any] = dict(
        epsilon=1.0, delta=1e-6, noise="gaussian", sequence_length=3,
        public_vocabulary_size=16, seed=5,
    )  # fmt: skip
    by_total, _ = run_on_topics(GenerationConfig(**common, per_class=None, total=60), per_class=12)
    run_on_topics(GenerationConfig(**common, per_class=20), per_class=12)
    # with `total` the released counts (shrunk, one per declared label) reach the gate; a
    # fixed per_class releases none, and the gate reads z alone
    assert len(seen) == 2 and seen[1] is None
    assert len(seen[0]) == len(TOPICS) and all(isinstance(n, float) for n in seen[0])
    assert by_total.report.as_planned


def test_a_run_reads_the_names_only_with_a_prior(monkeypatch: pytest.MonkeyPatch) -> None:
    import workers.methods.dpkps.stages as stages
    from tests.core.dpkps.test_pipeline import run_on_topics

    kappas: list[float] = []
    real = stages.apply_label_prior

    def recording(*args: Any, **kwargs: Any) -> Any:
        kappas.append(kwargs["kappa"])
        return real(*args, **kwargs)

    monkeypatch.setattr(stages, "apply_label_prior", recording)
    cfg = GenerationConfig(
        epsilon=1.0, delta=1e-6, noise="gaussian", sequence_length=3, per_class=None,
        total=60, public_vocabulary_size=16, seed=5,
    )  # fmt: skip
    run_on_topics(cfg, per_class=12)
    run_on_topics(dataclasses.replace(cfg, label_prior=0.0), per_class=12)  # κ = 0: off
    assert kappas == [DEFAULT_LABEL_PRIOR]


def test_the_prior_weighs_as_the_noise_does_against_the_signal() -> None:
    rng = np.random.default_rng(2)
    true = unit_rows(rng, 1)[0]
    name = name_directions((true + unit_rows(rng, 1)[0])[None, :])[0]
    sigma = 4.4

    def pulled(size: int) -> float:
        released = size * 0.5 * true + rng.normal(0.0, sigma, D)
        direction = with_label_prior(released, name, sigma, DEFAULT_LABEL_PRIOR)
        return float(direction @ name / np.linalg.norm(direction))

    # a few dozen units: the name dominates; hundreds: the release does
    assert pulled(20) > 0.9
    assert pulled(2000) < 0.75
    # weight κ·σ²·d/ŝ exactly, ŝ the noise-corrected norm
    released = 300 * 0.5 * true + rng.normal(0.0, sigma, D)
    signal = np.sqrt(released @ released - D * sigma**2)
    added = with_label_prior(released, name, sigma, 0.5) - released
    assert np.allclose(added, 0.5 * sigma**2 * D / signal * name)
    assert np.array_equal(with_label_prior(released, name, sigma, 0.0), released)


def test_cells_take_the_prior_by_their_own_noise() -> None:
    rng = np.random.default_rng(3)
    name = unit_rows(rng, 1)[0]
    total = rng.normal(0.0, 1.0, D) + 100 * name
    cells = rng.normal(0.0, 2.0, (3, D)) + 30 * name
    event = planned("gaussian", 1.0, multiplier=2.0, dimension=3 * D, mechanism=CELLS)
    sigma_total = (3.0**-2 + 1 / (3 * 2.0**2)) ** -0.5  # σ₁ = 3 and three cells of σ₂ = 2
    mixture = CellMixture("a", cells, np.full(3, 1 / 3), total, event, sigma_total)
    out = cells_with_label_prior(mixture, name, 0.5)
    assert np.allclose(out.total, with_label_prior(total, name, sigma_total, 0.5))
    assert np.allclose(out.directions[1], with_label_prior(cells[1], name, 2.0, 0.5))
    one = CellMixture("a", total[None, :], np.ones(1), total, event, sigma_total)
    single = cells_with_label_prior(one, name, 0.5)
    assert np.array_equal(single.directions[0], single.total)


@pytest.mark.parametrize("value", [-0.1, 101.0, float("nan"), "a"])
def test_a_bad_label_prior_names_its_field(value: Any) -> None:
    cfg = GenerationConfig(epsilon=1.0, delta=1e-6, noise="gaussian", label_prior=value)
    assert invalid_field(cfg) == "label_prior"


def test_the_prior_spends_nothing_and_pulls_a_small_noisy_class_to_its_own_phrases() -> None:
    from tests.core.dpkps.test_pipeline import assert_same_releases, own_phrase_shares

    def config(label_prior: float) -> GenerationConfig:
        return GenerationConfig(
            epsilon=1.0, delta=1e-6, noise="gaussian", per_class=40, sequence_length=3,
            public_vocabulary_size=16, label_prior=label_prior, seed=5, consistency_filter=False,
        )  # fmt: skip

    # the prior's pull on the draws themselves (the consistency filter, on by default here,
    # could leave a class no sequence to measure in a noisy run without the names);
    # medians over 9 runs each: the names' gate (their agreement with the noisy releases)
    # leaves some runs with a weak prior, by design (200 runs: 15 under 0.7, the lowest 0.38),
    # so a median of 5 fails about once in 250 runs of the test; of 9, once in 4,000
    shares, plain = own_phrase_shares(config(0.0), runs=9)
    named_shares, named = own_phrase_shares(config(DEFAULT_LABEL_PRIOR), runs=9)
    without, with_names = float(np.median(shares)), float(np.median(named_shares))
    # the same releases at the same cost: the prior is post-processing
    assert_same_releases(plain, named)
    # 12 documents a class at ε = 1: the names ("cardiology", …) carry what the noise hides
    # (one run at a time, 60 runs without the names: 0.28–0.68 of a class's phrases its own,
    # median 0.48; 200 runs with them: median 0.93)
    assert with_names > without + 0.25, (with_names, without)
