"""Fair and supervised (issue 65): per-organisation limits refused alike by the dry run
and the submission, a queue fair between organisations, and a dataset delete that
stops its running job within seconds.

The fair queue is checked on the real broker of the test app (kombu's in-memory
transport, first in, first out) and the real stages, in the order a worker with one
process takes the messages; the delete, on a real Aug-PE run whose LLM calls go to a
real HTTP server (``tests/fake_llm.py``) that answers slowly.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from app.config import Settings, get_settings
from app.db import Database
from app.jobs import admission, recovery, stages
from app.jobs import repository as jobs_repo
from app.jobs.stages import WorkerContext
from app.models import Job
from tests.fake_llm import FakeLLM
from tests.service import factories
from tests.service.method_jobs import AUG_PE, llm_worker, submit

SMALL_DPKPS: dict[str, Any] = {"vocabulary_size": 8, "num_features": 64, "sequence_length": 3}


def _post(
    client: TestClient, caller: factories.Caller, dataset_id: str, spec: Any, *, dry: bool
) -> Any:
    return client.post(
        f"/v1/datasets/{dataset_id}/jobs",
        headers=caller.headers,
        params={"dry_run": "true"} if dry else None,
        json=spec,
    )


def _refused(response: Any, limit: str, value: int) -> dict[str, Any]:
    assert response.status_code == 409, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = response.json()
    assert body["type"] == "/problems/limit-exceeded"
    assert body["limit"] == limit and body["value"] == value
    assert limit in body["detail"] and f"{value:,}" in body["detail"]
    return body


def _jobs_of(db: Database, dataset_id: str) -> list[Job]:
    with db.session() as session:
        return list(jobs_repo.list_for_dataset(session, uuid.UUID(dataset_id)))


# ------------------------------------------------------------------ limits


@pytest.mark.parametrize(
    ("spec", "limit", "value", "field"),
    [
        # the attack test's spec: 100,000 calls of up to 32,768 tokens
        (
            {"population": 25_000, "num_released": 100, "max_tokens": 32_768},
            "org_max_llm_calls_per_job",
            20_000,
            "population",
        ),
        ({"concurrency": 1024}, "org_max_llm_concurrency", 32, "concurrency"),
        (
            {"population": 1_000, "num_released": 100, "max_tokens": 32_768},
            "org_max_llm_tokens_per_job",
            10_000_000,
            "max_tokens",
        ),
    ],
)
def test_an_llm_method_job_over_a_limit_is_refused_by_the_dry_run_and_the_submission(
    client: TestClient,
    world: factories.World,
    db: Database,
    spec: dict[str, Any],
    limit: str,
    value: int,
    field: str,
) -> None:
    dataset_id = factories.dataset(client, world.owner, cap=50, delta_cap="1e-5")
    for dry in (True, False):
        body = _refused(
            _post(client, world.owner, dataset_id, {**AUG_PE, **spec}, dry=dry), limit, value
        )
        assert body["field"] == field and body["asked"] > value
    assert _jobs_of(db, dataset_id) == []  # nothing stored, nothing reserved
    ledger = client.get(f"/v1/datasets/{dataset_id}/ledger", headers=world.owner.headers)
    assert ledger.json()["entries"] == []


def test_a_dpkps_job_is_refused_over_the_llm_calls_it_plans_and_not_without_an_llm(
    client: TestClient, world: factories.World
) -> None:
    dataset_id = factories.dataset(client, world.owner, cap=5)
    spec = factories.spec(llm="vllm", per_class=15_000)  # 2 classes: 30,000 prompts
    for dry in (True, False):
        body = _refused(
            _post(client, world.owner, dataset_id, spec, dry=dry),
            "org_max_llm_calls_per_job",
            20_000,
        )
        assert body["field"] == "per_class" and body["asked"] == 30_000
    # without an LLM the same sequences cost no call
    plan = _post(client, world.owner, dataset_id, {**spec, "llm": "none"}, dry=True)
    assert plan.status_code == 200, plan.text


def test_an_organisation_s_jobs_queued_or_running_are_limited_and_others_are_not(
    client: TestClient,
    world: factories.World,
    app: FastAPI,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(app.state.settings, "org_max_active_jobs", 2)
    dataset_id = factories.dataset(client, world.owner, cap=10)
    first = factories.job(client, world.owner, dataset_id)
    factories.job(client, world.owner, dataset_id)
    spec = factories.spec()
    for dry in (True, False):
        body = _refused(
            _post(client, world.owner, dataset_id, spec, dry=dry), "org_max_active_jobs", 2
        )
        assert body["asked"] == 3 and "field" not in body
    # another organisation is not held back by this one's jobs
    other = factories.dataset(client, world.other_owner, cap=10)
    factories.job(client, world.other_owner, other)
    # a job that ends frees its place
    cancelled = client.post(f"/v1/jobs/{first}/cancel", headers=world.owner.headers)
    assert cancelled.status_code == 200, cancelled.text
    assert _post(client, world.owner, dataset_id, spec, dry=False).status_code == 202


def test_the_limits_are_documented_as_a_problem_type(client: TestClient) -> None:
    page = client.get("/problems/limit-exceeded", headers={"Accept": "application/json"})
    assert page.status_code == 200
    assert page.json()["status"] == 409


# ------------------------------------------------------------------ the fair queue


def _drain(app: FastAPI, queue_name: str) -> None:
    """Drop what earlier tests left on the session's in-memory broker."""
    with app.state.celery.connection_for_write() as connection:
        queue = connection.SimpleQueue(queue_name)
        try:
            queue.clear()
        finally:
            queue.close()


def _run_as_one_worker(app: FastAPI, worker: WorkerContext, queue_name: str) -> list[str]:
    """Take the broker's messages one at a time, first in first out, and run each task
    to its end, as a worker with one process does; the job ids in the order run."""
    order: list[str] = []
    for message in factories.taken_messages(app, queue_name, timeout=1.0):
        [job_id] = message.decode()[0]
        assert stages.run_sequences(worker, uuid.UUID(job_id)) == "succeeded"
        order.append(job_id)
    return order


@pytest.fixture
def worker(app: FastAPI, settings: Settings, tmp_path: Path) -> WorkerContext:
    """A worker's context on the test database and the app's broker."""
    return factories.worker_context(app, settings, tmp_path)


@pytest.fixture
def fair(app: FastAPI, monkeypatch: pytest.MonkeyPatch) -> None:
    """One job of each organisation in flight at a time (the default; the other service
    tests send every job at once)."""
    monkeypatch.setattr(app.state.settings, "org_dispatched_jobs", 1)
    assert get_settings().org_dispatched_jobs == 1  # what the worker's side uses


@pytest.mark.usefixtures("fair")
def test_one_organisation_s_many_jobs_do_not_starve_another_s_one_job(
    client: TestClient, world: factories.World, app: FastAPI, db: Database, worker: WorkerContext
) -> None:
    _drain(app, "cpu")
    busy = factories.dataset(client, world.owner, cap=10)
    many = [factories.job(client, world.owner, busy, **SMALL_DPKPS) for _ in range(4)]
    quiet = factories.dataset(client, world.other_owner, cap=10)
    one = factories.job(client, world.other_owner, quiet, **SMALL_DPKPS)
    # the busy organisation's first job is sent, the others wait in the database
    jobs = {str(j.id): j for j in _jobs_of(db, busy)}
    assert [bool(jobs[j].task_ids) for j in many] == [True, False, False, False]
    assert all(jobs[j].state == "queued" for j in many)

    order = _run_as_one_worker(app, worker, "cpu")

    # first in, first out would have run the busy organisation's four jobs first
    assert order == [many[0], one, *many[1:]]
    for job in [*_jobs_of(db, busy), *_jobs_of(db, quiet)]:
        assert job.state == "succeeded" and len(job.task_ids) == 1


@pytest.mark.usefixtures("fair")
def test_a_waiting_job_is_no_orphan_and_is_sent_when_the_job_before_it_is_cancelled(
    client: TestClient, world: factories.World, app: FastAPI, db: Database
) -> None:
    _drain(app, "cpu")
    dataset_id = factories.dataset(client, world.owner, cap=10)
    first = factories.job(client, world.owner, dataset_id)
    second = factories.job(client, world.owner, dataset_id)
    with db.session() as session:
        waiting = jobs_repo.get(session, uuid.UUID(second))
        assert waiting is not None and admission.waiting(waiting)
        assert not recovery.is_orphan(session, waiting, unheld=True)
    # nobody can resume it by hand either: it waits for its turn
    retried = client.post(f"/v1/jobs/{second}/retry", headers=world.owner.headers)
    assert retried.status_code == 409, retried.text
    cancelled = client.post(f"/v1/jobs/{first}/cancel", headers=world.owner.headers)
    assert cancelled.status_code == 200, cancelled.text
    message = factories.queued_message(app, "cpu", second)
    with db.session() as session:
        sent = jobs_repo.get(session, uuid.UUID(second))
        assert sent is not None and sent.task_ids == [message.headers["id"]]


# ------------------------------------------------------------------ delete stops the job


@pytest.fixture
def slow_llm() -> Iterator[FakeLLM]:
    with FakeLLM(latency=0.2) as fake:
        yield fake


def test_deleting_the_dataset_stops_its_running_job_within_seconds(
    client: TestClient,
    world: factories.World,
    app: FastAPI,
    settings: Settings,
    tmp_path: Path,
    slow_llm: FakeLLM,
) -> None:
    context = llm_worker(app, settings, tmp_path, slow_llm)
    context.settings = context.settings.model_copy(update={"progress_interval": 0.5})
    dataset_id = factories.dataset(client, world.owner, cap=50, delta_cap="1e-5")
    # thousands of LLM calls at 0.2 s each: minutes of work, most of it in one stage
    spec = {**AUG_PE, "population": 400, "num_released": 10, "iterations": 3}
    job_id = submit(client, world, dataset_id, spec)
    outcome: dict[str, str] = {}
    thread = threading.Thread(
        target=lambda: outcome.update(ended=stages.run_sequences(context, uuid.UUID(job_id)))
    )
    thread.start()
    try:
        factories.wait_for(
            lambda: len(slow_llm.chat_requests) >= 20, "the LLM calls are under way", timeout=300
        )
        assert thread.is_alive()
        started = time.monotonic()
        deleted = client.delete(f"/v1/datasets/{dataset_id}", headers=world.owner.headers)
        assert deleted.status_code == 200, deleted.text
        thread.join(timeout=60)
        took = time.monotonic() - started
    finally:
        thread.join(timeout=600)
    assert not thread.is_alive()
    assert outcome["ended"] == "cancelled"
    assert took < 5.0, f"the job ran on for {took:.1f} s after its dataset was deleted"
    job = client.get(f"/v1/jobs/{job_id}", headers=world.owner.headers).json()
    assert job["state"] == "cancelled" and job["epsilon"]["budget_state"] == "committed"
    calls = len(slow_llm.chat_requests)
    assert calls < 1000  # it stopped early in its thousands of calls
