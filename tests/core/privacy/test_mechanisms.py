"""Sensitivity and noise scale of every mechanism, checked against what the code does.

Each test would fail if the mechanism's contribution bound (sensitivity) or the scale
of the noise it draws were wrong: the sensitivity is checked by adding adversarial
documents to a corpus and measuring how far the raw aggregate moves, the scale by
measuring the spread of the noise the mechanism actually added.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tests.privacy_audit import planned
from workers.errors import ConfigError
from workers.methods.dpkps.config import GenerationConfig
from workers.methods.dpkps.density.common import kde_sensitivity
from workers.methods.dpkps.density.exact import ExactKernel, build_exact_structure, phrase_weights
from workers.methods.dpkps.density.random_features import (
    bag_sum,
    build_class_ensemble,
    build_structure,
    sequence_sum,
)
from workers.methods.dpkps.features import RandomFourierFeatures
from workers.methods.dpkps.noise import release_counts, release_vector
from workers.methods.dpkps.private_vocab import phrase_histogram, select_private_vocabulary
from workers.methods.dpkps.proportions import noisy_class_counts


def discrete_laplace_std(scale: float) -> float:
    """Standard deviation of the discrete Laplace distribution with parameter ``scale``."""
    q = math.exp(-1.0 / scale)
    return math.sqrt(2.0 * q) / (1.0 - q)


def unit_rows(n: int, d: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.nn.functional.normalize(torch.randn(n, d, generator=g, dtype=torch.float64), dim=1)


# ---------------------------------------------------------------- OpenDP wrappers


@pytest.mark.parametrize("epsilon", [0.5, 2.0])
def test_discrete_laplace_has_scale_sensitivity_over_epsilon(epsilon: float) -> None:
    plan = planned("discrete_laplace", 1.0, epsilon=epsilon, dimension=40_000)
    noisy, spend = release_counts(np.zeros(40_000, dtype=np.int64), plan, sensitivity=5, name="t")
    assert spend.scale == pytest.approx(5 / epsilon, rel=1e-9)
    assert float(spend.epsilon) == pytest.approx(epsilon, rel=1e-9)
    assert noisy.std() == pytest.approx(discrete_laplace_std(5 / epsilon), rel=0.04)
    assert abs(noisy.mean()) < 0.1 * noisy.std()


def test_float_laplace_has_scale_sensitivity_over_epsilon() -> None:
    plan = planned("laplace", 1.0, epsilon=1.5, dimension=40_000)
    noisy, spend = release_vector(np.zeros(40_000), plan, sensitivity=3.0, name="t")
    assert spend.scale == pytest.approx(2.0, rel=1e-5)
    assert float(spend.epsilon) == pytest.approx(1.5, rel=1e-9)
    # mean absolute deviation of Laplace(b) is b
    assert np.abs(noisy).mean() == pytest.approx(2.0, rel=0.03)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan, 2e-9, 9.9e-4, 100.5])
def test_epsilon_must_lie_between_the_floor_and_the_ceiling(bad: float) -> None:
    with pytest.raises(ConfigError, match=r"between 0\.001 and 100") as err:
        GenerationConfig(epsilon_vocab=1.0, epsilon_kde=bad).validate()
    assert err.value.field == "epsilon_kde"
    with pytest.raises(ConfigError, match=r"between 0\.001 and 100") as err:
        GenerationConfig(epsilon=bad, delta=1e-6, noise="gaussian").validate()
    assert err.value.field == "epsilon"


# ---------------------------------------------------------------- vocabulary histogram


def test_histogram_counts_first_s_matches_with_repeats() -> None:
    docs = [[0, 0, 1, 2, 3], [3], []]
    h = phrase_histogram(docs, vocabulary_size=5, max_per_document=3)
    assert h.tolist() == [2, 1, 0, 1, 0]


def test_histogram_sensitivity_is_s() -> None:
    rng = np.random.default_rng(0)
    base = [list(rng.integers(0, 50, size=rng.integers(0, 30))) for _ in range(100)]
    s = 7
    h = phrase_histogram(base, vocabulary_size=50, max_per_document=s)
    worst = 0
    for _ in range(200):
        extra = list(rng.integers(0, 50, size=rng.integers(0, 40)))
        h2 = phrase_histogram([*base, extra], vocabulary_size=50, max_per_document=s)
        worst = max(worst, int(np.abs(h2 - h).sum()))
    assert worst == s  # bounded by S, and the bound is reached


@pytest.mark.parametrize(("s", "epsilon"), [(4, 1.0), (10, 3.0)])
def test_private_vocabulary_noise_scale(s: int, epsilon: float) -> None:
    # Keep every entry, so the noisy counts of an empty corpus are the noise itself.
    size = 30_000
    chosen = select_private_vocabulary(
        [[1]],
        vocabulary_size=size,
        size=size,
        planned=planned("discrete_laplace", s, epsilon=epsilon, dimension=size),
        max_per_document=s,
    )
    assert chosen.event.sensitivity == s
    assert chosen.event.scale == pytest.approx(s / epsilon, rel=1e-9)
    assert chosen.event.dimension == size  # every public phrase is noised, zeros included
    noise = chosen.noisy_counts.astype(float)
    noise[chosen.indices == 1] -= 1
    assert noise.std() == pytest.approx(discrete_laplace_std(s / epsilon), rel=0.05)


def test_private_vocabulary_keeps_largest_noisy_counts() -> None:
    docs = [[0] * 10 for _ in range(500)] + [[1] * 10 for _ in range(300)]
    chosen = select_private_vocabulary(
        docs,
        vocabulary_size=1000,
        size=2,
        planned=planned("discrete_laplace", 10, epsilon=5.0, dimension=1000),
        max_per_document=10,
    )
    assert chosen.indices.tolist() == [0, 1]
    assert list(chosen.noisy_counts) == sorted(chosen.noisy_counts, reverse=True)


def test_private_vocabulary_larger_than_public_is_refused() -> None:
    with pytest.raises(ConfigError) as err:
        select_private_vocabulary(
            [[0]],
            vocabulary_size=10,
            size=11,
            planned=planned("discrete_laplace", 1, epsilon=1.0, dimension=10),
            max_per_document=1,
        )
    assert err.value.field == "vocabulary_size"


# ---------------------------------------------------------------- DP-KDE


@pytest.mark.parametrize("blocks", [0, 1, 3])
def test_kde_sum_sensitivity_is_sqrt2_times_features(blocks: int) -> None:
    emb = unit_rows(40, 8, 1)
    rff = RandomFourierFeatures(dim=8, num_features=64, max_blocks=3, seed=2, dtype=torch.float64)
    rng = np.random.default_rng(3)
    docs = [list(rng.permutation(40)[: rng.integers(1, 6)]) for _ in range(30)]

    def raw(corpus: list[list[int]]) -> np.ndarray:
        if blocks == 0:
            return bag_sum(corpus, emb, rff, num_features=64, max_phrases=4)
        return sequence_sum(corpus, emb, rff, num_features=64, blocks=blocks)

    base = raw(docs)
    worst = max(
        float(np.abs(raw([*docs, list(rng.permutation(40)[:5])]) - base).sum()) for _ in range(50)
    )
    bound = kde_sensitivity(64)
    assert bound == pytest.approx(math.sqrt(2) * 64)
    assert worst <= bound
    assert worst > 0.4 * bound  # one document really moves the sum by O(√2·I)


def test_one_document_contributes_one_bounded_vector_however_long() -> None:
    emb = unit_rows(100, 8, 4)
    rff = RandomFourierFeatures(dim=8, num_features=32, max_blocks=1, seed=5, dtype=torch.float64)
    long_doc = [list(range(100))]
    total = bag_sum(long_doc, emb, rff, num_features=32, max_phrases=1000)
    assert np.abs(total).max() <= math.sqrt(2) + 1e-12


@pytest.mark.parametrize(
    ("mode", "ensemble", "length", "n_structures"),
    [
        ("independent", "log", 6, 1),
        ("iterative", "log", 6, 4),  # blocks 1, 2, 4, 6
        ("iterative", "linear", 6, 6),
    ],
)
def test_kde_noise_scale_and_ensemble_split(
    mode: str, ensemble: str, length: int, n_structures: int
) -> None:
    emb = unit_rows(20, 8, 6)
    features = 4096
    rff = RandomFourierFeatures(dim=8, num_features=features, max_blocks=length, seed=7)
    structures = build_class_ensemble(
        [],
        emb.float(),
        rff,
        label="a",
        mode=mode,
        ensemble=ensemble,
        length=length,
        planned=planned(
            "laplace", 1.0, epsilon=3.0 / n_structures, dimension=features, count=n_structures
        ),
        num_features=features,
    )
    assert len(structures) == n_structures
    share = 3.0 / n_structures
    for kde in structures:
        b = math.sqrt(2) * features / share
        assert kde.event.sensitivity == pytest.approx(math.sqrt(2) * features)
        assert kde.event.scale == pytest.approx(b, rel=1e-5)
        assert kde.event.partition == "a"
        # an empty class: the release is the noise; mean |Laplace(b)| = b, and the mean of
        # 4,096 of them has a relative standard deviation of 1/64 (0.016): 0.1 is over 6 of
        # those (0.06, under 4, failed once in a CI run), and a scale 2× too small gives 0.5
        assert np.abs(kde.noisy_sum).mean() == pytest.approx(b, rel=0.1)
    assert sum(float(k.event.epsilon) for k in structures) == pytest.approx(3.0, rel=1e-9)


def test_structure_refuses_more_features_than_drawn() -> None:
    rff = RandomFourierFeatures(dim=4, num_features=8, max_blocks=1)
    with pytest.raises(ConfigError) as err:
        build_structure(
            [],
            unit_rows(3, 4, 0).float(),
            rff,
            label="a",
            blocks=1,
            num_features=9,
            planned=planned("laplace", 1.0, epsilon=1.0, dimension=9),
        )
    assert err.value.field == "num_features"


# ---------------------------------------------------------------- class counts


def test_class_counts_sensitivity_one_and_scale() -> None:
    labels = ["a"] * 30 + ["b"] * 10
    plan = planned("discrete_laplace", 1.0, epsilon=0.5, dimension=3)
    draws = np.array(
        [
            list(noisy_class_counts(labels, label_set=["a", "b", "c"], planned=plan)[0].values())
            for _ in range(3000)
        ]
    )
    _, spend = noisy_class_counts(labels, label_set=["a", "b", "c"], planned=plan)
    assert spend.sensitivity == 1
    assert spend.scale == pytest.approx(2.0)
    assert spend.dimension == 3  # declared labels, including one with no document
    noise = draws - np.array([30, 10, 0])
    assert noise.std() == pytest.approx(discrete_laplace_std(2.0), rel=0.05)


# ---------------------------------------------------------------- contribution bound


@pytest.mark.parametrize(("blocks", "bound"), [(0, 0.5), (0, 0.9), (2, 0.6)])
def test_clipped_contribution_sensitivity_is_bound_times_features(
    blocks: int, bound: float
) -> None:
    emb = unit_rows(40, 8, 11)
    features = 64
    rff = RandomFourierFeatures(
        dim=8, num_features=features, max_blocks=2, seed=12, dtype=torch.float64
    )
    rng = np.random.default_rng(13)
    docs = [list(rng.permutation(40)[: rng.integers(1, 6)]) for _ in range(30)]

    def raw(corpus: list[list[int]]) -> np.ndarray:
        if blocks == 0:
            return bag_sum(corpus, emb, rff, num_features=features, max_phrases=4, bound=bound)
        return sequence_sum(corpus, emb, rff, num_features=features, blocks=blocks, bound=bound)

    base = raw(docs)
    moves = [float(np.abs(raw([*docs, [int(v)]]) - base).sum()) for v in range(40)]
    assert kde_sensitivity(features, bound) == pytest.approx(bound * features)
    assert max(moves) <= bound * features * (1 + 1e-12)
    assert max(moves) > 0.95 * bound * features  # a one-phrase document is clipped to the bound


def test_clipping_leaves_small_contributions_unchanged() -> None:
    emb = unit_rows(40, 8, 14)
    rff = RandomFourierFeatures(dim=8, num_features=256, max_blocks=1, seed=15, dtype=torch.float64)
    docs = [list(range(i, i + 8)) for i in range(0, 32, 8)]  # means of 8: L1 well below √2·I
    loose = bag_sum(docs, emb, rff, num_features=256, max_phrases=8, bound=1.4)
    exact = bag_sum(docs, emb, rff, num_features=256, max_phrases=8)  # histogram path
    assert np.allclose(loose, exact, rtol=1e-12, atol=1e-9)


def test_clipped_structure_noise_scale() -> None:
    emb = unit_rows(20, 8, 16)
    rff = RandomFourierFeatures(dim=8, num_features=4096, max_blocks=1, seed=17)
    kde = build_structure(
        [],
        emb.float(),
        rff,
        label="a",
        blocks=0,
        num_features=4096,
        planned=planned("laplace", 1.0, epsilon=2.0, dimension=4096),
        bound=0.5,
    )
    assert kde.event.sensitivity == pytest.approx(0.5 * 4096)
    assert kde.event.scale == pytest.approx(0.5 * 4096 / 2.0, rel=1e-5)
    assert np.abs(kde.noisy_sum).mean() == pytest.approx(0.5 * 4096 / 2.0, rel=0.06)


@pytest.mark.parametrize("bad", [0.0, -0.1, 1.5, math.inf, math.nan])
def test_contribution_bound_out_of_range_is_refused(bad: float) -> None:
    with pytest.raises(ConfigError) as err:
        kde_sensitivity(16, bad)
    assert err.value.field == "contribution_bound"


# ---------------------------------------------------------------- exact kernel on Ṽ


def gaussian_kernel(emb: torch.Tensor, sigma: float) -> torch.Tensor:
    """``exp(−‖x − y‖²/σ²)`` computed the direct way (not the code's expansion)."""
    return torch.exp(-torch.cdist(emb, emb).pow(2) / sigma**2)


def test_exact_kde_sensitivity_is_the_largest_kernel_column_sum() -> None:
    emb = unit_rows(30, 8, 21)
    near = torch.nn.functional.normalize(emb[:1] + 0.1 * emb[1:2], dim=1)  # a near-duplicate
    emb = torch.cat([emb, near])
    sigma = 0.6
    kernel = gaussian_kernel(emb, sigma)
    exact = ExactKernel(emb, sigma)
    delta = exact.sensitivity
    assert delta == pytest.approx(float(kernel.sum(dim=0).max()), rel=1e-9)
    assert delta > 1.5  # the near-duplicates lift one column well above K[v, v] = 1
    corpus = [[0, 1, 2], [3], [4, 5]]
    base = exact.density(phrase_weights(corpus, 31, max_phrases=8))
    assert np.allclose(
        base, (kernel @ torch.as_tensor(phrase_weights(corpus, 31, max_phrases=8))).numpy()
    )
    worst = int(kernel.sum(dim=0).argmax())
    added = ([worst], [0, 30], list(range(31)), [worst] * 5, [7, 7, 8])
    moves = [
        float(np.abs(exact.density(phrase_weights([*corpus, d], 31, max_phrases=8)) - base).sum())
        for d in added
    ]
    assert max(moves) <= delta * (1 + 1e-9)
    assert moves[0] == pytest.approx(delta, rel=1e-9)  # the worst phrase alone attains it
    assert moves[3] == pytest.approx(delta, rel=1e-9)  # repeats count once


def test_exact_kde_document_weight_is_one_however_long() -> None:
    weights = phrase_weights([list(range(100)), [3, 3, 4], []], 100, max_phrases=8)
    assert weights.sum() == pytest.approx(2.0)
    assert weights[:8] == pytest.approx(
        [1 / 8] * 3 + [1 / 8 + 1 / 2] + [1 / 8 + 1 / 2] + [1 / 8] * 3
    )
    assert not weights[8:].any()


def test_exact_kde_noise_scale() -> None:
    emb = unit_rows(4000, 8, 22)
    kernel = ExactKernel(emb, 0.3)
    delta = kernel.sensitivity
    assert 1.0 <= delta == pytest.approx(float(gaussian_kernel(emb, 0.3).sum(dim=0).max()))
    plan = planned("laplace", 1.0, epsilon=2.0, dimension=4000)
    kde = build_exact_structure([], kernel, label="a", planned=plan, max_phrases=8)
    assert kde.event.sensitivity == pytest.approx(delta, rel=1e-5)
    assert kde.event.scale == pytest.approx(delta / 2.0, rel=1e-5)
    assert kde.event.partition == "a" and kde.event.dimension == 4000
    # an empty class: the release is the noise; mean |Laplace(b)| = b
    assert np.abs(kde.noisy_density).mean() == pytest.approx(delta / 2.0, rel=0.06)
    assert kde.noise_std == pytest.approx(math.sqrt(2) * delta / 2.0, rel=1e-5)


def test_exact_kde_refuses_bad_parameters() -> None:
    with pytest.raises(ConfigError) as err:
        ExactKernel(unit_rows(3, 4, 1), 0.0)
    assert err.value.field == "bandwidth"
    with pytest.raises(ConfigError) as err:
        GenerationConfig(epsilon_vocab=1.0, epsilon_kde=math.inf).validate()
    assert err.value.field == "epsilon_kde"
