"""SQL for jobs, their keyphrase sequences (or released texts), method checkpoints and
the shards of sharded jobs."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, insert, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from app.db import add_row, first_row
from app.models import (
    Job,
    JobCheckpoint,
    JobShard,
    JobShardPlan,
    JobShardRound,
    KeyphraseSequence,
    PromptRecord,
    Worker,
)

ACTIVE_STATES = ("queued", "running")


def add(session: Session, job: Job) -> Job:
    return add_row(session, job)


def get(session: Session, job_id: uuid.UUID, *, for_update: bool = False) -> Job | None:
    return first_row(session, select(Job).where(Job.id == job_id), for_update=for_update)


def list_for_dataset(session: Session, dataset_id: uuid.UUID) -> Sequence[Job]:
    query = select(Job).where(Job.dataset_id == dataset_id).order_by(Job.created_at.desc())
    return session.scalars(query).all()


def active_of_dataset(session: Session, dataset_id: uuid.UUID) -> Sequence[Job]:
    query = select(Job).where(Job.dataset_id == dataset_id, Job.state.in_(ACTIVE_STATES))
    return session.scalars(query.execution_options(populate_existing=True)).all()


def active(session: Session) -> Sequence[Job]:
    """Every queued or running job, oldest first."""
    query = select(Job).where(Job.state.in_(ACTIVE_STATES)).order_by(Job.created_at)
    return session.scalars(query.execution_options(populate_existing=True)).all()


def active_of_organisation(session: Session, organisation_id: uuid.UUID) -> Sequence[Job]:
    """The organisation's queued and running jobs, oldest first."""
    query = select(Job).where(Job.organisation_id == organisation_id, Job.state.in_(ACTIVE_STATES))
    return session.scalars(query.order_by(Job.created_at, Job.id)).all()


def lock_waiting(session: Session, job_id: uuid.UUID) -> Job | None:
    """The job, locked, unless another transaction holds its row (then None: that one
    is ending or sending it)."""
    query = (
        select(Job)
        .where(Job.id == job_id)
        .with_for_update(skip_locked=True)
        .execution_options(populate_existing=True)
    )
    return session.scalar(query)


def worker_expiry(session: Session, worker_id: str) -> datetime | None:
    """Until when a worker process counts as alive (None: no such process)."""
    return session.scalar(select(Worker.expires_at).where(Worker.id == worker_id))


def renew_worker(session: Session, worker_id: str, until: datetime) -> None:
    """The worker process counts as alive until ``until`` (its row is made if need be)."""
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    statement = dialect.insert(Worker).values(id=worker_id, expires_at=until)
    session.execute(
        statement.on_conflict_do_update(index_elements=[Worker.id], set_={"expires_at": until})
    )


def prune_workers(session: Session, before: datetime) -> int:
    """Forget the worker processes dead since before ``before`` that hold no job."""
    holding = select(Job.worker_id).where(Job.worker_id.is_not(None))
    result = session.execute(
        delete(Worker).where(Worker.expires_at < before, Worker.id.not_in(holding))
    )
    return int(getattr(result, "rowcount", 0) or 0)


def counts_by_state(session: Session) -> dict[str, int]:
    query = select(Job.state, func.count()).group_by(Job.state)
    return {state: int(count) for state, count in session.execute(query).all()}


def insert_sequences(session: Session, rows: Sequence[dict[str, Any]]) -> None:
    if rows:
        session.execute(insert(KeyphraseSequence), list(rows))


def sequences_page(
    session: Session,
    job_id: uuid.UUID,
    *,
    after: int,
    limit: int,
    with_text_only: bool = False,
    without_text_only: bool = False,
) -> Sequence[KeyphraseSequence]:
    """Sequences of a job by position, after ``after`` (keyset pagination)."""
    query = select(KeyphraseSequence).where(
        KeyphraseSequence.job_id == job_id, KeyphraseSequence.position > after
    )
    if with_text_only:
        query = query.where(KeyphraseSequence.text.is_not(None))
    if without_text_only:
        query = query.where(KeyphraseSequence.text.is_(None))
    return session.scalars(query.order_by(KeyphraseSequence.position).limit(limit)).all()


def get_sequence(session: Session, job_id: uuid.UUID, position: int) -> KeyphraseSequence | None:
    query = select(KeyphraseSequence).where(
        KeyphraseSequence.job_id == job_id, KeyphraseSequence.position == position
    )
    return session.scalar(query)


def count_sequences(session: Session, job_id: uuid.UUID, *, with_text_only: bool = False) -> int:
    query = select(func.count()).where(KeyphraseSequence.job_id == job_id)
    if with_text_only:
        query = query.where(KeyphraseSequence.text.is_not(None))
    return int(session.scalar(query) or 0)


def missing_texts_by_error(session: Session, job_id: uuid.UUID) -> dict[str, int]:
    """Sequences without a text, counted by their error code (None: never attempted)."""
    query = (
        select(KeyphraseSequence.error, func.count())
        .where(KeyphraseSequence.job_id == job_id, KeyphraseSequence.text.is_(None))
        .group_by(KeyphraseSequence.error)
    )
    return {error or "not_attempted": int(count) for error, count in session.execute(query).all()}


def get_checkpoint(session: Session, job_id: uuid.UUID, key: str) -> JobCheckpoint | None:
    return session.get(JobCheckpoint, (job_id, key))


def put_checkpoint(session: Session, job_id: uuid.UUID, key: str, data: bytes) -> None:
    """Insert or replace the checkpoint ``key`` of the job (the caller holds its row lock)."""
    existing = get_checkpoint(session, job_id, key)
    if existing is None:
        session.add(JobCheckpoint(job_id=job_id, key=key, data=data))
    else:
        existing.data = data
    session.flush()


def prompt_entries_among(session: Session, job_id: uuid.UUID, entries: Sequence[str]) -> set[str]:
    """Which of ``entries`` the job's prompt log holds already."""
    found: set[str] = set()
    for start in range(0, len(entries), 1000):
        query = select(PromptRecord.entry).where(
            PromptRecord.job_id == job_id, PromptRecord.entry.in_(entries[start : start + 1000])
        )
        found.update(session.scalars(query))
    return found


def prompt_log_head(session: Session, job_id: uuid.UUID) -> tuple[int, str | None]:
    """How many records the job's prompt log holds, and the last one's hash."""
    query = (
        select(PromptRecord.seq, PromptRecord.hash)
        .where(PromptRecord.job_id == job_id)
        .order_by(PromptRecord.seq.desc())
        .limit(1)
    )
    last = session.execute(query).first()
    return (0, None) if last is None else (int(last.seq) + 1, str(last.hash))


def add_prompt_records(session: Session, job_id: uuid.UUID, rows: Sequence[dict[str, Any]]) -> None:
    """Append records (``seq``, ``entry``, ``hash``, ``record``, ``content``) to the job's
    log (the caller holds the job's row lock)."""
    if rows:
        session.execute(insert(PromptRecord), [{"job_id": job_id, **row} for row in rows])
        session.flush()


def prompt_log_page(
    session: Session, job_id: uuid.UUID, *, after: int = -1, limit: int = 1000
) -> Sequence[PromptRecord]:
    """The job's prompt records after ``after``, in chain order."""
    query = (
        select(PromptRecord)
        .where(PromptRecord.job_id == job_id, PromptRecord.seq > after)
        .order_by(PromptRecord.seq)
        .limit(limit)
    )
    return session.scalars(query).all()


def count_checkpoints(session: Session, job_id: uuid.UUID) -> int:
    query = select(func.count()).select_from(JobCheckpoint).where(JobCheckpoint.job_id == job_id)
    return int(session.scalar(query) or 0)


def shard_plan(session: Session, job_id: uuid.UUID) -> JobShardPlan | None:
    return session.get(JobShardPlan, job_id)


def add_shard_plan(session: Session, plan: JobShardPlan) -> JobShardPlan:
    return add_row(session, plan)


def shards_of_round(session: Session, job_id: uuid.UUID, round_name: str) -> Sequence[JobShard]:
    query = (
        select(JobShard)
        .where(JobShard.job_id == job_id, JobShard.round == round_name)
        .order_by(JobShard.shard)
    )
    return session.scalars(query.execution_options(populate_existing=True)).all()


def shards_of_job(session: Session, job_id: uuid.UUID) -> Sequence[JobShard]:
    query = select(JobShard).where(JobShard.job_id == job_id)
    return session.scalars(query.order_by(JobShard.round, JobShard.shard)).all()


def get_shard(
    session: Session, job_id: uuid.UUID, round_name: str, shard: int, *, for_update: bool = False
) -> JobShard | None:
    query = select(JobShard).where(
        JobShard.job_id == job_id, JobShard.round == round_name, JobShard.shard == shard
    )
    return first_row(session, query, for_update=for_update)


def add_shards(session: Session, job_id: uuid.UUID, round_name: str, count: int) -> None:
    for shard in range(count):
        session.add(JobShard(job_id=job_id, round=round_name, shard=shard, state="pending"))
    session.flush()


def shard_round(session: Session, job_id: uuid.UUID, round_name: str) -> JobShardRound | None:
    return session.get(JobShardRound, (job_id, round_name))


def add_shard_round(session: Session, job_id: uuid.UUID, round_name: str, sealed: bytes) -> None:
    add_row(session, JobShardRound(job_id=job_id, round=round_name, sealed=sealed))


def running_shard_holders(session: Session, job_id: uuid.UUID) -> list[str]:
    """The processes that claimed a shard of the job that is not stored yet."""
    query = select(JobShard.worker_id).where(
        JobShard.job_id == job_id, JobShard.state == "running", JobShard.worker_id.is_not(None)
    )
    return [holder for holder in session.scalars(query) if holder is not None]
