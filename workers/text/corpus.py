"""Reading a labelled corpus from a CSV or JSONL file, with errors that name the problem.

Several text columns are joined with ``". "`` (a title and a body become one document).
Errors name the file, the column or the 1-based row (the header is row 0 of a CSV;
data rows count from 1), never the text of a document. Rows whose text is empty after
joining are skipped and counted, so a caller can say how many were left out.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from workers.errors import InputDataError

csv.field_size_limit(min(sys.maxsize, 2**31 - 1))  # clinical notes can be long

_MAX_ROWS_NAMED = 10


@dataclass(frozen=True)
class LabelledCorpus:
    texts: list[str]
    labels: list[str]  # "" for every row when no label column was asked for
    skipped_empty: int  # rows whose joined text was empty
    units: list[str] | None = None  # the privacy unit of each document (unit column)

    def label_set(self) -> list[str]:
        """The distinct labels in order of first appearance."""
        return list(dict.fromkeys(self.labels))


def _rows_named(rows: Sequence[int]) -> str:
    shown = ", ".join(map(str, rows[:_MAX_ROWS_NAMED]))
    return shown + (" …" if len(rows) > _MAX_ROWS_NAMED else "")


def _decode(path: Path, field: str) -> str:
    try:
        data = path.read_bytes()
    except FileNotFoundError as exc:
        raise InputDataError(f"{path} does not exist", field=field) from exc
    except IsADirectoryError as exc:
        raise InputDataError(f"{path} is a directory, not a file", field=field) from exc
    except OSError as exc:
        raise InputDataError(f"cannot read {path}: {exc.strerror}", field=field) from exc
    if not data.strip():
        raise InputDataError(f"{path} is empty", field=field)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise InputDataError(
            f"{path} is not valid UTF-8 (first bad byte on line {line})", field=field
        ) from exc


def _csv_records(text: str, path: Path, field: str) -> Iterator[tuple[int, dict[str, str]]]:
    reader = csv.reader(io.StringIO(text, newline=""))
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


def _jsonl_records(text: str, path: Path, field: str) -> Iterator[tuple[int, dict[str, str]]]:
    row = 0
    for line in text.split("\n"):
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


def read_labelled(
    path: str | Path,
    *,
    text_columns: Sequence[str],
    label_column: str | None,
    field: str = "input",
    unit_column: str | None = None,
) -> LabelledCorpus:
    """Documents (text columns joined by ". ") and labels from a CSV or JSONL file.

    The format is JSONL when the name ends in ``.jsonl`` or ``.ndjson``, CSV otherwise.
    Raises ``InputDataError`` (with ``field``) when the file is missing, empty, not
    UTF-8, lacks a named column, has a row without a label, or holds no document.
    """
    file = Path(path)
    if not text_columns:
        raise InputDataError("name at least one text column", field="text_column")
    text = _decode(file, field)
    jsonl = file.suffix.lower() in (".jsonl", ".ndjson")
    records = _jsonl_records(text, file, field) if jsonl else _csv_records(text, file, field)
    wanted = [
        *text_columns,
        *([label_column] if label_column else []),
        *([unit_column] if unit_column else []),
    ]
    texts: list[str] = []
    labels: list[str] = []
    units: list[str] = []
    skipped = 0
    missing_label: list[int] = []
    missing_unit: list[int] = []
    checked_header = False
    for row, record in records:
        if not checked_header or jsonl:
            absent = [c for c in wanted if c not in record]
            if absent:
                where = "the header" if not jsonl else f"row {row}"
                raise InputDataError(
                    f"{file}: column {absent[0]!r} is not in {where} "
                    f"(columns: {', '.join(sorted(record)) or 'none'})",
                    field={label_column: "label_column", unit_column: "unit_column"}.get(
                        absent[0], "text_column"
                    ),
                )
            checked_header = True
        parts = [" ".join(record[c].split()) for c in text_columns]
        joined = ". ".join(p for p in parts if p)
        label = record[label_column].strip() if label_column else ""
        if label_column and not label:
            missing_label.append(row)
            continue
        unit = record[unit_column].strip() if unit_column else ""
        if unit_column and not unit:
            missing_unit.append(row)
            continue
        if not joined:
            skipped += 1
            continue
        texts.append(joined)
        labels.append(label)
        units.append(unit)
    if missing_label:
        raise InputDataError(
            f"{file}: {len(missing_label)} row(s) have an empty label (rows "
            f"{_rows_named(missing_label)})",
            field="label_column",
        )
    if missing_unit:
        raise InputDataError(
            f"{file}: {len(missing_unit)} row(s) have an empty unit (rows "
            f"{_rows_named(missing_unit)})",
            field="unit_column",
        )
    if not texts:
        raise InputDataError(f"{file} holds no document with text", field=field)
    return LabelledCorpus(
        texts=texts, labels=labels, skipped_empty=skipped, units=units if unit_column else None
    )


def check_corpus(documents: Sequence[str], labels: Sequence[str], label_set: Sequence[str]) -> None:
    """Shape checks that name rows (1-based), never their text."""
    if len(documents) != len(labels):
        raise InputDataError("documents and labels differ in length", field="labels")
    if not documents:
        raise InputDataError("the corpus holds no document", field="documents")
    if not label_set:
        raise InputDataError("the label set is empty", field="labels")
    if len(set(label_set)) != len(label_set):
        raise InputDataError("the label set repeats a label", field="labels")
    declared = set(label_set)
    bad = [i + 1 for i, label in enumerate(labels) if label not in declared]
    if bad:
        raise InputDataError(
            f"{len(bad)} document(s) carry a label outside the declared set "
            f"(rows {_rows_named(bad)})",
            field="labels",
        )
