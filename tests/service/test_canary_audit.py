"""The release's empirical privacy audit (issue 66, item 3) through the service.

A real job (the engine in-process as a worker runs it, no LLM) draws its canaries, adds
those whose coin came up heads to the generation input, and keeps the canary set with the
job; the release runs the membership test on the released corpus and its report shows
the lower bound next to the claimed ε, in every view and rendering. The dataset keeps its
rows, no released document is a canary, and nothing of the canary set is served before
the release. A spec can turn the audit off (``audit_canaries: 0``).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.db import Database
from app.jobs import stages
from app.jobs.stages import WorkerContext
from app.models import Job
from tests.service import factories
from tests.service.test_worker import cache_dir, submit, worker

__all__ = ["cache_dir", "worker"]

pytestmark = pytest.mark.slow


def _stored_audit(db: Database, job_id: str) -> dict[str, Any]:
    with db.session() as session:
        job = session.get(Job, uuid.UUID(job_id))
        assert job is not None and job.manifest is not None
        stored: dict[str, Any] = job.manifest["audit"]
        return stored


def test_a_real_job_s_release_report_carries_the_audit(
    client: TestClient, world: factories.World, worker: WorkerContext, db: Database
) -> None:
    dataset_id, job_id = submit(client, world, llm="none")
    assert stages.run_sequences(worker, uuid.UUID(job_id)) == "succeeded"

    # the canary set is kept with the job: 64 canaries, their coins, the secret seed
    stored = _stored_audit(db, job_id)
    assert len(stored["canaries"]) == len(stored["included"]) == 64
    canary_texts = {f"{c['prefix']} {' '.join(c['suffix'])}" for c in stored["canaries"]}
    # ... and served to no one before the release (the seed is a 62-bit number)
    seed = str(stored["seed"])
    for caller in (world.owner, world.admin, world.auditor, world.client):
        for path in (f"/v1/jobs/{job_id}", f"/v1/datasets/{dataset_id}/jobs", "/v1/releases"):
            response = client.get(path, headers=caller.headers)
            assert seed not in response.text and "included" not in response.text, path
    # the dataset keeps its rows: canaries are not stored as data
    dataset = client.get(f"/v1/datasets/{dataset_id}", headers=world.owner.headers).json()
    assert dataset["documents"] == len(factories.ROWS)

    release = factories.release(client, world, job_id)
    audit = release["manifest"]["empirical_audit"]
    assert audit["canary_set"] == stored  # public from the release on: reproducible
    assert (audit["canaries"], audit["guesses"], audit["confidence"]) == (64, 32, 0.95)
    assert 0 <= audit["correct"] <= 32 and audit["included"] == sum(stored["included"])
    assert audit["copied_as_documents"] == 0

    # no downloaded document is a canary
    download = client.get(f"/v1/releases/{release['id']}/download", headers=world.client.headers)
    assert download.status_code == 200
    documents = [json.loads(line)["text"] for line in download.text.splitlines()]
    assert documents and not set(documents) & canary_texts

    path = f"/v1/releases/{release['id']}/report"
    for caller in (world.owner, world.client, world.auditor):
        body = client.get(path, headers=caller.headers).json()
        found = body["empirical_audit"]
        assert found["claimed_epsilon"] == pytest.approx(body["protection"]["epsilon"])
        assert found["epsilon_lower_bound"] == audit["epsilon_lower_bound"] >= 0
        assert (found["canaries"], found["guesses"], found["correct"]) == (
            64,
            32,
            audit["correct"],
        )
        assert found["largest_possible_bound"] == pytest.approx(2.3213737, abs=1e-6)
        assert "lower bound, not a proof" in found["finding_in_words"] or found["exceeds_claim"]
        assert "never released as documents" in found["canaries_in_release"]
        assert "only through the DP mechanism" in found["canaries_in_release"]
        assert "AG News" in found["utility_cost"]
    html = client.get(path, params={"format": "html"}, headers=world.owner.headers)
    assert html.status_code == 200 and "Empirical privacy evidence" in html.text
    assert 'id="audit-figures"' in html.text and "Audit: ε at least" in html.text
    pdf = client.get(path, params={"format": "pdf"}, headers=world.owner.headers)
    assert pdf.status_code == 200 and pdf.content.startswith(b"%PDF")


def test_a_job_can_opt_out_of_the_audit(
    client: TestClient, world: factories.World, worker: WorkerContext, db: Database
) -> None:
    _, job_id = submit(client, world, llm="none", audit_canaries=0)
    assert stages.run_sequences(worker, uuid.UUID(job_id)) == "succeeded"
    with db.session() as session:
        job = session.get(Job, uuid.UUID(job_id))
        assert job is not None and "audit" not in (job.manifest or {})
    release = factories.release(client, world, job_id)
    assert "empirical_audit" not in release["manifest"]
    body = client.get(f"/v1/releases/{release['id']}/report", headers=world.owner.headers).json()
    assert body["empirical_audit"] is None
    html = client.get(
        f"/v1/releases/{release['id']}/report",
        params={"format": "html"},
        headers=world.owner.headers,
    )
    assert "ran without canaries" in html.text


def test_the_number_of_canaries_is_checked(client: TestClient, world: factories.World) -> None:
    dataset_id = factories.dataset(client, world.owner)
    for bad in (-1, 1001, True, 2.5):
        response = factories.submit(client, world.owner, dataset_id, audit_canaries=bad)
        assert response.status_code == 422, (bad, response.text)
        assert "audit_canaries" in response.text
