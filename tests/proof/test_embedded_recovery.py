"""The embedded mode's worker (SQLite, and kombu's SQL transport as the broker: it
forgets a message once a worker has taken it) is killed with SIGKILL of its main
process in the middle of a job, then a worker is started again.

What must hold (issue 14, item 8): the job finishes, its ε is charged once, nothing
saved before the kill is drawn or prompted again, and a job whose worker died can be
cancelled. The worker is ``celery -A app.worker worker`` in a subprocess
(:class:`realworker.RealWorker`) on the data folder of the test's embedded API; only its
main process is killed, and its pool child dies with it (Celery sets the child's parent
death signal), as when the OOM killer or a crash takes the main process.

Where the worker dies is pinned, not guessed: in a private stage, the test takes the
SQLite database's write lock as soon as the job reports a stage after the documents were
read, so the worker cannot save anything after that, and then kills it; while
prompting, the fake LLM answers a few calls and holds the others.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import sqlite3
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

import migrations
from app.config import LLMEndpointSettings, Settings
from app.main import create_app
from app.models import Job
from app.worker import RUN_PROMPTS, RUN_SEQUENCES
from tests.fake_llm import FakeLLM
from tests.proof.realworker import RealWorker, base_env
from tests.proof.test_crashes import (  # the crash proofs' job, corpus and checks
    FREE_CALLS,
    LLM_CONCURRENCY,
    SEQUENCES,
    Corpus,
    Scene,
    Tap,
    corpus,
    events,
    prompt_of,
    tap,
    wait_for,
)
from tests.service import factories

__all__ = ["corpus", "tap"]

pytestmark = [pytest.mark.slow, pytest.mark.proof]

AFTER_THE_READ = ("private_vocabulary", "embed", "dp_kde", "sequences")  # private stages


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Embeddings of public phrases, shared by the tests' workers."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture
def scene(tap: Tap, corpus: Corpus, cache_dir: Path, tmp_path: Path) -> Iterator[Scene]:
    """The embedded API on a fresh data folder, and the workers the test starts on it."""
    data_dir = tmp_path / "data"
    with FakeLLM(latency=0.05, responder=tap) as llm:
        endpoint = LLMEndpointSettings(base_url=llm.base_url, model=llm.model)
        settings = Settings(
            data_dir=data_dir,
            database_url="",
            broker_url="",
            data_key=SecretStr(""),
            llm_endpoints={"fake": endpoint},
            log_json=True,
        )
        assert settings.embedded and settings.celery_broker_url.startswith("sqla+sqlite")
        migrations.upgrade(settings.sqlalchemy_url)
        app = create_app(settings)
        env = base_env(
            cache_dir,
            KEYSEED_DATA_DIR=str(data_dir),
            KEYSEED_LLM_ENDPOINTS=json.dumps({"fake": endpoint.model_dump(mode="json")}),
            KEYSEED_LLM_CONCURRENCY=str(LLM_CONCURRENCY),
            KEYSEED_LLM_MAX_RETRIES="0",
            KEYSEED_PROGRESS_INTERVAL="0",  # a write at every report of the engine
        )
        database = app.state.database
        world = factories.build_world(database)
        prefix = f"keyseed_recovery_{uuid.uuid4().hex[:8]}:"
        here = Scene(TestClient(app), world, database, llm, tap, prefix, env, tmp_path, corpus)
        try:
            with here:  # its workers stopped on the way out
                yield here
        finally:
            database.dispose()


def sqlite_path(scene: Scene) -> str:
    path = scene.db.engine.url.database
    assert path is not None
    return path


def kill_main(worker: RealWorker) -> None:
    """SIGKILL the worker's main process alone; its pool children die with it."""
    main = worker.process.pid
    children = Path(f"/proc/{main}/task/{main}/children").read_text().split()
    assert children, "the worker has no pool process"
    os.kill(main, signal.SIGKILL)
    worker.process.wait(timeout=30)

    def reaped() -> bool:
        return not any(Path(f"/proc/{child}").exists() for child in children)

    wait_for(reaped, "the pool processes die with the main process", timeout=30)


def kill_in_a_private_stage(scene: Scene, job_id: str, worker: RealWorker) -> str:
    """Kill ``worker`` once the job has read its documents and reported a private stage,
    before it can save anything; returns that stage."""
    connection = sqlite3.connect(sqlite_path(scene), isolation_level=None, timeout=30)
    query = "SELECT stage, sequences_total FROM jobs WHERE id = ?"
    try:
        while True:
            assert worker.alive, worker.text()[-3000:]
            stage, _ = connection.execute(query, (uuid.UUID(job_id).hex,)).fetchone()
            if stage in AFTER_THE_READ:
                break
            time.sleep(0.005)
        connection.execute("BEGIN IMMEDIATE")  # from here on the worker writes nothing
        try:
            stage, saved = connection.execute(query, (uuid.UUID(job_id).hex,)).fetchone()
            assert saved == 0, "the sequences were saved before the kill"
            kill_main(worker)
        finally:
            connection.execute("ROLLBACK")
    finally:
        connection.close()
    return str(stage)


def waiting_tasks(scene: Scene) -> list[tuple[str, list[Any]]]:
    """``(task name, arguments)`` of the messages the embedded broker still holds for a
    worker to take."""
    broker = sqlite3.connect(Path(sqlite_path(scene)).with_name("broker.sqlite3"))
    try:
        rows = broker.execute("SELECT payload FROM kombu_message WHERE visible").fetchall()
    finally:
        broker.close()
    found = []
    for (payload,) in rows:
        message = json.loads(payload)
        body = json.loads(base64.b64decode(message["body"]))
        found.append((str(message["headers"].get("task")), list(body[0])))
    return found


def recovered(worker: RealWorker, job_id: str) -> list[str]:
    return [e["task"] for e in events(worker, "job.recovered", job_id)]


def ledger_entries(scene: Scene, dataset_id: str) -> list[tuple[str, str]]:
    response = scene.client.get(
        f"/v1/datasets/{dataset_id}/ledger", headers=scene.world.owner.headers
    )
    assert response.status_code == 200, response.text
    return [(e["kind"], e["job_id"]) for e in response.json()["entries"]]


def private_vocabulary(scene: Scene, job_id: str) -> list[str] | None:
    with scene.db.session() as session:
        job = session.get(Job, uuid.UUID(job_id))
        assert job is not None
        return None if job.private_vocabulary is None else list(job.private_vocabulary)


# ------------------------------------------------------------------ the tests


def test_a_kill_in_a_private_stage_resumes_at_restart_and_charges_once(
    scene: Scene, request: pytest.FixtureRequest
) -> None:
    dataset_id, job_id = scene.submit()
    first = scene.start_worker()
    stage = kill_in_a_private_stage(scene, job_id, first)

    # what the kill left: the job running in a private stage, its ε committed, nothing
    # saved, nothing prompted, and no message of it left in the broker
    job = scene.job(job_id)
    assert (job["state"], job["stage"]) == ("running", stage)
    assert job["epsilon"]["budget_state"] == "committed" and job["counts"]["sequences"] == 0
    assert scene.llm.chat_requests == []
    assert scene.sequences(job_id) == []
    assert waiting_tasks(scene) == []  # the broker forgot the task the worker took

    second = scene.start_worker()
    ready = time.monotonic()
    job = scene.wait_until_ended(job_id, second)
    figures = {"killed_in": stage, "seconds_to_succeed": round(time.monotonic() - ready, 1)}
    request.node.user_properties.append(("figures", figures))
    scene.check_clean_end(job, second)
    assert recovered(second, job_id) == [RUN_SEQUENCES]
    (started,) = events(second, "job.sequences.started", job_id)
    assert started["restarted"] is True  # the ε committed before the kill is not charged again
    scene.check_ledger(dataset_id, job_id)
    saved = scene.check_release(job_id)
    assert Counter(scene.llm.prompts()) == Counter(prompt_of(s["text"]) for s in saved)


@pytest.mark.parametrize("tap", [FREE_CALLS], indirect=True)
def test_a_kill_while_prompting_resumes_at_restart_without_redrawing(
    scene: Scene, tap: Tap, request: pytest.FixtureRequest
) -> None:
    dataset_id, job_id = scene.submit()
    first = scene.start_worker()
    scene.wait_for_texts(job_id, first, hanging=2)
    kill_main(first)
    before = scene.sequences(job_id)
    vocabulary = private_vocabulary(scene, job_id)
    assert len(before) == SEQUENCES and vocabulary
    done = {s["position"] for s in before if s["text"] is not None}
    assert len(done) == FREE_CALLS
    calls_before = len(scene.llm.chat_requests)
    job = scene.job(job_id)
    assert (job["state"], job["stage"]) == ("running", "prompts")
    assert waiting_tasks(scene) == []

    tap.flowing.set()
    second = scene.start_worker()
    ready = time.monotonic()
    job = scene.wait_until_ended(job_id, second)
    figures = {"killed_in": "prompts", "seconds_to_succeed": round(time.monotonic() - ready, 1)}
    request.node.user_properties.append(("figures", figures))
    scene.check_clean_end(job, second)
    assert recovered(second, job_id) == [RUN_PROMPTS]
    assert events(second, "job.sequences.started", job_id) == []  # no private read again
    scene.check_ledger(dataset_id, job_id)

    # the released DP outputs are the ones saved before the kill
    scene.check_resumed_prompting(job_id, before, calls_before)
    assert private_vocabulary(scene, job_id) == vocabulary
    scene.check_release(job_id)


@pytest.mark.parametrize("tap", [FREE_CALLS], indirect=True)
def test_a_job_whose_worker_died_can_be_cancelled(scene: Scene, tap: Tap) -> None:
    dataset_id, job_id = scene.submit()
    first = scene.start_worker()
    scene.wait_for_texts(job_id, first)
    kill_main(first)
    response = scene.client.post(f"/v1/jobs/{job_id}/cancel", headers=scene.world.owner.headers)
    assert response.status_code == 200, response.text
    job: dict[str, Any] = response.json()
    assert job["state"] == "cancelled" and job["epsilon"]["budget_state"] == "committed"
    # it read the private documents: its spend stays, charged once
    assert ledger_entries(scene, dataset_id) == [("reserve", job_id), ("commit", job_id)]

    # a worker started afterwards leaves it alone: no task of the job waits for it to
    # take, and its start-up sweep (done before it reports "ready.") does not send one
    calls = len(scene.llm.chat_requests)
    assert not [args for _, args in waiting_tasks(scene) if job_id in args]
    tap.flowing.set()
    second = scene.start_worker()
    assert recovered(second, job_id) == []
    assert scene.job(job_id)["state"] == "cancelled"
    assert len(scene.llm.chat_requests) == calls
