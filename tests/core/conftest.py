"""Fixtures of the core tests: the sentence embedder, the LLM methods' fake LLM, a tiny
low-ε benchmark on AG News rows."""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.fake_llm import FakeLLM, Topical

if TYPE_CHECKING:
    from benchmarks.bench_low_epsilon import Bench
    from workers.text.embeddings import SentenceEmbedder


@pytest.fixture(scope="module")
def embedder() -> SentenceEmbedder:
    """The default sentence embedder, loaded once per module (imported here, not when
    every core test is collected)."""
    from workers.text.embeddings import SentenceEmbedder

    return SentenceEmbedder()


@pytest.fixture(scope="module")
def topical() -> Topical:
    """What the fake LLM answers in the LLM methods' tests: a short text on the topic of
    the prompt's label, numbered through the module (a module may override it)."""
    return Topical()


@pytest.fixture
def llm(topical: Topical) -> Iterator[FakeLLM]:
    """A fake LLM answering with ``topical`` (modules whose tests script the LLM
    otherwise define their own ``llm``)."""
    with FakeLLM(content_fn=topical) as server:
        yield server


@pytest.fixture
def tiny_bench(ag_news_path: Path) -> Bench:
    """The low-ε benchmark on AG News's first 240 rows: per class a quarter as test, the
    rest private. The benchmark is imported here, not when every core test is collected."""
    from benchmarks.bench_low_epsilon import Bench

    with open(ag_news_path, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))[:240]
    texts = [f"{r['title']}. {r['description']}" for r in rows]
    labels = [r["class"] for r in rows]
    private, test = [i for i in range(len(rows)) if i % 4], range(0, len(rows), 4)
    data = (
        [texts[i] for i in private],
        [labels[i] for i in private],
        [texts[i] for i in test],
        [labels[i] for i in test],
    )
    return Bench("ag-tiny", data=data)
