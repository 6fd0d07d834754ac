"""What the tests of ``keyseed generate --method …`` share: a tiny two-class private
corpus, the command line of a run of a method on it, the fake OpenAI-compatible server
it prompts (``--llm openai``) and the manifest the run writes."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.fake_llm import FakeLLM

LABELS = ("Sports", "Business")
TEXTS = {
    "Sports": "The team won the match with a late goal in the final minute.",
    "Business": "Shares rose after the bank reported higher quarterly profits.",
}


def write_corpus(path: Path, documents: int = 12, *, patients: bool = False) -> Path:
    """``documents`` numbered documents, the labels taking turns; with ``patients``, a
    ``patient`` column (four rows a patient)."""
    fields = ["text", "class", *(["patient"] if patients else [])]
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        for i in range(documents):
            label = LABELS[i % 2]
            row = {"text": f"{TEXTS[label]} ({i})", "class": label}
            writer.writerow({**row, "patient": str(i // 4)} if patients else row)
    return path


def generate_args(method: str, corpus: dict[str, Path], *extra: str, **options: str) -> list[str]:
    """``keyseed generate --method METHOD`` on ``corpus`` (its ``input``, written to its
    ``out``) with ``options`` (``--option``: value) and the flags ``extra``."""
    args = [
        "generate",
        "--method",
        method,
        "--input",
        str(corpus["input"]),
        "--text-column",
        "text",
        "--label-column",
        "class",
        "--labels",
        ",".join(LABELS),
        "--output",
        str(corpus["out"]),
    ]
    for option, value in options.items():
        args += [option, value]
    return args + list(extra)


def manifest_of(out: Path) -> dict[str, Any]:
    data = json.loads(out.with_name("out.manifest.json").read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


@contextmanager
def serving(
    content_fn: Callable[[dict[str, Any]], str], monkeypatch: pytest.MonkeyPatch
) -> Iterator[FakeLLM]:
    """A fake LLM answering with ``content_fn``, the endpoint of ``--llm openai``."""
    with FakeLLM(content_fn=content_fn) as server:
        monkeypatch.setenv("KEYSEED_LLM_BASE_URL", server.base_url)
        monkeypatch.setenv("KEYSEED_LLM_MODEL", server.model)
        yield server
