"""A job of each LLM method with the audit's canaries and a holdout, through the service
(issue 66, items 2 and 3): submitted over HTTP, reserved with the slice's evaluation in
parallel with the generation, run by the worker's first stage (real engine, real
embedding model, a real OpenAI-compatible HTTP server scripted by ``tests/fake_llm.py``)
on the rest side plus the canaries whose coin came up heads, released, downloaded.

The job keeps its canary set (served to no one before the release); the release's
manifest and report carry the audit's figures next to the claimed ε and the slice's
noisy accuracy; no canary reaches the LLM or the download, and the dataset keeps its
rows.
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
from tests.fake_llm import FakeLLM
from tests.service import factories
from tests.service.method_jobs import AUG_PE, download, submit
from tests.service.method_jobs import job as job_of
from tests.service.test_llm_method_jobs import (
    EDA,
    PATE,
    fake_llm,
    larger_dataset,
    upload_vocabulary,
    worker,
)
from tests.service.test_utility_holdout import check_sides
from workers.methods.registry import METHODS

__all__ = ["fake_llm", "worker"]  # fixtures

pytestmark = [pytest.mark.slow]

KEY = "llm-audit-test-key"
HOLDOUT = {"fraction": 0.3, "key": KEY}
PHRASES = (
    b"chest pain\nheart failure\natrial fibrillation\nfracture\nknee\nfall\nfemur\njoint\n"
    b"palpitations\nrhythm\nsyncope\nsprain\ncartilage\nligament\nmeniscus\nbruise"
)
SPECS: dict[str, dict[str, Any]] = {
    "aug-pe": AUG_PE,
    "pate-tutor": {**PATE, "llm": "vllm"},
    "dp-eda": EDA,
}
GENERATION = {
    "aug-pe": {"aug-pe-class-counts", "aug-pe-histogram"},
    "pate-tutor": {"pate-teacher-votes", "pate-tutor-counts"},
    "dp-eda": {"dp-eda-limited-domain"},
}


def _spec(client: TestClient, world: factories.World, method: str) -> dict[str, Any]:
    spec = {**SPECS[method], "holdout": HOLDOUT, "audit_canaries": 64}
    if method == "dp-eda":
        spec["vocabulary"] = upload_vocabulary(client, world, "clinical-audit", PHRASES)
    return spec


@pytest.mark.parametrize("method", ["aug-pe", "pate-tutor", "dp-eda"])
def test_an_llm_method_job_with_canaries_and_a_holdout_reports_both(
    method: str,
    client: TestClient,
    world: factories.World,
    worker: WorkerContext,
    fake_llm: FakeLLM,
    db: Database,
) -> None:
    dataset_id = larger_dataset(client, world)
    job_id = submit(client, world, dataset_id, _spec(client, world, method))
    queued = job_of(client, world, job_id)
    by_mechanism = queued["epsilon"]["by_mechanism"]
    assert set(by_mechanism) == GENERATION[method] | {"holdout_accuracy"}
    generation = queued["epsilon"]["requested"]
    # the evaluation's ε is the generation's (within a float) and composes in parallel
    assert by_mechanism["holdout_accuracy"] == pytest.approx(generation, rel=1e-12)
    assert by_mechanism["holdout_accuracy"] <= generation

    assert stages.run_sequences(worker, uuid.UUID(job_id)) == "succeeded"

    job = job_of(client, world, job_id)
    assert job["state"] == "succeeded" and job["epsilon"]["budget_state"] == "committed"
    assert job["epsilon"]["charged"]["epsilon"] == pytest.approx(generation, rel=1e-12)
    ledger = client.get(f"/v1/datasets/{dataset_id}/ledger", headers=world.owner.headers).json()
    split = check_sides(ledger, KEY)

    with db.session() as session:
        stored = session.get(Job, uuid.UUID(job_id))
        assert stored is not None and stored.manifest is not None
        audit = dict(stored.manifest["audit"])
        utility = dict(stored.manifest["utility"])
    assert len(audit["canaries"]) == len(audit["included"]) == 64
    canary_texts = {f"{c['prefix']} {' '.join(c['suffix'])}" for c in audit["canaries"]}
    suffixes = {" ".join(c["suffix"]) for c in audit["canaries"]}
    # the canary set is served to no one before the release
    for caller in (world.owner, world.admin, world.auditor, world.client):
        for path in (f"/v1/jobs/{job_id}", f"/v1/datasets/{dataset_id}/jobs"):
            text = client.get(path, headers=caller.headers).text
            assert str(audit["seed"]) not in text and '"included"' not in text, path
    # canaries join the run's input, never a prompt (nor does a private document)
    prompts = fake_llm.prompts()
    assert not any(s in p for s in suffixes for p in prompts)
    assert not any(text in p for text, _ in factories.ROWS for p in prompts)
    # the dataset keeps its rows
    dataset = client.get(f"/v1/datasets/{dataset_id}", headers=world.owner.headers).json()
    assert dataset["documents"] == 15 * len(factories.ROWS)
    assert utility["key"] == KEY and utility["split"] == split
    low, high = utility["interval"]
    assert 0.0 <= low <= high <= 1.0

    released = factories.release(client, world, job_id)
    found = released["manifest"]["empirical_audit"]
    assert found["canary_set"] == audit
    assert (found["canaries"], found["guesses"]) == (64, 32)
    assert found["claimed_epsilon"] == pytest.approx(job["epsilon"]["charged"]["epsilon"])
    assert found["copied_as_documents"] == 0
    records = download(client, world, released["id"])
    assert records and not {r["text"] for r in records} & canary_texts

    path = f"/v1/releases/{released['id']}/report"
    for caller in (world.owner, world.client, world.auditor):
        report = client.get(path, headers=caller.headers).json()
        shown = report["empirical_audit"]
        assert shown["epsilon_lower_bound"] == found["epsilon_lower_bound"] >= 0
        assert shown["claimed_epsilon"] == pytest.approx(report["protection"]["epsilon"])
        assert "lower bound, not a proof" in shown["finding_in_words"] or shown["exceeds_claim"]
        # the method's own measurement (benchmarks/notes/2026-12-07-llm-method-audit.md)
        assert f"Measured for {METHODS[method].title} " in shown["utility_cost"]
        assert "llm-method-audit.md" in shown["utility_cost"]
        if caller is not world.auditor:
            assert report["utility"]["interval"] == [low, high]
            assert report["utility"]["fraction"] == 0.3
    pdf = client.get(path, params={"format": "pdf"}, headers=world.owner.headers)
    assert pdf.status_code == 200 and pdf.content.startswith(b"%PDF")
    assert not any(text in json.dumps(released["manifest"]) for text, _ in factories.ROWS)


def test_an_llm_method_job_can_opt_out_of_the_audit(
    client: TestClient, world: factories.World, worker: WorkerContext, db: Database
) -> None:
    dataset_id = larger_dataset(client, world)
    job_id = submit(client, world, dataset_id, {**AUG_PE, "audit_canaries": 0})
    assert stages.run_sequences(worker, uuid.UUID(job_id)) == "succeeded"
    with db.session() as session:
        stored = session.get(Job, uuid.UUID(job_id))
        assert stored is not None and stored.manifest is not None
        assert "audit" not in stored.manifest and "utility" not in stored.manifest
    released = factories.release(client, world, job_id)
    assert "empirical_audit" not in released["manifest"]
