"""The consistency filter for class centroids: each drawn sequence is kept only where its own
class's released direction is the nearest to its public embedding (post-processing).

What is checked here: the rule against a brute-force reading of it; a run with the filter
makes exactly the releases of a run without it, and every sequence it returns is nearest its
own class's released sum (read back from the OpenDP sampler's output), and the manifest says how
many were drawn and kept; with cells each sequence is judged by every class's cells; the filter is
on by default with class centroids, and names its field in the engine, the job spec and the CLI
(``tests/core/cli/test_cli.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from app.jobs.schemas import JobSpec
from tests.core.dpkps.test_pipeline import TOPICS, assert_same_releases, corpus
from workers.errors import ConfigError
from workers.methods.dpkps import stages
from workers.methods.dpkps.config import GenerationConfig, method_description
from workers.methods.dpkps.pipeline import generate_sequences
from workers.methods.dpkps.sampling import consistent_sequences
from workers.privacy import noise as samplers
from workers.text.embeddings import SentenceEmbedder
from workers.text.vocabulary import Vocabulary


def test_a_sequence_is_kept_where_its_own_direction_is_the_nearest() -> None:
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(500, 12))
    directions = rng.normal(size=(5, 12)) * rng.uniform(0.1, 10.0, size=(5, 1))
    own = rng.integers(0, 5, size=500).tolist()
    kept = consistent_sequences(vectors, own, directions)
    for row, label, keep in zip(vectors, own, kept.tolist(), strict=True):
        cosines = [row @ d / (np.linalg.norm(row) * np.linalg.norm(d)) for d in directions]
        assert keep == (int(np.argmax(cosines)) == label)
    # a direction's length does not matter, only where it points
    assert np.array_equal(kept, consistent_sequences(vectors, own, directions * 7.0))
    assert 0 < kept.sum() < len(own)


@pytest.mark.parametrize(
    ("vectors", "own", "directions"),
    [
        (np.ones((3, 4)), [0, 1, 0], np.ones((2, 5))),  # dimensions differ
        (np.ones((3, 4)), [0, 1], np.ones((2, 4))),  # a label short
        (np.ones((3, 4)), [0, 2, 0], np.ones((2, 4))),  # no such class
        (np.ones(4), [0], np.ones((2, 4))),  # not one row per sequence
    ],
)
def test_bad_inputs_name_the_field(vectors: Any, own: list[int], directions: Any) -> None:
    with pytest.raises(ConfigError) as caught:
        consistent_sequences(vectors, own, directions)
    assert caught.value.field == "consistency_filter"


def test_owners_of_the_directions_are_checked() -> None:
    vectors, own = np.ones((2, 3)), [0, 1]
    for owners in ([0, 1], [0, -1, 1], [0, 0, 0]):  # one short, negative, class 1 has none
        with pytest.raises(ConfigError) as caught:
            consistent_sequences(vectors, own, np.eye(3), owners)
        assert caught.value.field == "consistency_filter"
    # several directions a class: a sequence is kept by any of its own class's
    kept = consistent_sequences(np.eye(3), [1, 1, 0], np.eye(3), [0, 1, 1])
    assert kept.tolist() == [False, True, False]


class SumSpy:
    """The released class sums: every real-valued Gaussian draw's output, in order."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.released: list[np.ndarray] = []
        real = samplers.gaussian_noise

        def spied(values: Any, *, scale: float) -> Any:
            out = real(values, scale=scale)
            self.released.append(np.asarray(out, dtype=np.float64))
            return out

        monkeypatch.setattr(samplers, "gaussian_noise", spied)


def test_the_filter_spends_nothing_and_keeps_only_consistent_sequences(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    embedder = SentenceEmbedder()
    phrases = [w for words in TOPICS.values() for w in words] + ["zz unrelated"]
    vocabulary = Vocabulary.from_phrases("t", phrases)
    texts, labels = corpus(per_class=6)
    label_set = list(TOPICS)

    def run(on: bool) -> tuple[Any, list[np.ndarray]]:
        spy = SumSpy(monkeypatch)
        cfg = GenerationConfig(
            epsilon=0.5, delta=1e-6, noise="gaussian", per_class=60, sequence_length=2,
            label_prior=0.0, centroid_cells=1, consistency_filter=on, seed=5, embed_sample=0,
        )  # fmt: skip
        result = generate_sequences(
            texts, labels, label_set=label_set, vocabulary=vocabulary, config=cfg,
            embedder=embedder,
        )  # fmt: skip
        return result, spy.released

    plain, _ = run(False)
    assert len(plain.sequences) == 60 * len(label_set)
    assert plain.manifest()["sequences_drawn"] == plain.manifest()["sequences"] == 60 * 3
    dropped = 0
    for _ in range(3):  # fresh DP noise each run: ε = 0.5 on 6 documents a class is noisy
        filtered, released = run(True)
        assert_same_releases([plain], [filtered])
        assert filtered.config.consistency_filter is True
        # the manifest (public) says how many were drawn and how many the filter kept
        shown = filtered.manifest()
        assert (shown["sequences_drawn"], shown["sequences"]) == (60 * 3, len(filtered.sequences))
        assert "own class's released direction is the nearest" in shown["method"]
        sums = np.stack(released)  # no class counts (per_class): the class sums alone
        assert sums.shape == (len(label_set), 384)
        vectors = embedder.encode([" ".join(s.keyphrases) for s in filtered.sequences])
        for sequence, row in zip(filtered.sequences, vectors, strict=True):
            cosines = sums @ row / np.linalg.norm(sums, axis=1)
            assert label_set[int(np.argmax(cosines))] == sequence.label
        dropped += 60 * len(label_set) - len(filtered.sequences)
    assert dropped > 0  # the filter had something to do


def test_with_cells_a_sequence_is_judged_by_every_class_s_cells(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[tuple[np.ndarray, list[int] | None]] = []

    def spied(vectors: Any, own: Any, directions: Any, owners: Any = None) -> Any:
        seen.append((np.asarray(directions), None if owners is None else list(owners)))
        return consistent_sequences(vectors, own, directions, owners)

    monkeypatch.setattr(stages, "consistent_sequences", spied)
    embedder = SentenceEmbedder()
    phrases = [w for words in TOPICS.values() for w in words] + ["zz unrelated"]
    texts, labels = corpus(per_class=12)
    label_set = list(TOPICS)
    cfg = GenerationConfig(
        epsilon=6.0, delta=1e-6, noise="gaussian", per_class=40, sequence_length=2,
        label_prior=0.0, centroid_cells=3, cell_kappa=1e-3, seed=3,
    )  # fmt: skip
    result = generate_sequences(
        texts, labels, label_set=label_set, vocabulary=Vocabulary.from_phrases("t", phrases),
        config=cfg, embedder=embedder,
    )  # fmt: skip
    assert result.manifest()["parameters"]["consistency_filter"] is True
    (directions, owners), = seen  # fmt: skip
    assert owners is not None and sorted(set(owners)) == [0, 1, 2]
    assert len(directions) == len(owners) > len(label_set)  # several cells a class
    assert owners == sorted(owners)  # each class's cells together, in the label set's order
    # every sequence returned lies nearest one of its own class's cells
    vectors = embedder.encode([" ".join(s.keyphrases) for s in result.sequences])
    units = directions / np.linalg.norm(directions, axis=1, keepdims=True)
    for sequence, row in zip(result.sequences, vectors, strict=True):
        assert label_set[owners[int(np.argmax(units @ row))]] == sequence.label
    assert 0 < len(result.sequences) <= result.manifest()["sequences_drawn"]


def test_the_filter_is_on_by_default_with_one_centroid_per_class() -> None:
    base: dict[str, Any] = dict(epsilon=1.0, delta=1e-6, noise="gaussian")
    default = GenerationConfig(**base).validate()
    assert default.density_method == "centroid" and default.consistency_filter is None
    assert default.filters_sequences and default.to_dict()["consistency_filter"] is True
    # with cells (from ε = 4 by default) too, judged by every class's cells
    cells = GenerationConfig(**{**base, "epsilon": 6.0}).validate()
    assert cells.cells > 1 and cells.filters_sequences
    assert "nearest cell is one of its own class's" in method_description(cells)
    assert not GenerationConfig(
        **{**base, "epsilon": 6.0}, consistency_filter=False
    ).filters_sequences
    off = GenerationConfig(**base, consistency_filter=False).validate()
    assert not off.filters_sequences and off.to_dict()["consistency_filter"] is False
    assert "nearest to its embedding" not in method_description(off)
    # no direction per class to compare with: off by default, an error when asked for
    for other in ("exact", "moments"):
        config = GenerationConfig(**base, kde_method=other).validate()
        assert not config.filters_sequences and config.to_dict()["consistency_filter"] is False
        with pytest.raises(ConfigError) as caught:
            GenerationConfig(**base, kde_method=other, consistency_filter=True).validate()
        assert caught.value.field == "consistency_filter"
    with pytest.raises(ConfigError) as caught:
        GenerationConfig(**base, consistency_filter="yes").validate()  # type: ignore[arg-type]
    assert caught.value.field == "consistency_filter"


def test_the_job_spec_takes_the_filter() -> None:
    base = {"vocabulary": "english", "document_type": "clinical note", "epsilon": 1.0,
            "delta": 1e-6, "noise": "gaussian"}  # fmt: skip
    assert JobSpec.model_validate(base).generation_config().filters_sequences is True
    for given in (None, False):
        spec = JobSpec.model_validate({**base, "consistency_filter": given})
        assert spec.generation_config().filters_sequences is bool(given is None)
    spec = JobSpec.model_validate({**base, "consistency_filter": True})
    assert spec.generation_config().consistency_filter is True
    exact = JobSpec.model_validate({**base, "consistency_filter": True, "kde_method": "exact"})
    with pytest.raises(ConfigError) as caught:
        exact.generation_config()
    assert caught.value.field == "consistency_filter"
    with pytest.raises(ValueError, match="consistency_filter"):
        JobSpec.model_validate({**base, "consistency_filter": "sometimes"})
