"""The ledger's rules at the service level, and the worker-side life cycle (runner)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import select

from app.db import Database
from app.errors import Conflict
from app.identity.policy import Actor
from app.jobs import repository as jobs_repo
from app.jobs import runner, stages
from app.jobs.stages import WorkerContext
from app.ledger import events as ledger_events
from app.ledger import service as ledger
from app.models import Dataset, LedgerEntry
from tests.service import factories
from tests.service.test_worker import cache_dir, submit, worker  # noqa: F401 (fixtures)

WORKER = Actor.system("worker")


def _budget(db: Database, dataset_id: str) -> ledger.Budget:
    with db.session() as session:
        dataset = session.get(Dataset, uuid.UUID(dataset_id))
        assert dataset is not None
        return ledger.budget(session, dataset)


def test_spent_reserved_and_remaining_follow_the_entries(
    client: TestClient, world: factories.World, db: Database
) -> None:
    dataset_id = factories.dataset(client, world.owner, cap=10)
    committed, released, _waiting = (
        uuid.UUID(factories.job(client, world.owner, dataset_id, epsilon_kde=k))
        for k in (1.5, 2.5, 3.5)
    )
    with db.transaction() as session:
        ledger.commit_spend(session, committed, WORKER)
        ledger.release_reservation(session, released, WORKER)
    figures = _budget(db, dataset_id)
    assert (figures.spent, figures.reserved, figures.remaining) == (2.0, 4.0, 4.0)
    assert figures.accountant.startswith("basic composition")


def test_commit_is_charged_exactly_once_and_never_released(
    client: TestClient, world: factories.World, db: Database
) -> None:
    dataset_id = factories.dataset(client, world.owner)
    job_id = uuid.UUID(factories.job(client, world.owner, dataset_id))
    with db.transaction() as session:
        first = ledger.commit_spend(session, job_id, WORKER)
    with db.transaction() as session:
        again = ledger.commit_spend(session, job_id, WORKER)
        assert again.id == first.id
        with pytest.raises(Conflict):
            ledger.release_reservation(session, job_id, WORKER)
    with db.session() as session:
        kinds = session.scalars(select(LedgerEntry.kind).order_by(LedgerEntry.id)).all()
    assert kinds == ["reserve", "commit"]
    assert _budget(db, dataset_id).spent == 1.0


def test_a_released_reservation_cannot_be_spent(
    client: TestClient, world: factories.World, db: Database
) -> None:
    dataset_id = factories.dataset(client, world.owner)
    job_id = uuid.UUID(factories.job(client, world.owner, dataset_id))
    with db.transaction() as session:
        ledger.release_reservation(session, job_id, WORKER)
        assert ledger.release_reservation(session, job_id, WORKER).kind == "release"
    with db.transaction() as session, pytest.raises(Conflict):
        ledger.commit_spend(session, job_id, WORKER)


def test_entries_cannot_be_edited_or_deleted(
    client: TestClient, world: factories.World, db: Database
) -> None:
    dataset_id = factories.dataset(client, world.owner)
    factories.job(client, world.owner, dataset_id)
    with pytest.raises(sa.exc.DBAPIError, match="append-only"), db.transaction() as session:
        entry = session.scalars(select(LedgerEntry)).one()
        entry.epsilon = 0.0
    with pytest.raises(sa.exc.DBAPIError, match="append-only"), db.transaction() as session:
        session.execute(sa.delete(LedgerEntry))
    assert _budget(db, dataset_id).reserved == 1.0


def test_the_worker_commits_before_it_can_read_private_documents(
    client: TestClient, world: factories.World, db: Database, app: FastAPI
) -> None:
    dataset_id = factories.dataset(client, world.owner)
    job_id = uuid.UUID(factories.job(client, world.owner, dataset_id))
    cipher = app.state.cipher
    with db.transaction() as session, pytest.raises(Conflict):
        next(runner.private_documents(session, cipher, job_id))
    with db.transaction() as session:
        started = runner.start_sequences(session, job_id)
    assert started is not None and started.labels == ["cardio", "ortho"]
    with db.transaction() as session:
        documents = list(runner.private_documents(session, cipher, job_id))
    assert documents == [(text, label, None) for text, label in factories.ROWS]
    job = client.get(f"/v1/jobs/{job_id}", headers=world.owner.headers).json()
    assert job["state"] == "running" and job["stage"] == "extract"
    assert job["epsilon"]["budget_state"] == "committed"
    with db.transaction() as session:  # a redelivered task starts nothing twice
        assert runner.start_sequences(session, job_id) is not None  # nothing persisted yet
        runner.save_sequences(
            session, job_id, factories.SEQUENCES, private_vocabulary=[], manifest={}
        )
    with db.transaction() as session:
        assert runner.start_sequences(session, job_id) is None
    assert _budget(db, dataset_id).spent == 1.0


def test_cancelled_or_deleted_jobs_do_not_start(
    client: TestClient, world: factories.World, db: Database
) -> None:
    dataset_id = factories.dataset(client, world.owner, cap=3)
    cancelled = factories.job(client, world.owner, dataset_id)
    client.post(f"/v1/jobs/{cancelled}/cancel", headers=world.owner.headers)
    with db.transaction() as session:
        assert runner.start_sequences(session, uuid.UUID(cancelled)) is None
    assert _budget(db, dataset_id).spent == 0.0


def test_failures_release_or_keep_the_budget_as_the_ledger_says(
    client: TestClient, world: factories.World, db: Database
) -> None:
    dataset_id = factories.dataset(client, world.owner, cap=3)
    before_read = uuid.UUID(factories.job(client, world.owner, dataset_id))
    after_read = uuid.UUID(factories.job(client, world.owner, dataset_id))
    with db.transaction() as session:
        runner.fail(session, before_read, "engine_unavailable", "no worker could load the model")
    with db.transaction() as session:
        runner.start_sequences(session, after_read)
    with db.transaction() as session:
        runner.fail(session, after_read, "soft_time_limit", "the job ran out of time")
    figures = _budget(db, dataset_id)
    assert (figures.spent, figures.reserved, figures.remaining) == (1.0, 0.0, 2.0)
    job = client.get(f"/v1/jobs/{after_read}", headers=world.owner.headers).json()
    assert job["state"] == "failed"
    assert job["error"] == {"code": "soft_time_limit", "message": "the job ran out of time"}


def test_prompting_is_queued_after_the_sequences_and_resumes_from_what_is_missing(
    client: TestClient, world: factories.World, db: Database, app: FastAPI
) -> None:
    dataset_id = factories.dataset(client, world.owner)
    job_id = uuid.UUID(factories.job(client, world.owner, dataset_id, llm="local"))
    with db.transaction() as session:
        runner.start_sequences(session, job_id)
        runner.save_sequences(
            session,
            job_id,
            factories.SEQUENCES,
            private_vocabulary=["x"],
            manifest={"sequences": 3},
        )
    with db.transaction() as session:
        runner.save_outcome(session, job_id, 0, text="A synthetic note.", error=None, attempts=1)
        runner.save_outcome(session, job_id, 1, text=None, error="http_503", attempts=3)
    with db.transaction() as session:
        assert [p for p, _ in runner.pending_prompts(session, job_id)] == [1, 2]
        runner.save_outcome(session, job_id, 1, text="Another one.", error=None, attempts=1)
        runner.report_progress(session, job_id, "prompts", 0.9)
    job = client.get(f"/v1/jobs/{job_id}", headers=world.owner.headers).json()
    assert job["counts"] == {"sequences": 3, "texts_done": 2, "texts_failed": 0, "llm_calls": 5}
    message = factories.queued_message(app, "llm", str(job_id))
    assert message.headers["task"] == "keyseed.jobs.run_prompts"
    assert job["stage"] == "prompts" and job["progress"] == 0.9


# -- every release on the ledger (issue 14, item 6) -------------------------------------


def _book(client: TestClient, world: factories.World, dataset_id: str) -> dict[str, Any]:
    response = client.get(f"/v1/datasets/{dataset_id}/ledger", headers=world.auditor.headers)
    assert response.status_code == 200
    return dict(response.json())


def _entries(client: TestClient, world: factories.World, dataset_id: str) -> list[dict[str, Any]]:
    return list(_book(client, world, dataset_id)["entries"])


def test_a_reservation_lists_every_planned_release_and_the_commit_charges_the_same(
    client: TestClient, world: factories.World, db: Database
) -> None:
    dataset_id = factories.dataset(client, world.owner, cap=10)
    job_id = factories.job(
        client,
        world.owner,
        dataset_id,
        mode="iterative",
        sequence_length=4,
        num_features=64,
        epsilon_kde=0.75,
        epsilon_count=0.25,
        total=4,
        max_matches_per_document=3,
        contribution_bound=0.5,
    )
    with db.transaction() as session:
        ledger.commit_spend(session, uuid.UUID(job_id), WORKER)
    reserve, commit = _entries(client, world, dataset_id)
    assert (reserve["kind"], commit["kind"]) == ("reserve", "commit")
    assert commit["events"] == reserve["events"]
    planned = {e["name"]: e for e in reserve["events"]}
    assert list(planned) == [
        "vocabulary",
        "class_counts",
        *(f"kde[label={c},blocks={b}]" for c in ("cardio", "ortho") for b in (1, 2, 4)),
    ]
    assert planned["vocabulary"] | {"dimension": 0} == {
        "mechanism": "vocabulary",
        "name": "vocabulary",
        "noise": "discrete_laplace",
        "scale": 6.0,  # S / ε_voc = 3 / 0.5
        "sensitivity": 3.0,
        "norm": "l1",
        "dimension": 0,
        "partition": None,
        "count": 1,
        "epsilon": "0.5",
    }
    assert planned["class_counts"]["scale"] == 4.0 and planned["class_counts"]["dimension"] == 2
    kde = planned["kde[label=ortho,blocks=2]"]
    assert (kde["partition"], kde["sensitivity"], kde["dimension"]) == ("ortho", 32.0, 64)
    assert kde["epsilon"] == "0.25" and kde["scale"] == 128.0  # c·I / (ε_kde / 3)


def test_the_engine_reports_what_it_released_and_the_ledger_reconciles_it(
    client: TestClient, world: factories.World, db: Database
) -> None:
    dataset_id = factories.dataset(client, world.owner, cap=10)
    job_id = factories.job(client, world.owner, dataset_id)  # independent, exact kernel
    reserve = _entries(client, world, dataset_id)[0]
    exact = [e for e in reserve["events"] if e["mechanism"] == "kde"]
    assert [(e["partition"], e["sensitivity"], e["scale"]) for e in exact] == [
        ("cardio", None, None),  # the kernel's column sums over Ṽ: known once Ṽ is
        ("ortho", None, None),
    ]
    ran = [
        {**e, "epsilon": 0.4999999999999999, "sensitivity": 1.7, "scale": 3.4}
        for e in reserve["events"]
    ]
    privacy = {"epsilon_total": 0.9999999999999998, "mechanisms": ran}
    with db.transaction() as session:
        job = jobs_repo.get(session, uuid.UUID(job_id))
        assert job is not None
        with pytest.raises(Conflict):  # nothing spent, nothing to report
            ledger.record_report(session, job, privacy, WORKER)
    with db.transaction() as session:
        runner.start_sequences(session, uuid.UUID(job_id))
    with db.transaction() as session:
        job = jobs_repo.get(session, uuid.UUID(job_id))
        assert job is not None
        first = ledger.record_report(session, job, privacy, WORKER)
        again = ledger.record_report(session, job, {"mechanisms": []}, WORKER)
        assert again.id == first.id  # one report per job
    with db.transaction() as session:
        runner.fail(session, uuid.UUID(job_id), "llm_failed", "the LLM failed")  # never released
    book = _book(client, world, dataset_id)
    assert [e["kind"] for e in book["entries"]] == ["reserve", "commit"]
    assert (book["budget"]["spent"], book["budget"]["reserved"]) == (1.0, 0.0)
    [report] = book["reports"]
    assert report["job_id"] == job_id and report["differences"] == []
    assert [e["sensitivity"] for e in report["events"]] == [1.7, 1.7, 1.7]
    assert report["epsilon"] == 0.9999999999999998
    extra = {**ran[0], "name": "vocabulary[again]"}
    costly = {**ran[1], "epsilon": 0.6}
    problems = ledger_events.reconcile(
        reserve["events"], ledger_events.reported({"mechanisms": [extra, costly, ran[2]]})
    )
    assert problems == [
        "kde[label=cardio,exact]: cost ε = 0.6, charged ε = 0.5",
        "vocabulary: planned, not reported",
        "vocabulary[again]: reported, not planned",
    ]


@pytest.mark.parametrize(
    "spec",
    [
        {},  # independent mode, exact kernel density
        {"mode": "iterative", "epsilon_count": 0.25, "total": 4, "per_class": None},
    ],
    ids=["exact", "iterative"],
)
def test_what_the_engine_runs_is_what_the_ledger_planned(
    client: TestClient,
    world: factories.World,
    worker: WorkerContext,  # noqa: F811 (the fixture imported above)
    spec: dict[str, Any],
) -> None:
    dataset_id, job_id = submit(client, world, **spec)
    assert stages.run_sequences(worker, uuid.UUID(job_id)) == "succeeded"
    book = _book(client, world, dataset_id)
    entries = {e["kind"]: e for e in book["entries"]}
    assert set(entries) == {"reserve", "commit"}
    [report] = book["reports"]
    planned, realised = entries["reserve"]["events"], report["events"]
    assert report["differences"] == ledger_events.reconcile(planned, realised) == []
    assert [e["name"] for e in realised] == [e["name"] for e in planned]
    assert all(r["sensitivity"] and r["scale"] for r in realised)  # the exact kernel's too
    for plan, ran in zip(planned, realised, strict=True):
        if plan["scale"] is not None:  # the engine's margin on float sensitivities: 1e-9
            assert ran["scale"] == pytest.approx(plan["scale"], rel=1e-8)
