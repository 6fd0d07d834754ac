"""The dry run's verdict (app.jobs.verdict): the class signal against the planned noise,
its band, and the smallest ε on the grid that makes it strong, on real plans."""

from __future__ import annotations

import pytest

from app.jobs.schemas import JobSpec
from app.jobs.verdict import MODERATE, STRONG, level, signal_to_noise, verdict
from workers.methods.registry import METHODS


def _events(epsilon: float, classes: int) -> list:  # type: ignore[type-arg]
    spec = JobSpec(
        epsilon=epsilon, delta=1e-6, llm="none", vocabulary="english", document_type="note"
    )
    labels = [f"c{i}" for i in range(classes)]
    return METHODS["dpkps"].plan(spec.params(), labels, 30_000)


def test_the_ratio_is_documents_a_class_over_the_density_sigma() -> None:
    events = _events(1.0, 4)
    sigma = max(e.scale for e in events if e.mechanism == "kde")
    # the analytic Gaussian σ at ε = 1 (4.2247), √1.01 larger: the class counts that set the
    # default sample's rate take 1 % of μ²
    assert sigma == pytest.approx(4.2457, abs=1e-3)
    assert signal_to_noise(events, 400, 4) == pytest.approx(100 / sigma)
    assert signal_to_noise([], 400, 4) is None


@pytest.mark.parametrize(
    ("ratio", "band"),
    [
        (STRONG, "strong"),
        (STRONG - 0.01, "moderate"),
        (MODERATE, "moderate"),
        (MODERATE - 0.01, "weak"),
        (0.5, "weak"),
    ],
)
def test_bands(ratio: float, band: str) -> None:
    assert level(ratio) == band


def test_a_moderate_plan_names_the_epsilon_that_makes_it_strong() -> None:
    # 100 documents a class at ε = 1: 100 / 4.25 = 23.6, moderate; at ε = 2, σ = 2.24: strong
    found = verdict(
        _events(1.0, 24),
        documents=2400,
        classes=24,
        epsilon=1.0,
        replan=lambda eps: _events(eps, 24),
    )
    assert found is not None
    assert found.level == "moderate"
    assert found.epsilon_for_strong == 2.0
    assert "ε = 2 would bring the ratio to 25" in found.summary
    assert found.observed_fraction_of_real == (0.66, 0.91)


def test_a_strong_plan_asks_for_nothing_more_and_a_per_mechanism_budget_names_no_epsilon() -> None:
    strong = verdict(_events(1.0, 4), documents=3000, classes=4, epsilon=1.0, replan=None)
    assert strong is not None and strong.level == "strong"
    assert strong.epsilon_for_strong is None and "would bring" not in strong.summary
    weak = verdict(_events(1.0, 4), documents=40, classes=4, epsilon=None, replan=None)
    assert weak is not None and weak.level == "weak"
    assert "would bring" not in weak.summary and "No ε" not in weak.summary
