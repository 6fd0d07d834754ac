"""The release subspace for class centroids (issue 16, small classes at small ε).

Each unit's vector is projected on the top k principal directions of Ṽ's public phrase
embeddings and rescaled there to its own norm, so the class sums are released in k
coordinates with L2 Δ = 1 as before. Fast tests check the basis, the bound a unit keeps,
the plan, bad settings and a run end to end; the ``slow`` one is the stochastic check on
neighbouring corpora of ``test_neighbouring.py`` for the projected release.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import numpy as np
import pytest

from app.jobs.schemas import JobSpec
from tests.core.dpkps import LABELS, config
from tests.core.privacy.test_neighbouring import SIGMA_1, check_gaussian
from tests.privacy_audit import planned
from workers.errors import ConfigError
from workers.methods.dpkps.config import (
    DEFAULT_SUBSPACE,
    EMBEDDING_DIMENSION,
    SUBSPACE_FROM_CLASSES,
    SUGGESTED_SUBSPACE,
    GenerationConfig,
    method_description,
)
from workers.methods.dpkps.density.centroid import build_centroid_structures
from workers.methods.dpkps.pipeline import generate_sequences
from workers.methods.dpkps.plan import CELLS, KDE, plan
from workers.methods.dpkps.subspace import project_units, public_basis
from workers.privacy.accountant import compose
from workers.text.embeddings import SentenceEmbedder
from workers.text.vocabulary import Vocabulary


def anisotropic(rng: np.random.Generator, n: int, spread: list[float]) -> np.ndarray:
    """``n`` unit rows whose variance along axis i is about ``spread[i]`` before scaling."""
    rows = rng.normal(size=(n, len(spread))) * np.asarray(spread)
    out: np.ndarray = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    return out


def test_the_basis_is_orthonormal_and_takes_the_phrases_widest_directions() -> None:
    rng = np.random.default_rng(0)
    phrases = anisotropic(rng, 4000, [5.0, 0.2, 3.0, 0.1, 1.0, 0.3])
    basis = public_basis(phrases, 3)
    assert basis.shape == (6, 3)
    assert basis.T @ basis == pytest.approx(np.eye(3), abs=1e-10)
    # the three widest axes (0, 2, 4), in that order, each signed positive
    assert np.abs(basis).argmax(axis=0).tolist() == [0, 2, 4]
    assert np.abs(basis).max(axis=0) == pytest.approx(np.ones(3), abs=0.05)
    assert (basis[[0, 2, 4], [0, 1, 2]] > 0).all()
    # deterministic: the same public phrases give the same basis
    assert np.array_equal(basis, public_basis(phrases.copy(), 3))
    for k in (0, 7):
        with pytest.raises(ValueError):
            public_basis(phrases, k)


def test_a_unit_keeps_its_norm_so_it_moves_a_class_sum_by_at_most_one() -> None:
    rng = np.random.default_rng(1)
    basis = public_basis(anisotropic(rng, 2000, [4.0, 3.0, 2.0, 1.0, 0.5, 0.2, 0.1, 0.1]), 3)
    docs = anisotropic(rng, 60, [1.0] * 8)
    # units: one document (norm 1), several documents' mean (norm < 1), none (norm 0)
    units = np.vstack([docs[:20], docs[20:40].reshape(10, 2, 8).mean(axis=1), np.zeros((1, 8))])
    projected = project_units(units, basis)
    assert projected.shape == (31, 3)
    assert np.linalg.norm(projected, axis=1) == pytest.approx(np.linalg.norm(units, axis=1))
    # a unit orthogonal to the subspace contributes nothing (not a division by zero)
    outside = np.linalg.svd(basis.T)[2][-1]
    assert project_units(outside[None, :], basis) == pytest.approx(np.zeros((1, 3)), abs=1e-9)
    # neighbouring corpora: adding any unit moves the class sum by its norm, at most 1
    plan_event = planned("gaussian", 1.0, multiplier=1e-9, dimension=3)

    def released(rows: np.ndarray) -> np.ndarray:
        return build_centroid_structures([("a", rows)], planned=plan_event)[0].noisy_sum

    base = released(projected[:30])
    for extra in [*units[30:31], *docs[40:], units[25]]:
        moved = released(np.vstack([projected[:30], project_units(extra[None, :], basis)]))
        assert np.linalg.norm(moved - base) <= 1.0 + 1e-6
    # the directions the phrases vary most keep most of a document; the rest is dropped
    assert np.median(np.linalg.norm(docs @ basis, axis=1)) < 1.0


def test_the_plan_releases_k_coordinates_at_the_same_cost() -> None:
    whole = plan(config(subspace=0), LABELS, 1000)
    sub = plan(config(subspace=64), LABELS, 1000)
    assert config(subspace=0).release_dimension == EMBEDDING_DIMENSION
    assert config(subspace=EMBEDDING_DIMENSION).release_dimension == EMBEDDING_DIMENSION
    assert {e.dimension for e in whole.events if e.mechanism == KDE} == {EMBEDDING_DIMENSION}
    assert {e.dimension for e in sub.events if e.mechanism == KDE} == {64}
    # σ is set by L2 Δ = 1 and the budget, whatever the dimension: the same ε
    assert [(e.mechanism, e.scale) for e in whole.events] == [
        (e.mechanism, e.scale) for e in sub.events
    ]
    assert compose(sub.events).epsilon(1e-6) == sub.epsilon == whole.epsilon <= Decimal("1")
    # with cells (ε = 6), each class's cells are released in the subspace too
    cells = plan(config(epsilon=6.0, subspace=32), LABELS, 1000)
    assert {e.dimension for e in cells.events if e.mechanism == CELLS} == {8 * 32}
    assert config(subspace=32).to_dict()["subspace"] == 32
    assert "top 32 principal directions" in method_description(config(subspace=32))
    assert "principal directions" not in method_description(config(subspace=0))


MANY = [f"label {i}" for i in range(SUBSPACE_FROM_CLASSES)]  # the small-hospital regime


def test_by_default_the_subspace_is_chosen_by_the_declared_label_set() -> None:
    assert DEFAULT_SUBSPACE is None and config().subspace is None
    assert 0 < SUGGESTED_SUBSPACE < EMBEDDING_DIMENSION
    few, many = len(MANY) - 1, len(MANY)
    for epsilon in (0.25, 1.0, 2.0):  # one cell a class: the subspace with many classes
        assert config(epsilon=epsilon).for_classes(many).release_dimension == SUGGESTED_SUBSPACE
        assert config(epsilon=epsilon).for_classes(few).release_dimension == EMBEDDING_DIMENSION
    # with cells (ε ≥ 4) the whole space, however many classes
    assert config(epsilon=6.0).for_classes(many).release_dimension == EMBEDDING_DIMENSION
    # what is asked for is kept, with cells too, and 0 keeps the whole space
    assert config(epsilon=6.0, subspace=64).for_classes(many).release_dimension == 64
    assert config(subspace=0).for_classes(many).release_dimension == EMBEDDING_DIMENSION
    for other in (  # no class centroids with a total Gaussian budget: the whole space
        GenerationConfig(epsilon_vocab=1.0, epsilon_kde=2.0).validate(),
        config(kde_method="moments"),
        config(kde_method="exact"),
    ):
        assert other.for_classes(many).release_dimension == EMBEDDING_DIMENSION
    # unresolved, the dimension is not guessed; the description and the parameters say so
    with pytest.raises(ValueError, match="for_classes"):
        _ = config().release_dimension
    assert config().to_dict()["subspace"] is None
    assert "with 20 or more classes" in method_description(config())
    assert "principal directions" not in method_description(config(epsilon=6.0))
    assert config().for_classes(many).to_dict()["subspace"] == SUGGESTED_SUBSPACE
    assert config().for_classes(few).to_dict()["subspace"] == EMBEDDING_DIMENSION


def test_the_plan_and_the_run_resolve_the_default_by_the_label_set() -> None:
    # the plan (public inputs only) knows the dimension: the declared labels are public
    many = plan(config(), MANY, 1000)
    few = plan(config(), MANY[:-1], 1000)
    whole = plan(config(subspace=0), MANY, 1000)
    assert {e.dimension for e in many.events if e.mechanism == KDE} == {SUGGESTED_SUBSPACE}
    assert {e.dimension for e in few.events if e.mechanism == KDE} == {EMBEDDING_DIMENSION}
    assert {e.dimension for e in whole.events if e.mechanism == KDE} == {EMBEDDING_DIMENSION}
    # the same noise and cost as the whole space for the same label set
    assert many.epsilon == whole.epsilon <= Decimal("1")
    assert [(e.mechanism, e.scale) for e in many.events] == [
        (e.mechanism, e.scale) for e in whole.events
    ]


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"subspace": -1}, "subspace"),
        ({"subspace": EMBEDDING_DIMENSION + 1}, "subspace"),
        ({"subspace": True}, "subspace"),
        ({"subspace": 2.5}, "subspace"),
        ({"subspace": 16, "kde_method": "moments"}, "subspace"),
        ({"subspace": 16, "kde_method": "random_features"}, "subspace"),
    ],
)
def test_a_bad_subspace_names_its_field(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        config(**overrides)
    assert info.value.field == field


def test_the_job_spec_takes_the_subspace() -> None:
    base = {"vocabulary": "english", "document_type": "clinical note", "epsilon": 1.0,
            "delta": 1e-6, "noise": "gaussian"}  # fmt: skip
    spec = JobSpec.model_validate({**base, "subspace": 48})
    assert spec.generation_config().release_dimension == 48
    default = JobSpec.model_validate(base).generation_config()
    assert default.subspace is None  # resolved by the dataset's declared labels
    assert default.for_classes(len(MANY)).release_dimension == SUGGESTED_SUBSPACE
    with pytest.raises(ValueError, match="subspace"):
        JobSpec.model_validate({**base, "subspace": EMBEDDING_DIMENSION + 1})
    with pytest.raises(ConfigError) as info:  # the engine names it too
        features = {**base, "subspace": 16, "kde_method": "random_features"}
        JobSpec.model_validate(features).generation_config()
    assert info.value.field == "subspace"


def test_a_default_run_takes_the_subspace_its_declared_labels_choose() -> None:
    from tests.core.dpkps.test_pipeline import TOPICS, corpus

    texts, labels = corpus(per_class=12)
    vocabulary = Vocabulary.from_phrases("t", [w for words in TOPICS.values() for w in words])
    cfg = GenerationConfig(
        epsilon=1.0, delta=1e-6, noise="gaussian", per_class=4, public_vocabulary_size=15,
    ).validate()  # fmt: skip
    declared = [*TOPICS, *(f"unused {i}" for i in range(SUBSPACE_FROM_CLASSES - len(TOPICS)))]
    for label_set, dimension in ((declared, SUGGESTED_SUBSPACE), (list(TOPICS), 384)):
        result = generate_sequences(
            texts, labels, label_set=label_set, vocabulary=vocabulary, config=cfg,
            embedder=SentenceEmbedder(),
        )  # fmt: skip
        assert result.report.as_planned
        assert {e.dimension for e in result.report.events if e.mechanism == KDE} == {dimension}
        assert result.manifest()["parameters"]["subspace"] == dimension
        # drawn as asked; the consistency filter (a default with centroids) keeps some
        assert result.manifest()["sequences_drawn"] == 4 * len(label_set)
        assert len(result.sequences) <= 4 * len(label_set)


def test_a_run_in_the_subspace_is_as_planned_and_keeps_classes_on_their_phrases() -> None:
    from tests.core.dpkps.test_pipeline import TOPICS, own_phrase_shares

    cfg = GenerationConfig(
        epsilon=6.0, delta=1e-6, noise="gaussian", per_class=40, sequence_length=3,
        public_vocabulary_size=16, label_prior=0.0, centroid_cells=1, subspace=8, seed=3,
        consistency_filter=False,
    )  # fmt: skip
    shares, results = own_phrase_shares(cfg, runs=4)
    for result in results:
        assert result.report.as_planned and float(result.report.epsilon) <= 6.0
        assert {e.dimension for e in result.report.events if e.mechanism == KDE} == {8}
        assert len(result.sequences) == 40 * len(TOPICS)
    # 5 of Ṽ's 16 phrases are a class's own (0.31 by chance)
    assert float(np.mean(shares)) > 0.7, shares


def test_the_suggested_subspace_with_the_names_keeps_small_classes_on_their_phrases() -> None:
    from tests.core.dpkps.test_pipeline import TOPICS, own_phrase_shares

    cfg = GenerationConfig(
        epsilon=1.0, delta=1e-6, noise="gaussian", per_class=40, sequence_length=3,
        public_vocabulary_size=16, seed=5, subspace=SUGGESTED_SUBSPACE, consistency_filter=False,
    ).validate()  # fmt: skip
    assert cfg.release_dimension == SUGGESTED_SUBSPACE and cfg.label_prior > 0
    shares, results = own_phrase_shares(cfg, runs=5)
    assert all(r.report.as_planned and float(r.report.epsilon) <= 1.0 for r in results)
    assert all(len(r.sequences) == 40 * len(TOPICS) for r in results)
    # 12 documents a class at ε = 1 (15 runs: 0.96–0.99 of a class's phrases its own; in
    # the whole space with the names, median 0.93; without them, 0.48 there and 0.62–0.71
    # in the subspace)
    assert float(np.median(shares)) > 0.85, shares


# ------------------------------------------------------- stochastic, neighbouring corpora


@pytest.mark.slow
def test_subspace_release_within_epsilon_delta() -> None:
    rng = np.random.default_rng(2)
    basis = public_basis(anisotropic(rng, 2000, [3.0, 2.0, 1.0, 0.5, 0.2]), 3)
    rows = project_units(anisotropic(rng, 3, [1.0] * 5), basis)
    # the worst neighbour: a unit wholly inside the subspace moves the sum by exactly 1
    added = project_units(basis[:, :1].T, basis)
    assert np.linalg.norm(added) == pytest.approx(1.0)
    plan_event = planned("gaussian", 1.0, multiplier=SIGMA_1, dimension=3)

    def draw(add: bool) -> np.ndarray:
        data = np.vstack([rows, added]) if add else rows
        return build_centroid_structures([("a", data)], planned=plan_event)[0].noisy_sum

    check_gaussian(draw, rows.sum(axis=0), rows.sum(axis=0) + added[0], SIGMA_1)
