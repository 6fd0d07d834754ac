"""A Postgres database of its own, for a benchmark or a test session (the service tests'
``database_url`` fixture): created on the local server, migrated, dropped after."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager


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
