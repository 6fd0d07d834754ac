"""PATE-tutor and DP-EDA as service jobs, end to end like Aug-PE's and DP-KPS's: submitted
over HTTP (validated per method, errors naming the field), planned and reserved, run by
the worker's first stage (real engine, real embedding model), committed, released with
a manifest, downloaded by a client organisation; LLM costs on the job and the manifest.

PATE-tutor runs on the packaged local LLM (SmolLM2 served by llama.cpp); DP-EDA on a real
OpenAI-compatible HTTP server scripted by ``tests/fake_llm.py`` (its LLM decoder asks for
dozens of completions) with a vocabulary uploaded through the API, so the job resolves
and pins the vocabulary like a DP-KPS job. A crashed DP-EDA job resumes from its
checkpoints without drawing noise or spending again.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
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
from tests.fake_llm import Behaviour, FakeLLM
from tests.service import factories
from tests.service.method_jobs import (
    AUG_PE,
    Crash,
    check_prompt_log,
    checkpoints,
    dataset,
    download,
    ledger_kinds,
    llm_worker,
    submit,
)
from tests.service.method_jobs import job as job_of
from workers.llm.attestation import verify

LABELS = list(factories.LABELS)
PATE: dict[str, Any] = {
    "method": "pate-tutor",
    "llm": "local",
    "document_type": "clinical note",
    "epsilon": 4.0,
    "delta": 1e-5,
    "teachers": 2,
    "queries": 4,
    "negatives": 4,
    "candidates": 6,
    "num_released": 4,
    "max_tokens": 24,
}
EDA: dict[str, Any] = {
    "method": "dp-eda",
    "llm": "vllm",
    "document_type": "clinical note",
    "epsilon": 40.0,
    "delta": 1e-5,
    "iterations": 2,
    "domain": 2,
    "parents": 2,
    "initial_population": 4,
    "offspring": 4,
    "top_r": 2,
    "nearest_phrases": 2,
    "candidates": 1,
    "rounds": 1,
    "perplexity_percentile": 100.0,
    "max_tokens": 24,
}
PHRASES = b"chest pain\nheart failure\natrial fibrillation\nfracture\nknee\nfall\nfemur\njoint"


def clinical(body: dict[str, Any]) -> str:
    """A completion on the topic of the label the prompt names (public), numbered."""
    user = str(body["messages"][-1]["content"])
    clinical.calls += 1  # type: ignore[attr-defined]
    n = clinical.calls  # type: ignore[attr-defined]
    if '"cardio"' in user or "cardio" in user:
        return f"Patient {n} reports chest pain and palpitations; heart rhythm checked."
    return f"Patient {n} has knee pain after a fall; the x-ray shows a small fracture."


clinical.calls = 0  # type: ignore[attr-defined]


@pytest.fixture
def fake_llm() -> Iterator[FakeLLM]:
    with FakeLLM(content_fn=clinical) as fake:
        yield fake


@pytest.fixture
def worker(app: FastAPI, settings: Settings, tmp_path: Path, fake_llm: FakeLLM) -> WorkerContext:
    """A worker on the test database: ``local`` is the packaged model, ``vllm`` the fake."""
    return llm_worker(app, settings, tmp_path, fake_llm)


def larger_dataset(client: TestClient, world: factories.World) -> str:
    """30 notes a class: enough votes for LimitedDomain's noisy threshold at ε = 40, and a
    cap (ε 50, δ 1e-5) the jobs fit."""
    rows = [(f"{text} (note {i})", label) for i in range(15) for text, label in factories.ROWS]
    return factories.dataset(
        client, world.owner, content=factories.csv_bytes(rows), cap=50, delta_cap="1e-5"
    )


def upload_vocabulary(
    client: TestClient,
    world: factories.World,
    name: str = "clinical-tiny",
    phrases: bytes = PHRASES,
) -> str:
    """The owner's vocabulary ``name`` of ``phrases`` (one a line); its id."""
    response = client.post(
        "/v1/vocabularies",
        headers=world.owner.headers,
        data={"name": name},
        files={"file": ("p.txt", phrases)},
    )
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def _events_match(manifest: dict[str, Any]) -> list[str]:
    charged, released = (
        sorted(json.dumps(e, sort_keys=True) for e in manifest["privacy"][name])
        for name in ("events_charged", "events_released")
    )
    assert released == charged
    return charged


@pytest.mark.slow
@pytest.mark.llm
def test_a_pate_tutor_job_runs_on_the_local_llm_is_released_and_downloaded(
    client: TestClient, world: factories.World, worker: WorkerContext
) -> None:
    dataset_id = dataset(client, world)
    job_id = submit(client, world, dataset_id, PATE)
    queued = job_of(client, world, job_id)
    assert queued["method"] == "pate-tutor" and queued["epsilon"]["budget_state"] == "reserved"
    assert 0 < queued["epsilon"]["requested"] <= 4.0 + 1e-9
    assert set(queued["epsilon"]["by_mechanism"]) == {"pate-teacher-votes", "pate-tutor-counts"}

    assert stages.run_sequences(worker, uuid.UUID(job_id)) == "succeeded"

    job = job_of(client, world, job_id)
    assert job["state"] == "succeeded" and job["epsilon"]["budget_state"] == "committed"
    assert 0 < job["counts"]["sequences"] == job["counts"]["texts_done"] <= 4
    assert job["llm_costs"]["calls"] >= 4 + 4 + 6  # the three public pools, retries aside
    assert job["llm_costs"]["completion_tokens"] > 0 and job["llm_costs"]["wall_seconds"] > 0
    assert ledger_kinds(client, world, dataset_id) == ["reserve", "commit"]

    released = factories.release(client, world, job_id)
    manifest = released["manifest"]
    assert manifest["method_id"] == "pate-tutor" and manifest["method"].startswith("PATE")
    assert manifest["parameters"]["queries"] == 4 and manifest["parameters"]["teachers"] == 2
    llm = manifest["models"]["llm"]  # the packaged model that wrote the texts, to the file
    assert llm["endpoint"] == "local" and llm["model"] == "SmolLM2-135M-Instruct"
    assert llm["version"] and llm["runs_as"] == "Q8_0" and len(llm["sha256"]) == 64
    assert manifest["models"]["embedding"]["sha256"]
    assert manifest["llm_costs"] == {"method": "pate-tutor", **job["llm_costs"]}
    assert len(_events_match(manifest)) == 2  # Q votes (one event, count Q) + the tutor
    records = download(client, world, released["id"])
    assert len(records) == released["documents"] == job["counts"]["sequences"]
    assert all(r["label"] in LABELS and r["text"].strip() for r in records)
    private = [text for text, _ in factories.ROWS]
    assert not any(text in json.dumps(manifest) for text in private)


def test_a_dp_eda_job_runs_is_released_resumes_and_names_its_decoder(
    app: FastAPI,
    client: TestClient,
    world: factories.World,
    worker: WorkerContext,
    fake_llm: FakeLLM,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dataset_id = larger_dataset(client, world)
    vocabulary = upload_vocabulary(client, world)
    spec = {**EDA, "vocabulary": vocabulary}
    job_id = submit(client, world, dataset_id, spec)
    queued = job_of(client, world, job_id)
    assert queued["method"] == "dp-eda" and queued["epsilon"]["budget_state"] == "reserved"
    assert queued["spec"]["vocabulary_ref"]["name"] == "clinical-tiny"
    assert set(queued["epsilon"]["by_mechanism"]) == {"dp-eda-limited-domain"}
    assert 0 < queued["epsilon"]["requested"] <= 40.0 + 1e-9

    # the worker dies right after the first iteration's decoded texts are saved
    from workers.methods.dp_eda import runner as eda_runner

    decode = eda_runner._Run.decoded
    state = {"calls": 0}

    def dying(self: Any, c: int, t: int, label: str, targets: Any) -> Any:
        texts = decode(self, c, t, label, targets)
        state["calls"] += 1
        if state["calls"] == 1:
            raise Crash
        return texts

    monkeypatch.setattr(eda_runner._Run, "decoded", dying)
    job_uuid = uuid.UUID(job_id)
    with pytest.raises(Crash):
        stages.run_sequences(worker, job_uuid)
    db: Database = app.state.database
    saved = checkpoints(db, job_id)
    assert "dp-eda-initial" in saved and any(k.startswith("dp-eda-select") for k in saved)
    calls_before = len(fake_llm.chat_requests)
    with db.transaction() as session:  # the lease ran out: recovery hands the job on
        job_row = jobs_repo.get(session, job_uuid, for_update=True)
        assert job_row is not None
        recovery.release(job_row)
    assert stages.run_sequences(worker, job_uuid) == "succeeded"

    after = checkpoints(db, job_id)
    for key, value in saved.items():
        if key.startswith(("dp-eda-select", "dp-eda-decode", "dp-eda-initial")):
            assert after[key] == value  # loaded, not drawn or asked again
    job = job_of(client, world, job_id)
    assert job["state"] == "succeeded" and job["epsilon"]["budget_state"] == "committed"
    assert ledger_kinds(client, world, dataset_id) == ["reserve", "commit"]
    assert job["llm_costs"]["calls"] == len(fake_llm.chat_requests) > calls_before
    assert not any(text in p for text, _ in factories.ROWS for p in fake_llm.prompts())

    released = factories.release(client, world, job_id)
    manifest = released["manifest"]
    assert manifest["method_id"] == "dp-eda" and manifest["method"].startswith("DP-EDA")
    assert manifest["decoder"]["name"] == "llm_reconstruction"  # the manifest names it
    assert manifest["llm_costs"]["method"] == "dp-eda"
    assert len(_events_match(manifest)) == 2 * len(LABELS)  # T iterations × classes
    records = download(client, world, released["id"])
    assert 0 < len(records) == released["documents"] <= 2 * len(LABELS)
    assert all(r["label"] in LABELS and r["text"].startswith("Patient") for r in records)
    # every prompt of both runs, the crashed one's included, is in the job's prompt log;
    # the public ones render again from their refs and inputs
    logged = check_prompt_log(app.state.database, job_id, fake_llm)
    kinds = {line["kind"] for line in logged}
    assert kinds == {"dp_eda.population", "dp_eda.reconstruction"}
    assert verify(logged).rederived == len(logged)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({**PATE, "num_released": 7}, "num_released"),  # more than the 6 candidates
        ({**PATE, "teachers": 1}, "teachers"),
        ({**PATE, "llm": "none"}, "llm"),
        ({**PATE, "iterations": 2}, "iterations"),  # an option of another method
        ({**EDA, "parents": 3}, "parents"),  # more than the domain K = 2
        ({**EDA, "vocabulary": "no-such-vocabulary"}, "vocabulary"),
        ({**EDA, "decoder": "trained"}, "decoder"),
        ({**EDA, "initial_population": 100_000, "max_llm_calls": 10}, "max_llm_calls"),
    ],
)
def test_a_bad_field_of_a_method_is_a_422_naming_it_and_stores_nothing(
    client: TestClient, world: factories.World, spec: dict[str, Any], field: str
) -> None:
    dataset_id = dataset(client, world)
    response = client.post(
        f"/v1/datasets/{dataset_id}/jobs", headers=world.owner.headers, json=spec
    )
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    assert field in json.dumps(response.json())
    listed = client.get(f"/v1/datasets/{dataset_id}/jobs", headers=world.owner.headers)
    assert listed.status_code == 200 and listed.json() == []
    assert ledger_kinds(client, world, dataset_id) == []


@pytest.mark.parametrize("spec", [PATE, EDA])
def test_a_dry_run_of_each_method_plans_without_storing_anything(
    client: TestClient, world: factories.World, spec: dict[str, Any]
) -> None:
    dataset_id = dataset(client, world)
    body = {**spec, "decoder": "retrieval"} if spec is EDA else spec
    response = client.post(
        f"/v1/datasets/{dataset_id}/jobs?dry_run=true", headers=world.owner.headers, json=body
    )
    assert response.status_code == 200, response.text
    plan = response.json()
    assert plan["dry_run"] is True and plan["delta"] == spec["delta"]
    assert 0 < plan["epsilon"] <= spec["epsilon"] + 1e-9
    assert plan["events"] and plan["method"]
    assert ledger_kinds(client, world, dataset_id) == []


def test_a_failed_llm_method_job_is_retried_from_its_checkpoints_without_new_spend(
    app: FastAPI,
    client: TestClient,
    world: factories.World,
    worker: WorkerContext,
    fake_llm: FakeLLM,
) -> None:
    """An LLM outage ends an Aug-PE job after its first private read (the DP class
    counts); a retry runs it again from its checkpoints: the counts are loaded, not drawn
    again, and the spend stays committed once."""
    dataset_id = dataset(client, world)
    job_id = submit(client, world, dataset_id, AUG_PE)
    fake_llm.default = Behaviour.parse("500")  # the endpoint is down
    assert stages.run_sequences(worker, uuid.UUID(job_id)) == "failed"
    failed = job_of(client, world, job_id)
    assert failed["state"] == "failed" and failed["epsilon"]["budget_state"] == "committed"
    counts = checkpoints(app.state.database, job_id)["aug-pe-counts"]

    fake_llm.default = Behaviour.parse("ok")  # the endpoint is back
    response = client.post(f"/v1/jobs/{job_id}/retry", headers=world.owner.headers)
    assert response.status_code == 202, response.text
    assert response.json()["state"] == "queued" and response.json()["error"] is None
    assert stages.run_sequences(worker, uuid.UUID(job_id)) == "succeeded"

    job = job_of(client, world, job_id)
    assert job["state"] == "succeeded" and job["counts"]["sequences"] == 2
    assert checkpoints(app.state.database, job_id)["aug-pe-counts"] == counts
    # the failed run's prompts and the retry's are in one chain, each request once
    logged = check_prompt_log(app.state.database, job_id, fake_llm)
    assert {line["kind"] for line in logged} == {"random_document", "aug_pe.variation"}
    assert ledger_kinds(client, world, dataset_id) == ["reserve", "commit"]
    again = client.post(f"/v1/jobs/{job_id}/retry", headers=world.owner.headers)
    assert again.status_code == 409  # a job that succeeded is not run again


def test_a_job_that_failed_before_reading_private_data_is_not_retried(
    client: TestClient, world: factories.World, worker: WorkerContext
) -> None:
    dataset_id = dataset(client, world)
    job_id = submit(client, world, dataset_id, {**PATE, "llm": "vllm"})
    with worker.database.transaction() as session:  # fails before its spend is committed
        job = jobs_repo.get(session, uuid.UUID(job_id), for_update=True)
        assert job is not None
        job.state, job.error_code = "failed", "llm_unavailable"
    response = client.post(f"/v1/jobs/{job_id}/retry", headers=world.owner.headers)
    assert response.status_code == 409
    assert "submit a new job" in response.json()["detail"]
