"""Migrations make the schema, match the models, go down and up, on Postgres and SQLite."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy.engine import make_url

import migrations
from app.models import Base
from tests.service.conftest import SERVER, _server_engine


@pytest.fixture
def scratch_postgres() -> Iterator[str]:
    name = f"keyseed_t_mig_{uuid.uuid4().hex[:10]}"
    server = _server_engine()
    with server.connect() as connection:
        connection.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(SERVER).set(database=name).render_as_string(hide_password=False)
    finally:
        with server.connect() as connection:
            connection.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        server.dispose()


def _tables(url: str) -> set[str]:
    engine = sa.create_engine(url)
    try:
        return set(sa.inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def _differences(url: str) -> list[object]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            return list(compare_metadata(context, Base.metadata))
    finally:
        engine.dispose()


def _up_down_up(url: str) -> None:
    migrations.upgrade(url)
    assert _tables(url) == set(Base.metadata.tables)
    assert migrations.current_revision(url) == migrations.head_revision()
    assert _differences(url) == []
    migrations.downgrade(url, "base")
    assert _tables(url) == set()
    migrations.upgrade(url)
    assert _tables(url) == set(Base.metadata.tables)


def test_postgres_up_down_up(scratch_postgres: str) -> None:
    _up_down_up(scratch_postgres)


def test_sqlite_up_down_up(tmp_path: Path) -> None:
    _up_down_up(f"sqlite:///{tmp_path / 'keyseed.sqlite3'}")


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
def test_ledger_and_audit_are_append_only(
    backend: str, scratch_postgres: str, tmp_path: Path
) -> None:
    url = scratch_postgres if backend == "postgres" else f"sqlite:///{tmp_path / 'k.sqlite3'}"
    migrations.upgrade(url)
    engine = sa.create_engine(url)
    try:
        with engine.begin() as connection:
            connection.execute(
                sa.text(
                    "INSERT INTO audit_events (kind, actor, details, created_at) "
                    "VALUES ('key.created', 'system:test', '{}', CURRENT_TIMESTAMP)"
                )
            )
        for statement in ("UPDATE audit_events SET actor = 'x'", "DELETE FROM audit_events"):
            with pytest.raises(sa.exc.DBAPIError, match="append-only"), engine.begin() as c:
                c.execute(sa.text(statement))
    finally:
        engine.dispose()
