"""A release's prompt log: what the LLM was sent for its job, hash-chained (issue 66, item 4).

The log (:mod:`workers.llm.attestation`) is served as JSONL at
``GET /v1/releases/{id}/prompts`` to whoever reads the release report. The prompts and
their inputs are built from DP outputs (the released keyphrase sequences, synthetic
texts selected by noisy histograms, phrases of a public vocabulary nearest a DP target)
and public inputs (document type, template, few-shot examples, labels, the model): the
owner and the grantees get them in clear (``content``), as they get the corpus; platform
roles, who never read a released document, get the records without their content: the
chain, the digests and the public refs, which verify all the same.

``keyseed verify-prompts`` (:mod:`app.cli.verify_prompts`) checks a log; the report
prints the command with the head hash it must end on.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

from sqlalchemy.orm import Session

from app.db import Database
from app.jobs import repository as jobs_repo
from workers.llm import attestation

PAGE = 1000
MEDIA_TYPE = "application/x-ndjson"
ALGORITHM = (
    "SHA-256 over the canonical JSON (keys sorted, no spaces, UTF-8) of each record: its "
    "number, the previous record's hash, its key and kind, the SHA-256 of the prompt's "
    "messages and of each input it was built from, and its public refs"
)


def head(session: Session, job_id: uuid.UUID) -> tuple[int, str]:
    """How many prompts the job's log holds and its head hash (GENESIS when none)."""
    count, last = jobs_repo.prompt_log_head(session, job_id)
    return count, last or attestation.GENESIS


def line(record: str, hash_: str, content: str | None) -> dict[str, Any]:
    """One JSONL line: the record, its hash and (when shown) its content."""
    shown: dict[str, Any] = {**json.loads(record), "hash": hash_}
    if content is not None:
        shown["content"] = json.loads(content)
    return shown


def jsonl_chunks(database: Database, job_id: uuid.UUID, *, content: bool) -> Iterator[bytes]:
    """The job's log as JSONL, a page of records at a time, in chain order."""
    after = -1
    while True:
        with database.session() as session:
            page = [
                line(r.record, r.hash, r.content if content else None)
                for r in jobs_repo.prompt_log_page(session, job_id, after=after, limit=PAGE)
            ]
        if not page:
            return
        yield "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in page).encode()
        after = int(page[-1]["seq"])
