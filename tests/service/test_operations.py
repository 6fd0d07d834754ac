"""Health, readiness, metrics, OpenAPI, request ids, body limits, Celery routing."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient
from kombu import Connection
from prometheus_client import REGISTRY

from app.config import Settings
from app.db import Database, enqueue_after_commit
from app.main import create_app
from app.metrics import observe_stage
from app.worker import RUN_PROMPTS, RUN_SEQUENCES, TASKS, celery_app, create_celery
from tests.service import factories
from tests.service.conftest import make_settings


def test_healthz(client: TestClient) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json()["status"] == "ok"


def test_readyz_checks_database_and_broker(client: TestClient) -> None:
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json()["checks"] == {"database": "ok", "broker": "ok"}


def test_readyz_answers_503_problem_when_the_broker_is_down(
    database_url: str, tmp_path: Path
) -> None:
    app = create_app(make_settings(database_url, tmp_path, broker_url="redis://127.0.0.1:1/0"))
    response = TestClient(app).get("/readyz")
    app.state.database.dispose()
    assert response.status_code == 503
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["checks"] == {"database": "ok", "broker": "unavailable"}


def test_metrics_report_jobs_by_state_and_epsilon_spent(
    client: TestClient, world: factories.World, db: Database
) -> None:
    dataset_id = factories.dataset(client, world.owner)
    job_id = factories.job(client, world.owner, dataset_id)
    factories.run_job(db, job_id)
    text = client.get("/metrics", headers=world.auditor.headers).text
    assert 'keyseed_jobs{state="succeeded"} 1.0' in text
    assert "keyseed_epsilon_spent_total 1.0" in text
    assert 'keyseed_http_requests_total{method="POST",route="/v1/datasets",status="201"}' in text
    assert "keyseed_job_stage_duration_seconds" in text
    assert "keyseed_llm_calls_total" in text or "keyseed_llm_calls" in text


def test_metrics_need_the_metrics_token_or_a_platform_key(
    database_url: str, tmp_path: Path, world: factories.World
) -> None:
    app = create_app(make_settings(database_url, tmp_path, metrics_token="scrape-7f2c-token"))
    client = TestClient(app)
    try:
        for headers, status in (
            ({}, 401),
            (factories.auth("not-the-token"), 401),
            (world.owner.headers, 403),
            (world.client.headers, 403),
            (factories.auth("scrape-7f2c-token"), 200),
            (world.admin.headers, 200),
            (world.auditor.headers, 200),
        ):
            response = client.get("/metrics", headers=headers)
            assert response.status_code == status, (headers, response.text)
        assert response.headers["content-type"].startswith("text/plain")
        assert "keyseed_jobs" in response.text
    finally:
        app.state.database.dispose()


def test_no_private_stage_is_timed() -> None:
    observe_stage("prompts", 1.5)
    for stage in ("extract", "private_vocabulary", "embed", "dp_kde", "sequences"):
        with pytest.raises(ValueError, match="private data"):
            observe_stage(stage, 1.0)
        assert REGISTRY.get_sample_value(
            "keyseed_job_stage_duration_seconds_count", {"stage": stage}
        ) in (None, 0.0)


def test_openapi_documents_problem_responses(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    assert "ProblemDetail" in schema["components"]["schemas"]
    for path, operations in schema["paths"].items():
        if not path.startswith("/v1/"):
            continue
        for method, operation in operations.items():
            for status in ("401", "403", "422"):
                content = operation["responses"][status]["content"]
                assert "application/problem+json" in content, (method, path, status)
    assert "bearerAuth" in json.dumps(schema) or "HTTPBearer" in json.dumps(schema)


def test_request_id_is_echoed_or_made(client: TestClient) -> None:
    given = client.get("/healthz", headers={"X-Request-ID": "abc-123-def-456"})
    assert given.headers["X-Request-ID"] == "abc-123-def-456"
    made = client.get("/healthz", headers={"X-Request-ID": "bad id with spaces"})
    assert made.headers["X-Request-ID"] != "bad id with spaces"
    assert len(made.headers["X-Request-ID"]) == 32


def test_unknown_route_is_a_problem(client: TestClient) -> None:
    response = client.get("/v1/nothing-here")
    assert response.status_code == 404
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["status"] == 404


def test_json_body_over_the_limit_is_413_declared_or_streamed(
    client: TestClient, world: factories.World, settings: Settings
) -> None:
    big = b'{"name": "' + b"x" * (settings.max_json_bytes + 10) + b'", "kind": "owner"}'
    declared = client.post(
        "/v1/organisations",
        content=big,
        headers={**world.admin.headers, "Content-Type": "application/json"},
    )
    assert declared.status_code == 413
    assert declared.headers["content-type"] == "application/problem+json"

    def chunks():  # no Content-Length: the limit applies while the body streams in
        for start in range(0, len(big), 65536):
            yield big[start : start + 65536]

    streamed = client.post(
        "/v1/organisations",
        content=chunks(),
        headers={**world.admin.headers, "Content-Type": "application/json"},
    )
    assert streamed.status_code == 413
    assert streamed.json()["title"] == "Content Too Large"


def test_every_task_is_routed_to_a_known_queue() -> None:
    router = celery_app.amqp.router
    for name in {*TASKS, *(t for t in celery_app.tasks if t.startswith("keyseed."))}:
        route = router.route({}, name)
        assert route["queue"].name in ("cpu", "gpu", "llm"), name
    assert router.route({}, RUN_PROMPTS)["queue"].name == "llm"
    assert celery_app.conf.task_acks_late is True
    assert celery_app.conf.accept_content == ["json"]
    assert celery_app.conf.task_soft_time_limit < celery_app.conf.task_time_limit


def test_sequences_queue_follows_the_setting(database_url: str, tmp_path: Path) -> None:
    gpu = create_celery(make_settings(database_url, tmp_path, sequences_queue="gpu"))
    assert gpu.amqp.router.route({}, RUN_SEQUENCES)["queue"].name == "gpu"


def test_tasks_are_sent_after_commit_and_dropped_on_rollback(
    database_url: str, tmp_path: Path
) -> None:
    """Against the real Redis, with a key prefix of our own."""
    prefix = f"keyseed_t_{uuid.uuid4().hex[:8]}:"
    settings = make_settings(database_url, tmp_path, broker_url="redis://127.0.0.1:6379/0")
    celery = create_celery(settings)
    celery.conf.broker_transport_options = {"global_keyprefix": prefix}
    database = Database.from_settings(settings, celery=celery)
    store = redis.Redis.from_url(settings.broker_url)
    options = {"global_keyprefix": prefix}
    try:
        with pytest.raises(RuntimeError), database.transaction() as session:
            enqueue_after_commit(session, RUN_SEQUENCES, "dropped")
            raise RuntimeError("roll back")
        with database.transaction() as session:
            enqueue_after_commit(session, RUN_SEQUENCES, "job-1", task_id="t-1")
            assert list(store.scan_iter(f"{prefix}*")) == []  # nothing before the commit
        connection = Connection(settings.broker_url, transport_options=options)
        with connection, connection.SimpleQueue("cpu") as queue:
            message = queue.get(timeout=5)
            message.ack()
            with pytest.raises(queue.Empty):  # the rolled-back task never went out
                queue.get(timeout=0.5)
        assert message.headers["task"] == RUN_SEQUENCES
        assert message.headers["id"] == "t-1"
        assert message.content_type == "application/json"
        args, kwargs, _ = message.decode()
        assert args == ["job-1"] and kwargs == {}
    finally:
        database.dispose()
        for key in store.scan_iter(f"{prefix}*"):
            store.delete(key)
