"""A Postgres database of its own, for a benchmark or a test session (the service tests'
``database_url`` fixture): created on the local server, migrated, dropped after; and the
service in process on one, for the benchmarks that drive it through its API."""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastapi.testclient import TestClient

    from app.db import Database


@contextmanager
def scratch_database(prefix: str = "keyseed_bench") -> Iterator[str]:
    """The URL of a fresh, migrated database, dropped (with its connections) on exit."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    import migrations
    from tests.service.conftest import SERVER

    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    server = create_engine(SERVER, isolation_level="AUTOCOMMIT")
    with server.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        url = make_url(SERVER).set(database=name).render_as_string(hide_password=False)
        migrations.upgrade(url)
        yield url
    finally:
        with server.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        server.dispose()


@contextmanager
def scratch_app() -> Iterator[tuple[str, Database, TestClient, Path]]:
    """The service in process on a :func:`scratch_database`: the database's URL, the app's
    :class:`~app.db.Database`, a client of the app, and a work folder (the app's files
    under ``inproc/``), all gone on exit."""
    from fastapi.testclient import TestClient

    from app.main import create_app
    from tests.service.conftest import make_settings

    with scratch_database() as url, tempfile.TemporaryDirectory() as folder:
        workdir = Path(folder)
        app = create_app(make_settings(url, workdir / "inproc"))
        try:
            with TestClient(app) as client:
                yield url, app.state.database, client, workdir
        finally:
            app.state.database.dispose()
