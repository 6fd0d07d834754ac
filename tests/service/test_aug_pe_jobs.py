"""Aug-PE as a service job: submitted, planned, reserved, run by the worker's first stage
(real engine, real embedding model, a real OpenAI-compatible HTTP server scripted by
``tests/fake_llm.py``), released and downloaded like a DP-KPS job; a crash after its
first iteration resumes from the checkpoints in the database without new noise or spend.
LLM costs are recorded for both methods.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from app.config import Settings
from app.db import Database
from app.jobs import recovery, stages
from app.jobs import repository as jobs_repo
from app.jobs.stages import WorkerContext
from tests.fake_llm import FakeLLM
from tests.service import factories
from tests.service.method_jobs import (
    AUG_PE,
    Crash,
    checkpoints,
    dataset,
    ledger_kinds,
    llm_worker,
    submit,
)
from tests.service.method_jobs import job as job_of
from workers.methods.aug_pe.runner import METHOD
from workers.methods.skeleton import costs_key

LABELS = list(factories.LABELS)


@pytest.fixture
def worker(app: FastAPI, settings: Settings, tmp_path: Path, fake_llm: FakeLLM) -> WorkerContext:
    """A worker on the test database: ``local`` is the packaged model, ``vllm`` the fake."""
    return llm_worker(app, settings, tmp_path, fake_llm)


def _submit(client: TestClient, world: factories.World, dataset_id: str, **spec: Any) -> str:
    return submit(client, world, dataset_id, {**AUG_PE, **spec})


def test_an_aug_pe_job_runs_is_released_and_downloaded(
    client: TestClient, world: factories.World, worker: WorkerContext, fake_llm: FakeLLM
) -> None:
    dataset_id = dataset(client, world)
    job_id = _submit(client, world, dataset_id)
    queued = job_of(client, world, job_id)
    assert queued["method"] == "aug-pe" and queued["spec"]["method"] == "aug-pe"
    assert queued["epsilon"]["budget_state"] == "reserved"
    assert 0 < queued["epsilon"]["requested"] <= 2.0 + 1e-9
    assert set(queued["epsilon"]["by_mechanism"]) == {"aug-pe-class-counts", "aug-pe-histogram"}

    assert stages.run_sequences(worker, uuid.UUID(job_id)) == "succeeded"

    job = job_of(client, world, job_id)
    assert job["state"] == "succeeded" and job["epsilon"]["budget_state"] == "committed"
    assert job["counts"]["sequences"] == job["counts"]["texts_done"] == 2
    calls = len(fake_llm.chat_requests)
    assert job["llm_costs"]["calls"] == calls > 0
    assert job["llm_costs"]["prompt_tokens"] > 0 and job["llm_costs"]["completion_tokens"] > 0
    assert ledger_kinds(client, world, dataset_id) == ["reserve", "commit"]
    # no private text ever reached the LLM
    assert not any(text in p for text, _ in factories.ROWS for p in fake_llm.prompts())

    release = factories.release(client, world, job_id)
    manifest = release["manifest"]
    assert release["documents"] == 2 and manifest["method_id"] == "aug-pe"
    assert manifest["method"].startswith("Aug-PE")
    assert manifest["parameters"]["iterations"] == 2
    assert manifest["llm_costs"]["method"] == "aug-pe"
    assert manifest["llm_costs"]["calls"] == calls
    charged, released = (
        sorted(json.dumps(e, sort_keys=True) for e in manifest["privacy"][name])
        for name in ("events_charged", "events_released")
    )
    assert released == charged and len(charged) == 1 + 2 * len(LABELS)
    download = client.get(f"/v1/releases/{release['id']}/download", headers=world.client.headers)
    assert download.status_code == 200
    records = [json.loads(line) for line in download.text.splitlines()]
    assert len(records) == 2
    assert all(r["label"] in LABELS and r["text"] and r["keyphrases"] == [] for r in records)


def test_a_dry_run_plans_an_aug_pe_job_without_storing_anything(
    client: TestClient, world: factories.World
) -> None:
    dataset_id = dataset(client, world)
    response = client.post(
        f"/v1/datasets/{dataset_id}/jobs?dry_run=true", headers=world.owner.headers, json=AUG_PE
    )
    assert response.status_code == 200, response.text
    plan = response.json()
    assert plan["method"].startswith("Aug-PE") and plan["delta"] == 1e-5
    assert 0 < plan["epsilon"] <= 2.0 + 1e-9
    assert plan["by_mechanism"].keys() == {"aug-pe-class-counts", "aug-pe-histogram"}
    # class counts once, then one histogram per iteration and class
    assert len(plan["events"]) == 1 + 2 * len(LABELS)
    assert ledger_kinds(client, world, dataset_id) == []
    jobs = client.get(f"/v1/datasets/{dataset_id}/jobs", headers=world.owner.headers)
    assert jobs.json() == []


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"population": 0}, "population"),
        ({"delta": 0.0}, "delta"),
        ({"selection": "best"}, "selection"),
        ({"vocabulary": "medical"}, "vocabulary"),  # a DP-KPS field
        ({"num_released": 99}, "num_released"),  # more than the last population holds
        ({"llm": "none"}, "llm"),
    ],
)
def test_a_bad_aug_pe_field_is_a_422_naming_it(
    client: TestClient, world: factories.World, change: dict[str, Any], field: str
) -> None:
    dataset_id = dataset(client, world)
    response = client.post(
        f"/v1/datasets/{dataset_id}/jobs", headers=world.owner.headers, json={**AUG_PE, **change}
    )
    assert response.status_code == 422, response.text
    assert response.json()["field"] == field
    assert ledger_kinds(client, world, dataset_id) == []


def test_an_unknown_method_is_refused_and_a_spec_without_one_is_dpkps(
    client: TestClient, world: factories.World
) -> None:
    dataset_id = dataset(client, world)
    path = f"/v1/datasets/{dataset_id}/jobs"
    response = client.post(path, headers=world.owner.headers, json={**AUG_PE, "method": "pe"})
    assert response.status_code == 422
    assert "method" in response.text
    job_id = factories.job(client, world.owner, dataset_id)
    job = job_of(client, world, job_id)
    assert job["method"] == "dpkps" and job["spec"]["method"] == "dpkps"


def test_a_crashed_aug_pe_job_resumes_from_its_checkpoints_without_new_spend(
    client: TestClient,
    world: factories.World,
    worker: WorkerContext,
    fake_llm: FakeLLM,
    db: Database,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dataset_id = dataset(client, world)
    job_id = _submit(client, world, dataset_id)
    job_uuid = uuid.UUID(job_id)
    # The iterations read private data: the job shows no progress within them, so the
    # crash comes once the first iteration's next population and its costs are saved.
    save = stages.JobCheckpoints.save
    saved_keys: list[str] = []

    def crash_after_first_iteration(self: stages.JobCheckpoints, key: str, data: bytes) -> None:
        save(self, key, data)
        saved_keys.append(key)
        if "aug-pe-population-1" in saved_keys[:-1] and key == costs_key(METHOD):
            raise Crash

    monkeypatch.setattr(stages.JobCheckpoints, "save", crash_after_first_iteration)
    with pytest.raises(Crash):
        stages.run_sequences(worker, job_uuid)
    monkeypatch.undo()

    saved = checkpoints(db, job_id)
    assert {"aug-pe-counts", "aug-pe-histogram-1", "aug-pe-population-1"} <= set(saved)
    assert "aug-pe-histogram-2" not in saved
    # no un-noised histogram is stored: every saved histogram is the noisy one
    first = json.loads(saved["aug-pe-histogram-1"])
    assert set(first) == {"iteration", "noisy", "scores", "selected", "events"}
    calls_before = len(fake_llm.chat_requests)
    assert job_of(client, world, job_id)["state"] == "running"
    assert ledger_kinds(client, world, dataset_id) == ["reserve", "commit"]

    # the process is dead: recovery frees the job, and its task runs again
    with db.transaction() as session:
        job = jobs_repo.get(session, job_uuid, for_update=True)
        assert job is not None
        recovery.release(job)
    assert stages.run_sequences(worker, job_uuid) == "succeeded"

    after = checkpoints(db, job_id)
    for key in ("aug-pe-counts", "aug-pe-histogram-1", "aug-pe-population-0"):
        assert after[key] == saved[key]  # loaded, not drawn again
    job_out = job_of(client, world, job_id)
    assert job_out["state"] == "succeeded"
    assert ledger_kinds(client, world, dataset_id) == ["reserve", "commit"]
    # population 1 was saved before the crash and iteration 2 (the last) varies
    # nothing: no LLM work is done again, and the costs of the first attempt are kept
    assert len(fake_llm.chat_requests) == calls_before
    assert job_out["llm_costs"]["calls"] == calls_before > 0
    assert job_out["epsilon"]["budget_state"] == "committed"


def test_a_dpkps_job_records_its_llm_costs(
    client: TestClient, world: factories.World, worker: WorkerContext, fake_llm: FakeLLM
) -> None:
    dataset_id = factories.dataset(client, world.owner, cap=5)
    vocabulary = client.post(
        "/v1/vocabularies",
        headers=world.owner.headers,
        data={"name": "tiny"},
        files={"file": ("p.txt", b"chest pain\nheart failure\nfracture\nknee\nfall\nfemur")},
    )
    assert vocabulary.status_code == 201, vocabulary.text
    job_id = factories.job(
        client,
        world.owner,
        dataset_id,
        vocabulary=vocabulary.json()["id"],
        vocabulary_size=6,
        sequence_length=2,
        num_features=32,
        per_class=1,
        llm="vllm",
    )
    assert stages.run_sequences(worker, uuid.UUID(job_id)) == "prompting"
    assert stages.run_prompts(worker, uuid.UUID(job_id)) == "succeeded"
    job = job_of(client, world, job_id)
    assert job["method"] == "dpkps"
    calls = len(fake_llm.chat_requests)
    assert job["llm_costs"]["calls"] == job["counts"]["llm_calls"] == calls == 2
    assert job["llm_costs"]["prompt_tokens"] > 0 and job["llm_costs"]["wall_seconds"] > 0
