"""The same API on the embedded SQLite database (immediate transactions)."""

from __future__ import annotations

import os
import stat
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

import migrations
from app.config import Settings
from app.db import Database
from app.jobs import runner
from app.main import create_app
from app.releases.prompts import jsonl_chunks
from tests.service import factories
from workers.llm.attestation import Prompt, read_jsonl, verify


@pytest.fixture
def embedded(tmp_path: Path) -> Iterator[tuple[FastAPI, Database]]:
    settings = factories.embedded_settings(tmp_path)
    assert settings.embedded and settings.sqlalchemy_url.startswith("sqlite:///")
    migrations.upgrade(settings.sqlalchemy_url)
    app = create_app(settings)
    yield app, app.state.database
    app.state.database.dispose()


def test_the_embedded_mode_makes_its_own_document_key(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, database_url="", data_key="")
    key = settings.document_key()
    path = tmp_path / "data.key"
    assert len(key) == 32 and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert Settings(data_dir=tmp_path, database_url="", data_key="").document_key() == key
    server = Settings(data_dir=tmp_path, database_url="postgresql://x@localhost/db", data_key="")
    with pytest.raises(RuntimeError, match="KEYSEED_DATA_KEY"):
        server.document_key()
    assert server.sqlalchemy_url.startswith("postgresql+psycopg://")


def test_budget_race_and_flow_on_sqlite(embedded: tuple[FastAPI, Database]) -> None:
    app, database = embedded
    world = factories.build_world(database)
    client = TestClient(app)
    dataset_id = factories.dataset(client, world.owner, cap=3)
    statuses = factories.concurrent_submissions(app, world.owner, dataset_id, 6)
    assert statuses == [202] * 3 + [409] * 3
    jobs = client.get(f"/v1/datasets/{dataset_id}/jobs", headers=world.owner.headers).json()
    factories.run_job(database, jobs[0]["id"])
    ledger = client.get(f"/v1/datasets/{dataset_id}/ledger", headers=world.owner.headers).json()
    assert ledger["budget"] == {**ledger["budget"], "spent": 1.0, "reserved": 2.0, "remaining": 0.0}
    release = factories.release(client, world, jobs[0]["id"])
    download = client.get(
        f"/v1/releases/{release['id']}/download?format=csv", headers=world.client.headers
    )
    assert download.status_code == 200 and len(download.text.splitlines()) == 4

    # the prompt log on SQLite: appended under the job's lock, a resent prompt adds nothing
    prompts = [
        Prompt(f"test/{n}", "test", [{"role": "user", "content": f"p{n}"}]) for n in range(3)
    ]
    job_id = uuid.UUID(jobs[1]["id"])
    with database.transaction() as session:
        assert runner.append_prompts(session, job_id, prompts[:2]) == 2
    with database.transaction() as session:
        assert runner.append_prompts(session, job_id, prompts[1:]) == 1
    lines = read_jsonl(b"".join(jsonl_chunks(database, job_id, content=True)).decode())
    assert [line["key"] for line in lines] == ["test/0", "test/1", "test/2"]
    assert verify(lines).ok


def test_the_sqlite_broker_queues_exist_before_any_message(tmp_path: Path) -> None:
    """Several processes starting at once must not race to create a queue's row (the
    loser's first message would be lost): each process declares them at start, and a
    second declaration, as by a concurrent process, changes nothing."""
    import sqlite3

    from app.worker import QUEUES, create_celery, declare_queues, declares_queues

    settings = Settings(data_dir=tmp_path, database_url="", data_key="", broker_url="")
    assert declares_queues(settings)
    assert not declares_queues(settings.model_copy(update={"broker_url": "redis://x:6379/0"}))
    celery = create_celery(settings)
    threads = [threading.Thread(target=declare_queues, args=(celery,)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    broker = sqlite3.connect(str(tmp_path / "broker.sqlite3"))
    try:
        names = sorted(row[0] for row in broker.execute("SELECT name FROM kombu_queue"))
    finally:
        broker.close()
    assert names == sorted(QUEUES)
