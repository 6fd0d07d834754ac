"""A queue fair between organisations, from Postgres state (or SQLite's, embedded).

The broker is first in, first out: were every job's task sent at submission, an
organisation that submits ten jobs would hold the only embedded worker for the time of
ten jobs before another organisation's one job ran. So a job's task is sent only while
its organisation has fewer than ``org_dispatched_jobs`` jobs **in flight** (queued with
a task sent, or running); its other jobs **wait** in the database (queued, no task id)
and are sent as the organisation's earlier ones end. When slots free, organisations take
turns (:func:`admit`): the organisation with the fewest jobs in flight first, then the
one whose oldest waiting job is the oldest, one job each per turn. With one slot per
organisation and one worker, the broker never holds more than one job of an
organisation, so each organisation waits for at most one job of each other one.

:func:`admit` runs in the transaction that ends a job (the worker's, or a cancel's), at
each submission, and every half lease in a worker's main process (the sweeper of
:mod:`app.jobs.recovery`), which sends what a crash between an end and its admission
left waiting. A waiting job is locked with ``SKIP LOCKED``: a transaction that holds its
row (a cancel of it) decides what becomes of it, and a job is never sent twice.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Sequence

from sqlalchemy.orm import Session

from app.config import get_settings
from app.db import enqueue_after_commit
from app.jobs import repository
from app.models import Job
from app.worker import RUN_SEQUENCES


def waiting(job: Job) -> bool:
    """Whether ``job`` waits for its organisation's turn (queued, no task sent yet)."""
    return job.state == "queued" and not job.task_ids


def send(session: Session, job: Job) -> None:
    """Send the job's first task once ``session`` commits."""
    task_id = str(uuid.uuid4())
    job.task_ids = [task_id]
    enqueue_after_commit(session, RUN_SEQUENCES, str(job.id), task_id=task_id)


def admit(session: Session, per_organisation: int | None = None) -> list[uuid.UUID]:
    """Send the waiting jobs that fit in their organisations' slots (``per_organisation``
    jobs in flight each; the setting ``org_dispatched_jobs`` by default), the
    organisations taking turns; returns the jobs sent, in the order sent."""
    limit = get_settings().org_dispatched_jobs if per_organisation is None else per_organisation
    active = repository.active(session)
    flying = Counter(job.organisation_id for job in active if not waiting(job))
    queues: dict[uuid.UUID, list[Job]] = {}
    for job in active:  # oldest first
        if waiting(job):
            queues.setdefault(job.organisation_id, []).append(job)
    sent: list[uuid.UUID] = []
    while True:
        turn = _turn(queues, flying, limit)
        if not turn:
            return sent
        for organisation in turn:
            job = queues[organisation].pop(0)
            locked = repository.lock_waiting(session, job.id)
            if locked is None or not waiting(locked):
                continue  # another transaction holds it, or it was sent or ended
            send(session, locked)
            flying[organisation] += 1
            sent.append(locked.id)


def _turn(
    queues: dict[uuid.UUID, list[Job]], flying: Counter[uuid.UUID], limit: int
) -> Sequence[uuid.UUID]:
    """The organisations that send one job each this turn, in order."""
    ready = [org for org, jobs in queues.items() if jobs and flying[org] < limit]
    return sorted(ready, key=lambda org: (flying[org], queues[org][0].created_at))
