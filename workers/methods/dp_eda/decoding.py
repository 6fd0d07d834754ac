"""Decoding DP-selected embeddings to text, and the readability filter (dp-eda.md §10).

Both are post-processing of DP outputs and public inputs; no private text is involved.

* :func:`reconstruction_messages` — decoder C ("DP-EDA selection + LLM reconstruction"):
  the m public vocabulary phrases nearest to the target embedding go into a prompt; the
  caller samples c candidates, re-embeds them and keeps the one nearest the target; with
  r rounds the next prompt is seeded with the best candidate so far.
* :func:`retrieve` — decoder B: the public-pool text nearest to the target.
* :class:`CharBigramPerplexity` — the filter that runs here: a character-bigram language
  model (add-one smoothing) fitted on public text, its threshold H the
  ``percentile`` of the perplexities of held-out public text. It replaces the paper's
  GPT-2 perplexity < 50 (the local LLM server returns no log-probabilities); the
  manifest names it.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from workers.errors import ConfigError

Messages = list[dict[str, str]]
FILTER_NAME = "character-bigram perplexity (add-one), fitted and calibrated on public text"
_START, _END = "\x02", "\x03"


def _clean(text: str) -> str:
    return " ".join(text.replace('"', "'").split())


def population_messages(*, document_type: str, label: str) -> Messages:
    """The zero-shot prompt of the initial population: public document type and label."""
    return [
        {"role": "system", "content": "You write short realistic texts."},
        {
            "role": "user",
            "content": f'Write one {_clean(document_type)} of the category "{_clean(label)}".',
        },
    ]


def reconstruction_messages(
    *, document_type: str, label: str, phrases: Sequence[str], draft: str | None
) -> Messages:
    """Ask for one text containing the public ``phrases`` (and close to ``draft``)."""
    listed = "; ".join(_clean(p) for p in phrases)
    content = (
        f'Write one {_clean(document_type)} of the category "{_clean(label)}" '
        f"using these phrases: {listed}."
    )
    if draft is not None:
        content += f' Improve on this draft: "{_clean(draft)}"'
    return [{"role": "system", "content": "You write short realistic texts."},
            {"role": "user", "content": content}]  # fmt: skip


def nearest_rows(target: NDArray[np.float32], rows: NDArray[np.float32], m: int) -> list[int]:
    """Indices of the ``m`` rows of largest inner product with ``target``, best first."""
    scores = rows @ target
    take = min(m, rows.shape[0])
    part = np.argpartition(-scores, take - 1)[:take]
    return [int(i) for i in part[np.argsort(-scores[part], kind="stable")]]


def retrieve(target: NDArray[np.float32], pool: NDArray[np.float32]) -> int:
    """The pool row nearest (cosine, unit rows) to ``target``."""
    return nearest_rows(target, pool, 1)[0]


class CharBigramPerplexity:
    """A character-bigram model of public text; :attr:`threshold` is H (module docstring)."""

    def __init__(self, texts: Sequence[str], *, percentile: float) -> None:
        train = [t for i, t in enumerate(texts) if i % 2 == 0]
        held_out = [t for i, t in enumerate(texts) if i % 2 == 1] or train
        if not train:
            raise ConfigError("the filter needs public text to fit on", field="texts")
        self._pairs: Counter[tuple[str, str]] = Counter()
        self._firsts: Counter[str] = Counter()
        for text in train:
            chars = [_START, *text.lower(), _END]
            self._pairs.update(itertools.pairwise(chars))
            self._firsts.update(chars[:-1])
        self._alphabet = len({c for pair in self._pairs for c in pair}) + 1
        self.threshold = float(np.percentile([self.perplexity(t) for t in held_out], percentile))

    def perplexity(self, text: str) -> float:
        chars = [_START, *text.lower(), _END]
        total = 0.0
        for pair in itertools.pairwise(chars):
            p = (self._pairs[pair] + 1) / (self._firsts[pair[0]] + self._alphabet)
            total -= math.log(p)
        return math.exp(total / (len(chars) - 1))

    def readable(self, text: str) -> bool:
        """Perplexity(text) < H, the paper's rule."""
        return self.perplexity(text) < self.threshold
