"""Engines, sessions, and tasks that are sent only when a transaction commits.

Sessions are read-only or writing, and a request's is read-only when its method is
(``GET``, ``HEAD``; :func:`app.deps.get_session`). On SQLite (the embedded mode) a
writing transaction begins ``IMMEDIATE``: it takes the database's write lock when it
starts, so two budget reservations can never interleave (the Postgres path locks the
dataset row with ``SELECT … FOR UPDATE`` instead). A read-only one begins deferred and
never takes that lock, so readers never wait for a writer (WAL mode); both backends
refuse a write in a read-only transaction (``query_only``, ``READ ONLY``), so a read
path that starts writing fails its tests instead of queueing behind writers.

Small bookkeeping a read path wants (a key's "last used" time) is :func:`write_later`:
written after the read ends, in a short transaction that, on SQLite, skips the write
rather than wait when the lock is taken.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import structlog
from sqlalchemy import Engine, Select, create_engine, event, inspect, update
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from app.config import Settings
from app.logging import task_headers

log = structlog.get_logger("keyseed.db")
_PENDING = "keyseed.pending_tasks"
_LATER = "keyseed.write_later"
_ON_COMMIT = "keyseed.on_commit"
_ON_ROLLBACK = "keyseed.on_rollback"
_CELERY = "keyseed.celery"
_WRITER = "keyseed.writer"  # the writing engine, in a read-only session's info
_READ_ONLY = "keyseed_read_only"  # execution options of connections
_NO_WAIT = "keyseed_no_wait"
BUSY_TIMEOUT_MS = 30_000


def _sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
    dbapi_connection.isolation_level = None  # SQLAlchemy's "begin" event issues BEGIN
    cursor = dbapi_connection.cursor()
    for pragma in (
        "foreign_keys=ON",
        "journal_mode=WAL",
        f"busy_timeout={BUSY_TIMEOUT_MS}",
        "synchronous=NORMAL",
    ):
        cursor.execute(f"PRAGMA {pragma}")
    cursor.close()


def _sqlite_begin(connection: Connection) -> None:
    options = connection.get_execution_options()
    read_only = bool(options.get(_READ_ONLY))
    busy = 0 if options.get(_NO_WAIT) else BUSY_TIMEOUT_MS
    state = connection.connection.info  # per DBAPI connection, across checkouts
    if state.get("query_only") != read_only:
        connection.exec_driver_sql(f"PRAGMA query_only={int(read_only)}")
        state["query_only"] = read_only
    if state.get("busy_timeout", BUSY_TIMEOUT_MS) != busy:
        connection.exec_driver_sql(f"PRAGMA busy_timeout={busy}")
        state["busy_timeout"] = busy
    connection.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")


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
    sessions: sessionmaker[Session]  # writing
    readers: sessionmaker[Session]  # read-only

    @classmethod
    def from_settings(cls, settings: Settings, *, celery: Any = None) -> Database:
        return cls.from_url(settings.sqlalchemy_url, celery=celery)

    @classmethod
    def from_url(cls, url: str, *, celery: Any = None) -> Database:
        engine = create_db_engine(url)
        info: dict[str, Any] = {_CELERY: celery} if celery is not None else {}
        read_only = {_READ_ONLY: True}
        if engine.dialect.name == "postgresql":
            read_only["postgresql_readonly"] = True
        reader = engine.execution_options(**read_only)
        return cls(
            engine,
            sessionmaker(engine, expire_on_commit=False, info=info),
            sessionmaker(reader, expire_on_commit=False, info={**info, _WRITER: engine}),
        )

    def session(self, *, write: bool = False) -> Session:
        """A session, read-only unless ``write``."""
        return self.sessions() if write else self.readers()

    @contextmanager
    def transaction(self, *, write: bool = True) -> Iterator[Session]:
        """A session that commits when the block ends cleanly and rolls back otherwise."""
        with self.session(write=write) as session:
            try:
                yield session
                session.commit()
            except BaseException:
                session.rollback()
                raise

    def dispose(self) -> None:
        self.engine.dispose()


Row = TypeVar("Row")


def add_row(session: Session, row: Row) -> Row:
    """Insert the mapped ``row`` now (flushed: its defaults and id are set)."""
    session.add(row)
    session.flush()
    return row


def first_row(session: Session, query: Select[Row], *, for_update: bool = False) -> Row | None:
    """The query's first row, or None; with ``for_update`` its row is locked and read
    afresh (it may be in the identity map already: the locked version replaces it)."""
    if for_update:
        query = query.with_for_update().execution_options(populate_existing=True)
    return session.scalar(query)


def writes(session: Session) -> bool:
    """Whether ``session`` may write (it is not a read-only session)."""
    return _WRITER not in session.info


def write_later(session: Session, row: Any, **values: Any) -> None:
    """Set ``values`` on the mapped ``row``: at once in a writing session; after a
    read-only one commits, in a transaction of its own that never waits for SQLite's
    write lock (when the lock is taken the write is skipped: use it for bookkeeping
    such as "last used" times, never for anything that must be recorded)."""
    if writes(session):
        for name, value in values.items():
            setattr(row, name, value)
        return
    mapper = inspect(row).mapper
    key = {column.key: getattr(row, column.key) for column in mapper.primary_key}
    statement = update(mapper).filter_by(**key).values(**values)
    session.info.setdefault(_LATER, []).append(statement)


def enqueue_after_commit(
    session: Session, task: str, *args: str, task_id: str | None = None
) -> None:
    """Send Celery task ``task(*args)`` once ``session`` commits; drop it on rollback.

    Arguments are ids (strings), never rows or text; the message headers carry the
    request id of the current request, nothing else.
    """
    session.info.setdefault(_PENDING, []).append((task, args, task_id, task_headers()))


def send_canvas_after_commit(
    session: Session, name: str, canvas: Callable[[Any], Any], **ids: object
) -> None:
    """Send the Celery canvas (a group, a chord) ``canvas(celery)`` builds once
    ``session`` commits; drop it on rollback. Its tasks' arguments are ids only; ``name``
    and ``ids`` (ids again) are what the log says of it."""

    def send() -> None:
        celery = session.info.get(_CELERY)
        if celery is None:
            log.error("task.enqueue_failed", task=name, reason="no broker configured", **ids)
            return
        try:
            canvas(celery).apply_async()
        except Exception as exc:  # the commit stands; recovery sends it again
            log.error("task.enqueue_failed", task=name, error=type(exc).__name__, **ids)
        else:
            log.info("task.enqueued", task=name, **ids)

    session.info.setdefault(_ON_COMMIT, []).append(send)


def after_commit(session: Session, action: Callable[[], object]) -> None:
    """Run ``action`` once ``session`` commits (not at all if it rolls back): for what
    must not happen unless the transaction stands, such as destroying a key."""
    session.info.setdefault(_ON_COMMIT, []).append(action)


def after_rollback(session: Session, action: Callable[[], object]) -> None:
    """Run ``action`` if ``session`` rolls back (not at all if it commits)."""
    session.info.setdefault(_ON_ROLLBACK, []).append(action)


@event.listens_for(Session, "after_commit")
def _run_on_commit(session: Session) -> None:
    session.info.pop(_ON_ROLLBACK, None)
    for action in session.info.pop(_ON_COMMIT, []):
        action()


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


@event.listens_for(Session, "after_commit")
def _write_later(session: Session) -> None:
    statements = session.info.pop(_LATER, None)
    if not statements:
        return
    engine: Engine = session.info[_WRITER]
    try:
        with (
            engine.connect() as connection,
            connection.execution_options(**{_NO_WAIT: True}).begin(),
        ):
            for statement in statements:
                connection.execute(statement)
    except OperationalError as exc:  # the database is busy: it can wait for next time
        log.info("db.write_later_skipped", error=type(exc).__name__)


@event.listens_for(Session, "after_rollback")
def _drop_pending(session: Session) -> None:
    session.info.pop(_PENDING, None)
    session.info.pop(_LATER, None)
    session.info.pop(_ON_COMMIT, None)
    for action in session.info.pop(_ON_ROLLBACK, []):
        action()
