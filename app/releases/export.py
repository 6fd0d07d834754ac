"""A released corpus as JSONL or CSV, streamed from the database a batch at a time.

Each batch is read in its own short transaction (keyset pagination on the sequence
position), so memory stays flat whatever the size of the corpus and no transaction is
held open while a slow client reads. CSV cells that a spreadsheet would run as a formula
are escaped with a leading apostrophe (OWASP, "CSV injection").
"""

from __future__ import annotations

import csv
import io
import json
import uuid
from collections.abc import Iterator
from typing import Any

from app.db import Database
from app.jobs import repository as jobs_repo

BATCH = 1000
FORMATS = {"jsonl": "application/jsonl", "csv": "text/csv"}  # text/* gets charset=utf-8
CSV_COLUMNS = ("label", "text", "keyphrases")
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
