"""A job with a held-out slice (issue 66, item 2; docs/utility.md): the real engine runs
on the rest, the slice is scored with noise, the ledger charges the two sides in
parallel, and the release report and the dry run show the figure and its cost."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from app.config import Settings
from app.db import Database
from app.jobs import stages
from app.jobs.stages import WorkerContext
from app.models import Job
from tests.service import factories
from tests.service.test_worker import vocabulary
from workers.evaluation import holdout

KEY = "service-test-key"
CARDIO = ("chest pain", "heart failure", "shortness of breath", "atrial fibrillation")
ORTHO = ("fracture", "femur", "knee", "arthritis", "joint pain")
ROWS = [
    *((f"Visit {i}: {CARDIO[i % 4]} and {CARDIO[(i + 1) % 4]}", "cardio") for i in range(40)),
    *((f"Visit {i}: {ORTHO[i % 5]} and {ORTHO[(i + 2) % 5]}", "ortho") for i in range(40)),
]
SPEC: dict[str, Any] = {
    "llm": "none",
    "vocabulary_size": 8,
    "sequence_length": 3,
    "per_class": 20,
    "holdout": {"fraction": 0.3, "key": KEY},
}


@pytest.fixture
def worker(app: FastAPI, settings: Settings, tmp_path: Path) -> WorkerContext:
    return factories.worker_context(app, settings, tmp_path / "cache")


def _dataset(client: TestClient, world: factories.World, rows: Any = ROWS) -> str:
    return factories.dataset(client, world.owner, content=factories.csv_bytes(rows), cap=10)


def check_sides(ledger: dict[str, Any], key: str) -> str:
    """Checks that the ledger's reservation charges the evaluation on the slice of the
    split of ``key`` (fraction 0.3) and every other event on the rest; the split's name."""
    reserve = next(e for e in ledger["entries"] if e["kind"] == "reserve")
    split = holdout.split_name(key, 0.3)
    sides = {(e["mechanism"], e.get("split"), e.get("side")) for e in reserve["events"]}
    assert ("holdout_accuracy", split, "slice") in sides
    assert {s for m, _, s in sides if m != "holdout_accuracy"} == {"rest"}
    return split


def test_a_job_with_a_holdout_publishes_its_accuracy_and_costs_its_generation(
    client: TestClient, world: factories.World, worker: WorkerContext, db: Database
) -> None:
    dataset_id = _dataset(client, world)
    spec = {"vocabulary": vocabulary(client, world.owner), **SPEC}
    job_id = factories.job(client, world.owner, dataset_id, **spec)
    assert stages.run_sequences(worker, uuid.UUID(job_id)) == "succeeded"

    job = client.get(f"/v1/jobs/{job_id}", headers=world.owner.headers).json()
    assert job["state"] == "succeeded"
    # ε_vocab 0.5 + ε_kde 0.5 = 1 for the generation; the evaluation's ε (default: the
    # generation's, 1) is on the disjoint slice: the job is charged 1, not 2
    assert job["epsilon"]["requested"] == 1.0
    assert job["epsilon"]["by_mechanism"]["holdout_accuracy"] == 1.0
    assert job["epsilon"]["charged"]["epsilon"] == 1.0

    ledger = client.get(f"/v1/datasets/{dataset_id}/ledger", headers=world.owner.headers).json()
    split = check_sides(ledger, KEY)
    assert ledger["budget"]["spent"] == 1.0

    with db.session() as session:
        stored = session.get(Job, uuid.UUID(job_id))
        assert stored is not None
        utility = dict(stored.manifest["utility"])
        privacy = stored.manifest["privacy"]
    assert utility["key"] == KEY and utility["split"] == split
    low, high = utility["interval"]
    assert 0.0 <= low <= high <= 1.0
    if utility["accuracy"] is not None:
        assert low <= utility["accuracy"] <= high
    assert set(utility["per_class"]) == {"cardio", "ortho"}
    assert len(utility["cells"]["correct"]) == 2 == len(utility["cells"]["wrong"])
    assert utility["noise_bound"] == holdout.noise_quantile(scale=1.0, terms=2, alpha=0.025)
    assert privacy["epsilon"] == 1.0  # the realised events, composed by sides
    assert any(e.get("side") == "slice" for e in privacy["events"])

    released = factories.release(client, world, job_id)
    path = f"/v1/releases/{released['id']}/report"
    for caller in (world.owner, world.client):
        report = client.get(path, headers=caller.headers).json()
        shown = report["utility"]
        assert shown["interval"] == [low, high] and shown["accuracy"] == utility["accuracy"]
        assert shown["epsilon"] == 1.0 and shown["fraction"] == 0.3
        assert [c["label"] for c in shown["per_class"]] == ["cardio", "ortho"]
        assert "held out from generation" in shown["in_words"]
        for c in shown["per_class"]:
            assert (c["accuracy"] is None) == (c["why_not"] is not None)
    html = client.get(path, params={"format": "html"}, headers=world.owner.headers)
    assert html.status_code == 200 and "Accuracy on held-out private data" in html.text
    pdf = client.get(path, params={"format": "pdf"}, headers=world.owner.headers)
    assert pdf.status_code == 200 and pdf.content.startswith(b"%PDF")


def test_a_job_without_a_holdout_has_no_figure(
    client: TestClient, world: factories.World, worker: WorkerContext, db: Database
) -> None:
    dataset_id = _dataset(client, world)
    spec = {"vocabulary": vocabulary(client, world.owner), **SPEC, "holdout": None}
    job_id = factories.job(client, world.owner, dataset_id, **spec)
    assert stages.run_sequences(worker, uuid.UUID(job_id)) == "succeeded"
    with db.session() as session:
        stored = session.get(Job, uuid.UUID(job_id))
        assert stored is not None and "utility" not in stored.manifest
        assert all("split" not in e for e in stored.manifest["privacy"]["events"])


def test_the_server_draws_a_key_when_the_spec_names_none(
    client: TestClient, world: factories.World
) -> None:
    dataset_id = _dataset(client, world)
    spec = {"vocabulary": vocabulary(client, world.owner), **SPEC, "holdout": {"fraction": 0.2}}
    first = factories.job(client, world.owner, dataset_id, **spec)
    second = factories.job(client, world.owner, dataset_id, **spec)
    keys = [
        client.get(f"/v1/jobs/{j}", headers=world.owner.headers).json()["spec"]["holdout"]["key"]
        for j in (first, second)
    ]
    assert all(isinstance(k, str) and len(k) >= 8 for k in keys) and keys[0] != keys[1]


def test_the_dry_run_shows_the_cost_and_says_why_the_holdout_is_off(
    client: TestClient, world: factories.World
) -> None:
    small = factories.dataset(client, world.owner, cap=10)  # four rows
    plan = factories.dry_run(client, world.owner, small)
    block = plan["utility"]
    assert block["holdout"] is False and block["extra_epsilon"] == 0.0
    assert block["useful"] is False and block["expected_half_width"] > 0.05
    assert "Holdout off" in block["summary"] and "too small" in block["summary"]
    # asked for anyway: its cost, nothing added to the job, and the same warning
    asked = factories.dry_run(client, world.owner, small, holdout={"fraction": 0.5})
    block = asked["utility"]
    assert block["holdout"] is True and block["extra_epsilon"] == 0.0
    assert asked["epsilon"] == 1.0 and asked["by_mechanism"]["holdout_accuracy"] == 1.0
    assert "the same as the generation alone" in block["cost"]
    assert "too small" in block["summary"]
    events = {e["mechanism"]: e for e in asked["events"]}
    assert events["holdout_accuracy"]["side"] == "slice"
    assert events["holdout_accuracy"]["dimension"] == 4  # correct and wrong, per class
    # a dearer evaluation is what the job costs (the worse side), never the sum
    dear = factories.dry_run(client, world.owner, small, holdout={"fraction": 0.5, "epsilon": 3.0})
    assert dear["epsilon"] == 3.0 and dear["utility"]["extra_epsilon"] == 2.0
    # a non-owner gets the cost but no figure computed from the raw count
    admin = factories.submit(client, world.admin, small, dry_run=True, holdout={"fraction": 0.5})
    if admin.status_code == 200:
        assert "expected_half_width" not in admin.json()["utility"]
        assert "summary" not in admin.json()["utility"]
    else:
        assert admin.status_code in (403, 404)


def test_the_dry_run_recommends_a_holdout_where_the_corpus_is_large_enough(
    client: TestClient, world: factories.World
) -> None:
    rows = [(f"c{i} {CARDIO[i % 4]}", "cardio") for i in range(750)]
    rows += [(f"o{i} {ORTHO[i % 5]}", "ortho") for i in range(750)]
    dataset_id = _dataset(client, world, rows)
    block = factories.dry_run(client, world.owner, dataset_id)["utility"]
    assert block["useful"] is True and block["expected_slice_units"] == 150
    assert "useful" in block["summary"] and '"holdout"' in block["summary"]


def test_a_bad_holdout_is_a_422_naming_the_field(
    client: TestClient, world: factories.World
) -> None:
    small = factories.dataset(client, world.owner, cap=10)
    for bad in ({"fraction": 0.9}, {"fraction": 0}, {"fractions": 0.1}, {"key": "no spaces here"}):
        response = factories.submit(client, world.owner, small, dry_run=True, holdout=bad)
        assert response.status_code == 422, (bad, response.text)
        assert "holdout" in response.text
