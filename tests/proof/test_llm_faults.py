"""A misbehaving LLM endpoint: every fault the issue names, served by a real HTTP server
under the test's control (``tests/fake_llm.py``), against the real prompting stage, the
real openai client and the real ledger on Postgres.

For each fault, two runs:

* transient (the first calls fail, later ones succeed): the job finishes with a text for
  every sequence;
* persistent (every call fails): the job fails, says how many prompts failed and why, and
  ``POST /v1/jobs/{id}/retry`` completes exactly the missing ones once the endpoint
  recovers.

Either way the budget is charged once (one reserve, one commit), whatever the number of
LLM calls: prompting is post-processing of DP output.
"""

from __future__ import annotations

import uuid

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from app.config import Settings
from app.db import Database
from app.jobs import stages
from app.jobs.stages import WorkerContext
from tests.fake_llm import Behaviour, FakeLLM
from tests.service import factories
from tests.service.test_worker import (
    cache_dir,
    job_of,
    ledger,
    saved_sequences,
    submit,
    with_llm,
)

__all__ = ["cache_dir"]

pytestmark = pytest.mark.slow

TIMEOUT = 0.5  # the client's time-out per call, seconds
# fault as the fake server plays it -> the error code the job reports for it
FAULTS = {
    "429:0": "http_429",
    "500": "http_500",
    "503": "http_503",
    "timeout:3": "timeout",
    "malformed": "malformed_response",
    "invalid": "malformed_response",
    "empty": "empty_content",
    "disconnect": "connection_error",
}


@pytest.fixture
def worker(app: FastAPI, settings: Settings, cache_dir: object) -> WorkerContext:
    """A worker context with quick back-off and a short client time-out."""
    worker_settings = settings.model_copy(
        update={
            "cache_dir": cache_dir,
            "progress_interval": 0.0,
            "llm_max_retries": 3,
            "llm_backoff_base": 0.01,
            "llm_backoff_max": 2.0,
            "llm_timeout": TIMEOUT,
            "llm_concurrency": 2,
        }
    )
    return WorkerContext(worker_settings, app.state.database, app.state.cipher)


def _charged_once(client: TestClient, world: factories.World, dataset_id: str, job_id: str) -> None:
    book = ledger(client, world, dataset_id)
    mine = [e for e in book["entries"] if e["job_id"] == job_id]
    assert sorted(e["kind"] for e in mine) == ["commit", "reserve"], mine
    assert book["budget"]["spent"] == pytest.approx(1.0)
    assert book["budget"]["reserved"] == pytest.approx(0.0)


def _texts(db: Database, job_id: str) -> dict[int, str | None]:
    from sqlalchemy import select

    from app.models import KeyphraseSequence

    with db.session() as session:
        rows = session.scalars(
            select(KeyphraseSequence).where(KeyphraseSequence.job_id == uuid.UUID(job_id))
        ).all()
        return {row.position: row.text for row in rows}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_transient_fault_is_retried_and_every_document_is_written(
    client: TestClient, world: factories.World, worker: WorkerContext, db: Database, fault: str
) -> None:
    with FakeLLM() as llm:
        ctx = with_llm(worker, llm)
        dataset_id, job_id = submit(client, world, llm="vllm")
        assert stages.run_sequences(ctx, uuid.UUID(job_id)) == "prompting"
        sequences = saved_sequences(db, job_id)
        llm.script(fault, fault)  # the first two calls fail, whichever sequences they are
        assert stages.run_prompts(ctx, uuid.UUID(job_id)) == "succeeded"
        job = job_of(client, world, job_id)
        assert job["counts"]["texts_done"] == len(sequences) == 4
        assert job["counts"]["texts_failed"] == 0
        assert job["counts"]["llm_calls"] == len(llm.chat_requests) == len(sequences) + 2
        assert all(_texts(db, job_id).values())
        assert saved_sequences(db, job_id) == sequences  # nothing redrawn
        _charged_once(client, world, dataset_id, job_id)


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_persistent_fault_fails_the_job_naming_it_and_a_retry_completes_it(
    client: TestClient, world: factories.World, worker: WorkerContext, db: Database, fault: str
) -> None:
    with FakeLLM(default=fault) as llm:
        ctx = with_llm(worker, llm)
        dataset_id, job_id = submit(client, world, llm="vllm")
        assert stages.run_sequences(ctx, uuid.UUID(job_id)) == "prompting"
        sequences = saved_sequences(db, job_id)
        assert stages.run_prompts(ctx, uuid.UUID(job_id)) == "failed"
        job = job_of(client, world, job_id)
        assert job["error"]["code"] == "prompts_failed"
        assert (
            f"4 of 4 prompts failed after retries ({FAULTS[fault]}: 4)" in job["error"]["message"]
        )
        assert f"/v1/jobs/{job_id}/retry" in job["error"]["message"]
        # each sequence: the first call and every retry allowed
        assert len(llm.chat_requests) == 4 * (1 + worker.settings.llm_max_retries)
        _charged_once(client, world, dataset_id, job_id)

        llm.default = Behaviour.parse("ok")  # the endpoint recovers
        retried = client.post(f"/v1/jobs/{job_id}/retry", headers=world.owner.headers)
        assert retried.status_code == 202, retried.text
        calls_before = len(llm.chat_requests)
        assert stages.run_prompts(ctx, uuid.UUID(job_id)) == "succeeded"
        assert len(llm.chat_requests) - calls_before == 4
        assert all(_texts(db, job_id).values())
        assert saved_sequences(db, job_id) == sequences
        _charged_once(client, world, dataset_id, job_id)


def test_retry_after_is_honoured(
    client: TestClient, world: factories.World, worker: WorkerContext
) -> None:
    """A 429 with ``Retry-After: 1`` delays that sequence's next call by about a second
    (the worker's own back-off alone would wait at most 10 ms here)."""
    with FakeLLM() as llm:
        ctx = with_llm(worker, llm)
        _, job_id = submit(client, world, llm="vllm", per_class=1)
        assert stages.run_sequences(ctx, uuid.UUID(job_id)) == "prompting"
        llm.script("429:1")
        assert stages.run_prompts(ctx, uuid.UUID(job_id)) == "succeeded"
        first = llm.chat_requests[0]
        again = [r for r in llm.chat_requests[1:] if r.user_text == first.user_text]
        assert again, "the refused sequence was not asked again"
        waited = again[0].started - (first.finished or first.started)
        assert 0.95 <= waited <= 3.0, waited  # upper bound: slack for a busy machine
