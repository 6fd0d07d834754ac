"""The direct DP classifier of ``benchmarks/dp_reference.py`` (issue 16's reference): its
per-document bound, its noise on neighbouring corpora, its accounting and that it learns."""

from __future__ import annotations

import math

import dp_accounting
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
    subsampled_event,
    subsampled_noise_multiplier,
)
from benchmarks.paired import seeded_noise
from tests.core.privacy.test_neighbouring import DELTA, EPSILON, SIGMA_1, check_gaussian, projected
from tests.privacy_audit import estimate_epsilon_at_delta
from workers.privacy.calibration import gaussian_noise_multiplier
from workers.privacy.noise import gaussian_noise


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


def test_a_subsampled_steps_multiplier_is_the_smallest_the_accountant_certifies() -> None:
    # dp_accounting's PLD accountant certifies (ε, δ) at the multiplier, not 2 % below it;
    # its RDP accountant, another analysis of the same mechanism, agrees within its known
    # looseness; a sampling rate near 1 comes back to the full batch's multiplier; and a
    # smaller rate, or fewer steps, needs less noise (amplification by subsampling).
    relation = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE

    def pld_epsilon(sigma: float, rate: float, steps: int) -> float:
        accountant = dp_accounting.pld.PLDAccountant(relation)  # the default, finer grid
        accountant.compose(subsampled_event(sigma, rate, steps))
        return float(accountant.get_epsilon(1e-6))

    sigma = subsampled_noise_multiplier(epsilon=1.0, delta=1e-6, steps=16, rate=0.25)
    assert pld_epsilon(sigma, 0.25, 16) <= 1.0 < pld_epsilon(0.98 * sigma, 0.25, 16)
    rdp = dp_accounting.rdp.RdpAccountant(neighboring_relation=relation)
    rdp.compose(subsampled_event(sigma, 0.25, 16))
    assert 1.0 <= rdp.get_epsilon(1e-6) < 1.3
    full = gaussian_noise_multiplier(epsilon=1.0, delta=1e-6, steps=16)
    near = subsampled_noise_multiplier(epsilon=1.0, delta=1e-6, steps=16, rate=0.999)
    assert near == pytest.approx(full, rel=0.01)
    assert sigma < near
    assert subsampled_noise_multiplier(epsilon=1.0, delta=1e-6, steps=16, rate=0.05) < sigma
    assert subsampled_noise_multiplier(epsilon=1.0, delta=1e-6, steps=8, rate=0.25) < sigma
    with pytest.raises(ValueError, match="rate"):
        subsampled_noise_multiplier(epsilon=1.0, delta=1e-6, steps=8, rate=1.0)


def test_a_subsampled_step_reads_a_poisson_sample_and_takes_its_multiplier() -> None:
    x, y = toy(np.random.default_rng(5), per=200)
    settings = Settings(steps=1, lr=1.0, clip=10.0, batch=0.3)
    scales: list[float] = []

    def recorded(values: NDArray[np.float64], scale: float) -> NDArray[np.float64]:
        scales.append(scale)
        return opendp_noise(values, scale)

    dp_gradient_descent(x, y, 3, epsilon=1.0, delta=1e-6, settings=settings, noise=recorded)
    sigma = subsampled_noise_multiplier(epsilon=1.0, delta=1e-6, steps=1, rate=0.3)
    assert scales == pytest.approx([sigma * 10.0])

    def noise_free(seed: int) -> NDArray[np.float64]:
        return dp_gradient_descent(
            x,
            y,
            3,
            epsilon=math.inf,
            delta=1e-6,
            settings=settings,
            sampling=np.random.default_rng(seed),
        )

    # a seed repeats its sample; other seeds draw other samples
    assert noise_free(0) == pytest.approx(noise_free(0))
    assert len({noise_free(seed).tobytes() for seed in range(20)}) == 20
    # the sample's sum over q·n estimates the whole sum over n without bias
    whole = dp_gradient_descent(
        x, y, 3, epsilon=math.inf, delta=1e-6, settings=Settings(steps=1, lr=1.0, clip=10.0)
    )
    mean = np.mean([noise_free(100 + seed) for seed in range(400)], axis=0)
    assert np.abs(mean - whole).max() < 0.05 * np.abs(whole).max()


@pytest.mark.slow
def test_a_subsampled_step_on_neighbouring_corpora_stays_within_epsilon_delta() -> None:
    # The dominating pair of the Poisson-subsampled Gaussian: no row against one row whose
    # clipped gradient has norm clip. Without it each release is N(0, σ²); with it, with
    # probability q the row is read and the mean moves by clip. The privacy loss is
    # monotone along that move, so the tail events are the worst, as the estimator needs.
    # A σ/2 control (the same mixture, half the noise) must be caught.
    rate, clip = 0.2, 0.5
    empty_x, empty_y = np.zeros((0, 6)), np.zeros(0, dtype=np.int64)
    one_x, one_y = features(np.array([[0.0, 0.0, 0.0, 0.0, 1.0]])), np.zeros(1, dtype=np.int64)
    start = np.zeros((3, 6))
    raw = clipped_gradient_sum(empty_x, empty_y, start, clip).ravel()
    raw2 = clipped_gradient_sum(one_x, one_y, start, clip).ravel()
    assert np.linalg.norm(raw2 - raw) == pytest.approx(clip)
    sigma = subsampled_noise_multiplier(epsilon=EPSILON, delta=DELTA, steps=1, rate=rate)
    assert sigma < SIGMA_1  # amplified: less noise than one full-batch release

    def releases(add: bool, runs: int, factor: float) -> NDArray[np.float64]:
        # each run samples through the learner, which names its noise's scale; OpenDP's
        # noise of that scale (times ``factor``) is then drawn for all runs in one call
        sums: list[NDArray[np.float64]] = []
        scales: set[float] = set()

        def kept(values: NDArray[np.float64], scale: float) -> NDArray[np.float64]:
            sums.append(values.ravel())
            scales.add(scale)
            return values

        for _ in range(runs):
            dp_gradient_descent(
                one_x if add else empty_x,
                one_y if add else empty_y,
                3,
                epsilon=EPSILON,
                delta=DELTA,
                settings=Settings(steps=1, clip=clip, batch=rate),
                noise=kept,
            )
        assert list(scales) == [pytest.approx(sigma * clip)]
        stacked = np.stack(sums)
        noisy = gaussian_noise(stacked.ravel(), scale=factor * sigma * clip)
        return projected(list(noisy.reshape(stacked.shape)), raw, raw2)

    # the mixture's worst tails are thin: 20,000 runs a side (6,000 estimate about 0.6 ε)
    runs = 20_000
    loss = estimate_epsilon_at_delta(
        releases(False, runs, 1.0), releases(True, runs, 1.0), delta=DELTA
    )
    assert 0.7 * EPSILON < loss <= 1.3 * EPSILON
    control = estimate_epsilon_at_delta(
        releases(False, runs, 0.5), releases(True, runs, 0.5), delta=DELTA
    )
    assert control > 1.6 * EPSILON


@pytest.mark.parametrize(
    "bad", [Settings(steps=0), Settings(clip=0.0), Settings(batch=0.0), Settings(batch=1.5)]
)
def test_bad_settings_and_rows_outside_the_ball_are_refused(bad: Settings) -> None:
    x, y = toy(np.random.default_rng(4))
    with pytest.raises(ValueError):
        dp_gradient_descent(x, y, 3, epsilon=1.0, delta=1e-6, settings=bad)
    with pytest.raises(ValueError, match="norm"):
        dp_gradient_descent(2 * x, y, 3, epsilon=1.0, delta=1e-6, settings=Settings())
