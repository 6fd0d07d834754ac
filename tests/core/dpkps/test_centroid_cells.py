"""Cells: class centroids split into a mixture by a second release (issue 16, high ε).

The first release (a class's sum) places the cells; each unit joins its nearest cell and a
second Gaussian release gives the cells' sums (L2 Δ = 1: one unit, one cell). Fast tests
check the plan, the cell count rule, what the cells find and a run end to end; the
``slow`` one is the stochastic check on neighbouring corpora of ``test_neighbouring.py``:
the cells' release stays within (ε, δ) and a control with half the noise is caught.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import numpy as np
import pytest

from tests.core import dpkps
from tests.core.dpkps import LABELS
from tests.core.privacy.test_neighbouring import SIGMA_1, check_gaussian
from tests.privacy_audit import planned
from workers.errors import ConfigError
from workers.methods.dpkps.config import (
    CELLS_FROM_EPSILON,
    DEFAULT_CELLS,
    GenerationConfig,
    method_description,
)
from workers.methods.dpkps.density.cells import build_cell_structures, cell_centres, cell_count
from workers.methods.dpkps.density.centroid import CentroidKDE, build_centroid_structures
from workers.methods.dpkps.plan import CELLS, CLASS_COUNTS, KDE, plan
from workers.privacy.accountant import compose
from workers.privacy.events import PrivacyEvent


def config(**overrides: Any) -> GenerationConfig:
    """ε = 6 unless told: above the ε from which cells are planned."""
    return dpkps.config(**{"epsilon": 6.0, **overrides})


def test_cells_are_planned_from_epsilon_4_and_compose_to_the_budget() -> None:
    for epsilon in (0.25, 1.0, 2.0):
        p = plan(config(epsilon=epsilon), LABELS, 1000)
        assert config(epsilon=epsilon).cells == 1
        # the class sums, and the counts that set the default sample's rate (embed_sample)
        assert {e.mechanism for e in p.events} == {CLASS_COUNTS, KDE}
    for epsilon in (CELLS_FROM_EPSILON, 6.0):
        cfg = config(epsilon=epsilon)
        p = plan(cfg, LABELS, 1000)
        assert cfg.cells == DEFAULT_CELLS
        cells = [e for e in p.events if e.mechanism == CELLS]
        sums = [e for e in p.events if e.mechanism == KDE]
        assert len(cells) == len(sums) == len(LABELS)  # one each per class, in parallel
        assert {e.partition for e in cells} == set(LABELS)
        assert all(e.dimension == DEFAULT_CELLS * 384 and e.sensitivity == 1 for e in cells)
        # μ² split: the class sum cell_share of the KDE's, the cells the rest
        mu2_sum, mu2_cells = (sums[0].sensitivity / sums[0].scale) ** 2, cells[0].scale ** -2
        assert mu2_sum / (mu2_sum + mu2_cells) == pytest.approx(cfg.cell_share, rel=1e-6)
        # what the ledger sees, composing the events alone, is the plan's ε ≤ ε
        assert compose(p.events).epsilon(1e-6) == p.epsilon <= Decimal(str(epsilon))
        assert float(p.epsilon) == pytest.approx(epsilon, rel=1e-3)
    assert "up to 8 cells by a second release" in method_description(config(epsilon=6.0))
    assert "cells" not in method_description(config(epsilon=1.0))
    # one cell asked for: the single release of the whole KDE share, as before cells
    one = plan(config(centroid_cells=1, embed_sample=0), LABELS, 1000)
    assert {e.mechanism for e in one.events} == {KDE}


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"centroid_cells": 0}, "centroid_cells"),
        ({"centroid_cells": 65}, "centroid_cells"),
        ({"centroid_cells": 4, "kde_method": "moments"}, "centroid_cells"),
        ({"centroid_cells": 2, "kde_method": "exact"}, "centroid_cells"),
        ({"cell_share": 0.0}, "cell_share"),
        ({"cell_share": 1.0}, "cell_share"),
        ({"cell_kappa": -1.0}, "cell_kappa"),
    ],
)
def test_bad_cell_settings_name_their_field(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        config(**overrides)
    assert info.value.field == field


def test_the_cell_count_keeps_each_cell_kappa_noise_norms_above_its_noise() -> None:
    d = 16
    released = np.full(d, 10.0)  # norm 40
    assert cell_count(released, 0.0, 1.0, max_cells=64, kappa=1.0) == 10  # 40 / (1·1·4)
    assert cell_count(released, 0.0, 1.0, max_cells=8, kappa=1.0) == 8
    assert cell_count(released, 0.0, 1.0, max_cells=64, kappa=2.0) == 5
    assert cell_count(released, 0.0, 20.0, max_cells=64, kappa=1.0) == 1  # never below 1
    # the first release's own noise energy is taken off: norm √(1600 − 16·9) ≈ 38.2
    assert cell_count(released, 3.0, 1.0, max_cells=64, kappa=1.0) == 9


def two_topics(rng: np.random.Generator, per: int) -> tuple[np.ndarray, np.ndarray]:
    """Unit rows around two directions of a class, and phrases around each (public)."""
    d = 8
    axes = np.eye(d)[:2]
    rows = np.vstack([axes[k] + 0.1 * rng.normal(size=(per, d)) for k in (0, 1)])
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    phrases = np.vstack([axes[k] + 0.2 * rng.normal(size=(50, d)) for k in (0, 1)])
    phrases = np.vstack([phrases, rng.normal(size=(100, d))])
    phrases /= np.linalg.norm(phrases, axis=1, keepdims=True)
    return rows, phrases


def releases(
    rows: np.ndarray, multiplier: float, cells: int
) -> tuple[list[CentroidKDE], PrivacyEvent]:
    """The first release of ``rows`` (one class "a"), and the planned cells' release."""
    first_event = planned("gaussian", 1.0, multiplier=multiplier, dimension=8, mechanism=KDE)
    first = build_centroid_structures([("a", rows)], planned=first_event)
    dimension = cells * 8
    return first, planned(
        "gaussian", 1.0, multiplier=multiplier, dimension=dimension, mechanism=CELLS
    )


def test_cells_find_the_directions_a_class_takes_and_keep_its_sum() -> None:
    rng = np.random.default_rng(0)
    rows, phrases = two_topics(rng, per=30)
    first, cells_event = releases(rows, 1e-6, cells=2)
    (mixture,) = build_cell_structures(
        [("a", rows)], first, phrases, planned=cells_event, max_cells=2, kappa=1.0, seed=0
    )
    assert mixture.directions.shape == (2, 8) and mixture.event.partition == "a"
    units = mixture.directions / np.linalg.norm(mixture.directions, axis=1, keepdims=True)
    # one cell per topic, each holding its 30 rows: even weights
    assert sorted(int(np.argmax(np.abs(u))) for u in units) == [0, 1]
    assert mixture.weights == pytest.approx([0.5, 0.5], abs=0.05)
    assert mixture.total == pytest.approx(rows.sum(axis=0), abs=1e-3)
    # centres come from the public phrases near the released sum, and are seeded
    again = cell_centres(first[0].noisy_sum, phrases, 2, seed=0)
    assert again == pytest.approx(cell_centres(first[0].noisy_sum, phrases, 2, seed=0))


def test_one_cell_combines_both_releases_into_the_class_sum() -> None:
    rng = np.random.default_rng(1)
    rows, phrases = two_topics(rng, per=5)
    sigma = 0.5
    noisy = planned("gaussian", 1.0, multiplier=sigma, dimension=8, mechanism=KDE)
    cells_event = planned("gaussian", 1.0, multiplier=sigma, dimension=4 * 8, mechanism=CELLS)
    errors_first, errors_total = [], []
    for _ in range(400):
        first = build_centroid_structures([("a", rows)], planned=noisy)
        # max_cells 4, but a κ this large leaves one cell: the class sum measured twice
        (mixture,) = build_cell_structures(
            [("a", rows)], first, phrases, planned=cells_event, max_cells=4, kappa=1e3, seed=0
        )
        assert mixture.directions.shape == (1, 8)
        errors_first.append(np.sum((first[0].noisy_sum - rows.sum(axis=0)) ** 2))
        errors_total.append(np.sum((mixture.total - rows.sum(axis=0)) ** 2))
    # two equal-noise measurements averaged: half the squared error of one
    assert np.mean(errors_total) / np.mean(errors_first) == pytest.approx(0.5, abs=0.08)
    # and the mixture carries that combined noise: σ² / 2 per coordinate
    assert mixture.total_scale == pytest.approx(sigma / np.sqrt(2.0))


def test_a_unit_moves_the_cells_release_by_at_most_one() -> None:
    rng = np.random.default_rng(2)
    rows, phrases = two_topics(rng, per=20)
    first, cells_event = releases(rows, 1e-9, cells=3)

    def release(data: np.ndarray) -> np.ndarray:
        (m,) = build_cell_structures(
            [("a", data)], first, phrases, planned=cells_event, max_cells=3, kappa=0.5, seed=0
        )
        assert len(m.directions) == 3
        return m.directions.ravel()

    base = release(rows)
    for extra in (rows[0], 3.0 * rows[5], np.eye(8)[7]):  # a row above norm 1 is clipped
        moved = release(np.vstack([rows, extra]))
        assert np.linalg.norm(moved - base) <= 1 + 1e-6


def test_cells_need_gaussian_noise_and_the_first_release_of_the_same_class() -> None:
    rows = np.eye(4)[:2]
    event = planned("gaussian", 1.0, multiplier=1.0, dimension=4)
    first = [CentroidKDE("a", rows.sum(axis=0), event)]
    laplace = planned("laplace", 1.0, epsilon=1.0, dimension=8)
    with pytest.raises(ConfigError):
        build_cell_structures([("a", rows)], first, np.eye(4), planned=laplace, max_cells=2,
                              kappa=1.0, seed=0)  # fmt: skip
    gaussian = planned("gaussian", 1.0, multiplier=1.0, dimension=8)
    with pytest.raises(ConfigError):
        build_cell_structures([("b", rows)], first, np.eye(4), planned=gaussian, max_cells=2,
                              kappa=1.0, seed=0)  # fmt: skip


def test_a_run_with_cells_makes_the_planned_releases_within_its_budget() -> None:
    from tests.core.dpkps.test_pipeline import TOPICS, run_on_topics

    cfg = config(
        public_vocabulary_size=16, sequence_length=3, per_class=12, centroid_cells=3, cell_kappa=0.1
    )
    result, _ = run_on_topics(cfg, per_class=30)
    assert result.report.as_planned and float(result.report.epsilon) <= 6.0
    assert [e.mechanism for e in result.report.events].count(CELLS) == len(TOPICS)
    assert len(result.sequences) == 12 * len(TOPICS)
    by_label: dict[str, list[str]] = {label: [] for label in TOPICS}
    for s in result.sequences:
        by_label[s.label].extend(s.keyphrases)
    # at ε = 6 on 30 documents a class, a class's sequences hold mostly its own phrases
    for label, words in TOPICS.items():
        own = sum(p in words for p in by_label[label]) / len(by_label[label])
        assert own > 0.5, (label, own)


# ------------------------------------------------------- stochastic, neighbouring corpora


@pytest.mark.slow
def test_cells_release_within_epsilon_delta() -> None:
    # Adaptive composition: the cells are placed by the first release's output, so the
    # second release is checked for a fixed first output. The added unit joins one cell.
    rng = np.random.default_rng(3)
    rows, phrases = two_topics(rng, per=10)
    rows, phrases = rows[:, :3], phrases[:, :3]
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    phrases /= np.linalg.norm(phrases, axis=1, keepdims=True)
    first_event = planned("gaussian", 1.0, multiplier=1.0, dimension=3, mechanism=KDE)
    first = [CentroidKDE("a", rows.sum(axis=0), first_event)]
    added = np.array([[0.0, 0.0, 1.0]])
    cells_event = planned("gaussian", 1.0, multiplier=SIGMA_1, dimension=2 * 3, mechanism=CELLS)
    centres = cell_centres(first[0].noisy_sum, phrases, 2, seed=0)

    def raw(data: np.ndarray) -> np.ndarray:
        out = np.zeros((2, 3))
        np.add.at(out, (data @ centres.T).argmax(axis=1), data)
        return out.ravel()

    def draw(add: bool) -> np.ndarray:
        data = np.vstack([rows, added]) if add else rows
        (m,) = build_cell_structures(
            [("a", data)], first, phrases, planned=cells_event, max_cells=2, kappa=0.01, seed=0
        )
        return m.directions.ravel()

    base, moved = raw(rows), raw(np.vstack([rows, added]))
    assert np.linalg.norm(moved - base) == pytest.approx(1.0)
    check_gaussian(draw, base, moved, SIGMA_1)
