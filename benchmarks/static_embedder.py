"""A static embedder distilled from the packaged MiniLM (model2vec's recipe): public model,
no privacy cost.

Distillation (Tulkens and van Dongen, model2vec, 2024; ``model2vec.distill`` 0.10): every
token of MiniLM's own word-piece vocabulary (its ``[unused…]`` slots left out) goes
through MiniLM alone, as ``[CLS] token [SEP]``; the token's vector is the mean of the three
outputs. The vectors are centred (model2vec's PCA without its rotation, which changes no
cosine and no linear map) and weighted by SIF on a Zipf estimate of the token's frequency
from its rank in the vocabulary, ``a / (a + p(rank))`` with ``a = 1e-4``. A text's
embedding is the mean of its first ``MAX_TOKENS`` word pieces' vectors (``[UNK]`` counts
as a zero vector), L2-normalised; a text without a known word piece is the zero row.

Encoding is a tokenizer pass and one sparse product with the table: about 7,700 AG
documents per CPU second here, 670× MiniLM. The table is not downloaded: :func:`load_static`
builds it at first use from the packaged model, offline, into the cache folder
(``KEYSEED_CACHE_DIR``) under the model's fingerprint, as the phrase embeddings are
cached; a changed source model has another fingerprint and so another table.

Not wired into the engine: as the document embedder of the class-centroid default it lost
0.017 to 0.048 of accuracy at ε = 1 on the tuning splits
(benchmarks/notes/2026-12-07-static-document-embedder.md).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from workers.errors import ConfigError

RECIPE = "model2vec-mean-centred-sif"
RECIPE_VERSION = 1
SIF_COEFFICIENT = 1e-4
MAX_TOKENS = 512  # word pieces of a text read (model2vec's default)
REMOVED_TOKENS = re.compile(r"\[unused\d+\]")
DISTILL_BATCH = 512
_SOURCE_FILES = ("config.json", "model.safetensors", "tokenizer.json", "modules.json")


def model_fingerprint(source: Path, *, tokens: int | None = None) -> str:
    """sha256 of the source model's weights, tokenizer and configuration files (each
    named) and of the recipe (its version, SIF, ``tokens``): a changed model, a changed
    recipe or a partial table has another fingerprint."""
    digest = hashlib.sha256()
    digest.update(f"{RECIPE}:{RECIPE_VERSION}:{SIF_COEFFICIENT}:{tokens}".encode())
    for name in _SOURCE_FILES:
        path = source / name
        if not path.exists():
            continue
        digest.update(name.encode() + b"\0")
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def _tokenizer(source: Path) -> Any:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(source / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


def sif_weights(n: int, coefficient: float = SIF_COEFFICIENT) -> NDArray[np.float64]:
    """model2vec's weights for ``n`` tokens in rank order: ``a / (a + p)``, ``p`` the Zipf
    probability of the rank (``1 / (rank + 2)``, normalised)."""
    inverse = 1.0 / np.arange(2, n + 2, dtype=np.float64)
    weights: NDArray[np.float64] = coefficient / (coefficient + inverse / inverse.sum())
    return weights


def distill(source: Path, *, tokens: int | None = None) -> NDArray[np.float32]:
    """USES ONLY PUBLIC INPUTS: the ``vocabulary × dim`` table of the source model's word
    pieces (module docstring); only the first ``tokens`` ids are distilled when given (the
    others stay zero: a partial table, for tests). Rows of removed tokens are zero."""
    import torch
    from transformers import AutoModel
    from transformers.utils import logging as transformers_logging

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    tokenizer = _tokenizer(source)
    vocabulary: dict[str, int] = tokenizer.get_vocab()
    size = tokenizer.get_vocab_size()
    cls, sep = vocabulary["[CLS]"], vocabulary["[SEP]"]
    last = size if tokens is None else min(tokens, size)
    kept = np.array(
        sorted(i for t, i in vocabulary.items() if i < last and not REMOVED_TOKENS.fullmatch(t)),
        dtype=np.int64,
    )
    model: Any = AutoModel.from_pretrained(str(source)).eval()
    raw = np.zeros((len(kept), int(model.config.hidden_size)), dtype=np.float64)
    with torch.inference_mode():
        for start in range(0, len(kept), DISTILL_BATCH):
            ids = torch.as_tensor(kept[start : start + DISTILL_BATCH])
            batch = torch.stack([torch.full_like(ids, cls), ids, torch.full_like(ids, sep)], dim=1)
            hidden = model(
                input_ids=batch,
                attention_mask=torch.ones_like(batch),
                token_type_ids=torch.zeros_like(batch),
            ).last_hidden_state
            raw[start : start + len(ids)] = hidden.float().mean(dim=1).numpy()
    raw = np.nan_to_num(raw)
    vectors = (raw - raw.mean(axis=0)) * sif_weights(len(kept))[:, None]
    table = np.zeros((size, raw.shape[1]), dtype=np.float32)
    table[kept] = vectors
    return table


class StaticEmbedder:
    """Mean-pooled rows of a distilled table over a text's word pieces (see module)."""

    def __init__(self, table: NDArray[np.float32], source: Path, fingerprint: str) -> None:
        self._table = np.array(table, dtype=np.float32)
        self._tokenizer = _tokenizer(source)
        self._tokenizer.enable_truncation(MAX_TOKENS)
        unknown = self._tokenizer.token_to_id("[UNK]")
        if unknown is not None:  # a zero row: [UNK] adds nothing to a normalised mean
            self._table[unknown] = 0.0
        self.fingerprint = fingerprint

    @property
    def name(self) -> str:
        return f"minilm-static-{self.fingerprint[:12]}"

    @property
    def dim(self) -> int:
        return int(self._table.shape[1])

    def encode(self, texts: Sequence[str], *, batch_size: int = 256) -> NDArray[np.float32]:
        """L2-normalised mean of each text's word-piece rows (zero for none)."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        from scipy.sparse import csr_matrix

        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=False)
        pieces = [np.asarray(e.ids, dtype=np.int64) for e in encodings]
        indptr = np.zeros(len(pieces) + 1, dtype=np.int64)
        np.cumsum([len(p) for p in pieces], out=indptr[1:])
        if indptr[-1] == 0:
            return out
        # each text's sum of rows as one sparse (texts × vocabulary) product
        counts = csr_matrix(
            (np.ones(int(indptr[-1]), dtype=np.float32), np.concatenate(pieces), indptr),
            shape=(len(pieces), self._table.shape[0]),
        )
        sums = np.asarray(counts @ self._table, dtype=np.float32)
        norms = np.linalg.norm(sums, axis=1, keepdims=True)
        np.divide(sums, norms, out=out, where=norms > 0)
        return out


def load_static(
    cache_dir: Path | str, *, source: Path | None = None, tokens: int | None = None
) -> StaticEmbedder:
    """The static embedder of ``source`` (the packaged MiniLM by default), its table read
    from ``cache_dir/static/<fingerprint>/`` or distilled there first (offline, under an
    advisory lock, so concurrent workers distil it once)."""
    from workers.text.embeddings import packaged_model_path

    source = Path(source or packaged_model_path())
    if not (source / "tokenizer.json").exists():
        raise ConfigError(
            f"no tokenizer.json in {source}: cannot distil a static embedder",
            field="embedding_model",
        )
    fingerprint = model_fingerprint(source, tokens=tokens)
    folder = Path(cache_dir) / "static" / fingerprint[:32]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "table.npy"
    with open(folder / ".lock", "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            if not path.exists():
                table = distill(source, tokens=tokens)
                tmp = folder / "table.tmp.npy"
                np.save(tmp, table)
                os.replace(tmp, path)  # whole or not at all
                meta = {
                    "recipe": RECIPE,
                    "version": RECIPE_VERSION,
                    "sif": SIF_COEFFICIENT,
                    "tokens": tokens,
                    "fingerprint": fingerprint,
                    "shape": list(table.shape),
                }
                (folder / "meta.json").write_text(json.dumps(meta))
            table = np.load(path)
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
    return StaticEmbedder(table, source, fingerprint)
