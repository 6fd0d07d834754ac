"""Engines, sessions, and tasks that are sent only when a transaction commits.

SQLite (the embedded mode) runs every transaction as ``BEGIN IMMEDIATE``: a writer takes
the database lock when it starts, so two budget reservations can never interleave (the
Postgres path locks the dataset row with ``SELECT … FOR UPDATE`` instead).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from app.config import Settings
from app.logging import task_headers

log = structlog.get_logger("keyseed.db")
_PENDING = "keyseed.pending_tasks"
_CELERY = "keyseed.celery"


def _sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
    dbapi_connection.isolation_level = None  # SQLAlchemy's "begin" event issues BEGIN
    cursor = dbapi_connection.cursor()
    for pragma in (
        "foreign_keys=ON",
        "journal_mode=WAL",
        "busy_timeout=30000",
        "synchronous=NORMAL",
    ):
        cursor.execute(f"PRAGMA {pragma}")
    cursor.close()


def _sqlite_begin(connection: Any) -> None:
    connection.exec_driver_sql("BEGIN IMMEDIATE")


def create_db_engine(url: str) -> Engine:
    if make_url(url).get_backend_name() == "sqlite":
        database = make_url(url).database
        if database and database != ":memory:":
            Path(database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        event.listen(engine, "connect", _sqlite_connect)
        event.listen(engine, "begin", _sqlite_begin)
        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)


@dataclass
class Database:
    engine: Engine
    sessions: sessionmaker[Session]

    @classmethod
    def from_settings(cls, settings: Settings, *, celery: Any = None) -> Database:
        return cls.from_url(settings.sqlalchemy_url, celery=celery)

    @classmethod
    def from_url(cls, url: str, *, celery: Any = None) -> Database:
        engine = create_db_engine(url)
        info = {_CELERY: celery} if celery is not None else {}
        return cls(engine, sessionmaker(engine, expire_on_commit=False, info=info))

    def session(self) -> Session:
        return self.sessions()

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """A session that commits when the block ends cleanly and rolls back otherwise."""
        with self.sessions() as session:
            try:
                yield session
                session.commit()
            except BaseException:
                session.rollback()
                raise

    def dispose(self) -> None:
        self.engine.dispose()


def enqueue_after_commit(
    session: Session, task: str, *args: str, task_id: str | None = None
) -> None:
    """Send Celery task ``task(*args)`` once ``session`` commits; drop it on rollback.

    Arguments are ids (strings), never rows or text; the message headers carry the
    request id of the current request, nothing else.
    """
    session.info.setdefault(_PENDING, []).append((task, args, task_id, task_headers()))


@event.listens_for(Session, "after_commit")
def _send_pending(session: Session) -> None:
    pending = session.info.pop(_PENDING, None)
    if not pending:
        return
    celery = session.info.get(_CELERY)
    for task, args, task_id, headers in pending:
        if celery is None:
            log.error("task.enqueue_failed", task=task, reason="no broker configured")
            continue
        try:
            celery.send_task(task, args=list(args), task_id=task_id, headers=headers)
        except Exception as exc:  # the commit stands; the job stays queued
            log.error("task.enqueue_failed", task=task, args=list(args), error=type(exc).__name__)
        else:
            log.info("task.enqueued", task=task, args=list(args))


@event.listens_for(Session, "after_rollback")
def _drop_pending(session: Session) -> None:
    session.info.pop(_PENDING, None)
