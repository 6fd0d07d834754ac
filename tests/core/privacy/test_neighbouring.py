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

from tests.privacy_audit import estimate_epsilon_at_delta, estimate_privacy_loss, planned
from workers.methods.dpkps.density.exact import ExactKernel, build_exact_structure, phrase_weights
from workers.methods.dpkps.density.random_features import bag_sum, build_structure
from workers.methods.dpkps.features import RandomFourierFeatures
from workers.methods.dpkps.private_vocab import phrase_histogram, select_private_vocabulary
from workers.methods.dpkps.proportions import noisy_class_counts
from workers.privacy.calibration import analytic_gaussian_sigma
from workers.privacy.noise import discrete_gaussian_noise, gaussian_noise
from workers.privacy.units import pool

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
            docs,
            vocabulary_size=3,
            size=3,
            planned=planned("discrete_laplace", s, epsilon=epsilon, dimension=3),
            max_per_document=s,
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
            docs,
            emb,
            rff,
            label="a",
            blocks=0,
            num_features=features,
            planned=planned("laplace", 1.0, epsilon=epsilon, dimension=features),
            bound=bound,
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
        plan = planned("laplace", 1.0, epsilon=epsilon, dimension=2)
        kde = build_exact_structure(docs, kernel, label="a", planned=plan, max_phrases=8)
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

    plan = planned("discrete_laplace", 1.0, epsilon=epsilon, dimension=2)

    def count_a(ls: list[str]) -> float:
        return float(noisy_class_counts(ls, label_set=["a", "b"], planned=plan)[0]["a"])

    x = np.array([count_a(labels) for _ in range(RUNS)])
    y = np.array([count_a([*labels, "a"]) for _ in range(RUNS)])
    loss = estimate_privacy_loss(x, y)
    # integer counts read coarse ratios: drawn directly 200,000 times
    # (benchmarks/estimator_tails.py, seeds 4 and 5), the estimate had mean 1.06ε and SD
    # 0.05ε; 15 draws read above 1.3ε, the highest 1.39ε; the σ/2 control, 1.86ε or more
    assert 0.75 * epsilon < loss <= 1.4 * epsilon
    assert halved_scale_control(np.array([12]), np.array([13]), 1 / epsilon) > 1.6 * epsilon


# ---------------------------------------------------------------- Gaussian (ε, δ) variants
#
# Each Gaussian release is checked the same way: the privacy loss of isotropic Gaussian
# noise is linear in the projection of the release on the shift between the two raw
# aggregates, so that projection is the statistic; ε is estimated at δ
# (``estimate_epsilon_at_delta``) and a control at half the noise scale must exceed 1.6ε.
# δ = 1e-2 keeps the worst events within reach of RUNS samples.

EPSILON, DELTA = 1.0, 1e-2
SIGMA_1 = analytic_gaussian_sigma(epsilon=EPSILON, delta=DELTA)  # σ for Δ₂ = 1
CONTROL_RUNS = 40_000  # one OpenDP call each: the control can afford a sharper estimate


def projected(releases: list[np.ndarray], raw: np.ndarray, raw2: np.ndarray) -> np.ndarray:
    shift = np.asarray(raw2, dtype=float) - np.asarray(raw, dtype=float)
    direction = shift / np.linalg.norm(shift)
    return np.array([float(np.dot(np.asarray(r, dtype=float), direction)) for r in releases])


def check_gaussian(
    draw: object, raw: np.ndarray, raw2: np.ndarray, sigma: float, *, integer: bool = False
) -> None:
    """``draw(neighbour: bool)`` releases once; a σ/2 OpenDP control must be caught."""
    x = projected([draw(False) for _ in range(RUNS)], raw, raw2)  # type: ignore[operator]
    y = projected([draw(True) for _ in range(RUNS)], raw, raw2)  # type: ignore[operator]
    loss = estimate_epsilon_at_delta(x, y, delta=DELTA)
    assert 0.7 * EPSILON < loss <= 1.3 * EPSILON
    sampler = discrete_gaussian_noise if integer else gaussian_noise
    n = np.size(raw)
    cx = sampler(np.tile(raw, CONTROL_RUNS), scale=sigma / 2).reshape(CONTROL_RUNS, n)
    cy = sampler(np.tile(raw2, CONTROL_RUNS), scale=sigma / 2).reshape(CONTROL_RUNS, n)
    control = estimate_epsilon_at_delta(
        projected(list(cx), raw, raw2), projected(list(cy), raw, raw2), delta=DELTA
    )
    assert control > 1.6 * EPSILON


def test_gaussian_vocabulary_histogram_within_epsilon_delta() -> None:
    # S distinct phrases per unit, each counted once: Δ₂ = √S (repeats add nothing).
    s = 4
    corpus = [[0, 1, 2], [1, 1], [2]]
    neighbour = [*corpus, [0, 0, 3, 4, 5, 6, 7]]  # distinct 0, 3, 4, 5 within the first S
    size = 8
    plan = planned("gaussian", math.sqrt(s), multiplier=SIGMA_1, dimension=size)
    raw = phrase_histogram(corpus, vocabulary_size=size, max_per_document=s, distinct=True)
    raw2 = phrase_histogram(neighbour, vocabulary_size=size, max_per_document=s, distinct=True)
    assert np.linalg.norm(raw2 - raw) == pytest.approx(math.sqrt(s))

    def draw(add: bool) -> np.ndarray:
        chosen = select_private_vocabulary(
            neighbour if add else corpus,
            vocabulary_size=size,
            size=size,
            planned=plan,
            max_per_document=s,
        )
        out = np.zeros(size)
        out[chosen.indices] = chosen.noisy_counts
        return out

    check_gaussian(draw, raw, raw2, SIGMA_1 * math.sqrt(s))


def test_gaussian_exact_kde_within_epsilon_delta() -> None:
    first = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    second = torch.tensor([[math.cos(0.74), math.sin(0.74)]], dtype=torch.float64)
    kernel = ExactKernel(torch.cat([first, second]), 1.0)
    delta2 = kernel.sensitivities["l2"]
    assert 1.1 < delta2 < 1.2  # the column norm √(1 + 0.6²), below the column sum 1.6
    corpus = [[0, 1], [1]]
    neighbour = [*corpus, [0]]
    raw = kernel.density(phrase_weights(corpus, 2, max_phrases=8))
    raw2 = kernel.density(phrase_weights(neighbour, 2, max_phrases=8))
    assert np.linalg.norm(raw2 - raw) == pytest.approx(delta2, rel=1e-9)
    plan = planned("gaussian", 1.0, multiplier=SIGMA_1, dimension=2)

    def draw(add: bool) -> np.ndarray:
        docs = neighbour if add else corpus
        return build_exact_structure(
            docs, kernel, label="a", planned=plan, max_phrases=8
        ).noisy_density

    check_gaussian(draw, raw, raw2, SIGMA_1 * delta2)


def test_gaussian_random_feature_kde_within_epsilon_delta() -> None:
    # L2 clipping to c·√I: a one-phrase document with a large feature vector is clipped.
    features, bound = 4, 0.5
    rff = RandomFourierFeatures(
        dim=8, num_features=features, max_blocks=1, seed=3, dtype=torch.float64
    )
    emb = torch.nn.functional.normalize(
        torch.randn(6, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64), dim=1
    )
    corpus = [[0, 1], [2], [3, 4]]
    neighbour = [*corpus, [5]]
    raw = bag_sum(corpus, emb, rff, num_features=features, max_phrases=32, bound=bound, norm="l2")
    raw2 = bag_sum(
        neighbour, emb, rff, num_features=features, max_phrases=32, bound=bound, norm="l2"
    )
    limit = bound * math.sqrt(features)
    assert np.linalg.norm(raw2 - raw) == pytest.approx(limit, rel=1e-9)  # clipped to the bound
    plan = planned("gaussian", 1.0, multiplier=SIGMA_1, dimension=features)

    def draw(add: bool) -> np.ndarray:
        kde = build_structure(
            neighbour if add else corpus,
            emb,
            rff,
            label="a",
            blocks=0,
            num_features=features,
            planned=plan,
            bound=bound,
        )
        return kde.noisy_sum

    check_gaussian(draw, raw, raw2, SIGMA_1 * limit)


def test_gaussian_class_counts_within_epsilon_delta() -> None:
    labels = ["a"] * 12 + ["b"] * 5
    plan = planned("gaussian", 1.0, multiplier=SIGMA_1, dimension=2)

    def draw(add: bool) -> np.ndarray:
        counts = noisy_class_counts(
            [*labels, "a"] if add else labels, label_set=["a", "b"], planned=plan
        )[0]
        return np.array([counts["a"], counts["b"]], dtype=float)

    check_gaussian(draw, np.array([12.0, 5.0]), np.array([13.0, 5.0]), SIGMA_1)


# ---------------------------------------------------------------- patients (unit column)


def test_a_patient_with_several_notes_stays_within_epsilon_only_at_unit_level() -> None:
    """Neighbours differ by one patient with five notes: pooled by unit, the class counts
    move by 1 and stay within ε; counted by row they move by 5 and exceed it."""
    epsilon = 0.5
    labels = ["a"] * 12 + ["b"] * 5
    units = [f"p{i}" for i in range(len(labels))]
    patient_labels, patient_units = ["a"] * 5, ["new"] * 5
    plan = planned("discrete_laplace", 1.0, epsilon=epsilon, dimension=2)

    def count_a(ls: list[str], us: list[str] | None) -> float:
        unit_labels = [u.label for u in pool(ls, us, label_set=["a", "b"])]
        return float(noisy_class_counts(unit_labels, label_set=["a", "b"], planned=plan)[0]["a"])

    pooled_x = np.array([count_a(labels, units) for _ in range(RUNS)])
    pooled_y = np.array(
        [count_a([*labels, *patient_labels], [*units, *patient_units]) for _ in range(RUNS)]
    )
    # The estimator's error is absolute (about 0.07 on each tail event of 400 hits, and the
    # largest of some hundred events is kept), so at ε = 0.5 the room above ε is 1.5ε, not
    # the 1.3ε of the tests at ε ≥ 0.7: 1.3ε failed 0.5–0.9 % of simulated runs,
    # 1.5ε none of a thousand; half the noise scale still reads above 1.8ε (the control below).
    assert estimate_privacy_loss(pooled_x, pooled_y) <= 1.5 * epsilon
    assert halved_scale_control(np.array([12]), np.array([13]), 1 / epsilon) > 1.6 * epsilon
    rows_y = np.array([count_a([*labels, *patient_labels], None) for _ in range(RUNS)])
    assert estimate_privacy_loss(pooled_x, rows_y) > 3 * epsilon  # row-level: about 5ε
