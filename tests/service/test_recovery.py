"""Job leases and the jobs sent again when the worker process running them died, on the
test database: the real stages, ledger and API; real processes of this machine stand
for the other workers (``sleep``: one that runs, one that has exited); the app's
in-memory broker receives what is sent again. The real embedded worker, killed and
restarted, is in ``tests/proof/test_embedded_recovery.py``.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import SecretStr

from app.config import Settings
from app.db import Database
from app.jobs import recovery, runner, stages
from app.jobs import repository as jobs_repo
from app.jobs.stages import WorkerContext
from app.models import Job, KeyphraseSequence, Worker, utcnow
from app.worker import (
    RUN_PROMPTS,
    RUN_SEQUENCES,
    create_celery,
    declare_queues,
    waiting_task_ids,
)
from tests.fake_llm import FakeLLM
from tests.service import factories
from tests.service.method_jobs import ledger_kinds
from tests.service.test_worker import (  # fixtures and helpers of the stages' tests
    cache_dir,
    job_of,
    last_task_id,
    queued_task_ids,
    submit,
    with_llm,
    worker,
)

__all__ = ["cache_dir", "worker"]

ELSEWHERE = "worker-7.example:4242:1"  # a process of another machine: its row says


@contextmanager
def a_process() -> Iterator[str]:
    """A running process of this machine, as a holder of jobs."""
    process = subprocess.Popen(["sleep", "600"])
    try:
        yield recovery.process_id(process.pid)
    finally:
        process.kill()
        process.wait(timeout=10)


def a_dead_process() -> str:
    with a_process() as holder:
        pass
    return holder


def hold(db: Database, job_id: str, holder: str, *, seconds: float = 60.0) -> None:
    """What a worker process's claim and heartbeat leave: ``holder`` holds the job and
    is alive for ``seconds`` more (ago, when negative)."""
    with db.transaction() as session:
        job = jobs_repo.get(session, uuid.UUID(job_id), for_update=True)
        assert job is not None
        job.worker_id = holder
        jobs_repo.renew_worker(session, holder, utcnow() + timedelta(seconds=seconds))


def start(db: Database, job_id: str) -> None:
    """The job running, its ε committed (as a worker's first step leaves it)."""
    with db.transaction() as session:
        assert runner.start_sequences(session, uuid.UUID(job_id)) is not None


def row(db: Database, job_id: str) -> Job:
    with db.session() as session:
        job = session.get(Job, uuid.UUID(job_id))
        assert job is not None
        return job


def keyphrases(db: Database, job_id: str) -> list[tuple[int, str, list[str]]]:
    with db.session() as session:
        rows = session.query(KeyphraseSequence).filter_by(job_id=uuid.UUID(job_id)).all()
        return sorted((s.id, s.label, list(s.keyphrases)) for s in rows)


# ------------------------------------------------------------------ who holds a job


def test_a_process_of_this_machine_is_gone_once_it_has_exited() -> None:
    with a_process() as holder:
        assert not recovery.gone(holder)
        host, pid, _ = holder.rsplit(":", 2)
        assert recovery.gone(f"{host}:{pid}:1")  # the same pid, another process
    assert recovery.gone(holder)
    assert not recovery.gone(recovery.this_process())
    assert not recovery.gone(ELSEWHERE)  # of another machine: only its row can tell


def test_the_heartbeat_keeps_this_process_alive(db: Database) -> None:
    def expiry() -> datetime | None:
        with db.session() as session:
            return jobs_repo.worker_expiry(session, recovery.this_process())

    def beats(after: datetime | None) -> datetime:
        def renewed() -> datetime | None:
            value = expiry()
            return value if value is not None and (after is None or value > after) else None

        return factories.wait_for(renewed, "the heartbeat renews the row", timeout=30)

    heartbeat = recovery.Heartbeat(db, 2.0).start()  # a beat every half second
    try:
        first = beats(None)
        assert first > utcnow()
        later = beats(first)
        with db.session() as session:
            assert recovery.alive(session, recovery.this_process())
            assert not recovery.alive(session, recovery.this_process(), later)
    finally:
        heartbeat.stop()


def test_a_job_held_by_a_live_process_runs_nowhere_else(
    client: TestClient, world: factories.World, worker: WorkerContext, db: Database
) -> None:
    dataset_id, job_id = submit(client, world)
    start(db, job_id)
    with a_process() as other:
        hold(db, job_id, other)
        assert stages.run_sequences(worker, uuid.UUID(job_id)) == "held"
        assert recovery.recover(db, unheld=True) == []
        retry = client.post(f"/v1/jobs/{job_id}/retry", headers=world.owner.headers)
        assert retry.status_code == 409 and "live worker" in retry.json()["detail"]
        cancel = client.post(f"/v1/jobs/{job_id}/cancel", headers=world.owner.headers)
        assert cancel.status_code == 200
        assert (cancel.json()["state"], cancel.json()["cancel_requested"]) == ("running", True)
    assert row(db, job_id).sequences_total == 0
    assert ledger_kinds(client, world, dataset_id) == ["reserve", "commit"]


def test_a_process_whose_job_was_taken_over_stops_without_writing(
    client: TestClient, world: factories.World, worker: WorkerContext, db: Database
) -> None:
    dataset_id, job_id = submit(client, world)
    with a_process() as other:

        def take_over(job: uuid.UUID, stage: str, fraction: float) -> None:
            if stage == "embed":  # this process was thought dead; another one resumed
                hold(db, job_id, other)

        ctx = WorkerContext(worker.settings, worker.database, worker.cipher, [take_over])
        assert stages.run_sequences(ctx, uuid.UUID(job_id)) == "lost"
        job = row(db, job_id)
        assert (job.state, job.stage, job.worker_id) == ("running", "embed", other)
    assert job.sequences_total == 0 and keyphrases(db, job_id) == []
    assert ledger_kinds(client, world, dataset_id) == ["reserve", "commit"]


# ------------------------------------------------------------------ orphans


def test_each_orphan_is_sent_the_task_that_continues_it(
    app: FastAPI,
    client: TestClient,
    world: factories.World,
    worker: WorkerContext,
    fake_llm: FakeLLM,
    db: Database,
) -> None:
    ctx = with_llm(worker, fake_llm)
    dead = a_dead_process()
    # died in a private stage: nothing saved
    private_dataset, private = submit(client, world)
    start(db, private)
    hold(db, private, dead)
    # died while prompting: the sequences are saved
    prompting_dataset, prompting = submit(client, world, llm="vllm")
    assert stages.run_sequences(ctx, uuid.UUID(prompting)) == "prompting"
    assert queued_task_ids(app, "llm", prompting) == [last_task_id(db, prompting)]
    drawn = keyphrases(db, prompting)
    hold(db, prompting, dead)
    # held by processes of another machine: alive, then past its time
    _, elsewhere = submit(client, world)
    start(db, elsewhere)
    hold(db, elsewhere, ELSEWHERE)
    _, expired = submit(client, world)
    start(db, expired)
    hold(db, expired, "worker-8.example:1:1", seconds=-1)
    # queued, taken by no process: its message was lost with a worker, or it waits
    _, lost = submit(client, world)
    queued_task_ids(app, "cpu", lost)  # consumed: as by a worker that died at once
    _, waiting = submit(client, world)

    assert dict(recovery.recover(db, unheld=False)) == {
        uuid.UUID(private): RUN_SEQUENCES,
        uuid.UUID(prompting): RUN_PROMPTS,
        uuid.UUID(expired): RUN_SEQUENCES,
    }
    assert queued_task_ids(app, "cpu", private) == [last_task_id(db, private)]
    assert queued_task_ids(app, "llm", prompting) == [last_task_id(db, prompting)]
    assert row(db, private).worker_id is None
    assert recovery.recover(db, unheld=False) == []  # sent: nobody holds them now
    # a worker starting on a broker that forgets taken messages sends every job nobody
    # holds and no message of which waits; the one held elsewhere stays where it is
    messages = {last_task_id(db, waiting), last_task_id(db, private), last_task_id(db, expired)}
    messages.add(last_task_id(db, prompting))
    at_start = dict(recovery.recover(db, unheld=True, waiting=messages))
    assert at_start == {uuid.UUID(lost): RUN_SEQUENCES}
    assert queued_task_ids(app, "cpu", lost) == [last_task_id(db, lost)]

    # each resumes from what is persisted, its ε charged once
    assert stages.run_sequences(ctx, uuid.UUID(private)) == "succeeded"
    assert ledger_kinds(client, world, private_dataset) == ["reserve", "commit"]
    calls = len(fake_llm.chat_requests)
    assert stages.run_sequences(ctx, uuid.UUID(prompting)) == "skipped"  # a second copy
    assert stages.run_prompts(ctx, uuid.UUID(prompting)) == "succeeded"
    assert stages.run_prompts(ctx, uuid.UUID(prompting)) == "skipped"  # a second copy
    assert len(fake_llm.chat_requests) - calls == 4  # one call per sequence
    assert keyphrases(db, prompting) == drawn  # nothing drawn again
    assert ledger_kinds(client, world, prompting_dataset) == ["reserve", "commit"]


def test_the_embedded_broker_lists_the_task_messages_that_wait(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, database_url="", data_key=SecretStr(""), broker_url="")
    celery = create_celery(settings)
    declare_queues(celery)
    assert waiting_task_ids(celery) == set()
    celery.send_task(RUN_SEQUENCES, args=[str(uuid.uuid4())], task_id="task-1")
    celery.send_task(RUN_PROMPTS, args=[str(uuid.uuid4())], task_id="task-2")
    assert waiting_task_ids(celery) == {"task-1", "task-2"}
    with celery.connection_for_read() as connection:  # a worker takes one
        queue = connection.SimpleQueue("llm")
        try:
            message = queue.get(timeout=10)
            assert message.headers["id"] == "task-2"
            assert waiting_task_ids(celery) == {"task-1"}  # while it runs
            message.ack()
        finally:
            queue.close()
    assert waiting_task_ids(celery) == {"task-1"}
    redis = settings.model_copy(update={"broker_url": "redis://127.0.0.1:6379/0"})
    assert waiting_task_ids(create_celery(redis)) is None  # Redis cannot tell


def test_recovery_forgets_long_dead_workers_that_hold_nothing(
    client: TestClient, world: factories.World, db: Database
) -> None:
    _, job_id = submit(client, world)
    start(db, job_id)
    hold(db, job_id, "worker-9.example:1:1", seconds=-3 * 86400)
    with db.transaction() as session:
        jobs_repo.renew_worker(session, "worker-9.example:2:1", utcnow() - timedelta(days=3))
        jobs_repo.renew_worker(session, "worker-9.example:3:1", utcnow() - timedelta(hours=1))
    assert recovery.recover(db, unheld=False) == [(uuid.UUID(job_id), RUN_SEQUENCES)]
    with db.session() as session:  # dead for more than a day, and its job sent again
        left = {w.id for w in session.query(Worker).all()}
    assert left == {"worker-9.example:3:1", recovery.this_process()}


# ------------------------------------------------------------------ cancel and retry


@pytest.mark.parametrize("saved", [False, True], ids=["private stage", "prompting"])
def test_cancelling_a_job_whose_process_died_ends_it_and_keeps_its_spend(
    client: TestClient,
    world: factories.World,
    worker: WorkerContext,
    fake_llm: FakeLLM,
    db: Database,
    saved: bool,
) -> None:
    ctx = with_llm(worker, fake_llm)
    dataset_id, job_id = submit(client, world, llm="vllm")
    if saved:
        assert stages.run_sequences(ctx, uuid.UUID(job_id)) == "prompting"
    else:
        start(db, job_id)
    hold(db, job_id, a_dead_process())
    response = client.post(f"/v1/jobs/{job_id}/cancel", headers=world.owner.headers)
    assert response.status_code == 200, response.text
    job = response.json()
    assert job["state"] == "cancelled" and job["epsilon"]["budget_state"] == "committed"
    assert ledger_kinds(client, world, dataset_id) == ["reserve", "commit"]
    budget = client.get(f"/v1/datasets/{dataset_id}", headers=world.owner.headers).json()
    assert budget["budget"]["spent"] == 1.0 and budget["budget"]["reserved"] == 0.0
    events = client.get(
        "/v1/audit/events",
        params={"kind": "job.cancelled", "target_id": job_id},
        headers=world.admin.headers,
    ).json()["events"]
    assert [e["details"] for e in events] == [{"epsilon_released": 0.0}]
    # a task of the job that comes late finds it ended
    assert stages.run_sequences(ctx, uuid.UUID(job_id)) == "skipped"
    assert stages.run_prompts(ctx, uuid.UUID(job_id)) == "skipped"
    assert job_of(client, world, job_id)["state"] == "cancelled"
    assert fake_llm.chat_requests == []
    again = client.post(f"/v1/jobs/{job_id}/cancel", headers=world.owner.headers)
    assert again.status_code == 409


def test_retry_resumes_a_job_whose_process_died(
    app: FastAPI,
    client: TestClient,
    world: factories.World,
    worker: WorkerContext,
    db: Database,
) -> None:
    dataset_id, job_id = submit(client, world)
    queued_task_ids(app, "cpu", job_id)  # taken by a worker
    start(db, job_id)
    hold(db, job_id, a_dead_process())
    url = f"/v1/jobs/{job_id}/retry"
    assert client.post(url, headers=world.client.headers).status_code == 403
    response = client.post(url, headers=world.owner.headers)
    assert response.status_code == 202, response.text
    assert response.json()["state"] == "running"
    assert queued_task_ids(app, "cpu", job_id) == [last_task_id(db, job_id)]
    again = client.post(url, headers=world.owner.headers)
    assert again.status_code == 409 and "waits for a worker" in again.json()["detail"]
    events = client.get(
        "/v1/audit/events",
        params={"kind": "job.retried", "target_id": job_id},
        headers=world.admin.headers,
    ).json()["events"]
    assert [e["details"] for e in events] == [{"resumed_with": RUN_SEQUENCES}]
    assert stages.run_sequences(worker, uuid.UUID(job_id)) == "succeeded"
    assert ledger_kinds(client, world, dataset_id) == ["reserve", "commit"]
