"""Reading an uploaded corpus (CSV or JSONL) as a stream, with errors that name rows.

Rows are numbered from 1 (the header of a CSV is row 0; blank lines are not rows).
Nothing in an error comes from the file: messages name rows, lines and the columns the
uploader declared, never a value, a header cell or a label found in the data.

With a ``unit_column`` (a patient id, say) every row must name its unit; the unit is
stored with the document (sealed like it) so that mechanisms can bound one unit's
contribution, and a repeat must repeat the unit as well.

Policies the uploader chooses (``on_empty``, ``on_duplicate``): ``skip`` (default) leaves
empty and repeated documents out and counts them; ``reject`` makes them row errors. A
repeat is a row whose text (after whitespace is collapsed) AND label equal an earlier
row's. Keying on the text alone would let one removed row turn a stored ``(text, a)``
into ``(text, b)`` (the first row kept changes): a substitution, where the privacy
guarantee is stated for one row added or removed (docs/privacy.md). Keyed on the pair,
one row added to or removed from the file changes at most one stored document.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from app.errors import Unprocessable, UnsupportedMediaType

csv.field_size_limit(2**31 - 1)  # the body limit bounds a field; clinical notes are long

MAX_ROW_ERRORS = 50
MAX_DOCUMENT_CHARS = 1_000_000
MAX_NUMBER_DIGITS = 1000  # a JSON integer longer than this is refused, never converted
MAX_UNIT_CHARS = 200
FORMATS = ("csv", "jsonl")
POLICIES = ("skip", "reject")
_SIGNATURES = {
    b"PK\x03\x04": "a zip archive",
    b"PK\x05\x06": "a zip archive",
    b"\x1f\x8b": "gzip data",
    b"BZh": "bzip2 data",
    b"\xfd7zXZ\x00": "xz data",
    b"\x28\xb5\x2f\xfd": "zstd data",
    b"7z\xbc\xaf\x27\x1c": "a 7-zip archive",
    b"Rar!": "a RAR archive",
    b"%PDF-": "a PDF document",
    b"\xd0\xcf\x11\xe0": "an OLE document (old Excel or Word)",
    b"\xff\xfe": "UTF-16 text",
    b"\xfe\xff": "UTF-16 text",
}


@dataclass(frozen=True)
class UploadSpec:
    format: str
    text_columns: tuple[str, ...]
    label_column: str
    labels: tuple[str, ...]
    on_empty: str = "skip"
    on_duplicate: str = "skip"
    unit_column: str | None = None

    @property
    def columns(self) -> dict[str, str]:
        """Every declared column, and the form field that declared it."""
        named = {column: "text_column" for column in self.text_columns}
        named[self.label_column] = "label_column"
        if self.unit_column is not None:
            named[self.unit_column] = "unit_column"
        return named


@dataclass
class UploadReport:
    rows: int = 0
    documents: int = 0
    skipped_empty: int = 0
    skipped_duplicate: int = 0
    errors: list[dict[str, Any]] = field(default_factory=list)
    error_count: int = 0

    def error(self, row: int, message: str, column: str | None = None) -> None:
        self.error_count += 1
        if len(self.errors) < MAX_ROW_ERRORS:
            self.errors.append({"row": row, "column": column, "message": message})


class _LineError(Exception):
    def __init__(self, line: int, problem: str) -> None:
        super().__init__(problem)
        self.line = line
        self.problem = problem


def check_content(head: bytes) -> None:
    """Refuse archives, compressed and binary files from their first bytes."""
    for signature, what in _SIGNATURES.items():
        if head.startswith(signature):
            raise UnsupportedMediaType(f"the file is {what}; upload UTF-8 CSV or JSONL text")
    if b"\x00" in head:
        raise UnsupportedMediaType("the file holds binary data; upload UTF-8 CSV or JSONL text")


def detect_format(declared: str | None, filename: str | None, head: bytes) -> str:
    if declared:
        return declared
    suffix = (filename or "").rsplit(".", 1)[-1].lower() if "." in (filename or "") else ""
    if suffix in ("jsonl", "ndjson"):
        return "jsonl"
    if suffix in ("csv", "txt"):
        return "csv"
    return "jsonl" if head.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"{") else "csv"


@dataclass
class ParseState:
    """Where the reading of a file stands between chunks: the CSV header, how many rows
    and physical lines were read, and the bytes of an incomplete last row (read again
    with the next chunk). Stored sealed between requests (app.datasets.service)."""

    header: list[str] | None = None
    rows: int = 0
    lines: int = 0
    tail: bytes = b""

    def dumps(self) -> str:
        return json.dumps(
            {
                "header": self.header,
                "rows": self.rows,
                "lines": self.lines,
                "tail": base64.b64encode(self.tail).decode("ascii"),
            }
        )

    @classmethod
    def loads(cls, data: str) -> ParseState:
        record = json.loads(data)
        return cls(record["header"], record["rows"], record["lines"], b64decode(record["tail"]))


class _Lines:
    """The physical lines of ``tail`` then ``stream``, decoded (ending kept, for the CSV
    reader); errors name the physical line, counted across chunks in ``state.lines``.

    Unless ``final``, an unterminated last line is not read: it is left in ``carry``.
    ``record`` holds the raw lines read since the last row ended (the reader clears it),
    so that a row cut by the end of a chunk can be read again with the next one."""

    def __init__(self, stream: IO[bytes], state: ParseState, final: bool) -> None:
        self.stream = stream
        self.state = state
        self.final = final
        self.carry = b""
        self.record: list[bytes] = []
        self.exhausted = False

    def _raw(self) -> Iterator[bytes]:
        carry = b""
        for part in (io.BytesIO(self.state.tail), self.stream):
            for raw in iter(part.readline, b""):
                if carry:
                    raw, carry = carry + raw, b""
                if raw.endswith(b"\n"):
                    yield raw
                else:
                    carry = raw
        if carry and self.final:
            yield carry
        else:
            self.carry = carry

    def __iter__(self) -> Iterator[str]:
        state, record = self.state, self.record
        for raw in self._raw():
            state.lines += 1
            record.append(raw)
            if b"\x00" in raw:
                raise _LineError(state.lines, "holds binary data (a NUL byte)")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise _LineError(state.lines, "is not valid UTF-8") from None
            yield line.removeprefix("\ufeff") if state.lines == 1 else line
        self.exhausted = True

    def keep_rest(self) -> None:
        """Leave the lines of the current (incomplete) row and the unterminated last
        line for the next chunk."""
        self.state.lines -= len(self.record)
        self.state.tail = b"".join(self.record) + self.carry
        self.record.clear()


def _check_header(values: list[str], spec: UploadSpec) -> list[str]:
    if not any(v.strip() for v in values):
        raise Unprocessable("the file is empty", field="file")
    names = [name.strip() for name in values]
    for column, which in spec.columns.items():
        if column not in names:
            raise Unprocessable(f"column {column!r} is not in the header", field=which)
        if names.count(column) > 1:  # which of them holds the data would be a guess
            raise Unprocessable(f"column {column!r} is in the header more than once", field=which)
    return names


def _csv_records(lines: _Lines, spec: UploadSpec) -> Iterator[tuple[int, dict[str, Any]]]:
    state = lines.state
    reader = csv.reader(lines)
    for values in reader:
        if lines.exhausted and not lines.final:
            lines.keep_rest()  # a quoted field goes on past this chunk
            return
        lines.record.clear()
        if state.header is None:
            if any(v.strip() for v in values):
                state.header = _check_header(values, spec)
            continue
        if not any(map(str.strip, values)):
            continue  # a blank line is not a row
        state.rows += 1
        names = state.header
        if len(values) != len(names):
            yield state.rows, {"__error__": f"has {len(values)} fields, the header {len(names)}"}
            continue
        yield state.rows, dict(zip(names, values, strict=True))
    lines.keep_rest()
    if state.header is None and lines.final:
        raise Unprocessable("the file is empty", field="file")


class _LongNumber:
    """A JSON integer of more than :data:`MAX_NUMBER_DIGITS` digits (Python would refuse
    to convert it past 4,300 digits, and no text or label is such a number)."""


def _integer(digits: str) -> int | _LongNumber:
    return _LongNumber() if len(digits.lstrip("-")) > MAX_NUMBER_DIGITS else int(digits)


def _jsonl_records(lines: _Lines, spec: UploadSpec) -> Iterator[tuple[int, dict[str, Any]]]:
    state = lines.state
    for line in lines:
        lines.record.clear()
        if not line.strip():
            continue
        state.rows += 1
        try:
            value = json.loads(line, parse_int=_integer)
        except (json.JSONDecodeError, RecursionError):
            yield state.rows, {"__error__": "is not valid JSON"}
            continue
        if not isinstance(value, dict):
            yield state.rows, {"__error__": "is not a JSON object"}
            continue
        yield state.rows, value
    lines.keep_rest()


def _unreadable(record: dict[str, Any], column: str) -> str:
    """Why the text cell ``column`` of a row cannot be read."""
    if isinstance(record.get(column), _LongNumber):
        return f"the column is a number of more than {MAX_NUMBER_DIGITS} digits"
    return "the column is missing or not Unicode text"


def _cell(record: dict[str, Any], column: str) -> str | None:
    """The text of a cell, or None when it is absent, not a scalar, or not Unicode text
    (JSON can escape a lone surrogate, which no UTF-8 text holds)."""
    if column not in record:
        return None
    value = record[column]
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return None
    text = str(value)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return text


def b64decode(data: str) -> bytes:
    return base64.b64decode(data.encode("ascii"), validate=True)


def plain_digest(key: bytes) -> bytes:
    return hashlib.blake2b(key, digest_size=16).digest()


@dataclass(frozen=True, slots=True)
class Row:
    """A document to store: its row in the file, text, label, unit (or None) and the
    digest of the three that finds a repeat."""

    row: int
    text: str
    label: str
    unit: str | None = None
    digest: bytes = b""


def read_documents(
    stream: IO[bytes],
    spec: UploadSpec,
    report: UploadReport,
    *,
    state: ParseState | None = None,
    final: bool = True,
    seen: dict[bytes, int] | None = None,
    digest: Callable[[bytes], bytes] = plain_digest,
) -> Iterator[Row]:
    """Every row to store; row errors go to ``report``.

    Once a row error is seen nothing more is yielded (the upload will be refused), but
    the file is read to the end so that the report lists the errors of every row.
    Structural errors (not UTF-8, malformed CSV, missing column) raise ``Unprocessable``.

    A chunk of a file is read with the ``state`` the previous chunk left (updated in
    place) and ``final`` False: its incomplete last row is left in ``state.tail``.
    ``seen`` maps the digests of the rows read so far to their row (repeats within what
    is read here; a caller reading chunks looks the digests up in what it stored).
    """
    state = ParseState() if state is None else state
    seen = {} if seen is None else seen
    declared = set(spec.labels)
    lines = _Lines(stream, state, final)
    records = _csv_records if spec.format == "csv" else _jsonl_records
    row = state.rows
    try:
        for row, record in records(lines, spec):
            report.rows = row
            if "__error__" in record:
                report.error(row, f"the row {record['__error__']}")
                continue
            parts: list[str] = []
            for column in spec.text_columns:
                cell = _cell(record, column)
                if cell is None:
                    report.error(row, _unreadable(record, column), column)
                    break
                parts.append(" ".join(cell.split()))
            else:
                label = _cell(record, spec.label_column)
                unit = _cell(record, spec.unit_column) if spec.unit_column else None
                text = ". ".join(p for p in parts if p)
                document = _check_row(report, row, text, label, unit, spec, declared, seen, digest)
                if document is not None and report.error_count == 0:
                    report.documents += 1
                    yield document
    except _LineError as exc:
        raise Unprocessable(
            f"line {exc.line} (row {row + 1}) {exc.problem}",
            field="file",
            row=row + 1,
            line=exc.line,
        ) from None
    except csv.Error:
        raise Unprocessable(f"malformed CSV at row {row + 1}", field="file", row=row + 1) from None


def _stripped(
    report: UploadReport, row: int, value: str | None, what: str, column: str
) -> str | None:
    """A label or unit cell's value, stripped; None once the row's error is recorded (the
    cell is missing, not Unicode text, or blank)."""
    if value is None:
        report.error(row, f"the {what} is missing or not Unicode text", column)
        return None
    value = value.strip()
    if not value:
        report.error(row, f"the {what} is empty", column)
        return None
    return value


def _check_row(
    report: UploadReport,
    row: int,
    text: str,
    label: str | None,
    unit: str | None,
    spec: UploadSpec,
    declared: set[str],
    seen: dict[bytes, int],
    digest: Callable[[bytes], bytes],
) -> Row | None:
    """The row as a document to store, or None (errors and skips are recorded)."""
    label = _stripped(report, row, label, "label", spec.label_column)
    if label is None:
        return None
    if label not in declared:
        report.error(row, "the label is not one of the declared labels", spec.label_column)
        return None
    if spec.unit_column is not None:
        unit = _stripped(report, row, unit, "unit", spec.unit_column)
        if unit is None:
            return None
        if len(unit) > MAX_UNIT_CHARS:
            report.error(
                row, f"the unit is longer than {MAX_UNIT_CHARS} characters", spec.unit_column
            )
            return None
    if len(text) > MAX_DOCUMENT_CHARS:
        report.error(row, f"the document is longer than {MAX_DOCUMENT_CHARS} characters")
        return None
    if not text:
        if spec.on_empty == "reject":
            report.error(row, "the document is empty")
        else:
            report.skipped_empty += 1
        return None
    # A repeat repeats the text, the label and the unit (see the module docstring).
    # Lengths first: one encoding per (text, label, unit), read back unambiguously.
    key = f"{len(text)}|{len(label)}|{text}{label}{unit or ''}".encode("utf-8", "surrogatepass")
    hashed = digest(key)
    first = seen.setdefault(hashed, row)
    if first != row:
        if spec.on_duplicate == "reject":
            report.error(row, f"the document repeats row {first}")
        else:
            report.skipped_duplicate += 1
        return None
    return Row(row, text, label, unit, hashed)
