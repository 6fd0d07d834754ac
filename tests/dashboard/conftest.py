"""Fixtures of the dashboard tests: the service tests' database, app and callers."""

from __future__ import annotations

from tests.service.conftest import (  # noqa: F401 (fixtures)
    app,
    client,
    database_url,
    db,
    settings,
    world,
)
