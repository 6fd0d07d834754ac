"""Fixtures of the proof suite: the service test fixtures (a fresh migrated Postgres
database per session, the app, a caller of every role), plus helpers to count every
table's rows and to check problem bodies.

The fixtures are imported from ``tests.service.conftest`` so that both suites build the
database and the app the same way; pytest registers them again under this directory,
so the proof suite gets a database of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from httpx import Response
from sqlalchemy import func, select

from app.db import Database
from app.models import Base
from tests.proof.scene import revoked_caller
from tests.service import factories
from tests.service.conftest import app, client, database_url, db, settings, world

__all__ = ["app", "client", "database_url", "db", "settings", "world"]

PROBLEM_JSON = "application/problem+json"


def table_counts(db: Database) -> dict[str, int]:
    """The number of rows of every table of the schema."""
    with db.session() as session:
        return {
            table.name: int(session.scalar(select(func.count()).select_from(table)) or 0)
            for table in Base.metadata.sorted_tables
        }


def assert_problem(response: Response, status: int, *, field: str | None = None) -> dict[str, Any]:
    """``response`` is an RFC 9457 problem of ``status`` (naming ``field`` if given)."""
    assert response.status_code == status, (response.status_code, response.text[:500])
    assert response.headers["content-type"] == PROBLEM_JSON, response.headers["content-type"]
    body: dict[str, Any] = response.json()
    assert body["status"] == status and body["title"], body
    if field is not None:
        assert body.get("field") == field, (field, body)
    return body


@contextmanager
def nothing_stored(db: Database) -> Iterator[None]:
    """The block (a refused request) adds or removes no row of any table."""
    before = table_counts(db)
    yield
    after = table_counts(db)
    assert after == before, {k: (before[k], after[k]) for k in before if before[k] != after[k]}


class _Collect(logging.Handler):
    def __init__(self, lines: list[str]) -> None:
        super().__init__()
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture
def log_lines() -> Iterator[list[str]]:
    """Every log line the service writes during the test, rendered as in production."""
    root = logging.getLogger()
    lines: list[str] = []
    handler = _Collect(lines)
    if root.handlers:
        handler.setFormatter(root.handlers[0].formatter)
    root.addHandler(handler)
    try:
        yield lines
    finally:
        root.removeHandler(handler)


@pytest.fixture
def revoked(db: Database) -> list[factories.Caller]:
    """A revoked admin key and a revoked owner key."""
    return [revoked_caller(db, "admin"), revoked_caller(db, "owner")]
