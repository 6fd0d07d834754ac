"""Reading a labelled corpus (workers/text/corpus.py): :class:`LabelledRows` streams the
rows of a CSV or JSONL file at each pass, :func:`read_labelled` is one pass of it, and
both refuse a bad file naming the column or the rows, never a document's text."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from workers.errors import InputDataError
from workers.text.corpus import LabelledRows, check_corpus, check_labels, read_labelled

CSV = (
    "title,body,class,unit\nGoal,late in the match,Sports,p1\n,,Sports,p1\nShares,up,Business,p2\n"
)


def test_each_pass_reads_the_file_again_and_read_labelled_is_one_pass(tmp_path: Path) -> None:
    path = tmp_path / "in.csv"
    path.write_bytes(b"\xef\xbb\xbf" + CSV.replace("\n", "\r\n").encode())
    rows = LabelledRows(
        path, text_columns=["title", "body"], label_column="class", unit_column="unit"
    )
    first = list(rows)
    assert first == [
        ("Goal. late in the match", "Sports", "p1"),
        ("Shares. up", "Business", "p2"),
    ]
    assert (rows.documents, rows.skipped_empty) == (2, 1)
    assert list(rows) == first
    corpus = read_labelled(
        path, text_columns=["title", "body"], label_column="class", unit_column="unit"
    )
    assert list(zip(corpus.texts, corpus.labels, corpus.units or [], strict=True)) == first
    assert corpus.skipped_empty == 1
    plain = LabelledRows(path, text_columns=["body"], label_column=None)
    assert [unit for _, _, unit in plain] == [None, None]


@pytest.mark.parametrize(
    ("name", "content", "needle", "field"),
    [
        ("a.csv", b" \n\n", "is empty", "input"),
        ("b.csv", b"text,class\n" + b"ok,A\n" * 3000 + b"caf\xe9,A\n", "line 3002", "input"),
        ("c.csv", b"text,label\nok,A\n", "column 'class' is not in the header", "label_column"),
        ("d.csv", b"text,class\n" + b"secret,\n" * 12, "12 row(s) have an empty label (rows "
         "1, 2, 3, 4, 5, 6, 7, 8, 9, 10 …)", "label_column"),
        ("e.csv", b"text,class\n,A\n", "holds no document", "input"),
        ("f.jsonl", b'{"text": "ok", "class": "A"}\n{"text": "secret"}\n',
         "column 'class' is not in row 2", "label_column"),
        ("g.jsonl", b'{"text": "ok", "class": "A"}\n[1]\n', "row 2 is not a JSON object",
         "input"),
    ],
)  # fmt: skip
def test_a_bad_file_is_refused_alike_by_a_pass_and_read_labelled(
    tmp_path: Path, name: str, content: bytes, needle: str, field: str
) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    messages = []
    for read in (
        lambda: list(LabelledRows(path, text_columns=["text"], label_column="class")),
        lambda: read_labelled(path, text_columns=["text"], label_column="class"),
    ):
        with pytest.raises(InputDataError) as caught:
            read()
        assert needle in caught.value.message and "secret" not in caught.value.message
        assert caught.value.field == field
        messages.append(caught.value.message)
    assert messages[0] == messages[1]


def test_a_missing_file_and_a_folder_are_refused(tmp_path: Path) -> None:
    for path, needle in ((tmp_path / "none.csv", "does not exist"), (tmp_path, "a directory")):
        with pytest.raises(InputDataError, match=needle):
            list(LabelledRows(path, text_columns=["text"], label_column="class"))


def test_labels_outside_the_declared_set_are_named_streamed_or_not() -> None:
    labels = ["A", "Z", "A", "Y"]
    with pytest.raises(InputDataError, match=r"2 document\(s\) .* \(rows 2, 4\)"):
        check_labels(iter(labels), ["A", "B"])
    with pytest.raises(InputDataError, match=r"\(rows 2, 4\)"):
        check_corpus(["x"] * 4, labels, ["A", "B"])
    assert check_labels(iter(["A", "B"]), ["A", "B"]) == 2


def test_a_pass_holds_memory_flat_in_the_number_of_rows(tmp_path: Path) -> None:
    def peak(n: int) -> int:
        path = tmp_path / f"rows-{n}.csv"
        with open(path, "w", encoding="utf-8") as handle:
            handle.write("text,class\n")
            handle.writelines(f"note {i} about the heart,{'AB'[i % 2]}\n" for i in range(n))
        rows = LabelledRows(path, text_columns=["text"], label_column="class")
        tracemalloc.start()
        read = check_labels((label for _, label, _ in rows), ["A", "B"])
        _, top = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert read == n
        return top

    small, large = peak(2_000), peak(50_000)
    assert large < small + 256 * 1024, (small, large)
