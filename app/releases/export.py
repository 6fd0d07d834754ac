"""A released corpus as JSONL, CSV or Parquet, streamed from the database a batch at a time.

Each batch is read in its own short transaction (keyset pagination on the sequence
position), so memory stays flat whatever the size of the corpus and no transaction is
held open while a slow client reads. CSV cells that a spreadsheet would run as a formula
are escaped with a leading apostrophe (OWASP, "CSV injection").

Parquet has the JSONL's columns and types (``label`` and ``text`` strings, ``text`` null
where a sequence has none; ``keyphrases`` a list of strings), one row group per batch:
each row group's bytes are sent once it is written, and the footer last, so the file is
never whole in memory either. Its cells are typed values, not formulas, so they are not
escaped (as in JSONL).
"""

from __future__ import annotations

import csv
import io
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from app.db import Database
from app.jobs import repository as jobs_repo

BATCH = 1000
FORMATS = {  # text/* gets charset=utf-8
    "jsonl": "application/jsonl",
    "csv": "text/csv",
    "parquet": "application/vnd.apache.parquet",  # IANA, 2024
}
CSV_COLUMNS = ("label", "text", "keyphrases")
PARQUET_SCHEMA = pa.schema(
    [
        pa.field("label", pa.string(), nullable=False),
        pa.field("text", pa.string()),
        pa.field("keyphrases", pa.list_(pa.string()), nullable=False),
    ]
)
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "\n", "＝", "＋", "－", "＠")


def escape_cell(value: str) -> str:
    """``'`` before a cell that starts like a formula, so it is read as text."""
    return "'" + value if value.startswith(_FORMULA_STARTS) else value


def _records(
    database: Database, job_id: uuid.UUID, *, texts_only: bool
) -> Iterator[list[dict[str, Any]]]:
    after = -1
    while True:
        with database.session() as session:
            page = jobs_repo.sequences_page(
                session, job_id, after=after, limit=BATCH, with_text_only=texts_only
            )
            records: list[dict[str, Any]] = [
                {
                    "position": s.position,
                    "label": s.label,
                    "text": s.text,
                    "keyphrases": list(s.keyphrases),
                }
                for s in page
            ]
        if not records:
            return
        yield records
        after = records[-1]["position"]


def jsonl_chunks(database: Database, job_id: uuid.UUID, *, texts_only: bool) -> Iterator[bytes]:
    for records in _records(database, job_id, texts_only=texts_only):
        lines = (
            json.dumps({k: r[k] for k in CSV_COLUMNS}, ensure_ascii=False) + "\n" for r in records
        )
        yield "".join(lines).encode("utf-8")


def csv_chunks(database: Database, job_id: uuid.UUID, *, texts_only: bool) -> Iterator[bytes]:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n")
    writer.writerow(CSV_COLUMNS)
    for records in _records(database, job_id, texts_only=texts_only):
        for r in records:
            writer.writerow(
                [
                    escape_cell(r["label"]),
                    escape_cell(r["text"] or ""),
                    escape_cell("; ".join(r["keyphrases"])),
                ]
            )
        yield buffer.getvalue().encode("utf-8")
        buffer.seek(0)
        buffer.truncate()
    if buffer.tell():
        yield buffer.getvalue().encode("utf-8")


class _Sink(io.RawIOBase):
    """Where the Parquet writer puts its bytes until they are sent: what was written
    since the last :meth:`drain` (one row group at most), and how much in all (the
    writer asks, to record the row groups' offsets in the footer)."""

    def __init__(self) -> None:
        super().__init__()
        self._parts: list[bytes] = []
        self._written = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        chunk = bytes(data)
        self._parts.append(chunk)
        self._written += len(chunk)
        return len(chunk)

    def tell(self) -> int:
        return self._written

    def drain(self) -> bytes:
        data = b"".join(self._parts)
        self._parts.clear()
        return data


def parquet_chunks(database: Database, job_id: uuid.UUID, *, texts_only: bool) -> Iterator[bytes]:
    sink = _Sink()
    with pq.ParquetWriter(sink, PARQUET_SCHEMA, compression="zstd") as writer:
        for records in _records(database, job_id, texts_only=texts_only):
            columns = {name: [r[name] for r in records] for name in CSV_COLUMNS}
            writer.write_table(pa.table(columns, schema=PARQUET_SCHEMA))
            yield sink.drain()
    yield sink.drain()  # the footer (and the magic number of a file with no rows)


CHUNKS = {"jsonl": jsonl_chunks, "csv": csv_chunks, "parquet": parquet_chunks}
