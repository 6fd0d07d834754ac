"""Job leases, and jobs sent to a worker again when the process running them died.

A worker process claims a job before it runs a stage of it: ``jobs.worker_id`` names
the process (:func:`this_process`: host, process id, process start time). The process
says it is alive in ``workers``: its row's ``expires_at`` is pushed ``job_lease_seconds``
ahead when it claims a job and every quarter of that by a :class:`Heartbeat` thread.
A job is **held** while its process is alive: its row has not expired, and it is not a
process of this machine that has exited (then it is dead at once, so a worker restarted
after a crash resumes the job without waiting for the lease to lapse) (:func:`held`).

A task that finds its job held by another process does nothing (``held``), so a job
never runs twice at once, whatever copies of its task a broker delivers; a process that
finds at its next write that another one holds the job now stops without writing
(:class:`LeaseLost`, raised by the writes of :mod:`app.jobs.runner`).

An **orphan** is a queued or running job no live process holds whose task is lost.
A worker looks for them before it takes its first task, then every half lease
(:class:`Sweeper`):

* a job whose process died is an orphan (the task it ran died with it on the embedded
  broker, and comes back on Redis only after the visibility timeout, hours later);
* on a broker that forgets a message once a worker has taken it (kombu's SQL transport
  of the embedded mode: :func:`app.worker.redelivers`), a worker that starts also takes
  for an orphan an active job nobody holds: the worker that took its message may have
  died before it claimed the job;
* a sharded job one of whose shards was claimed by a process that died (its round's
  unfinished shards are sent again, :mod:`app.jobs.shards`);
* but never a job a message of which waits in the broker, where the broker can tell
  (:func:`app.worker.waiting_task_ids`: the SQL transport): a worker will take it.

A task delivered twice all the same (Redis' late redelivery, a retry) finds the job
held or ended and does nothing, or its sequences saved and runs no DP mechanism again.

An orphan is sent the task that continues it from what is persisted (:func:`dispatch`):
the sequences task while no sequence is saved (the ledger's commit is idempotent, so
its ε is charged once; the DP mechanisms run again, as nothing of the lost attempt left
the dead process), the prompting task otherwise (it prompts only the sequences without
a text: nothing saved is drawn or written again).
"""

from __future__ import annotations

import functools
import os
import socket
import threading
import uuid
from collections.abc import Callable, Set
from datetime import datetime, timedelta
from pathlib import Path

import structlog
from sqlalchemy.orm import Session

from app.config import LEASE_SECONDS
from app.db import Database, enqueue_after_commit
from app.jobs import admission, repository
from app.models import Job, utcnow
from app.worker import RUN_PROMPTS, RUN_SEQUENCES

log = structlog.get_logger("keyseed.jobs")
FORGET_AFTER = timedelta(days=1)  # a dead worker's row, once it holds no job


class LeaseLost(Exception):
    """Another live process holds the job: this one must not run it or write to it."""


# ------------------------------------------------------------------ who holds a job


def _stat(pid: int) -> tuple[str, str] | None:
    """``(state, start time)`` of a process of this machine, from ``/proc`` (Linux)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()  # the command name may hold ")" or spaces
    return (fields[0], fields[19]) if len(fields) > 19 else None


def process_id(pid: int) -> str:
    """Process ``pid`` of this machine as a holder of jobs: ``host:pid:start time``."""
    stat = _stat(pid)
    return f"{socket.gethostname()}:{pid}:{stat[1] if stat else ''}"


@functools.cache
def _own_id(pid: int) -> str:  # by pid: a forked child is another holder
    return process_id(pid)


def this_process() -> str:
    return _own_id(os.getpid())


def gone(worker_id: str) -> bool:
    """Whether ``worker_id`` names a process of this machine that no longer runs (one
    of another machine may run still: its row in ``workers`` says until when)."""
    try:
        host, pid, started = worker_id.rsplit(":", 2)
    except ValueError:
        return False
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # it runs, as another user
    stat = _stat(int(pid))
    if stat is None:
        return False
    state, start = stat
    return state in ("Z", "X") or (bool(started) and start != started)  # or a reused pid


def alive(session: Session, worker_id: str, now: datetime | None = None) -> bool:
    if gone(worker_id):
        return False
    expiry = repository.worker_expiry(session, worker_id)
    return expiry is not None and expiry > (now or utcnow())


def held(session: Session, job: Job, now: datetime | None = None) -> bool:
    """Whether a live process holds ``job``."""
    return job.worker_id is not None and alive(session, job.worker_id, now)


def held_by_another(session: Session, job: Job) -> bool:
    return job.worker_id not in (None, this_process()) and held(session, job)


def take(session: Session, job: Job, seconds: float = LEASE_SECONDS) -> bool:
    """Make this process the holder of the (locked) job, alive for ``seconds`` at least;
    False when another live process holds it."""
    if held_by_another(session, job):
        return False
    repository.renew_worker(session, this_process(), utcnow() + timedelta(seconds=seconds))
    job.worker_id = this_process()
    return True


def release(job: Job) -> None:
    """No process holds the job any more (it ended, or waits for its next task)."""
    job.worker_id = None


def dispatch(session: Session, job: Job) -> str:
    """Send, once ``session`` commits, the task that continues ``job`` from what is
    persisted, and release the job (a process that held it stops at its next write).
    Returns the task's name."""
    task = RUN_SEQUENCES if job.sequences_total == 0 else RUN_PROMPTS
    task_id = str(uuid.uuid4())
    job.task_ids = [*job.task_ids, task_id]
    release(job)
    enqueue_after_commit(session, task, str(job.id), task_id=task_id)
    return task


class Heartbeat:
    """Says every quarter of ``seconds``, in a thread, that this process is alive for
    ``seconds`` more (a worker process runs one from its first task on)."""

    def __init__(self, database: Database, seconds: float) -> None:
        self.database = database
        self.seconds = seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="keyseed-heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def beat(self) -> None:
        until = utcnow() + timedelta(seconds=self.seconds)
        with self.database.transaction() as session:
            repository.renew_worker(session, this_process(), until)

    def _run(self) -> None:
        while True:
            try:
                self.beat()
            except Exception as error:  # the database is out of reach: next time
                log.warning("worker.heartbeat_failed", error=type(error).__name__)
            if self._stop.wait(self.seconds / 4):
                return


# ------------------------------------------------------------------ orphans


def is_orphan(
    session: Session,
    job: Job,
    *,
    unheld: bool,
    waiting: Set[str] | None = None,
    now: datetime | None = None,
) -> bool:
    """Whether ``job`` is active, no message of it waits in the broker (``waiting``:
    the ids of the task messages that wait, when the broker can tell), and its process
    died (``unheld``: or it has none)."""
    if job.state not in repository.ACTIVE_STATES:
        return False
    if admission.waiting(job):
        return False  # it waits for its organisation's turn: no task was sent
    if waiting is not None and not waiting.isdisjoint(job.task_ids):
        return False  # a worker will take the job's task
    if job.worker_id is None:
        return unheld or shard_died(session, job, now)
    return not alive(session, job.worker_id, now)


def shard_died(session: Session, job: Job, now: datetime | None = None) -> bool:
    """Whether a shard of the (sharded) job was claimed by a process that died before
    storing it (:mod:`app.jobs.shards`): its sequences task, sent again, sends the
    round's unfinished shards again."""
    return any(
        not alive(session, holder, now)
        for holder in repository.running_shard_holders(session, job.id)
    )


def recover(
    database: Database, *, unheld: bool, waiting: Set[str] | None = None
) -> list[tuple[uuid.UUID, str]]:
    """Send the task of every orphan again (see the module's docstring); returns each
    job recovered and the task sent. Each job is checked again under its row lock."""
    now = utcnow()
    orphan = functools.partial(is_orphan, unheld=unheld, waiting=waiting)
    with database.session() as session:
        candidates = [j.id for j in repository.active(session) if orphan(session, j, now=now)]
    recovered = []
    for job_id in candidates:
        with database.transaction() as session:
            job = repository.get(session, job_id, for_update=True)
            if job is None or not orphan(session, job):
                continue
            task = dispatch(session, job)
        log.warning("job.recovered", job_id=str(job_id), task=task)
        recovered.append((job_id, task))
    with database.transaction() as session:
        repository.prune_workers(session, now - FORGET_AFTER)
    with database.transaction() as session:  # what a crash left waiting for its turn
        admission.admit(session)
    return recovered


class Sweeper:
    """:func:`recover` for a worker's main process: :meth:`sweep` once before the
    worker takes any task (with ``unheld``, for jobs nobody holds too), then, from
    :meth:`start` on, every half lease in a thread, for jobs whose process died.
    ``waiting`` lists the broker's waiting task messages (None: it cannot)."""

    def __init__(
        self,
        database: Database,
        seconds: float,
        *,
        unheld: bool,
        waiting: Callable[[], Set[str] | None],
    ) -> None:
        self.database = database
        self.seconds = seconds
        self.unheld = unheld
        self.waiting = waiting
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="keyseed-recovery", daemon=True)

    def sweep(self) -> None:
        try:
            recover(self.database, unheld=self.unheld, waiting=self.waiting())
        except Exception as error:  # the database or the broker is out of reach: next time
            log.error("job.recovery_failed", error=type(error).__name__)
        else:
            self.unheld = False  # from now on, a job nobody holds is one a worker took

    def start(self) -> Sweeper:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self.seconds / 2):
            self.sweep()
