"""The on-disk embedding cache survives a process killed while it was making it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from workers.text.embeddings import EmbeddingCache, SentenceEmbedder

PHRASES = ["chest pain", "heart failure", "fracture", "shortness of breath"]
FINGERPRINT = "f" * 64


def lookup(cache: EmbeddingCache, embedder: SentenceEmbedder) -> np.ndarray:
    indices = np.arange(len(PHRASES), dtype=np.int64)
    return cache.lookup(
        phrases=PHRASES, fingerprint=FINGERPRINT, indices=indices, embedder=embedder
    )


@pytest.mark.parametrize("left", ["an empty embeddings file", "a truncated embeddings file"])
def test_a_cache_left_without_its_mask_is_made_again(
    tmp_path: Path, embedder: SentenceEmbedder, left: str
) -> None:
    """A worker killed while it made the cache (found by the embedded crash proof) left
    the embeddings file without the mask: every later job then failed."""
    cache = EmbeddingCache(tmp_path)
    folder = cache.folder(FINGERPRINT, embedder.name)
    folder.mkdir(parents=True)
    path = folder / "embeddings.npy"
    if left == "an empty embeddings file":
        shape = (len(PHRASES), embedder.dim)
        np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=shape).flush()
    else:
        path.write_bytes(b"\x93NUMPY\x01\x00")
    expected = embedder.encode(PHRASES)
    np.testing.assert_allclose(lookup(cache, embedder), expected, atol=1e-6)
    assert sorted(p.name for p in folder.iterdir()) == [
        ".lock",
        "embeddings.npy",
        "mask.npy",
        "meta.json",
    ]
    np.testing.assert_allclose(lookup(cache, embedder), expected, atol=1e-6)  # from disk
