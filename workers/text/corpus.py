"""Reading a labelled corpus from a CSV or JSONL file, with errors that name the problem.

Several text columns are joined with ``". "`` (a title and a body become one document).
Errors name the file, the column or the 1-based row (the header is row 0 of a CSV;
data rows count from 1), never the text of a document. Rows whose text is empty after
joining are skipped and counted, so a caller can say how many were left out.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import KW_ONLY, dataclass
from pathlib import Path
from typing import BinaryIO

from workers.errors import InputDataError

csv.field_size_limit(min(sys.maxsize, 2**31 - 1))  # clinical notes can be long

_MAX_ROWS_NAMED = 10
_CHUNK = 1 << 20  # bytes read at a time where a file is checked for any text


@dataclass(frozen=True)
class LabelledCorpus:
    texts: list[str]
    labels: list[str]  # "" for every row when no label column was asked for
    skipped_empty: int  # rows whose joined text was empty
    units: list[str] | None = None  # the privacy unit of each document (unit column)

    def label_set(self) -> list[str]:
        """The distinct labels in order of first appearance."""
        return list(dict.fromkeys(self.labels))


class _RowsNamed:
    """Rows with one problem, as an error names them: how many, and the first few (the
    rows themselves are not kept: a stream of millions holds a dozen numbers)."""

    def __init__(self) -> None:
        self.count = 0
        self.first: list[int] = []

    def add(self, row: int) -> None:
        self.count += 1
        if len(self.first) < _MAX_ROWS_NAMED:
            self.first.append(row)

    def __bool__(self) -> bool:
        return self.count > 0

    def __str__(self) -> str:
        shown = ", ".join(map(str, self.first))
        return shown + (" …" if self.count > _MAX_ROWS_NAMED else "")


def _opened(path: Path, field: str) -> BinaryIO:
    """``path`` open for reading (bytes); refused if it is missing, a folder, unreadable
    or holds only whitespace."""
    try:
        handle = open(path, "rb")  # noqa: SIM115 (the caller closes it)
    except FileNotFoundError as exc:
        raise InputDataError(f"{path} does not exist", field=field) from exc
    except IsADirectoryError as exc:
        raise InputDataError(f"{path} is a directory, not a file", field=field) from exc
    except OSError as exc:
        raise InputDataError(f"cannot read {path}: {exc.strerror}", field=field) from exc
    try:
        while chunk := handle.read(_CHUNK):
            if chunk.strip():
                handle.seek(0)
                return handle
    except OSError as exc:
        handle.close()
        raise InputDataError(f"cannot read {path}: {exc.strerror}", field=field) from exc
    handle.close()
    raise InputDataError(f"{path} is empty", field=field)


def _bad_line(path: Path) -> int:
    """The line (1-based) of the first byte of ``path`` that is not UTF-8 (a line of
    bytes never splits a character: no byte of a multi-byte one is a newline)."""
    number = 0
    with open(path, "rb") as handle:
        for number, line in enumerate(handle, start=1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError:
                return number
    return number


def _lines(path: Path, field: str, newline: str) -> Iterator[str]:
    """The lines of ``path`` decoded as UTF-8 (a BOM dropped), read as they are needed;
    ``newline`` as :func:`open`'s."""
    with (
        _opened(path, field) as raw,
        io.TextIOWrapper(raw, encoding="utf-8-sig", newline=newline) as text,
    ):
        try:
            yield from text
        except UnicodeDecodeError as exc:
            raise InputDataError(
                f"{path} is not valid UTF-8 (first bad byte on line {_bad_line(path)})",
                field=field,
            ) from exc


def _csv_records(
    lines: Iterator[str], path: Path, field: str
) -> Iterator[tuple[int, dict[str, str]]]:
    reader = csv.reader(lines)
    try:
        header = next(reader)
    except StopIteration:
        raise InputDataError(f"{path} has no header row", field=field) from None
    except csv.Error as exc:
        raise InputDataError(f"{path}: malformed header ({exc})", field=field) from None
    names = [h.strip() for h in header]
    row = 0
    try:
        for values in reader:
            if not values or all(not v.strip() for v in values):
                continue  # blank line
            row += 1
            if len(values) > len(names):
                raise InputDataError(
                    f"{path}: row {row} has {len(values)} fields, the header {len(names)}",
                    field=field,
                )
            yield row, dict(zip(names, values, strict=False))
    except csv.Error as exc:
        raise InputDataError(
            f"{path}: malformed CSV after row {row} ({exc})", field=field
        ) from None


def _jsonl_records(
    lines: Iterator[str], path: Path, field: str
) -> Iterator[tuple[int, dict[str, str]]]:
    row = 0
    for line in lines:
        if not line.strip():
            continue
        row += 1
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            raise InputDataError(f"{path}: row {row} is not valid JSON", field=field) from None
        if not isinstance(value, dict):
            raise InputDataError(f"{path}: row {row} is not a JSON object", field=field)
        yield row, {str(k): "" if v is None else str(v) for k, v in value.items()}


@dataclass
class LabelledRows:
    """The documents of a CSV or JSONL file as ``(text, label, unit)`` rows, read from
    the file each time they are iterated, one row at a time: neither the file nor the
    corpus is held (what a pass holds besides the row it yields: a dozen row numbers
    for its errors).

    Text columns are joined by ". "; ``label`` is "" where no label column was asked
    for, ``unit`` None where no unit column was. The format is JSONL when the name ends
    in ``.jsonl`` or ``.ndjson``, CSV otherwise. A pass raises ``InputDataError`` (with
    ``field``) when the file is missing, empty, not UTF-8 or lacks a named column (as it
    meets the problem), and, once it has read every row, when a row has no label (or
    unit) or the file holds no document. After a whole pass, ``skipped_empty`` counts the
    rows whose joined text was empty and ``documents`` the rows yielded.
    """

    path: Path
    _: KW_ONLY
    text_columns: Sequence[str]
    label_column: str | None
    field: str = "input"
    unit_column: str | None = None
    skipped_empty: int = dataclasses.field(default=0, init=False)
    documents: int = dataclasses.field(default=0, init=False)

    def __post_init__(self) -> None:
        if not self.text_columns:
            raise InputDataError("name at least one text column", field="text_column")
        self.path = Path(self.path)

    def _records(self) -> tuple[bool, Iterator[tuple[int, dict[str, str]]]]:
        file, field = self.path, self.field
        if file.suffix.lower() in (".jsonl", ".ndjson"):
            return True, _jsonl_records(_lines(file, field, "\n"), file, field)
        return False, _csv_records(_lines(file, field, ""), file, field)

    def _check_columns(self, record: dict[str, str], where: str) -> None:
        label_column, unit_column = self.label_column, self.unit_column
        wanted = [
            *self.text_columns,
            *([label_column] if label_column else []),
            *([unit_column] if unit_column else []),
        ]
        absent = [c for c in wanted if c not in record]
        if absent:
            raise InputDataError(
                f"{self.path}: column {absent[0]!r} is not in {where} "
                f"(columns: {', '.join(sorted(record)) or 'none'})",
                field={label_column: "label_column", unit_column: "unit_column"}.get(
                    absent[0], "text_column"
                ),
            )

    def __iter__(self) -> Iterator[tuple[str, str, str | None]]:
        jsonl, records = self._records()
        label_column, unit_column = self.label_column, self.unit_column
        skipped = documents = 0
        missing_label, missing_unit = _RowsNamed(), _RowsNamed()
        checked_header = False
        for row, record in records:
            if not checked_header or jsonl:
                self._check_columns(record, "the header" if not jsonl else f"row {row}")
                checked_header = True
            parts = [" ".join(record[c].split()) for c in self.text_columns]
            joined = ". ".join(p for p in parts if p)
            label = record[label_column].strip() if label_column else ""
            if label_column and not label:
                missing_label.add(row)
                continue
            unit = record[unit_column].strip() if unit_column else None
            if unit_column and not unit:
                missing_unit.add(row)
                continue
            if not joined:
                skipped += 1
                continue
            documents += 1
            yield joined, label, unit
        if missing_label:
            raise InputDataError(
                f"{self.path}: {missing_label.count} row(s) have an empty label (rows "
                f"{missing_label})",
                field="label_column",
            )
        if missing_unit:
            raise InputDataError(
                f"{self.path}: {missing_unit.count} row(s) have an empty unit (rows "
                f"{missing_unit})",
                field="unit_column",
            )
        if not documents:
            raise InputDataError(f"{self.path} holds no document with text", field=self.field)
        self.skipped_empty, self.documents = skipped, documents

    def read(self) -> LabelledCorpus:
        """One pass, held in memory."""
        texts: list[str] = []
        labels: list[str] = []
        units: list[str] = []
        for text, label, unit in self:
            texts.append(text)
            labels.append(label)
            units.append(unit or "")
        return LabelledCorpus(
            texts=texts,
            labels=labels,
            skipped_empty=self.skipped_empty,
            units=units if self.unit_column else None,
        )


def read_labelled(
    path: str | Path,
    *,
    text_columns: Sequence[str],
    label_column: str | None,
    field: str = "input",
    unit_column: str | None = None,
) -> LabelledCorpus:
    """Documents (text columns joined by ". ") and labels from a CSV or JSONL file, in
    memory: one pass of :class:`LabelledRows` (its format rules and its errors)."""
    rows = LabelledRows(
        Path(path), text_columns=text_columns, label_column=label_column, field=field,
        unit_column=unit_column,
    )  # fmt: skip
    return rows.read()


def check_corpus(documents: Sequence[str], labels: Sequence[str], label_set: Sequence[str]) -> None:
    """Shape checks that name rows (1-based), never their text."""
    if len(documents) != len(labels):
        raise InputDataError("documents and labels differ in length", field="labels")
    if not documents:
        raise InputDataError("the corpus holds no document", field="documents")
    check_labels(labels, label_set)


def check_labels(labels: Iterable[str], label_set: Sequence[str]) -> int:
    """The label set has labels and repeats none, and every label (streamed, one a
    document) is one of them; errors name the documents (1-based), never their text.
    The number of labels read."""
    if not label_set:
        raise InputDataError("the label set is empty", field="labels")
    if len(set(label_set)) != len(label_set):
        raise InputDataError("the label set repeats a label", field="labels")
    declared = set(label_set)
    bad = _RowsNamed()
    read = 0
    for read, label in enumerate(labels, start=1):
        if label not in declared:
            bad.add(read)
    if bad:
        raise InputDataError(
            f"{bad.count} document(s) carry a label outside the declared set (rows {bad})",
            field="labels",
        )
    return read
