"""The ledger's rules at the service level, and the worker-side life cycle (runner)."""

from __future__ import annotations

import uuid

import pytest
import sqlalchemy as sa
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import select

from app.db import Database
from app.errors import Conflict
from app.identity.policy import Actor
from app.jobs import runner
from app.ledger import service as ledger
from app.models import Dataset, LedgerEntry
from tests.service import factories

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
