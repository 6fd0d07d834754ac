"""Canaries: private text must never leave the boundary except as DP output.

Every private document carries a unique canary string (words that no public vocabulary
holds, so no DP mechanism can ever select them). The corpus goes through a full job (the
real engine, the real prompting stage against a recording LLM server, the real ledger),
a release and downloads in both formats, plus a refused upload whose bad row carries a
canary too. Then no canary may appear in:

* any API response body or header of the whole run (every route the three kinds of user
  and the privacy officer touch, errors included);
* any log line the service wrote, at DEBUG level, rendered as in production;
* any Celery message (body and headers) the run queued;
* the Prometheus metrics;
* any request the LLM endpoint received (the server records the raw bytes).

Control: the canaries are really in the stored corpus (decrypted, they come back), so a
test that looked in the wrong place would fail.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from app.jobs import stages
from app.jobs.runner import private_documents
from app.jobs.stages import WorkerContext
from app.worker import QUEUES
from tests.fake_llm import FakeLLM
from tests.service import factories
from tests.service.test_worker import cache_dir, vocabulary, with_llm, worker

__all__ = ["cache_dir", "worker"]

pytestmark = pytest.mark.slow

BASE = (
    ("Chest pain and heart failure with shortness of breath", "cardio"),
    ("Atrial fibrillation treated with anticoagulation", "cardio"),
    ("Heart failure and chest pain at rest", "cardio"),
    ("Fracture of the femur after a fall", "ortho"),
    ("Knee arthritis with joint pain", "ortho"),
    ("Joint pain in the knee after a fall", "ortho"),
)


def _canary() -> str:
    return f"zqcanary{uuid.uuid4().hex[:12]}"


@pytest.fixture
def canaries() -> list[str]:
    return [_canary() for _ in range(len(BASE) + 1)]


class Recorder:
    """Every response the test's client received, body and headers."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def __call__(self, response: httpx.Response) -> None:
        response.read()
        self.seen.append(f"{response.request.method} {response.request.url}")
        self.seen.append(repr(dict(response.headers)))
        self.seen.append(response.content.decode("utf-8", errors="replace"))


@pytest.fixture
def recorded(client: TestClient) -> Iterator[Recorder]:
    recorder = Recorder()
    client.event_hooks["response"].append(recorder)
    try:
        yield recorder
    finally:
        client.event_hooks["response"].remove(recorder)


@pytest.fixture
def debug_logs(log_lines: list[str]) -> Iterator[list[str]]:
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.DEBUG)
    try:
        yield log_lines
    finally:
        root.setLevel(level)


def _drain_messages(app: FastAPI) -> list[str]:
    """Every message on the app's (in-memory) broker, body and headers, consumed."""
    found: list[str] = []
    for name in QUEUES:
        for message in factories.taken_messages(app, name, timeout=0.2):
            body = message.body
            found.append(body.decode() if isinstance(body, bytes) else str(body))
            found.append(repr(message.headers) + repr(message.properties))
    return found


def _leaks(canaries: list[str], places: dict[str, list[str]]) -> dict[str, list[str]]:
    return {
        where: [c for c in canaries if any(c in text for text in texts)]
        for where, texts in places.items()
        if any(c in text for c in canaries for text in texts)
    }


def test_no_canary_leaves_the_boundary(
    app: FastAPI,
    client: TestClient,
    world: factories.World,
    worker: WorkerContext,
    canaries: list[str],
    recorded: Recorder,
    debug_logs: list[str],
) -> None:
    _drain_messages(app)  # what earlier tests left on the shared in-memory broker
    owner, client_org = world.owner, world.client
    rows = [
        (f"{text} {canary}", label)
        for (text, label), canary in zip(BASE, canaries[:-1], strict=True)
    ]
    response = factories.upload(client, owner, factories.csv_bytes(rows), cap=5)
    assert response.status_code == 201, response.text
    dataset_id = str(response.json()["id"])
    # a refused upload whose bad row (an undeclared label) holds the last canary
    bad = [*rows[:2], (f"Heart failure {canaries[-1]}", "neuro")]
    refused = factories.upload(client, owner, factories.csv_bytes(bad), cap=5)
    assert refused.status_code == 422, refused.text

    with FakeLLM(latency=0.01) as llm:
        ctx = with_llm(worker, llm)
        spec: dict[str, Any] = {
            "vocabulary": vocabulary(client, owner),
            "vocabulary_size": 8,
            "sequence_length": 3,
            "num_features": 64,
            "per_class": 3,
            "llm": "vllm",
        }
        job_id = factories.job(client, owner, dataset_id, **spec)
        assert stages.run_sequences(ctx, uuid.UUID(job_id)) == "prompting"
        client.get(f"/v1/jobs/{job_id}", headers=owner.headers)
        assert stages.run_prompts(ctx, uuid.UUID(job_id)) == "succeeded"
        llm_traffic = [repr(r.headers) + r.raw.decode("utf-8", "replace") for r in llm.requests]
    assert len(llm.chat_requests) == 6

    released = client.post(
        f"/v1/jobs/{job_id}/release",
        headers=owner.headers,
        json={"client_organisations": [str(client_org.organisation_id)]},
    )
    assert released.status_code == 201, released.text
    release_id = released.json()["id"]
    for caller in (owner, client_org, world.admin, world.auditor):
        client.get("/v1/releases", headers=caller.headers)
        client.get(f"/v1/releases/{release_id}", headers=caller.headers)
    for fmt in ("jsonl", "csv"):
        download = client.get(
            f"/v1/releases/{release_id}/download",
            params={"format": fmt},
            headers=client_org.headers,
        )
        assert download.status_code == 200
    for caller in (owner, world.admin, world.auditor):
        for path in (
            f"/v1/datasets/{dataset_id}",
            f"/v1/datasets/{dataset_id}/ledger",
            f"/v1/datasets/{dataset_id}/jobs",
            f"/v1/jobs/{job_id}",
            "/v1/datasets",
        ):
            assert client.get(path, headers=caller.headers).status_code == 200
    client.get("/v1/audit/events", headers=world.admin.headers, params={"limit": 500})
    metrics = client.get("/metrics", headers=world.admin.headers).text
    messages = _drain_messages(app)
    assert any(job_id in m for m in messages), "the job's Celery messages were not seen"
    assert debug_logs, "no log line was captured"

    places = {
        "API responses": recorded.seen,
        "log lines": debug_logs,
        "Celery messages": messages,
        "metrics": [metrics],
        "LLM requests": llm_traffic,
    }
    assert not _leaks(canaries, places), _leaks(canaries, places)

    # control: the canaries are in the stored corpus, so the search above could find them
    with app.state.database.session() as session:
        texts = [
            text for text, _, _ in private_documents(session, app.state.cipher, uuid.UUID(job_id))
        ]
    assert all(any(c in t for t in texts) for c in canaries[:-1])
