"""The low-ε benchmark's limits diagnostic: each document's margin and the noise on it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from benchmarks import bench_low_epsilon as bench
from workers.methods.dpkps.config import LowEpsilonConfig
from workers.methods.dpkps.plan import CELLS, KDE, plan

LABELS = ["a", "b", "c"]


def test_margin_is_own_class_left_out_minus_the_other_classes_mean() -> None:
    e = np.eye(3)
    x = np.stack([e[0], e[0], e[1], e[1], e[1], e[2]])
    labels = ["a", "a", "a", "b", "b", "c"]
    margin, size = bench.score_margins(x, labels)
    # row 0 (a, e0): own mean without it (e0 + e1) / 2 scores 0.5; b's mean e1 and c's e2
    # score 0: margin 0.5. Row 2 (a, e1): own (e0 + e0) / 2 scores 0; b scores 1, c 0.
    # Row 3 (b, e1): own e1 scores 1; a's mean (2e0 + e1) / 3 scores 1/3, c 0.
    # Row 5 (c, e2), a class of one: nothing left, own 0; a and b score 0.
    np.testing.assert_allclose(margin, [0.5, 0.5, -0.5, 1 - 1 / 6, 1 - 1 / 6, 0.0])
    np.testing.assert_array_equal(size, [3, 3, 3, 2, 2, 1])


@pytest.mark.parametrize("epsilon", [1.0, 6.0])
def test_class_sum_noise_is_the_plans_sigma_both_releases_combined(epsilon: float) -> None:
    config = LowEpsilonConfig(
        epsilon=epsilon, delta=1e-6, noise="gaussian", per_class=None, total=2000
    ).validate()
    the_plan = plan(config, LABELS, 30_000)
    sigma = bench.class_sum_noise(config, LABELS, 30_000)
    first = the_plan.noise_per_sensitivity(KDE)
    if config.cells > 1:  # from ε = 4 on: a class with one cell reads both releases
        second = the_plan.noise_per_sensitivity(CELLS)
        assert sigma == pytest.approx(1 / math.sqrt(first**-2 + second**-2))
        assert sigma < min(first, second)
    else:
        assert all(e.mechanism != CELLS for e in the_plan.events)
        assert sigma == first
    # a larger budget never adds noise
    assert (
        bench.class_sum_noise(
            LowEpsilonConfig(
                epsilon=1.5 * epsilon, delta=1e-6, noise="gaussian", per_class=None, total=2000
            ).validate(),
            LABELS,
            30_000,
        )
        < sigma
    )
