"""What the service tests of the LLM methods' jobs share: a worker whose ``vllm`` endpoint
is a fake OpenAI-compatible server (``tests/fake_llm.py``) and ``local`` the packaged
model, and the HTTP calls that submit, read and download a job (``factories.release``
releases it)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import select

from app.config import LLMEndpointSettings, Settings
from app.db import Database
from app.jobs.stages import WorkerContext
from app.models import JobCheckpoint
from tests.fake_llm import FakeLLM
from tests.service import factories

# a small Aug-PE job on the fake vLLM endpoint (two iterations, two texts a class)
AUG_PE: dict[str, Any] = {
    "method": "aug-pe",
    "llm": "vllm",
    "document_type": "clinical note",
    "epsilon": 2.0,
    "delta": 1e-5,
    "iterations": 2,
    "population": 2,
    "initial_variation_folds": 1,
    "variation_folds": 1,
    "num_released": 2,
    "max_tokens": 16,
}


class Crash(BaseException):
    """The worker process dies here (nothing of the stage catches it)."""


def llm_worker(
    app: FastAPI, settings: Settings, cache_dir: Path, fake: FakeLLM, **update: Any
) -> WorkerContext:
    """A worker on the test database whose ``vllm`` endpoint is ``fake`` (one retry of a
    failed call, short backoffs, ``update`` to its other settings)."""
    endpoints = {"vllm": LLMEndpointSettings(base_url=fake.base_url, model=fake.model)}
    return factories.worker_context(
        app,
        settings,
        cache_dir,
        **{
            "llm_endpoints": endpoints,
            "llm_max_retries": 1,
            "llm_backoff_base": 0.01,
            "llm_backoff_max": 0.05,
            **update,
        },
    )


def dataset(client: TestClient, world: factories.World) -> str:
    """The owner's small labelled dataset, with a cap (ε 50, δ 1e-5) the methods' jobs fit."""
    return factories.dataset(client, world.owner, cap=50, delta_cap="1e-5")


def submit(client: TestClient, world: factories.World, dataset_id: str, spec: Any) -> str:
    response = client.post(
        f"/v1/datasets/{dataset_id}/jobs", headers=world.owner.headers, json=spec
    )
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def job(client: TestClient, world: factories.World, job_id: str) -> dict[str, Any]:
    response = client.get(f"/v1/jobs/{job_id}", headers=world.owner.headers)
    assert response.status_code == 200
    return dict(response.json())


def ledger_kinds(client: TestClient, world: factories.World, dataset_id: str) -> list[str]:
    response = client.get(f"/v1/datasets/{dataset_id}/ledger", headers=world.owner.headers)
    assert response.status_code == 200, response.text
    return [entry["kind"] for entry in response.json()["entries"]]


def checkpoints(db: Database, job_id: str) -> dict[str, bytes]:
    with db.session() as session:
        rows = session.scalars(
            select(JobCheckpoint).where(JobCheckpoint.job_id == uuid.UUID(job_id))
        ).all()
        return {row.key: bytes(row.data) for row in rows}


def download(client: TestClient, world: factories.World, release_id: str) -> list[Any]:
    response = client.get(f"/v1/releases/{release_id}/download", headers=world.client.headers)
    assert response.status_code == 200
    return [json.loads(line) for line in response.text.splitlines()]


def prompt_log(db: Database, job_id: str) -> list[dict[str, Any]]:
    """The job's prompt log as the owner reads it (records with their content)."""
    from app.releases.prompts import jsonl_chunks
    from workers.llm.attestation import read_jsonl

    text = b"".join(jsonl_chunks(db, uuid.UUID(job_id), content=True)).decode()
    return read_jsonl(text)


def check_prompt_log(db: Database, job_id: str, fake: FakeLLM) -> list[dict[str, Any]]:
    """The job's prompt log holds, verifies, names each request once, and every prompt
    that reached the LLM is one of its records (no prompt left unrecorded)."""
    from workers.llm.attestation import entry_of, verify

    lines = prompt_log(db, job_id)
    verdict = verify(lines)
    assert verdict.ok, verdict.problems
    assert verdict.with_content == len(lines) > 0
    assert len({entry_of(line) for line in lines}) == len(lines)
    recorded = {json.dumps(line["content"]["messages"], sort_keys=True) for line in lines}
    sent = {json.dumps(request.messages, sort_keys=True) for request in fake.chat_requests}
    assert sent <= recorded, "a prompt reached the LLM without being recorded"
    return lines
