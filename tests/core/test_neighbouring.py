"""Statistical checks on neighbouring corpora: each mechanism's output stays within its ε.

For every mechanism we run it many times on a corpus ``D`` and on ``D`` plus one
adversarially chosen document, and estimate the privacy loss from the two output
samples (see ``tests/privacy_audit.py``). A control run of the same estimator on the
same mechanism with its noise scale halved shows that the test has the power to catch
a noise scale that is too small by a factor of two.
"""

from __future__ import annotations

import math

import numpy as np
import opendp.prelude as dp
import pytest
import torch

from tests.privacy_audit import estimate_privacy_loss
from workers.dpkps.features import RandomFourierFeatures
from workers.dpkps.kde import (
    ExactKernel,
    bag_sum,
    build_exact_structure,
    build_structure,
    phrase_weights,
)
from workers.dpkps.private_vocab import phrase_histogram, select_private_vocabulary
from workers.dpkps.proportions import noisy_class_counts

RUNS = 6000
pytestmark = pytest.mark.slow


def halved_scale_control(raw: np.ndarray, raw_neighbour: np.ndarray, scale: float) -> float:
    """The estimator on a broken mechanism: OpenDP Laplace at half the right scale."""
    integer = raw.dtype.kind == "i"
    atom = dp.atom_domain(T=int) if integer else dp.atom_domain(T=float, nan=False)
    metric = dp.l1_distance(T=int) if integer else dp.l1_distance(T=float)
    meas = dp.m.make_laplace(dp.vector_domain(atom), metric, scale=scale / 2)
    cast = int if integer else float
    x = [meas([cast(v) for v in raw])[0] for _ in range(RUNS)]
    y = [meas([cast(v) for v in raw_neighbour])[0] for _ in range(RUNS)]
    return estimate_privacy_loss(np.array(x), np.array(y))


def test_vocabulary_histogram_within_epsilon() -> None:
    epsilon, s = 1.0, 4
    corpus = [[0, 1, 2], [1, 1], [2]]
    neighbour = [*corpus, [0] * 10]  # the first S matches all land on phrase 0

    def count_of_phrase0(docs: list[list[int]]) -> float:
        chosen = select_private_vocabulary(
            docs, vocabulary_size=3, size=3, epsilon=epsilon, max_per_document=s
        )
        return float(chosen.noisy_counts[list(chosen.indices).index(0)])

    x = np.array([count_of_phrase0(corpus) for _ in range(RUNS)])
    y = np.array([count_of_phrase0(neighbour) for _ in range(RUNS)])
    loss = estimate_privacy_loss(x, y)
    assert 0.75 * epsilon < loss <= 1.3 * epsilon

    raw = phrase_histogram(corpus, vocabulary_size=3, max_per_document=s)[:1]
    raw2 = phrase_histogram(neighbour, vocabulary_size=3, max_per_document=s)[:1]
    assert halved_scale_control(raw, raw2, s / epsilon) > 1.6 * epsilon


@pytest.mark.parametrize("bound", [math.sqrt(2), 0.5])
def test_kde_structure_within_epsilon(bound: float) -> None:
    epsilon, features = 1.0, 1
    rff = RandomFourierFeatures(
        dim=8, num_features=features, max_blocks=1, seed=3, dtype=torch.float64
    )
    g = torch.Generator().manual_seed(0)
    cand = torch.nn.functional.normalize(
        torch.randn(4000, 8, generator=g, dtype=torch.float64), dim=1
    )
    phase = rff.project(cand, 0)[:, 0] + rff.beta[0]
    extreme = int(torch.argmax(torch.cos(phase).abs()))  # its feature is ≈ ±√2
    emb = torch.cat([cand[:5], cand[extreme : extreme + 1]])
    corpus = [[0, 1], [2], [3, 4]]
    neighbour = [*corpus, [5]]

    def release(docs: list[list[int]]) -> float:
        kde = build_structure(
            docs, emb, rff, label="a", blocks=0, num_features=features, epsilon=epsilon, bound=bound
        )
        return float(kde.noisy_sum[0])

    x = np.array([release(corpus) for _ in range(RUNS)])
    y = np.array([release(neighbour) for _ in range(RUNS)])
    loss = estimate_privacy_loss(x, y)
    assert 0.75 * epsilon < loss <= 1.3 * epsilon

    raw = bag_sum(corpus, emb, rff, num_features=features, max_phrases=32, bound=bound)
    raw2 = bag_sum(neighbour, emb, rff, num_features=features, max_phrases=32, bound=bound)
    assert abs(raw2[0] - raw[0]) > 0.99 * bound  # the added document moves the sum fully
    assert halved_scale_control(raw, raw2, bound * features / epsilon) > 1.6 * epsilon


def test_exact_kde_within_epsilon() -> None:
    # Two phrases with kernel value ≈ 0.6: the added document moves both densities, by
    # 1 and ≈ 0.6, so the L1 shift is the column sum Δ ≈ 1.6. The statistic is the
    # log-likelihood ratio of Laplace noise, which carries the whole shift.
    epsilon, sigma = 1.0, 1.0
    first = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    second = torch.tensor([[math.cos(0.74), math.sin(0.74)]], dtype=torch.float64)
    emb = torch.cat([first, second])
    kernel = ExactKernel(emb, sigma)
    delta = kernel.sensitivity
    assert 1.5 < delta < 1.7
    corpus = [[0, 1], [1]]
    neighbour = [*corpus, [0]]
    raw = kernel.density(phrase_weights(corpus, 2, max_phrases=8))
    raw2 = kernel.density(phrase_weights(neighbour, 2, max_phrases=8))
    assert np.abs(raw2 - raw).sum() == pytest.approx(delta, rel=1e-9)

    def statistic(release: np.ndarray) -> float:
        return float(np.abs(release - raw).sum() - np.abs(release - raw2).sum())

    def release(docs: list[list[int]]) -> float:
        kde = build_exact_structure(docs, kernel, label="a", epsilon=epsilon, max_phrases=8)
        return statistic(kde.noisy_density)

    x = np.array([release(corpus) for _ in range(RUNS)])
    y = np.array([release(neighbour) for _ in range(RUNS)])
    loss = estimate_privacy_loss(x, y)
    assert 0.75 * epsilon < loss <= 1.3 * epsilon

    half = dp.m.make_laplace(
        dp.vector_domain(dp.atom_domain(T=float, nan=False)),
        dp.l1_distance(T=float),
        scale=delta / epsilon / 2,
    )
    cx = np.array([statistic(np.array(half(raw.tolist()))) for _ in range(RUNS)])
    cy = np.array([statistic(np.array(half(raw2.tolist()))) for _ in range(RUNS)])
    assert estimate_privacy_loss(cx, cy) > 1.6 * epsilon


def test_class_counts_within_epsilon() -> None:
    epsilon = 0.7
    labels = ["a"] * 12 + ["b"] * 5

    def count_a(ls: list[str]) -> float:
        return float(noisy_class_counts(ls, label_set=["a", "b"], epsilon=epsilon)[0]["a"])

    x = np.array([count_a(labels) for _ in range(RUNS)])
    y = np.array([count_a([*labels, "a"]) for _ in range(RUNS)])
    loss = estimate_privacy_loss(x, y)
    assert 0.75 * epsilon < loss <= 1.3 * epsilon
    assert halved_scale_control(np.array([12]), np.array([13]), 1 / epsilon) > 1.6 * epsilon
