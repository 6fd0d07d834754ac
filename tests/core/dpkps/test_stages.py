"""Each stage of the DP-KPS run on small inputs: what it returns, in what shape.

The run end to end (and each stage's privacy) is tested in ``test_pipeline.py``,
``test_neighbouring.py`` and the mechanism tests; here every stage is called on its own,
with the inputs the driver would give it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from workers.methods.dpkps import stages
from workers.methods.dpkps.config import EMBEDDING_DIMENSION, GenerationConfig
from workers.methods.dpkps.plan import Plan, plan
from workers.methods.dpkps.private_vocab import PrivateVocabulary
from workers.privacy.units import pool
from workers.text.embeddings import SentenceEmbedder
from workers.text.vocabulary import Vocabulary

PHRASES = ["heart failure", "chest pain", "stent", "seizure", "migraine", "stroke", "rash"]
LABELS = ["cardiology", "neurology"]
DOCUMENTS = [
    "Heart failure and chest pain, then a stent.",
    "Chest pain again.",
    "A seizure, a migraine and a stroke.",
    "Nothing of note.",
]
DOC_LABELS = ["cardiology", "cardiology", "neurology", "neurology"]


def laplace(**overrides: Any) -> GenerationConfig:
    base: dict[str, Any] = dict(
        epsilon_vocab=2.0, epsilon_kde=4.0, per_class=3, vocabulary_size=5,
        max_matches_per_document=4, sequence_length=2, num_features=32, seed=1,
    )  # fmt: skip
    return GenerationConfig(**{**base, **overrides}).for_classes(len(LABELS))


def gaussian(**overrides: Any) -> GenerationConfig:
    base: dict[str, Any] = dict(
        epsilon=4.0, delta=1e-6, noise="gaussian", per_class=3, sequence_length=2,
        public_vocabulary_size=len(PHRASES), seed=1,
    )  # fmt: skip
    return GenerationConfig(**{**base, **overrides}).for_classes(len(LABELS))


def planned(config: GenerationConfig) -> Plan:
    return plan(config, LABELS, len(PHRASES))


def recorder() -> tuple[list[tuple[str, float]], stages.ProgressFn]:
    seen: list[tuple[str, float]] = []
    return seen, lambda stage, fraction: seen.append((stage, fraction))


def unit_rows(n: int, dim: int, seed: int = 0) -> torch.Tensor:
    rows = torch.randn(n, dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return torch.nn.functional.normalize(rows, dim=1).to(torch.float32)


def test_extract_pools_units_and_lists_their_matches_in_document_order() -> None:
    seen, progress = recorder()
    found = stages.extract(
        DOCUMENTS, DOC_LABELS, ["a", "a", "b", "b"], label_set=LABELS,
        vocabulary=Vocabulary.from_phrases("t", PHRASES), config=laplace(), progress=progress,
    )  # fmt: skip
    assert [u.documents for u in found.units] == [(0, 1), (2, 3)]
    assert found.matches == [[0, 1, 2, 1], [3, 4, 5]]
    assert found.without_match == 1  # "Nothing of note."
    assert seen == [("extract", 0.0), ("extract", 1.0)]


def test_the_private_vocabulary_is_a_release_of_its_size_and_padded_to_a_sequence() -> None:
    config = laplace()
    seen, progress = recorder()
    private = stages.private_vocabulary(
        [[0, 1, 2], [3, 4]], vocabulary_size=len(PHRASES), config=config,
        the_plan=planned(config), progress=progress,
    )  # fmt: skip
    assert private.indices.shape == (config.vocabulary_size,)
    assert private.event is not None and private.event.mechanism == "vocabulary"
    assert seen == [("private_vocabulary", 0.0), ("private_vocabulary", 1.0)]
    empty = PrivateVocabulary(np.zeros(0, dtype=np.int64), np.zeros(0), None)
    assert stages.padded(empty, config, len(PHRASES)).indices.tolist() == [0, 1]  # L = 2


def test_embed_gives_one_unit_row_per_phrase_of_v_tilde(embedder: SentenceEmbedder) -> None:
    seen, progress = recorder()
    vectors = stages.embed(
        Vocabulary.from_phrases("t", PHRASES), np.array([4, 0, 2]), embedder=embedder,
        cache=None, device="cpu", progress=progress,
    )  # fmt: skip
    assert vectors.shape == (3, embedder.dim) and vectors.dtype == torch.float32
    assert torch.allclose(vectors.norm(dim=1), torch.ones(3), atol=1e-4)
    assert seen[0] == ("embed", 0.0) and seen[-1] == ("embed", 1.0)


def test_unit_phrases_are_distinct_in_document_order_and_capped() -> None:
    units = pool(DOC_LABELS, ["a", "a", "b", "b"], label_set=LABELS)
    found = stages.unit_phrases(DOCUMENTS, units, PHRASES, keep=3)
    assert found == [[0, 1, 2], [3, 4, 5]]  # "chest pain" twice in unit a: once
    assert stages.unit_phrases(DOCUMENTS, units, PHRASES, keep=1) == [[0], [3]]
    grouped = stages.by_class(["neurology", "cardiology"], [[3], [0, 1]], LABELS)
    assert grouped == {"cardiology": [[0, 1]], "neurology": [[3]]}


def test_class_counts_fixed_or_a_split_of_the_released_counts() -> None:
    config = laplace()
    fixed = stages.class_counts(
        DOC_LABELS, label_set=LABELS, config=config, the_plan=planned(config)
    )
    assert fixed == stages.ClassCounts({"cardiology": 3, "neurology": 3}, None, None, None)
    config = gaussian(per_class=None, total=10)
    split = stages.class_counts(
        DOC_LABELS, label_set=LABELS, config=config, the_plan=planned(config)
    )
    assert sum(split.wanted.values()) == 10 and split.released is not None
    assert len(split.released) == 2 and split.event is not None
    assert split.event.mechanism == "class_counts"


def test_the_exact_kernel_releases_one_density_per_class_and_sampling_draws_from_it() -> None:
    config = laplace(kde_method="exact")
    embeddings = unit_rows(len(PHRASES), 8)
    grouped = {"cardiology": [[0, 1], [1, 2]], "neurology": [[3, 4, 5]]}
    seen, progress = recorder()
    releases = stages.release_exact(
        grouped, embeddings, label_set=LABELS, config=config, the_plan=planned(config),
        progress=progress,
    )  # fmt: skip
    assert [k.label for k in releases.exact] == LABELS and len(releases.events) == 2
    assert seen == [("dp_kde", 0.5), ("dp_kde", 1.0)]
    scores = stages.class_scores(releases, config=config)
    assert scores is not None and scores.shape == (2, len(PHRASES)) and bool((scores >= 0).all())
    counts = stages.ClassCounts({"cardiology": 3, "neurology": 1}, None, None, None)
    drawn = stages.sample(
        releases, scores, label_set=LABELS, counts=counts, config=config, progress=progress,
    )  # fmt: skip
    assert [label for label, _ in drawn] == ["cardiology"] * 3 + ["neurology"]
    assert all(len(set(row)) == 2 and max(row) < len(PHRASES) for _, row in drawn)


@pytest.mark.parametrize("mode", ["independent", "iterative"])
def test_random_features_release_a_bag_or_an_ensemble_per_class(mode: str) -> None:
    config = laplace(kde_method="random_features", mode=mode)
    grouped = {"cardiology": [[0, 1], [1, 2]], "neurology": [[3, 4]]}
    releases = stages.release_random_features(
        grouped, unit_rows(len(PHRASES), 8), label_set=LABELS, config=config,
        the_plan=planned(config), progress=lambda *_: None,
    )  # fmt: skip
    assert releases.rff is not None and len(releases.ensembles) == 2
    sizes = [len(e) for e in releases.ensembles]
    assert sizes == ([1, 1] if mode == "independent" else [2, 2])  # blocks 1, 2 for L = 2
    assert len(releases.events) == sum(sizes)
    scores = stages.class_scores(releases, config=config)
    assert (scores is None) == (mode == "iterative")
    counts = stages.ClassCounts({"cardiology": 2, "neurology": 2}, None, None, None)
    drawn = stages.sample(
        releases, scores, label_set=LABELS, counts=counts, config=config,
        progress=lambda *_: None,
    )  # fmt: skip
    assert len(drawn) == 4 and all(len(row) == 2 for _, row in drawn)


def test_centroids_from_embedded_units_then_prior_scores_sampling_and_filter(
    embedder: SentenceEmbedder,
) -> None:
    config = gaussian(subspace=16, label_prior=0.5)
    units = pool(DOC_LABELS, None, label_set=LABELS)
    phrase_vectors = torch.as_tensor(embedder.encode(PHRASES), dtype=torch.float32)
    basis = stages.release_space(phrase_vectors, config=config)
    assert basis is not None and basis.shape == (EMBEDDING_DIMENSION, 16)
    assert stages.release_space(phrase_vectors, config=gaussian(subspace=None)) is None
    rows, row_labels = stages.embedded_units(
        DOCUMENTS, units, None, rates=None, basis=basis, embedder=embedder, config=config,
        progress=lambda *_: None,
    )  # fmt: skip
    assert rows.shape == (4, 16) and row_labels == DOC_LABELS
    releases = stages.release_centroids(
        rows, row_labels, phrase_vectors, basis=basis, label_set=LABELS, config=config,
        the_plan=planned(config), progress=lambda *_: None,
    )  # fmt: skip
    assert [c.noisy_sum.shape for c in releases.centroids] == [(16,), (16,)]
    assert releases.embeddings.shape == (len(PHRASES), 16)
    assert [m.label for m in releases.mixtures] == LABELS  # cells from ε = 4 on: a 2nd release
    assert len(releases.events) == 4
    pulled = stages.label_prior(
        releases, embedder=embedder, label_set=LABELS, config=config, counts=None
    )
    assert [c.event for c in pulled.centroids] == [c.event for c in releases.centroids]
    off = gaussian(label_prior=0.0)
    kept = stages.label_prior(
        releases, embedder=embedder, label_set=LABELS, config=off, counts=None
    )
    assert kept is releases
    scores = stages.class_scores(pulled, config=config)
    assert scores is not None and scores.shape == (2, len(PHRASES))
    counts = stages.ClassCounts({"cardiology": 4, "neurology": 4}, None, None, None)
    drawn = stages.sample(
        pulled, scores, label_set=LABELS, counts=counts, config=config,
        progress=lambda *_: None,
    )  # fmt: skip
    assert len(drawn) == 8
    seen, progress = recorder()
    filtered = stages.filter_sequences(
        drawn, phrases=PHRASES, releases=pulled, embedder=embedder, label_set=LABELS,
        config=config, progress=progress,
    )  # fmt: skip
    assert set(filtered) <= set(drawn) and seen == [("sequences", 1.0)]


def test_release_densities_builds_only_the_configured_estimator(embedder: SentenceEmbedder) -> None:
    config = laplace(kde_method="exact")
    units = pool(DOC_LABELS, None, label_set=LABELS)
    grouped = {"cardiology": [[0, 1], [1]], "neurology": [[3], []]}
    counts = stages.ClassCounts({"cardiology": 1, "neurology": 1}, None, None, None)
    releases = stages.release_densities(
        DOCUMENTS, units, None, grouped, unit_rows(len(PHRASES), 8), counts=counts,
        embedder=embedder, label_set=LABELS, config=config, the_plan=planned(config),
        progress=lambda *_: None,
    )  # fmt: skip
    assert len(releases.exact) == 2 and not releases.centroids and not releases.ensembles
