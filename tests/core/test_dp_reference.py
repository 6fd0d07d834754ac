"""The direct DP classifier of ``benchmarks/dp_reference.py`` (issue 16's reference): its
per-document bound, its noise on neighbouring corpora, its accounting and that it learns."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from numpy.typing import NDArray

from benchmarks.dp_reference import (
    Settings,
    clipped_gradient_sum,
    dp_gradient_descent,
    features,
    opendp_noise,
)
from benchmarks.paired import seeded_noise
from tests.core.test_neighbouring import DELTA, EPSILON, SIGMA_1, check_gaussian
from workers.privacy.calibration import gaussian_noise_multiplier


def toy(rng: np.random.Generator, per: int = 30) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """Three classes around three orthogonal directions, rows of norm ≤ 1 with the bias."""
    centres = np.eye(3, 5)
    rows = np.vstack([c + 0.15 * rng.normal(size=(per, 5)) for c in centres])
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    return features(rows), np.repeat(np.arange(3), per)


def test_features_keep_every_row_with_its_bias_within_the_unit_ball() -> None:
    x = features(np.array([[3.0, 4.0], [0.0, 0.5], [0.0, 0.0]]))
    assert np.linalg.norm(x, axis=1).max() <= 1.0 + 1e-12
    assert x[:, -1] == pytest.approx(np.full(3, 1 / math.sqrt(2)))
    assert x[0, :2] == pytest.approx(np.array([0.6, 0.8]) / math.sqrt(2))


def test_the_clipped_sum_is_the_cross_entropy_gradient_and_one_row_moves_it_at_most_clip() -> None:
    rng = np.random.default_rng(0)
    x, y = toy(rng)
    w = rng.normal(size=(3, x.shape[1]))
    # unclipped: the gradient of the summed cross-entropy (autograd)
    tw = torch.tensor(w, requires_grad=True)
    loss = torch.nn.functional.cross_entropy(
        torch.tensor(x) @ tw.T, torch.tensor(y), reduction="sum"
    )
    loss.backward()
    assert tw.grad is not None
    assert clipped_gradient_sum(x, y, w, clip=10.0) == pytest.approx(tw.grad.numpy())
    # clipped: every row's share has norm ≤ clip, so a neighbour moves the sum by ≤ clip
    for i in range(len(x)):
        alone = clipped_gradient_sum(x[i : i + 1], y[i : i + 1], w, clip=0.1)
        assert np.linalg.norm(alone) <= 0.1 + 1e-12
        without = clipped_gradient_sum(np.delete(x, i, 0), np.delete(y, i), w, clip=0.1)
        assert np.linalg.norm(clipped_gradient_sum(x, y, w, clip=0.1) - without) <= 0.1 + 1e-12


def test_each_step_takes_the_accountants_noise_for_its_number_of_steps() -> None:
    rng = np.random.default_rng(1)
    x, y = toy(rng)
    scales: list[float] = []

    def recorded(values: NDArray[np.float64], scale: float) -> NDArray[np.float64]:
        scales.append(scale)
        return opendp_noise(values, scale)

    settings = Settings(steps=4, lr=2.0, clip=0.5)
    dp_gradient_descent(x, y, 3, epsilon=1.0, delta=1e-6, settings=settings, noise=recorded)
    sigma = gaussian_noise_multiplier(epsilon=1.0, delta=1e-6, steps=4)
    assert scales == pytest.approx([sigma * 0.5] * 4)
    # four steps at (1, 1e-6) need more noise per step than one, less than four separate ε/4
    assert sigma > gaussian_noise_multiplier(epsilon=1.0, delta=1e-6, steps=1)
    assert sigma < gaussian_noise_multiplier(epsilon=0.25, delta=1e-6 / 4, steps=1)


@pytest.mark.slow
def test_a_step_on_neighbouring_corpora_stays_within_epsilon_delta() -> None:
    # One step at (EPSILON, DELTA); the added row's gradient is larger than the clip, so
    # the neighbouring sums differ by exactly the clip. A σ/2 control must be caught.
    rng = np.random.default_rng(2)
    x, y = toy(rng, per=4)
    added_x = features(np.array([[0.0, 0.0, 0.0, 0.0, 1.0]]))
    x2, y2 = np.vstack([x, added_x]), np.append(y, 0)
    clip = 0.5
    start = np.zeros((3, x.shape[1]))
    raw = clipped_gradient_sum(x, y, start, clip)
    raw2 = clipped_gradient_sum(x2, y2, start, clip)
    assert np.linalg.norm(raw2 - raw) == pytest.approx(clip)
    assert gaussian_noise_multiplier(epsilon=EPSILON, delta=DELTA, steps=1) == pytest.approx(
        SIGMA_1, rel=1e-3
    )

    def draw(add: bool) -> NDArray[np.float64]:
        released: list[NDArray[np.float64]] = []

        def kept(values: NDArray[np.float64], scale: float) -> NDArray[np.float64]:
            released.append(opendp_noise(values, scale))
            return released[-1]

        dp_gradient_descent(
            x2 if add else x,
            y2 if add else y,
            3,
            epsilon=EPSILON,
            delta=DELTA,
            settings=Settings(steps=1, clip=clip),
            noise=kept,
        )
        return released[0].ravel()

    check_gaussian(draw, raw.ravel(), raw2.ravel(), SIGMA_1 * clip)


def test_it_learns_without_noise_and_with_a_little_and_a_seeded_draw_repeats() -> None:
    rng = np.random.default_rng(3)
    x, y = toy(rng)
    settings = Settings(steps=8, lr=8.0)

    def accuracy(weights: NDArray[np.float64]) -> float:
        return float(((x @ weights.T).argmax(axis=1) == y).mean())

    assert (
        accuracy(dp_gradient_descent(x, y, 3, epsilon=math.inf, delta=1e-6, settings=settings))
        == 1.0
    )
    large = dp_gradient_descent(x, y, 3, epsilon=10.0, delta=1e-6, settings=settings)
    assert accuracy(large) > 0.95
    runs = []
    for _ in range(2):
        with seeded_noise(7):
            runs.append(dp_gradient_descent(x, y, 3, epsilon=1.0, delta=1e-6, settings=settings))
    first, second = runs
    assert first == pytest.approx(second)


@pytest.mark.parametrize("bad", [Settings(steps=0), Settings(clip=0.0)])
def test_bad_settings_and_rows_outside_the_ball_are_refused(bad: Settings) -> None:
    x, y = toy(np.random.default_rng(4))
    with pytest.raises(ValueError):
        dp_gradient_descent(x, y, 3, epsilon=1.0, delta=1e-6, settings=bad)
    with pytest.raises(ValueError, match="norm"):
        dp_gradient_descent(2 * x, y, 3, epsilon=1.0, delta=1e-6, settings=Settings())
