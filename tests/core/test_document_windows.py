"""Long documents read whole: windows of words, embedded and averaged (encode_documents)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from workers.errors import ConfigError
from workers.methods.dpkps.config import MAX_DOCUMENT_WINDOW, GenerationConfig
from workers.text.embeddings import SentenceEmbedder, encode_documents, windows

# A discharge summary's opening: the same administrative header on every note, longer than
# the 256 word pieces all-MiniLM-L6-v2 reads.
HEADER = " ".join(
    ["Admission date and discharge date recorded, service medicine, attending physician on"]
    + ["file, allergies reviewed, code status full, history obtained from the patient"] * 30
)
CARDIAC = (
    "Chest pain radiating to the left arm with ST elevation; troponin rose; coronary "
    "angiography showed an occluded left anterior descending artery, stented. "
) * 4
FRACTURE = (
    "Fall on an outstretched hand; radiographs showed a displaced distal radius fracture, "
    "reduced and cast in the emergency department; orthopaedic follow-up arranged. "
) * 4


def test_windows_cut_a_text_into_runs_of_words_with_their_counts() -> None:
    text = " ".join(f"w{i}" for i in range(10))
    assert windows(text, 4) == [("w0 w1 w2 w3", 4), ("w4 w5 w6 w7", 4), ("w8 w9", 2)]
    assert windows(text, 10) == [(text, 10)]  # no longer than a window: the text itself
    assert windows(text, 0) == [(text, 10)]  # 0: one piece, as before
    assert windows("", 4) == [("", 1)]  # an empty document is still one (embedded) piece


def test_short_documents_embed_as_before(embedder: SentenceEmbedder) -> None:
    texts = ["heart failure with reduced ejection fraction", "a fractured wrist", ""]
    np.testing.assert_allclose(
        encode_documents(embedder, texts, window=128), embedder.encode(texts), atol=1e-6
    )
    np.testing.assert_allclose(
        encode_documents(embedder, [], window=128), np.zeros((0, embedder.dim)), atol=0
    )


def test_a_long_document_is_the_length_weighted_mean_of_its_windows(
    embedder: SentenceEmbedder,
) -> None:
    text = HEADER + " " + CARDIAC
    pieces = windows(text, 50)
    assert len(pieces) > 3
    rows = embedder.encode([p for p, _ in pieces]).astype(np.float64)
    mean = (rows * np.array([w for _, w in pieces], dtype=np.float64)[:, None]).sum(axis=0)
    got = encode_documents(embedder, [text], window=50)[0]
    np.testing.assert_allclose(got, mean / np.linalg.norm(mean), atol=1e-5)
    assert abs(np.linalg.norm(got) - 1) < 1e-5  # a unit's vector keeps norm ≤ 1


def test_a_note_whose_opening_is_boilerplate_is_read_to_its_end(
    embedder: SentenceEmbedder,
) -> None:
    """Two notes that differ only after a long common header: the model alone sees the
    header in both, so their embeddings coincide; read in windows, each points to its own
    content, which is what the class sums must carry."""
    notes = [HEADER + " " + CARDIAC, HEADER + " " + FRACTURE]
    content = embedder.encode([CARDIAC, FRACTURE]).astype(np.float64)
    truncated = embedder.encode(notes).astype(np.float64)
    whole = encode_documents(embedder, notes, window=128).astype(np.float64)
    assert truncated[0] @ truncated[1] > 0.999  # the tails never reached the model
    assert whole[0] @ whole[1] < truncated[0] @ truncated[1] - 0.05
    for i in range(2):  # each note now lies nearer its own content than the other's
        assert whole[i] @ content[i] > whole[i] @ content[1 - i] + 0.05
        assert whole[i] @ content[i] > truncated[i] @ content[i] + 0.05


@pytest.mark.parametrize("value", [-1, MAX_DOCUMENT_WINDOW + 1, 1.5, True])
def test_a_bad_window_names_its_field(value: object) -> None:
    config = GenerationConfig(epsilon=1.0, delta=1e-6, noise="gaussian", per_class=10)
    with pytest.raises(ConfigError) as caught:
        dataclasses.replace(config, document_window=value).validate()  # type: ignore[arg-type]
    assert caught.value.field == "document_window"


def test_windows_are_refused_where_no_document_embedding_is_released() -> None:
    """The exact kernel and random features read phrases, not document embeddings: a window
    there would do nothing, so it is refused naming the field rather than ignored."""
    base = dict(epsilon=1.0, delta=1e-6, noise="gaussian", per_class=10, document_window=128)
    for kde_method in ("centroid", "moments"):
        assert GenerationConfig(**base, kde_method=kde_method).validate().document_window == 128
    with pytest.raises(ConfigError) as caught:
        GenerationConfig(**base, kde_method="exact", vocabulary_method="histogram").validate()
    assert caught.value.field == "document_window"


@pytest.mark.parametrize("window", [0, 64])
def test_the_class_sums_are_built_from_the_windowed_documents(
    monkeypatch: pytest.MonkeyPatch, embedder: SentenceEmbedder, window: int
) -> None:
    """A run's units are the documents as ``document_window`` reads them: the rows the
    class sums add up are :func:`encode_documents`'s, and the releases are unchanged."""
    from tests.core.test_pipeline import TOPICS, corpus
    from workers.methods.dpkps import pipeline
    from workers.methods.dpkps.density import centroid
    from workers.text.vocabulary import Vocabulary

    texts, labels = corpus(per_class=4)
    texts = [HEADER + " " + t if i % 2 else t for i, t in enumerate(texts)]  # some long
    seen: list[np.ndarray] = []
    real = centroid.unit_vectors  # embed_units adds up each batch's rows with it

    def spied(units: Any, document_embeddings: Any) -> Any:
        seen.append(np.asarray(document_embeddings))
        return real(units, document_embeddings)

    monkeypatch.setattr(centroid, "unit_vectors", spied)
    config = GenerationConfig(
        epsilon=1.0, delta=1e-6, noise="gaussian", per_class=5, sequence_length=2,
        document_window=window, seed=1,
    )  # fmt: skip
    phrases = [w for words in TOPICS.values() for w in words]
    result = pipeline.generate_sequences(
        texts, labels, label_set=list(TOPICS), vocabulary=Vocabulary.from_phrases("t", phrases),
        config=config, embedder=embedder,
    )  # fmt: skip
    assert result.report.as_planned and result.config.document_window == window
    said = "each document embedded whole, in windows of 64 words"
    assert (said in result.manifest()["method"]) == bool(window)  # the manifest says so
    np.testing.assert_allclose(seen[0], encode_documents(embedder, texts, window=window), atol=1e-5)
    if window:  # the long documents differ from their first tokens' embedding
        differs = np.abs(seen[0] - embedder.encode(texts)).max(axis=1) > 1e-3
        assert differs.tolist() == [bool(i % 2) for i in range(len(texts))]
