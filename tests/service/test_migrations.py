"""Migrations make the schema, match the models, go down and up, on Postgres and SQLite."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

import migrations
from app.models import Base, Dataset, Document, Organisation
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


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
def test_the_unit_columns_go_down_and_up_keeping_the_documents(
    backend: str, scratch_postgres: str, tmp_path: Path
) -> None:
    url = scratch_postgres if backend == "postgres" else f"sqlite:///{tmp_path / 'u.sqlite3'}"
    script = ScriptDirectory.from_config(migrations.alembic_config(url)).get_revision("0004")
    assert script is not None and isinstance(script.down_revision, str)
    migrations.upgrade(url)
    engine = sa.create_engine(url)
    try:
        with Session(engine) as session, session.begin():
            organisation = Organisation(name="hospital", kind="owner")
            session.add(organisation)
            session.flush()
            dataset = Dataset(
                organisation_id=organisation.id,
                name="notes",
                format="csv",
                text_columns=["text"],
                label_column="label",
                labels=["a"],
                unit_column="patient",
                epsilon_cap=1.0,
                created_by="system:test",
            )
            session.add(dataset)
            session.flush()
            session.add(
                Document(
                    dataset_id=dataset.id,
                    row=1,
                    key_id="k",
                    nonce=b"n" * 12,
                    ciphertext=b"sealed",
                    unit=b"sealed unit",
                )
            )
        engine.dispose()
        migrations.downgrade(url, script.down_revision)
        with engine.connect() as connection:
            assert "unit" not in {
                c["name"] for c in sa.inspect(connection).get_columns("documents")
            }
            assert connection.execute(sa.text("SELECT ciphertext FROM documents")).scalar_one() == (
                b"sealed"
            )
        engine.dispose()
        migrations.upgrade(url)
        with engine.connect() as connection:
            row = connection.execute(
                sa.text(
                    "SELECT d.ciphertext, d.unit, s.unit_column FROM documents d "
                    "JOIN datasets s ON s.id = d.dataset_id"
                )
            ).one()
        assert tuple(row) == (b"sealed", None, None)
    finally:
        engine.dispose()
