"""The triggers that keep ``ledger_entries`` and ``audit_events`` append-only, for the
migrations: made once (0001) and lifted only while a migration rewrites a table."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from alembic import op


def _postgres() -> bool:
    return bool(op.get_bind().dialect.name == "postgresql")


def append_only(table: str) -> None:
    """Refuse UPDATE and DELETE on ``table`` (the function ``keyseed_append_only`` of
    Postgres is made once, by 0001)."""
    if _postgres():
        op.execute(
            f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
            "FOR EACH ROW EXECUTE FUNCTION keyseed_append_only()"
        )
        return
    for event in ("UPDATE", "DELETE"):
        op.execute(
            f"CREATE TRIGGER {table}_no_{event.lower()} BEFORE {event} ON {table} "
            f"BEGIN SELECT RAISE(ABORT, '{table} is append-only'); END"
        )


def _drop(table: str) -> None:
    if _postgres():
        op.execute(f"DROP TRIGGER IF EXISTS {table}_append_only ON {table}")
        return
    for event in ("update", "delete"):
        op.execute(f"DROP TRIGGER IF EXISTS {table}_no_{event}")


@contextmanager
def lifted(table: str) -> Iterator[None]:
    """Within the block (inside the migration's transaction) ``table`` may be rewritten
    (on SQLite a batch operation copies it, which drops its triggers); the triggers are
    made again at the end."""
    _drop(table)
    yield
    append_only(table)
