"""The worker's stages on the test database, called in-process as a Celery worker would
call them: the real engine (a small uploaded vocabulary keeps it fast), the real
ledger, and, for prompting, a real HTTP server scripted to fail (``tests/fake_llm.py``).
A crash is a real SIGKILL of a process running the prompting stage.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY
from sqlalchemy import select

from app.config import LLMEndpointSettings, Settings
from app.db import Database
from app.jobs import stages, tasks
from app.jobs.stages import AccountingMismatch, WorkerContext, check_accounting
from app.models import Job, KeyphraseSequence
from app.worker import QUEUES, RUN_PROMPTS, RUN_SEQUENCES, TASK_MODULES, celery_app
from tests.fake_llm import FakeLLM
from tests.service import factories
from tests.service.conftest import DATA_KEY

REPO = Path(__file__).resolve().parents[2]
STAGES = ["extract", "private_vocabulary", "embed", "dp_kde", "sequences"]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture
def worker(app: FastAPI, settings: Settings, cache_dir: Path) -> WorkerContext:
    """A worker's context on the test database; its broker is the app's in-memory one."""
    return factories.worker_context(
        app, settings, cache_dir, llm_max_retries=2, llm_backoff_base=0.01, llm_backoff_max=0.05
    )


def with_llm(worker: WorkerContext, fake: FakeLLM) -> WorkerContext:
    """The context with the endpoint the job names ("vllm") served by ``fake``."""
    endpoints = {"vllm": LLMEndpointSettings(base_url=fake.base_url, model=fake.model)}
    settings = worker.settings.model_copy(update={"llm_endpoints": endpoints})
    return WorkerContext(settings, worker.database, worker.cipher, worker.stage_hooks)


def vocabulary(client: TestClient, caller: factories.Caller) -> str:
    response = client.post(
        "/v1/vocabularies",
        headers=caller.headers,
        data={"name": "cardio-ortho"},
        files={"file": ("phrases.txt", "\n".join(factories.PHRASES).encode())},
    )
    if response.status_code == 409:  # uploaded already by this organisation
        return str(response.json()["existing"])
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def submit(client: TestClient, world: factories.World, **overrides: Any) -> tuple[str, str]:
    """A dataset of the four factory rows and a small job on it: (dataset id, job id)."""
    dataset_id = factories.dataset(client, world.owner, cap=5)
    spec: dict[str, Any] = {
        "vocabulary": vocabulary(client, world.owner),
        "vocabulary_size": 8,
        "sequence_length": 3,
        "num_features": 64,
        "per_class": 2,
        **overrides,
    }
    return dataset_id, factories.job(client, world.owner, dataset_id, **spec)


def job_of(client: TestClient, world: factories.World, job_id: str) -> dict[str, Any]:
    response = client.get(f"/v1/jobs/{job_id}", headers=world.owner.headers)
    assert response.status_code == 200
    return dict(response.json())


def ledger(client: TestClient, world: factories.World, dataset_id: str) -> dict[str, Any]:
    response = client.get(f"/v1/datasets/{dataset_id}/ledger", headers=world.owner.headers)
    assert response.status_code == 200
    return dict(response.json())


def saved_sequences(db: Database, job_id: str) -> list[tuple[int, str, list[str]]]:
    with db.session() as session:
        rows = session.scalars(
            select(KeyphraseSequence)
            .where(KeyphraseSequence.job_id == uuid.UUID(job_id))
            .order_by(KeyphraseSequence.position)
        ).all()
        return [(s.position, s.label, list(s.keyphrases)) for s in rows]


def queued_task_ids(app: FastAPI, queue_name: str, job_id: str) -> list[str]:
    """Ids of the tasks queued for ``job_id`` on the app's in-memory broker (consumed)."""
    return [
        message.headers["id"]
        for message in factories.taken_messages(app, queue_name, timeout=0.5)
        if message.decode()[0] == [job_id]
    ]


def last_task_id(db: Database, job_id: str) -> str:
    """The id of the task most recently queued for the job (the job records them)."""
    with db.session() as session:
        job = session.get(Job, uuid.UUID(job_id))
        assert job is not None
        return str(job.task_ids[-1])


def stage_count(stage: str) -> float:
    value = REGISTRY.get_sample_value("keyseed_job_stage_duration_seconds_count", {"stage": stage})
    return value or 0.0


# ------------------------------------------------------------------ registration


def test_the_tasks_are_registered_under_their_routed_names() -> None:
    assert "app.jobs.tasks" in TASK_MODULES
    assert set(celery_app.conf.include) >= set(TASK_MODULES)
    router = celery_app.amqp.router
    assert router.route({}, RUN_SEQUENCES)["queue"].name in QUEUES
    assert router.route({}, RUN_PROMPTS)["queue"].name == "llm"
    for name, function in ((RUN_SEQUENCES, tasks.run_sequences), (RUN_PROMPTS, tasks.run_prompts)):
        task = celery_app.tasks[name]
        assert task.run is function
        assert task.acks_late is True and task.reject_on_worker_lost is True
        assert task.ignore_result is True
    # a message that is not a job id is refused without touching anything
    assert tasks.run_sequences("not-a-job") == "bad_argument"


def test_accounting_accepts_float_rounding_only() -> None:
    reserved = {"vocabulary": 0.5, "kde": 0.5}
    check_accounting({"vocabulary": 0.5, "kde": 0.49999999999999944}, reserved)
    with pytest.raises(AccountingMismatch, match="kde"):
        check_accounting({"vocabulary": 0.5, "kde": 0.45}, reserved)
    with pytest.raises(AccountingMismatch, match="class_counts"):
        check_accounting({"vocabulary": 0.5, "kde": 0.5, "class_counts": 0.1}, reserved)
    with pytest.raises(AccountingMismatch):
        check_accounting({"vocabulary": 0.5}, reserved)


# ------------------------------------------------------------------ stages 1-6


def test_the_sequences_stage_saves_dp_outputs_and_commits_the_spend_once(
    client: TestClient, world: factories.World, worker: WorkerContext, db: Database
) -> None:
    dataset_id, job_id = submit(client, world)
    seen: list[tuple[str, float]] = []
    worker.stage_hooks.append(lambda _job, stage, fraction: seen.append((stage, fraction)))
    before = {stage: stage_count(stage) for stage in STAGES}

    assert stages.run_sequences(worker, uuid.UUID(job_id)) == "succeeded"

    # each stage is shown as it starts; the private stages show their boundaries only
    # (no i/n that would give n), the public-work ones (embedding Ṽ, sampling from the
    # releases, by class) a fraction; none of them is timed (durations depend on data)
    assert seen == [
        ("extract", 0.0),
        ("extract", 1.0),
        ("private_vocabulary", 0.0),
        ("private_vocabulary", 1.0),
        ("embed", 0.0),
        ("embed", 1.0),
        ("dp_kde", 0.0),
        ("dp_kde", 1.0),
        ("sequences", 0.0),
        ("sequences", 0.5),
        ("sequences", 1.0),
    ]
    assert all(stage_count(stage) == before[stage] for stage in STAGES)
    job = job_of(client, world, job_id)
    assert job["state"] == "succeeded" and job["error"] is None
    assert job["counts"] == {
        "sequences": 4, "sequences_drawn": 4, "texts_done": 4, "texts_failed": 0, "llm_calls": 0
    }  # fmt: skip
    assert job["epsilon"]["budget_state"] == "committed"
    sequences = saved_sequences(db, job_id)
    assert sorted(label for _, label, _ in sequences) == ["cardio", "cardio", "ortho", "ortho"]
    assert all(
        len(phrases) == 3 and set(phrases) <= set(factories.PHRASES) for _, _, phrases in sequences
    )
    with db.session() as session:
        texts = session.scalars(
            select(KeyphraseSequence.text).where(KeyphraseSequence.job_id == uuid.UUID(job_id))
        ).all()
        stored = session.get(Job, uuid.UUID(job_id))
        assert stored is not None and stored.manifest is not None
        manifest = stored.manifest
    assert sorted(texts) == sorted(" ".join(p) for _, _, p in sequences)  # llm "none"
    reported = manifest["privacy"]["epsilon_by_mechanism"]
    check_accounting(reported, job["epsilon"]["by_mechanism"])
    assert manifest["embedding_model"] == "all-MiniLM-L6-v2"
    assert manifest["vocabulary"]["name"] == "cardio-ortho"

    # a second delivery of the task does nothing: no second draw, no second charge
    assert stages.run_sequences(worker, uuid.UUID(job_id)) == "skipped"
    assert saved_sequences(db, job_id) == sequences
    book = ledger(client, world, dataset_id)
    assert [e["kind"] for e in book["entries"]] == ["reserve", "commit"]
    assert [e["epsilon"] for e in book["entries"]] == [1.0, 1.0]
    assert book["budget"] == {**book["budget"], "spent": 1.0, "reserved": 0.0, "remaining": 4.0}


def test_a_job_stored_with_research_levers_runs_with_them(
    client: TestClient, world: factories.World, worker: WorkerContext, db: Database
) -> None:
    # submitted while the research levers were public (docs/parameters.md): its stored
    # spec recorded each of them, some at values no default reaches, and levers since
    # removed from the engine (issue 64), one at its default and one asked for; a retry
    # reads it and runs as the engine now does, its manifest naming what it did not apply
    _, job_id = submit(client, world)
    levers = {"noise_floor": 0.5, "class_contrast": 2.0, "bandwidth": 0.4, "distinct": True}
    removed = {"label_prior_lead": 0.0, "document_window": 128}
    with db.transaction() as session:
        job = session.get(Job, uuid.UUID(job_id))
        assert job is not None and not set(levers) & set(job.spec)
        job.spec = {**job.spec, **levers, "kde_weighting": "l1", **removed}
    assert stages.run_sequences(worker, uuid.UUID(job_id)) == "succeeded"
    with db.session() as session:
        stored = session.get(Job, uuid.UUID(job_id))
        assert stored is not None and stored.manifest is not None
        manifest = stored.manifest
    assert {name: manifest["parameters"][name] for name in levers} == levers
    assert not set(removed) & set(manifest["parameters"])
    assert manifest["settings_not_applied"] == {"document_window": 128}
    assert len(saved_sequences(db, job_id)) == 4


def test_a_centroid_job_shows_how_many_sequences_the_consistency_filter_kept(
    client: TestClient, world: factories.World, worker: WorkerContext, db: Database
) -> None:
    # a total Gaussian budget: class centroids, one cell a class, the filter on by default
    dataset_id = factories.dataset(client, world.owner, cap=5, delta_cap="1e-5")
    common = {
        "vocabulary": vocabulary(client, world.owner), "sequence_length": 2, "per_class": 20,
        "vocabulary_size": 8, "epsilon_vocab": None, "epsilon_kde": None, "epsilon": 2.0,
        "delta": 1e-6,
    }  # fmt: skip
    counts = {}
    for given in (None, False):
        job_id = factories.job(client, world.owner, dataset_id, **common, consistency_filter=given)
        assert stages.run_sequences(worker, uuid.UUID(job_id)) == "succeeded"
        job = job_of(client, world, job_id)
        assert job["state"] == "succeeded"
        counts[given] = job["counts"]
        with db.session() as session:
            stored = session.get(Job, uuid.UUID(job_id))
            assert stored is not None and stored.manifest is not None
            parameters = stored.manifest["parameters"]
        assert parameters["kde_method"] == "centroid" and parameters["centroid_cells"] == 1
        assert parameters["consistency_filter"] is (given is None)
        assert len(saved_sequences(db, job_id)) == job["counts"]["sequences"]
    # both drew the 40 sequences asked for; the filter's job returns those it kept
    assert counts[False]["sequences"] == counts[False]["sequences_drawn"] == 40
    assert counts[None]["sequences_drawn"] == 40 and counts[None]["sequences"] <= 40


def test_a_job_with_an_llm_saves_its_sequences_then_queues_the_prompting(
    app: FastAPI, client: TestClient, world: factories.World, worker: WorkerContext, db: Database
) -> None:
    _, job_id = submit(client, world, llm="vllm")
    assert stages.run_sequences(worker, uuid.UUID(job_id)) == "prompting"
    job = job_of(client, world, job_id)
    assert (job["state"], job["stage"], job["counts"]["sequences"]) == ("running", "prompts", 4)
    with db.session() as session:
        texts = session.scalars(
            select(KeyphraseSequence.text).where(KeyphraseSequence.job_id == uuid.UUID(job_id))
        ).all()
    assert texts == [None] * 4
    assert len(queued_task_ids(app, "llm", job_id)) == 1


def test_cancelling_before_the_start_releases_the_reservation(
    client: TestClient, world: factories.World, worker: WorkerContext, db: Database
) -> None:
    dataset_id, job_id = submit(client, world)
    cancelled = client.post(f"/v1/jobs/{job_id}/cancel", headers=world.owner.headers)
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
    assert stages.run_sequences(worker, uuid.UUID(job_id)) == "skipped"
    job = job_of(client, world, job_id)
    assert job["state"] == "cancelled" and job["epsilon"]["budget_state"] == "released"
    assert saved_sequences(db, job_id) == []
    book = ledger(client, world, dataset_id)
    assert [e["kind"] for e in book["entries"]] == ["reserve", "release"]
    assert (book["budget"]["spent"], book["budget"]["remaining"]) == (0.0, 5.0)


def test_cancelling_a_running_job_stops_it_and_keeps_the_commit(
    client: TestClient, world: factories.World, worker: WorkerContext, db: Database
) -> None:
    dataset_id, job_id = submit(client, world)
    answers: list[int] = []

    def cancel_when_embedding(_job: uuid.UUID, stage: str, _fraction: float) -> None:
        if stage == "embed" and not answers:
            response = client.post(f"/v1/jobs/{job_id}/cancel", headers=world.owner.headers)
            answers.append(response.status_code)
            assert response.json()["cancel_requested"] is True

    worker.stage_hooks.append(cancel_when_embedding)
    assert stages.run_sequences(worker, uuid.UUID(job_id)) == "cancelled"
    assert answers == [200]
    job = job_of(client, world, job_id)
    assert job["state"] == "cancelled" and job["stage"] == "embed"
    assert job["epsilon"]["budget_state"] == "committed"
    assert saved_sequences(db, job_id) == []
    book = ledger(client, world, dataset_id)
    assert [e["kind"] for e in book["entries"]] == ["reserve", "commit"]
    assert (book["budget"]["spent"], book["budget"]["reserved"]) == (1.0, 0.0)


def test_an_accounting_mismatch_fails_the_job_and_saves_nothing(
    client: TestClient, world: factories.World, worker: WorkerContext, db: Database
) -> None:
    dataset_id, job_id = submit(client, world)
    with db.transaction() as session:  # as if the engine and the ledger disagreed
        job = session.get(Job, uuid.UUID(job_id))
        assert job is not None
        job.epsilon_by_mechanism = {"vocabulary": 0.5, "kde": 0.25}
    assert stages.run_sequences(worker, uuid.UUID(job_id)) == "failed"
    body = job_of(client, world, job_id)
    assert body["state"] == "failed" and body["error"]["code"] == "accounting_mismatch"
    assert "bug" in body["error"]["message"]
    assert saved_sequences(db, job_id) == []
    assert ledger(client, world, dataset_id)["budget"]["spent"] == 1.0


def test_a_corpus_matching_no_phrase_runs_like_any_other(
    client: TestClient, world: factories.World, worker: WorkerContext
) -> None:
    # No branch on raw data after the private read: a corpus whose documents match no
    # phrase of the vocabulary releases noise like any other instead of failing.
    secret = "CANARY-worker-3f9a"
    content = factories.csv_bytes([(f"{secret} nothing to match", "cardio")] * 2)
    dataset_id = factories.dataset(client, world.owner, content=content)
    job_id = factories.job(
        client,
        world.owner,
        dataset_id,
        vocabulary=vocabulary(client, world.owner),
        vocabulary_size=8,
        sequence_length=3,
        num_features=64,
    )
    assert stages.run_sequences(worker, uuid.UUID(job_id)) != "failed"
    body = job_of(client, world, job_id)
    assert body["error"] is None
    assert secret not in json.dumps(body)
    assert ledger(client, world, dataset_id)["budget"]["spent"] == 1.0  # the data was read


# ------------------------------------------------------------------ step 7


def test_prompting_retries_faults_reports_failures_and_the_retry_route_completes_them(
    app: FastAPI,
    client: TestClient,
    world: factories.World,
    worker: WorkerContext,
    fake_llm: FakeLLM,
    db: Database,
) -> None:
    ctx = with_llm(worker, fake_llm)
    dataset_id, job_id = submit(client, world, llm="vllm")
    assert stages.run_sequences(ctx, uuid.UUID(job_id)) == "prompting"
    queued_task_ids(app, "llm", job_id)  # the message save_sequences sent
    fake_llm.script("500", "429:0", "401")  # the first three calls, whichever they are
    ok_before = REGISTRY.get_sample_value(
        "keyseed_llm_calls_total", {"endpoint": "vllm", "outcome": "ok"}
    )

    assert stages.run_prompts(ctx, uuid.UUID(job_id)) == "failed"
    job = job_of(client, world, job_id)
    assert job["state"] == "failed" and job["error"]["code"] == "prompts_failed"
    assert "1 of 4 prompts failed" in job["error"]["message"]
    assert "http_401: 1" in job["error"]["message"]
    assert f"/v1/jobs/{job_id}/retry" in job["error"]["message"]
    assert job["counts"] == {
        "sequences": 4, "sequences_drawn": 4, "texts_done": 3, "texts_failed": 1, "llm_calls": 6
    }  # fmt: skip
    assert len(fake_llm.chat_requests) == 6
    ok_after = REGISTRY.get_sample_value(
        "keyseed_llm_calls_total", {"endpoint": "vllm", "outcome": "ok"}
    )
    assert (ok_after or 0) - (ok_before or 0) == 3

    # the API refuses a retry to whoever may not ask for one
    url = f"/v1/jobs/{job_id}/retry"
    assert client.post(url, headers=world.client.headers).status_code == 403
    assert client.post(url, headers=world.other_owner.headers).status_code == 404
    retried = client.post(url, headers=world.owner.headers)
    assert retried.status_code == 202, retried.text
    body = retried.json()
    assert (body["state"], body["stage"], body["error"]) == ("running", "prompts", None)
    assert client.post(url, headers=world.owner.headers).status_code == 409  # running now
    task_ids = queued_task_ids(app, "llm", job_id)
    assert task_ids == [last_task_id(db, job_id)]

    assert stages.run_prompts(ctx, uuid.UUID(job_id)) == "succeeded"
    job = job_of(client, world, job_id)
    assert job["state"] == "succeeded"
    assert job["counts"] == {
        "sequences": 4, "sequences_drawn": 4, "texts_done": 4, "texts_failed": 0, "llm_calls": 7
    }  # fmt: skip
    assert len(fake_llm.chat_requests) == 7  # only the failed sequence was prompted again
    book = ledger(client, world, dataset_id)
    assert [e["kind"] for e in book["entries"]] == ["reserve", "commit"]
    assert book["budget"]["spent"] == 1.0
    events = client.get(
        "/v1/audit/events", params={"kind": "job.retried"}, headers=world.admin.headers
    ).json()["events"]
    assert [e["target_id"] for e in events] == [job_id]
    assert client.post(url, headers=world.owner.headers).status_code == 409  # nothing missing
    for prompt in fake_llm.prompts():  # no private text, no label
        assert not any(text in prompt for text, _ in factories.ROWS)
        assert "cardio" not in prompt and "ortho" not in prompt


def test_only_a_failed_job_with_saved_sequences_can_be_retried(
    client: TestClient, world: factories.World, worker: WorkerContext
) -> None:
    _, queued = submit(client, world, llm="vllm")
    response = client.post(f"/v1/jobs/{queued}/retry", headers=world.owner.headers)
    assert response.status_code == 409 and "sequences" in response.json()["detail"]
    _, done = submit(client, world)
    assert stages.run_sequences(worker, uuid.UUID(done)) == "succeeded"
    response = client.post(f"/v1/jobs/{done}/retry", headers=world.admin.headers)
    assert response.status_code == 409 and "failed" in response.json()["detail"]


def test_an_unreachable_endpoint_fails_the_job_and_a_retry_resumes_it(
    client: TestClient, world: factories.World, worker: WorkerContext, fake_llm: FakeLLM
) -> None:
    _, job_id = submit(client, world, llm="vllm")
    assert stages.run_sequences(worker, uuid.UUID(job_id)) == "prompting"
    # the test settings point "vllm" at a closed port
    assert stages.run_prompts(worker, uuid.UUID(job_id)) == "failed"
    job = job_of(client, world, job_id)
    assert "4 of 4 prompts failed" in job["error"]["message"]
    assert "connection_error: 4" in job["error"]["message"]
    assert client.post(f"/v1/jobs/{job_id}/retry", headers=world.admin.headers).status_code == 202
    assert stages.run_prompts(with_llm(worker, fake_llm), uuid.UUID(job_id)) == "succeeded"
    assert job_of(client, world, job_id)["counts"]["texts_done"] == 4


def test_a_crash_while_prompting_resumes_without_redrawing_or_spending_again(
    client: TestClient,
    world: factories.World,
    worker: WorkerContext,
    db: Database,
    database_url: str,
    cache_dir: Path,
) -> None:
    with FakeLLM(latency=2.0) as fake:
        ctx = with_llm(worker, fake)
        dataset_id, job_id = submit(client, world, llm="vllm")
        assert stages.run_sequences(ctx, uuid.UUID(job_id)) == "prompting"
        drawn = saved_sequences(db, job_id)
        assert stages.run_sequences(ctx, uuid.UUID(job_id)) == "skipped"  # redelivered

        env = {
            **os.environ,
            "KEYSEED_DATABASE_URL": database_url,
            "KEYSEED_BROKER_URL": "memory://",
            "KEYSEED_DATA_KEY": DATA_KEY,
            "KEYSEED_CACHE_DIR": str(cache_dir),
            "KEYSEED_LLM_CONCURRENCY": "1",
            "KEYSEED_LLM_ENDPOINTS": json.dumps(
                {"vllm": {"base_url": fake.base_url, "model": fake.model}}
            ),
        }
        worker_process = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys; from app.jobs import tasks; tasks.run_prompts(sys.argv[1])",
                job_id,
            ],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

        def a_text_saved() -> bool:
            assert worker_process.poll() is None, "the prompting process ended early"
            return bool(job_of(client, world, job_id)["counts"]["texts_done"] >= 1)

        try:
            factories.wait_for(a_text_saved, "a text is saved", timeout=180, interval=0.1)
            worker_process.send_signal(signal.SIGKILL)  # the worker dies mid-stage
        finally:
            worker_process.kill()
            worker_process.wait(timeout=30)
        crashed = job_of(client, world, job_id)
        done_before = crashed["counts"]["texts_done"]
        assert crashed["state"] == "running" and 1 <= done_before < 4
        calls_before = len(fake.chat_requests)

        assert stages.run_prompts(ctx, uuid.UUID(job_id)) == "succeeded"  # the redelivery

        assert len(fake.chat_requests) - calls_before == 4 - done_before
        job = job_of(client, world, job_id)
        assert job["state"] == "succeeded" and job["counts"]["texts_done"] == 4
        assert saved_sequences(db, job_id) == drawn  # nothing drawn again
        book = ledger(client, world, dataset_id)
        assert [e["kind"] for e in book["entries"]] == ["reserve", "commit"]
        assert book["budget"]["spent"] == 1.0


def test_the_soft_time_limit_fails_the_job_cleanly_in_either_stage(
    client: TestClient, world: factories.World, worker: WorkerContext, db: Database
) -> None:
    dataset_id, first = submit(client, world)

    def out_of_time(_job: uuid.UUID, stage: str, _fraction: float) -> None:
        if stage == "dp_kde":  # where Celery's signal handler would raise it
            raise SoftTimeLimitExceeded

    worker.stage_hooks.append(out_of_time)
    assert stages.run_sequences(worker, uuid.UUID(first)) == "failed"
    worker.stage_hooks.clear()
    job = job_of(client, world, first)
    assert job["error"]["code"] == "time_limit" and "time limit" in job["error"]["message"]
    assert job["epsilon"]["budget_state"] == "committed" and saved_sequences(db, first) == []

    # during prompting: a real signal, delivered to this (main) thread as Celery does
    with FakeLLM(latency=5.0) as slow:
        ctx = with_llm(worker, slow)
        _, second = submit(client, world, llm="vllm")
        assert stages.run_sequences(ctx, uuid.UUID(second)) == "prompting"

        def raise_soft_limit(signum: int, frame: object) -> None:
            raise SoftTimeLimitExceeded

        previous = signal.signal(signal.SIGALRM, raise_soft_limit)
        signal.setitimer(signal.ITIMER_REAL, 1.0)
        try:
            assert stages.run_prompts(ctx, uuid.UUID(second)) == "failed"
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    job = job_of(client, world, second)
    assert job["error"]["code"] == "time_limit"
    assert f"/v1/jobs/{second}/retry" in job["error"]["message"]
    book = ledger(client, world, dataset_id)
    assert [e["kind"] for e in book["entries"]] == ["reserve", "commit"]


def test_prompting_goes_page_by_page_and_stops_at_the_call_cap_of_a_run(
    client: TestClient,
    world: factories.World,
    worker: WorkerContext,
    fake_llm: FakeLLM,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(stages, "PROMPT_BATCH", 2)  # pages of two sequences
    ctx = with_llm(worker, fake_llm)
    _, job_id = submit(client, world, llm="vllm", max_llm_calls=3)
    assert stages.run_sequences(ctx, uuid.UUID(job_id)) == "prompting"
    assert stages.run_prompts(ctx, uuid.UUID(job_id)) == "failed"
    job = job_of(client, world, job_id)
    assert len(fake_llm.chat_requests) == 3 and job["counts"]["texts_done"] == 3
    assert "1 of 4 prompts failed" in job["error"]["message"]
    assert "call_cap_reached: 1" in job["error"]["message"]
    # the cap bounds each run of the stage: a retry may make up to 3 calls again
    assert client.post(f"/v1/jobs/{job_id}/retry", headers=world.owner.headers).status_code == 202
    assert stages.run_prompts(ctx, uuid.UUID(job_id)) == "succeeded"
    assert len(fake_llm.chat_requests) == 4
    # a late redelivery finds nothing to prompt and starts no LLM
    assert stages.run_prompts(ctx, uuid.UUID(job_id)) == "skipped"
