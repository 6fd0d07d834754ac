"""The ledger's rules at the service level, and the worker-side life cycle (runner)."""

from __future__ import annotations

import uuid
from dataclasses import replace
from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import select

from app.db import Database
from app.errors import BudgetExceeded, Conflict
from app.identity.policy import Actor
from app.jobs import repository as jobs_repo
from app.jobs import runner, stages
from app.jobs.stages import WorkerContext
from app.ledger import events as ledger_events
from app.ledger import service as ledger
from app.models import Dataset, Job, LedgerEntry
from tests.service import factories
from tests.service.test_worker import cache_dir, submit, worker  # noqa: F401 (fixtures)
from workers.methods.dp_eda import DPEDAParams, plan_dp_eda
from workers.privacy.accountant import compose
from workers.privacy.events import PrivacyEvent

WORKER = Actor.system("worker")


def _budget(db: Database, dataset_id: str) -> ledger.Budget:
    with db.session() as session:
        dataset = session.get(Dataset, uuid.UUID(dataset_id))
        assert dataset is not None
        return ledger.budget(session, dataset)


@pytest.fixture
def queued(client: TestClient, world: factories.World) -> tuple[str, uuid.UUID]:
    """A job of the factory spec queued on a dataset of the owner's, its ε reserved:
    (the dataset id, the job id)."""
    dataset_id = factories.dataset(client, world.owner)
    return dataset_id, uuid.UUID(factories.job(client, world.owner, dataset_id))


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
    assert (figures.spent, figures.reserved, figures.remaining) == (2, 4, 4)
    assert figures.accountant == "exact-sum"


def test_commit_is_charged_exactly_once_and_never_released(
    db: Database, queued: tuple[str, uuid.UUID]
) -> None:
    dataset_id, job_id = queued
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
    db: Database, queued: tuple[str, uuid.UUID]
) -> None:
    _, job_id = queued
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
    client: TestClient,
    world: factories.World,
    db: Database,
    app: FastAPI,
    queued: tuple[str, uuid.UUID],
) -> None:
    dataset_id, job_id = queued
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
    assert job["counts"] == {
        "sequences": 3, "sequences_drawn": 3, "texts_done": 2, "texts_failed": 0, "llm_calls": 5
    }  # fmt: skip
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
    )
    with db.transaction() as session:
        ledger.commit_spend(session, uuid.UUID(job_id), WORKER)
    reserve, commit = _entries(client, world, dataset_id)
    assert (reserve["kind"], commit["kind"]) == ("reserve", "commit")
    assert commit["events"] == reserve["events"]
    assert (commit["epsilon"], commit["delta"]) == (reserve["epsilon"], 0.0) == (1.5, 0.0)
    assert reserve["accountant"] == commit["accountant"] == "exact-sum"
    planned = {(e["mechanism"], e["partition"]): e for e in reserve["events"]}
    assert sorted(planned, key=str) == sorted(
        [("vocabulary", None), ("class_counts", None), ("kde", "cardio"), ("kde", "ortho")],
        key=str,
    )
    vocabulary = planned["vocabulary", None]
    assert (vocabulary["noise"], vocabulary["norm"]) == ("discrete_laplace", "l1")
    assert (vocabulary["sensitivity"], Decimal(vocabulary["epsilon"])) == (3.0, Decimal("0.5"))
    assert vocabulary["scale"] == pytest.approx(6.0)  # S / ε_voc
    counts = planned["class_counts", None]
    assert (counts["sensitivity"], counts["dimension"]) == (1.0, 2)
    assert Decimal(counts["epsilon"]) == Decimal("0.25")
    kde = planned["kde", "ortho"]
    assert (kde["count"], kde["sensitivity"], kde["dimension"]) == (3, 32.0, 64)  # c·I
    assert Decimal(kde["epsilon"]) * 3 == Decimal("0.75")  # ε_kde over the ensemble [1, 2, 4]


def _report(planned: list[dict[str, Any]], sensitivity: float = 1.7) -> dict[str, Any]:
    """An engine's report of exactly the planned releases (each release on its own)."""
    events = []
    for event in planned:
        per_unit = event["scale"] / event["sensitivity"]
        one = {**event, "count": 1, "sensitivity": sensitivity, "scale": sensitivity * per_unit}
        events += [one] * event["count"]
    return {"events": events}


def test_the_engine_reports_what_it_released_and_the_ledger_reconciles_it(
    client: TestClient, world: factories.World, db: Database
) -> None:
    dataset_id = factories.dataset(client, world.owner, cap=10)
    job_id = factories.job(client, world.owner, dataset_id)  # independent, exact kernel
    reserve = _entries(client, world, dataset_id)[0]
    kde = [e for e in reserve["events"] if e["mechanism"] == "kde"]
    # the exact kernel's real sensitivity is known once Ṽ is: planned per unit of it
    assert [(e["partition"], e["sensitivity"]) for e in kde] == [("cardio", 1.0), ("ortho", 1.0)]
    assert [e["scale"] for e in kde] == pytest.approx([2.0, 2.0])  # 1 / ε_kde
    privacy = _report(reserve["events"])
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
        again = ledger.record_report(session, job, {"events": []}, WORKER)
        assert again.id == first.id  # one report per job
    with db.transaction() as session:
        runner.fail(session, uuid.UUID(job_id), "llm_failed", "the LLM failed")  # never released
    book = _book(client, world, dataset_id)
    assert [e["kind"] for e in book["entries"]] == ["reserve", "commit"]
    assert (book["budget"]["spent"], book["budget"]["reserved"]) == (1.0, 0.0)
    [report] = book["reports"]
    assert report["job_id"] == job_id and report["differences"] == []
    assert [e["sensitivity"] for e in report["events"]] == [1.7, 1.7, 1.7]
    assert (report["epsilon"], report["delta"], report["accountant"]) == (1.0, 0.0, "exact-sum")
    events = [PrivacyEvent.from_dict(e) for e in reserve["events"]]
    made = [PrivacyEvent.from_dict(e) for e in report["events"]]
    costly = replace(made[1], epsilon=Decimal("0.6"), scale=made[1].sensitivity / 0.6)
    assert ledger_events.reconcile(events, [made[0], costly]) == [
        "kde (cardio): the noise or ε differs from the plan",
        "kde (ortho): 1 releases planned, 0 made",
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
    planned = [PrivacyEvent.from_dict(e) for e in entries["reserve"]["events"]]
    realised = [PrivacyEvent.from_dict(e) for e in report["events"]]
    assert report["differences"] == ledger_events.reconcile(planned, realised) == []
    assert sum(e.count for e in realised) == sum(e.count for e in planned)
    assert report["epsilon"] <= entries["commit"]["epsilon"]


# -- composition (issue 15, item 3) ----------------------------------------------------


def _gaussian(sigma: float, partition: str | None = None) -> PrivacyEvent:
    return PrivacyEvent(
        mechanism="kde",
        noise="gaussian",
        scale=sigma,
        sensitivity=1.0,
        norm="l2",
        dimension=16,
        partition=partition,
    )


def _laplace(epsilon: str, partition: str | None = None) -> PrivacyEvent:
    return PrivacyEvent(
        mechanism="vocabulary" if partition is None else "kde",
        noise="laplace",
        scale=1 / float(epsilon),
        sensitivity=1.0,
        norm="l1",
        dimension=8,
        partition=partition,
        epsilon=epsilon,
    )


def _reserve(db: Database, dataset_id: str, events: list[PrivacyEvent]) -> dict[str, Any]:
    """Reserve a job of ``events`` on the dataset through the ledger; the problem body
    when it is refused."""
    with db.session() as session:
        dataset = session.get(Dataset, uuid.UUID(dataset_id))
        assert dataset is not None
        job = Job(
            id=uuid.uuid4(),
            dataset_id=dataset.id,
            organisation_id=dataset.organisation_id,
            submitted_by="system:tests",
            spec={},
            epsilon=0.0,
            epsilon_by_mechanism={},
            task_ids=[],
        )
    try:
        with db.transaction() as session:
            entry = ledger.reserve(session, job, WORKER, events)
            return {"epsilon": float(entry.epsilon), "delta": float(entry.delta)}
    except BudgetExceeded as exc:
        return {"refused": exc.detail, **exc.extra}


def _capped(client: TestClient, world: factories.World, epsilon: float, delta: str) -> str:
    return factories.dataset(client, world.owner, cap=epsilon, delta_cap=delta)


def test_gaussian_jobs_compose_under_the_cap_tighter_than_their_sum(
    client: TestClient, world: factories.World, db: Database
) -> None:
    """Each job: 10 Gaussian releases of σ = 20 (ε ≈ 0.8 at δ = 1e-6 alone). The cap
    (ε = 2, δ = 1e-6) takes as many jobs as the accountant's composition of all of them
    allows, more than ⌊2 / 0.8⌋ = 2 by summing, and never one over."""
    dataset_id = _capped(client, world, 2.0, "1e-6")
    job = [_gaussian(20.0)] * 10
    delta = Decimal("1e-6")
    alone = compose(job).epsilon(delta)
    accepted = 0
    while "refused" not in (outcome := _reserve(db, dataset_id, job)):
        accepted += 1
        assert outcome["delta"] == 1e-6 and outcome["epsilon"] == pytest.approx(float(alone))
    assert (
        compose(job * accepted).epsilon(delta) <= 2 < compose(job * (accepted + 1)).epsilon(delta)
    )
    assert accepted > int(Decimal(2) / alone)
    figures = _budget(db, dataset_id)
    assert figures.accountant.startswith("pld(dp-accounting")
    assert figures.reserved + figures.remaining == 2 and figures.remaining >= 0
    assert outcome["requested"] == {
        "epsilon": float(ledger.amounts.epsilon(alone, charge=True)),
        "delta": 1e-6,
    }
    assert outcome["remaining"] == {"epsilon": float(figures.remaining), "delta": 1e-6}
    assert outcome["accountant"] == figures.accountant
    assert "at δ = 1e-06" in outcome["refused"]


def test_gaussian_releases_need_a_delta_and_pure_ones_are_summed_exactly(
    client: TestClient, world: factories.World, db: Database
) -> None:
    pure_only = _capped(client, world, 1.0, "0")
    refused = _reserve(db, pure_only, [_gaussian(50.0)])
    assert "no finite ε at the dataset's δ = 0" in refused["refused"]
    assert refused["requested"] == {"epsilon": None, "delta": 0.0}
    for _ in range(10):  # ten jobs of 0.1: exactly the cap
        assert _reserve(db, pure_only, [_laplace("0.05"), _laplace("0.05", "a")]) == {
            "epsilon": 0.1,
            "delta": 0.0,
        }
    assert "refused" in _reserve(db, pure_only, [_laplace("0.001")])
    figures = _budget(db, pure_only)
    assert (figures.reserved, figures.remaining, figures.accountant) == (1, 0, "exact-sum")


def test_a_dp_eda_job_is_charged_its_domain_restrictions_delta(
    client: TestClient, world: factories.World, db: Database
) -> None:
    """DP-EDA's LimitedDomain calls spend δ_LD outright: the job's planned events fit a
    cap of the job's own (ε, δ), and are refused by a cap whose δ is below T·δ_LD —
    which would take them were δ_LD left out (their Gumbel part is pure)."""
    p = DPEDAParams(document_type="note", epsilon=2.0, delta=5e-7, iterations=4, domain=10,
                    parents=3, initial_population=20, offspring=20)  # fmt: skip
    events = plan_dp_eda(p, ["a", "b"])
    fits = _capped(client, world, 2.0, "5e-7")
    charged = _reserve(db, fits, events)
    assert charged["delta"] == 5e-7 and 1.99 < charged["epsilon"] <= 2.0
    figures = _budget(db, fits)
    assert figures.accountant == "exact-sum" and 0 <= figures.remaining < Decimal("0.01")
    assert ledger.composed(events, Decimal("5e-7")).delta == Decimal("5e-7")  # not 0
    tight = _capped(client, world, 2.0, "2e-7")  # T·δ_LD = 2.5e-7
    refused = _reserve(db, tight, events)
    assert "no finite ε at the dataset's δ = 2e-07" in refused["refused"]
    assert "spend δ = 2.5e-07 outright" in refused["refused"]
    assert refused["requested"] == {"epsilon": None, "delta": 2e-7}
    without = [replace(e, delta=None) for e in events]
    assert ledger.composed(without, Decimal("2e-7")).epsilon <= 2
    # and a run that recorded its selections without δ_LD does not reconcile
    assert ledger_events.reconcile(events, without) == [
        f"dp-eda-limited-domain ({c}): the δ spent differs from the plan" for c in "ab"
    ]


def test_per_class_releases_compose_in_parallel_across_jobs(
    client: TestClient, world: factories.World, db: Database
) -> None:
    dataset_id = _capped(client, world, 1.0, "0")
    for label in ("a", "b", "c", "d"):  # four jobs on disjoint classes: the worst class
        assert _reserve(db, dataset_id, [_laplace("0.5", label)])["epsilon"] == 0.5
    assert _budget(db, dataset_id).reserved == Decimal("0.5")
    assert _reserve(db, dataset_id, [_laplace("0.5", "a")])["epsilon"] == 0.5
    assert "refused" in _reserve(db, dataset_id, [_laplace("0.5", "a")])


def test_a_cap_holds_what_is_spent_composed_at_its_new_delta(
    client: TestClient, world: factories.World, db: Database
) -> None:
    dataset_id = _capped(client, world, 3.0, "1e-5")
    _reserve(db, dataset_id, [_gaussian(3.0)] * 4)  # ε ≈ 2.75 at δ = 1e-5
    path = f"/v1/datasets/{dataset_id}"
    held = compose([_gaussian(3.0)] * 4)
    too_tight = {"epsilon_cap": 3.0, "delta_cap": 1e-9, "reason": "tighter δ"}
    assert held.epsilon(Decimal("1e-9")) > 3
    refused = client.patch(path, json=too_tight, headers=world.admin.headers)
    assert refused.status_code == 409, refused.text
    assert "at δ = 1e-09" in refused.json()["detail"]
    loose = {"epsilon_cap": 3.5, "delta_cap": 1e-6, "reason": "a δ the board accepts"}
    changed = client.patch(path, json=loose, headers=world.admin.headers)
    assert changed.status_code == 200, changed.text
    budget = changed.json()["budget"]
    assert budget["delta_cap"] == 1e-6
    assert budget["reserved"] == float(
        ledger.amounts.epsilon(held.epsilon(Decimal("1e-6")), charge=True)
    )
    events = client.get(
        f"/v1/audit/events?kind=dataset.cap_changed&target_id={dataset_id}",
        headers=world.auditor.headers,
    ).json()["events"]
    assert events[0]["details"] | {"reason": ""} == {
        "previous": 3.0,
        "epsilon_cap": 3.5,
        "previous_delta": 1e-5,
        "delta_cap": 1e-6,
        "reason": "",
    }


def test_the_organisation_figure_composes_every_dataset_sequentially(
    client: TestClient, world: factories.World, db: Database
) -> None:
    first = _capped(client, world, 2.0, "0")
    second = _capped(client, world, 2.0, "0")
    _reserve(db, first, [_laplace("0.5", "a")])
    _reserve(db, second, [_laplace("0.5", "b")])  # another dataset: the same patients, maybe
    figures = client.get(
        f"/v1/organisations/{world.owner.organisation_id}/budget", headers=world.admin.headers
    ).json()
    assert (figures["spent"], figures["reserved"], figures["accountant"]) == (0.0, 1.0, "exact-sum")


def test_a_gaussian_job_is_charged_at_the_caps_delta_and_says_by_which_accountant(
    client: TestClient, world: factories.World
) -> None:
    spec = {k: v for k, v in factories.spec().items() if not k.startswith("epsilon_")}
    spec |= {"epsilon": 0.5, "delta": 1e-7, "noise": "gaussian"}
    pure_only = _capped(client, world, 5.0, "0")
    refused = client.post(f"/v1/datasets/{pure_only}/jobs", headers=world.owner.headers, json=spec)
    assert refused.status_code == 409
    assert "no finite ε at the dataset's δ = 0" in refused.json()["detail"]
    dataset_id = _capped(client, world, 5.0, "1e-6")
    response = client.post(
        f"/v1/datasets/{dataset_id}/jobs", headers=world.owner.headers, json=spec
    )
    assert response.status_code == 202, response.text
    job = response.json()["epsilon"]
    assert job["requested"] == pytest.approx(0.5, abs=1e-6)  # the job's own (ε, δ)
    charged = job["charged"]
    assert charged["delta"] == 1e-6 and charged["accountant"].startswith("pld(dp-accounting")
    assert charged["epsilon"] < 0.5  # at the cap's larger δ, the same releases cost less
    book = _book(client, world, dataset_id)
    [entry] = book["entries"]
    assert (entry["epsilon"], entry["delta"], entry["accountant"]) == (
        charged["epsilon"],
        charged["delta"],
        charged["accountant"],
    )
    assert {e["noise"] for e in entry["events"]} == {"gaussian"}
    assert all(e["epsilon"] is None and e["norm"] == "l2" for e in entry["events"])
    assert book["budget"]["reserved"] == charged["epsilon"]
    assert book["budget"]["accountant"] == charged["accountant"]
