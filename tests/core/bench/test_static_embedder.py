"""The static embedder distilled from the packaged MiniLM (benchmarks/static_embedder.py, a study
tool: benchmarks/notes/2026-12-07-static-document-embedder.md; no product code uses it).

Every test distils the real packaged model, offline; a partial table (the first
``TOKENS`` word-piece ids, about 1,900 real tokens: characters, common words) keeps the
forward passes to seconds. No stand-in for the model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from benchmarks.static_embedder import (
    StaticEmbedder,
    distill,
    load_static,
    model_fingerprint,
)
from workers.text.embeddings import packaged_model_path

pytestmark = pytest.mark.slow  # distils the packaged model (seconds)

TOKENS = 3000  # ids 0..2999: "the" is 1996, "a" 1037; ids below 999 are special or unused
TEXTS = ["the cat sat on the mat", "a dog and a man", "in the end of the day", "the"]


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[StaticEmbedder, Path]:
    cache = tmp_path_factory.mktemp("cache")
    return load_static(cache, tokens=TOKENS), cache


def test_built_offline_from_the_packaged_model_into_the_cache(
    built: tuple[StaticEmbedder, Path],
) -> None:
    embedder, cache = built
    source = packaged_model_path()
    assert embedder.fingerprint == model_fingerprint(source, tokens=TOKENS)
    folder = cache / "static" / embedder.fingerprint[:32]
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["fingerprint"] == embedder.fingerprint and meta["tokens"] == TOKENS
    table = np.load(folder / "table.npy")
    assert table.shape == (30522, 384) and embedder.dim == 384
    assert not table[TOKENS:].any()  # only the ids asked for are distilled
    assert not table[1:99].any()  # [unused…] slots are left out
    assert np.count_nonzero(np.abs(table[999:TOKENS]).sum(axis=1)) == TOKENS - 999
    # a second load reads the table, it does not distil again
    stamp = (folder / "table.npy").stat().st_mtime_ns
    again = load_static(cache, tokens=TOKENS)
    assert (folder / "table.npy").stat().st_mtime_ns == stamp
    np.testing.assert_array_equal(again.encode(TEXTS), embedder.encode(TEXTS))
    assert again.name == embedder.name and embedder.name.startswith("minilm-static-")


def test_distillation_and_encoding_are_deterministic(built: tuple[StaticEmbedder, Path]) -> None:
    embedder, cache = built
    table = np.load(cache / "static" / embedder.fingerprint[:32] / "table.npy")
    np.testing.assert_allclose(distill(packaged_model_path(), tokens=TOKENS), table, atol=1e-6)
    np.testing.assert_array_equal(embedder.encode(TEXTS), embedder.encode(TEXTS))
    # one text's row does not depend on the batch it is in
    np.testing.assert_allclose(embedder.encode(TEXTS[1:2])[0], embedder.encode(TEXTS)[1], atol=1e-7)


def test_rows_are_unit_norm_and_a_text_without_word_pieces_is_zero(
    built: tuple[StaticEmbedder, Path],
) -> None:
    embedder, _ = built
    rows = embedder.encode(TEXTS)
    assert rows.dtype == np.float32 and rows.shape == (len(TEXTS), 384)
    np.testing.assert_allclose(np.linalg.norm(rows, axis=1), 1.0, atol=1e-5)
    assert not embedder.encode([""]).any()
    assert embedder.encode([]).shape == (0, 384)
    # the mean of word pieces: a repeated text has the text's own row
    np.testing.assert_allclose(embedder.encode(["the cat the cat"]), embedder.encode(["the cat"]),
                               atol=1e-6)  # fmt: skip


def test_the_fingerprint_and_the_table_change_with_the_source_model(
    built: tuple[StaticEmbedder, Path], tmp_path: Path
) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    embedder, cache = built
    source = packaged_model_path()
    changed = tmp_path / "model"
    shutil.copytree(source, changed)
    assert model_fingerprint(changed, tokens=TOKENS) == embedder.fingerprint  # same files
    weights = load_file(str(source / "model.safetensors"))
    key = next(k for k in sorted(weights) if k.endswith("word_embeddings.weight"))
    noise = torch.randn(weights[key].shape, generator=torch.Generator().manual_seed(0))
    weights[key] = weights[key] + 0.05 * noise  # (a constant shift would be normalised away)
    save_file(weights, str(changed / "model.safetensors"), metadata={"format": "pt"})
    other = load_static(cache, source=changed, tokens=TOKENS)
    assert other.fingerprint != embedder.fingerprint
    assert (cache / "static" / other.fingerprint[:32] / "table.npy").exists()
    assert not np.allclose(other.encode(TEXTS), embedder.encode(TEXTS), atol=1e-4)
    # the recipe is in the fingerprint too: another partial table, another fingerprint
    assert model_fingerprint(source, tokens=TOKENS + 1) != embedder.fingerprint
    assert model_fingerprint(source) != embedder.fingerprint
