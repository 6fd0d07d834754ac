"""Fixtures of the service tests: a fresh Postgres database per test session, made by
the migrations, emptied after every test; the app; one caller per role and organisation;
a fake OpenAI-compatible LLM server (``tests/fake_llm.py``).

The database is ``keyseed_t_<random>`` on the server of ``KEYSEED_TEST_POSTGRES``
(default: the local server), created and dropped by
:func:`benchmarks.scratch.scratch_database`, so concurrent test sessions
never share tables. The broker is kombu's in-memory transport except where a test
asks for Redis explicitly.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from app.config import LLMEndpointSettings, Settings
from app.db import Database
from app.main import create_app
from app.models import Base
from benchmarks.scratch import scratch_database
from tests.fake_llm import FakeLLM
from tests.service import factories

# Only CREATE DATABASE and DROP DATABASE run on this connection; its tables are never read.
SERVER = os.environ.get(
    "KEYSEED_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
DATA_KEY = base64.b64encode(b"k" * 32).decode()
UPLOAD_LIMIT = 64 * 1024


def _server_engine():  # type: ignore[no-untyped-def]
    return create_engine(SERVER, isolation_level="AUTOCOMMIT")


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    with scratch_database("keyseed_t") as url:
        yield url


def make_settings(database_url: str, data_dir: Path, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "database_url": database_url,
        "broker_url": "memory://",
        "data_dir": data_dir,
        "data_key": DATA_KEY,
        "max_upload_bytes": UPLOAD_LIMIT,
        "llm_endpoints": {
            "vllm": LLMEndpointSettings(base_url="http://127.0.0.1:9/v1", model="open-model")
        },
        "log_json": True,
        # every job is sent at submission, as before the fair queue: the tests that are
        # about the fair queue set it to 1 (tests/service/test_fair_limits.py)
        "org_dispatched_jobs": 1000,
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def settings(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    return make_settings(database_url, tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="session")
def app(settings: Settings) -> Iterator[FastAPI]:
    application = create_app(settings)
    yield application
    application.state.database.dispose()


@pytest.fixture(scope="session")
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app) as test_client:
        yield test_client


@pytest.fixture(autouse=True)
def db(app: FastAPI) -> Iterator[Database]:
    """The app's database; every table is emptied after each test."""
    database: Database = app.state.database
    yield database
    tables = ", ".join(f'"{t.name}"' for t in reversed(Base.metadata.sorted_tables))
    with database.engine.begin() as connection:
        connection.execute(text(f"TRUNCATE {tables} RESTART IDENTITY CASCADE"))


@pytest.fixture
def world(db: Database) -> factories.World:
    return factories.build_world(db)


@pytest.fixture
def fake_llm() -> Iterator[FakeLLM]:
    """A fake OpenAI-compatible LLM server, running for the test."""
    with FakeLLM() as fake:
        yield fake
