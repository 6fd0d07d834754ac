"""``keyseed generate`` streams its input (issue 65): a DP-KPS run in a configuration the
service shards runs as one shard of the sharded run, reading the file once a round, and
records what the same run in memory records; the input's checks read it a row at a time
and still refuse a bad row, naming it, before the model loads; the reader and a round's
map hold memory flat in the number of rows."""

from __future__ import annotations

import csv
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from app.cli import generate as generate_module
from app.cli import main
from tests.core.cli.generate_runs import TEXTS, generate_args, manifest_of, write_corpus
from tests.core.dpkps import config
from tests.core.dpkps.test_shards import LABELS as TOPICS
from tests.core.dpkps.test_shards import HashEmbedder, make_run
from workers.methods.dpkps import shards
from workers.text.corpus import LabelledRows

WORDS = [w for text in TEXTS.values() for w in text.lower().rstrip(".").split()]
# noise-dependent: what the draws gave, and when the run was
DRAWN = ("documents_written", "sequences", "sequences_drawn", "created_at")


@pytest.fixture
def corpus(tmp_path: Path) -> dict[str, Path]:
    vocabulary = tmp_path / "vocab.txt"
    vocabulary.write_text("\n".join(dict.fromkeys(WORDS)), encoding="utf-8")
    return {
        "input": write_corpus(tmp_path / "in.csv", 40, patients=True),
        "out": tmp_path / "out.jsonl",
        "vocab": vocabulary,
    }


def run_args(corpus: dict[str, Path], *extra: str) -> list[str]:
    return generate_args(
        "dpkps", corpus, "--llm", "none", *extra,
        **{"--vocabulary": str(corpus["vocab"]), "--vocabulary-size": "10", "--epsilon": "1",
           "--delta": "1e-6", "--per-class": "4", "--sequence-length": "3"},
    )  # fmt: skip


class Spy:
    """Counts the streamed runs (:func:`app.cli.generate._streamed`)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.runs: list[tuple[str, ...]] = []
        streamed = generate_module._streamed

        def spied(run: Any, rows: Any, progress: Any) -> Any:
            self.runs.append(tuple(run.rounds))
            return streamed(run, rows, progress)

        monkeypatch.setattr(generate_module, "_streamed", spied)


def drawn_apart(manifest: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in manifest.items() if k not in DRAWN}


@pytest.mark.parametrize(
    ("extra", "rounds"),
    [
        ((), ("counts", "sums")),  # the default: a sample of units, at rates the counts set
        (("--unit-column", "patient"), ("counts", "sums")),
        (("--embed-sample", "6"), ("counts", "sums")),
        (("--embed-sample", "0"), ("sums",)),  # every unit embedded
        (("--centroid-cells", "2"), ("counts", "sums", "cells")),
    ],
    ids=["rows", "unit column", "embed sample", "every unit", "cells"],
)
def test_a_streamed_run_records_what_the_run_in_memory_records(
    corpus: dict[str, Path], monkeypatch: pytest.MonkeyPatch, extra: tuple[str, ...],
    rounds: tuple[str, ...],
) -> None:  # fmt: skip
    spy = Spy(monkeypatch)
    assert main(run_args(corpus, *extra)) == 0
    assert spy.runs == [rounds]
    streamed = manifest_of(corpus["out"])
    with monkeypatch.context() as patched:  # the same configuration, read into memory
        patched.setattr(shards, "shardable", lambda config: False)
        assert main(run_args(corpus, *extra)) == 0
    assert spy.runs == [rounds]  # not streamed this time
    in_memory = manifest_of(corpus["out"])
    # the same parameters, privacy events and accounting, in the same form: only the
    # draws (and the time) differ
    assert drawn_apart(streamed) == drawn_apart(in_memory)
    assert streamed.keys() == in_memory.keys()
    assert streamed["privacy"]["planned"]["events"]
    assert streamed["documents_written"] > 0


def test_configurations_the_sharded_run_does_not_take_are_read_into_memory(
    corpus: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = Spy(monkeypatch)
    assert main(run_args(corpus, "--kde-method", "random_features")) == 0
    assert spy.runs == []
    assert "random Fourier features" in manifest_of(corpus["out"])["method"]


@pytest.mark.parametrize(
    ("row", "needle"),
    [
        ({"text": "late goal", "class": "Weather", "patient": "9"}, "(rows 41)"),
        ({"text": "late goal", "class": "", "patient": "9"}, "empty label (rows 41)"),
        ({"text": "late goal", "class": "Sports", "patient": ""}, "empty unit (rows 41)"),
    ],
    ids=["undeclared label", "no label", "no unit"],
)
def test_a_bad_row_is_refused_by_its_number_before_the_model_loads(
    corpus: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    row: dict[str, str],
    needle: str,
) -> None:
    with open(corpus["input"], "a", newline="", encoding="utf-8") as handle:
        csv.DictWriter(handle, fieldnames=list(row)).writerow(row)

    def no_model(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the embedding model loaded before the input was checked")

    monkeypatch.setattr("workers.text.embeddings.SentenceEmbedder", no_model)
    assert main(run_args(corpus, "--unit-column", "patient")) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: "), err
    assert needle in err and "late goal" not in err
    assert not corpus["out"].exists()


def test_a_bad_byte_late_in_the_file_is_refused_before_the_model_loads(
    corpus: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with open(corpus["input"], "ab") as handle:
        handle.write(b"caf\xe9 news,Sports,9\n")
    monkeypatch.setattr("workers.text.embeddings.SentenceEmbedder", None)
    assert main(run_args(corpus)) == 2
    assert "not valid UTF-8 (first bad byte on line 42)" in capsys.readouterr().err


def test_the_reader_and_a_rounds_map_hold_memory_flat_in_the_number_of_rows(
    tmp_path: Path,
) -> None:
    class Constant(HashEmbedder):
        def encode(self, texts: Any, *, batch_size: int = 256) -> Any:
            import numpy as np

            out = np.zeros((len(texts), self.dim), dtype=np.float32)
            out[:, 0] = 1.0
            return out

    run = make_run(config(epsilon=2.0, embed_sample=0), Constant(), batch=256)

    def peak(n: int) -> int:
        path = tmp_path / f"rows-{n}.csv"
        with open(path, "w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(["text", "class"])
            writer.writerows([f"note {i} about the heart", TOPICS[i % 3]] for i in range(n))
        rows = LabelledRows(path, text_columns=["text"], label_column="class")
        tracemalloc.start()
        run.map("sums", rows, None)
        _, top = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert rows.documents == n
        return top

    peak(100)  # warm: Ṽ's matcher and the like
    small, large = peak(2_000), peak(20_000)
    assert large < small + 512 * 1024, (small, large)  # ten times the rows, not the memory
