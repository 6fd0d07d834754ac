"""The Celery tasks of a job. Their names are the wire format (see :mod:`app.worker`);
their arguments are ids (the job's; a sharded job's round name and shard number), and
everything else is read from the database.

Both tasks acknowledge late: a task whose worker dies goes back on its queue. What a
second delivery does is decided by the job's state (:mod:`app.jobs.runner`): the
sequences stage never runs again once the sequences are saved (a delivery after a
worker died before saving them runs the engine again: the ε was committed once and is
not charged again, and nothing of the lost attempt left the worker), and the prompting
stage only prompts the sequences that have no text. The soft time limit (settings)
makes a task mark its job failed; the stages catch it.

A worker process builds its :class:`~app.jobs.stages.WorkerContext` (settings, database
with this Celery app, so that saving the sequences queues the prompting stage after the
commit, and the document key) on its first task, and from then on says that it is alive
(:class:`~app.jobs.recovery.Heartbeat`), so that the jobs it holds are not taken for
orphans. A worker's main process, before it takes a task, sends again the jobs whose
worker died, then looks for such jobs every half lease (:class:`~app.jobs.recovery.Sweeper`).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import structlog
from celery import signals

from app.config import get_settings
from app.db import Database
from app.jobs import recovery, shards, stages
from app.worker import (
    MAP_SHARD,
    REDUCE_ROUND,
    RUN_PROMPTS,
    RUN_SEQUENCES,
    celery_app,
    redelivers,
    waiting_task_ids,
)

log = structlog.get_logger("keyseed.jobs")
_context: stages.WorkerContext | None = None
_sweeper: recovery.Sweeper | None = None


def worker_context() -> stages.WorkerContext:
    """This process's context, made on first use (after the pool has forked), and its
    heartbeat started."""
    global _context
    if _context is None:
        _context = stages.WorkerContext.from_settings(get_settings(), celery=celery_app)
        recovery.Heartbeat(_context.database, _context.settings.job_lease_seconds).start()
    return _context


def _forget_context(**_: Any) -> None:
    global _context
    _context = None  # a forked child must not share its parent's connections


def _recover_at_start(**_: Any) -> None:
    """Before the worker takes a task: send again the jobs whose worker died, and on a
    broker that forgets taken messages those nobody holds that have no task waiting."""
    global _sweeper
    settings = get_settings()
    database = Database.from_settings(settings, celery=celery_app)
    _sweeper = recovery.Sweeper(
        database,
        settings.job_lease_seconds,
        unheld=not redelivers(settings),
        waiting=lambda: waiting_task_ids(celery_app),
    )
    _sweeper.sweep()
    database.engine.dispose()  # no connection of it crosses the fork of the pool


def _recover_periodically(**_: Any) -> None:
    if _sweeper is not None:
        _sweeper.start()


def _stop_recovery(**_: Any) -> None:
    if _sweeper is not None:
        _sweeper.stop()


signals.worker_process_init.connect(_forget_context, weak=False)
signals.celeryd_after_setup.connect(_recover_at_start, weak=False)
signals.worker_ready.connect(_recover_periodically, weak=False)
signals.worker_shutdown.connect(_stop_recovery, weak=False)


def _run(part: Callable[[stages.WorkerContext, uuid.UUID], str], job_id: object) -> str:
    """Run a task's part of a job with the job's id bound to the log; a malformed id is
    logged and answered ``bad_argument``."""
    try:
        job = uuid.UUID(str(job_id))
    except ValueError:
        log.error("task.bad_argument", expected="a job id")
        return "bad_argument"
    structlog.contextvars.bind_contextvars(job_id=str(job))
    return part(worker_context(), job)


def run_sequences(job_id: str) -> str:
    """Stages 1-6: private read, DP mechanisms, keyphrase sequences saved."""
    return _run(stages.run_sequences, job_id)


def run_prompts(job_id: str) -> str:
    """Step 7: one LLM call per saved sequence without a text."""
    return _run(stages.run_prompts, job_id)


def map_shard(job_id: str, round_name: str, shard: int) -> str:
    """One shard of a sharded job's round (:mod:`app.jobs.shards`): its rows streamed,
    its raw aggregate stored sealed. Returns a status word, never the aggregate."""
    if not isinstance(round_name, str) or not isinstance(shard, int) or isinstance(shard, bool):
        log.error("task.bad_argument", expected="a job id, a round name, a shard number")
        return "bad_argument"
    return _run(lambda ctx, job: shards.map_shard(ctx, job, round_name, shard), job_id)


def reduce_round(job_id: str, round_name: str) -> str:
    """A round of a sharded job reduced (its noise drawn once), then the next round or
    the run's end (:mod:`app.jobs.shards`)."""
    if not isinstance(round_name, str):
        log.error("task.bad_argument", expected="a job id and a round name")
        return "bad_argument"
    return _run(lambda ctx, job: shards.reduce_round(ctx, job, round_name), job_id)


# The Celery tasks (the functions above stay plain functions, callable in-process).
_OPTIONS: dict[str, Any] = {"acks_late": True, "reject_on_worker_lost": True}
sequences_task = celery_app.task(name=RUN_SEQUENCES, **_OPTIONS)(run_sequences)
prompts_task = celery_app.task(name=RUN_PROMPTS, **_OPTIONS)(run_prompts)
map_task = celery_app.task(name=MAP_SHARD, **_OPTIONS)(map_shard)
reduce_task = celery_app.task(name=REDUCE_ROUND, **_OPTIONS)(reduce_round)
