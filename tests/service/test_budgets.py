"""Organisation budgets (issue 14, item 9): set by admins, caps carved out of them, so
that neither an owner's own choice of cap nor a re-upload of the same corpus yields a
fresh budget."""

from __future__ import annotations

import json
import threading
import uuid
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.script import ScriptDirectory
from fastapi.testclient import TestClient
from sqlalchemy import func, select

import migrations
from app.db import Database
from app.errors import BudgetExceeded, Forbidden
from app.identity.policy import Principal
from app.jobs import runner
from app.ledger import service as ledger
from app.models import Dataset, Organisation
from app.releases import service as releases
from tests.service import factories
from tests.service.test_migrations import scratch_postgres  # noqa: F401 (a fixture)
from workers.privacy.accountant import compose
from workers.privacy.events import PrivacyEvent


def _hospital(db: Database, epsilon: str = "10", name: str = "Small Hospital") -> factories.Caller:
    """An owner organisation with a budget of ε = ``epsilon`` (δ = 0) and its key."""
    organisation = factories.organisation(
        db, name, "owner", epsilon_budget=Decimal(epsilon), delta_budget=Decimal(0)
    )
    return factories.api_key(db, "owner", organisation)


def _budget(client: TestClient, caller: factories.Caller, organisation: uuid.UUID) -> Any:
    response = client.get(f"/v1/organisations/{organisation}/budget", headers=caller.headers)
    assert response.status_code == 200, response.text
    return response.json()


def _datasets(db: Database) -> int:
    with db.session() as session:
        return int(session.scalar(select(func.count()).select_from(Dataset)) or 0)


def test_a_new_owner_organisation_gets_the_default_budget_or_the_admins_figure(
    client: TestClient, world: factories.World
) -> None:
    made = client.post(
        "/v1/organisations", json={"name": "Clinic", "kind": "owner"}, headers=world.admin.headers
    ).json()
    assert (made["epsilon_budget"], made["delta_budget"]) == (10.0, 1e-6)  # the settings
    chosen = client.post(
        "/v1/organisations",
        json={"name": "Clinic 2", "kind": "owner", "epsilon_budget": 2.5, "delta_budget": 0},
        headers=world.admin.headers,
    ).json()
    assert (chosen["epsilon_budget"], chosen["delta_budget"]) == (2.5, 0.0)
    lab = client.post(
        "/v1/organisations",
        json={"name": "Lab", "kind": "client", "epsilon_budget": 5},
        headers=world.admin.headers,
    ).json()
    assert lab["epsilon_budget"] == 0.0  # a client holds no budget
    refused = client.post(
        "/v1/organisations",
        json={"name": "Clinic 3", "kind": "owner", "epsilon_budget": True},
        headers=world.admin.headers,
    )
    assert refused.status_code == 422 and refused.json()["field"] == "epsilon_budget"
    created = client.get(
        f"/v1/audit/events?kind=organisation.created&target_id={made['id']}",
        headers=world.auditor.headers,
    ).json()["events"]
    assert created[0]["details"]["budget"] == {"epsilon": 10.0, "delta": 1e-6}


def test_dataset_caps_are_carved_out_of_the_organisation_budget(
    client: TestClient, world: factories.World, db: Database
) -> None:
    owner = _hospital(db, "10")
    first = factories.dataset(client, owner, cap=6)
    before = _datasets(db)
    # The same corpus again: its cap comes out of what is left, not a fresh budget.
    again = factories.upload(client, owner, cap=5)
    assert again.status_code == 409, again.text
    problem = again.json()
    assert problem["title"] == "Privacy budget exceeded"
    assert problem["requested"] == {"epsilon": 5.0, "delta": 0.0}
    assert problem["remaining"] == {"epsilon": 4.0, "delta": 0.0}
    assert problem["organisation_budget"] == {"epsilon": 10.0, "delta": 0.0}
    assert "has ε = 4, δ = 0 left" in problem["detail"]
    assert _datasets(db) == before  # nothing stored
    assert factories.upload(client, owner, cap=4).status_code == 201  # exactly what is left
    figures = _budget(client, owner, owner.organisation_id)
    assert figures["allocated"] == {"epsilon": 10.0, "delta": 0.0}
    assert figures["remaining"] == {"epsilon": 0.0, "delta": 0.0}
    assert figures["datasets"] == 2
    # Another organisation's budget is its own.
    assert factories.upload(client, world.other_owner, cap=1000).status_code == 201
    assert factories.upload(client, owner, cap=0.001).status_code == 409
    assert client.get(f"/v1/datasets/{first}", headers=owner.headers).is_success


def test_caps_that_add_up_exactly_fit_and_delta_is_carved_as_well(
    client: TestClient, db: Database
) -> None:
    organisation = factories.organisation(
        db, "Delta Hospital", "owner", epsilon_budget=Decimal(1), delta_budget=Decimal(0)
    )
    with db.transaction() as session:
        found = session.get(Organisation, organisation)
        assert found is not None
        found.delta_budget = Decimal("1e-6")
    owner = factories.api_key(db, "owner", organisation)
    for _ in range(10):  # 0.1 ten times is exactly 1 (no float drift)
        assert factories.upload(client, owner, cap=0.1).status_code == 201
    with db.transaction() as session:
        found = session.get(Organisation, organisation)
        assert found is not None
        found.epsilon_budget = Decimal(2)
    too_much_delta = factories.upload(client, owner, cap=0.5, delta_cap="2e-6")
    assert too_much_delta.status_code == 409
    assert too_much_delta.json()["remaining"] == {"epsilon": 1.0, "delta": 1e-6}
    fits = factories.upload(client, owner, cap=0.5, delta_cap="1e-6")
    assert fits.status_code == 201 and fits.json()["budget"]["delta_cap"] == 1e-6
    refused = factories.upload(client, owner, cap=0.1, delta_cap="1e-9")
    assert refused.status_code == 409


def test_a_deleted_dataset_keeps_what_it_spent_and_returns_the_rest(
    client: TestClient, db: Database
) -> None:
    owner = _hospital(db, "10")
    dataset_id = factories.dataset(client, owner, cap=6)
    job_id = factories.job(client, owner, dataset_id, epsilon_vocab=1.0, epsilon_kde=1.5)
    with db.transaction() as session:
        assert runner.start_sequences(session, uuid.UUID(job_id)) is not None  # spends 2.5
    assert factories.upload(client, owner, cap=5).status_code == 409
    assert client.delete(f"/v1/datasets/{dataset_id}", headers=owner.headers).is_success
    figures = _budget(client, owner, owner.organisation_id)
    assert figures["allocated"] == {"epsilon": 2.5, "delta": 0.0}
    assert figures["spent"] == 2.5
    # Re-uploading the deleted corpus: what it spent stays spent.
    assert factories.upload(client, owner, cap=7.6).status_code == 409
    assert factories.upload(client, owner, cap=7.5).status_code == 201


def test_raising_a_cap_beyond_the_budget_needs_the_admin_to_raise_the_budget_with_a_reason(
    client: TestClient, world: factories.World, db: Database
) -> None:
    owner = _hospital(db, "10")
    dataset_id = factories.dataset(client, owner, cap=4)
    factories.dataset(client, owner, cap=5)
    path = f"/v1/datasets/{dataset_id}"
    beyond = client.patch(
        path, json={"epsilon_cap": 6, "reason": "board decision 17"}, headers=world.admin.headers
    )
    assert beyond.status_code == 409
    assert beyond.json()["remaining"] == {"epsilon": 5.0, "delta": 0.0}
    assert client.patch(
        path, json={"epsilon_cap": 5, "reason": "board decision 17"}, headers=world.admin.headers
    ).is_success
    budget_path = f"/v1/organisations/{owner.organisation_id}/budget"
    change = {"epsilon": 12, "delta": 1e-6, "reason": "privacy board 2026-11: second study"}
    for name in ("owner", "auditor", "client"):
        caller = getattr(world, name)
        assert client.patch(budget_path, json=change, headers=caller.headers).status_code == 403
    assert client.patch(budget_path, json=change, headers=owner.headers).status_code == 403
    no_reason = {"epsilon": 12, "delta": 1e-6}
    assert client.patch(budget_path, json=no_reason, headers=world.admin.headers).status_code == 422
    below = client.patch(budget_path, json={**change, "epsilon": 9.5}, headers=world.admin.headers)
    assert below.status_code == 409 and below.json()["allocated"]["epsilon"] == 10.0
    raised = client.patch(budget_path, json=change, headers=world.admin.headers)
    assert raised.status_code == 200, raised.text
    assert raised.json()["budget"] == {"epsilon": 12.0, "delta": 1e-6}
    assert raised.json()["remaining"] == {"epsilon": 2.0, "delta": 1e-6}
    assert client.patch(
        path, json={"epsilon_cap": 7, "reason": "board decision 18"}, headers=world.admin.headers
    ).is_success
    events = client.get(
        f"/v1/audit/events?kind=organisation.budget_changed&target_id={owner.organisation_id}",
        headers=world.auditor.headers,
    ).json()["events"]
    assert [e["details"] for e in events] == [
        {
            "previous": {"epsilon": 10.0, "delta": 0.0},
            "budget": {"epsilon": 12.0, "delta": 1e-6},
            "reason": "privacy board 2026-11: second study",
        }
    ]
    assert events[0]["actor_organisation_id"] == str(world.admin.organisation_id)


def test_who_reads_and_sets_an_organisation_budget(
    client: TestClient, world: factories.World
) -> None:
    mine = f"/v1/organisations/{world.owner.organisation_id}/budget"
    for name in ("owner", "admin", "auditor"):
        assert client.get(mine, headers=getattr(world, name).headers).status_code == 200
    assert client.get(mine, headers=world.other_owner.headers).status_code == 404
    assert client.get(mine, headers=world.client.headers).status_code == 403
    assert client.get(mine).status_code == 401
    unknown = f"/v1/organisations/{uuid.uuid4()}/budget"
    assert client.get(unknown, headers=world.admin.headers).status_code == 404
    change = {"epsilon": 3, "delta": 0, "reason": "a client holds no budget"}
    lab = f"/v1/organisations/{world.client.organisation_id}/budget"
    assert client.patch(lab, json=change, headers=world.admin.headers).status_code == 409
    assert client.patch(unknown, json=change, headers=world.admin.headers).status_code == 404
    for bad in ({**change, "epsilon": 0}, {**change, "delta": 1}, {**change, "epsilon": "inf"}):
        assert client.patch(mine, json=bad, headers=world.admin.headers).status_code == 422


def test_concurrent_uploads_cannot_both_take_the_same_rest(
    client: TestClient, db: Database
) -> None:
    """Two transactions carve 6 out of 10 at once: the organisation row lock makes the
    second wait for the first, then see its dataset and refuse."""
    owner = _hospital(db, "10")
    organisation = owner.organisation_id
    holding, outcome = threading.Event(), list[object]()

    def second() -> None:
        holding.wait(timeout=30)
        try:
            with db.transaction() as session:
                ledger.carve(session, organisation, ledger.Amount.granted(6, 0))
            outcome.append("carved")
        except BudgetExceeded as exc:
            outcome.append(exc.extra["remaining"])

    thread = threading.Thread(target=second)
    thread.start()
    with db.transaction() as session:
        ledger.carve(session, organisation, ledger.Amount.granted(6, 0))
        holding.set()
        thread.join(timeout=1.0)
        assert thread.is_alive(), "the second carve did not wait for the first"
        session.add(
            Dataset(
                organisation_id=organisation,
                name="notes",
                format="csv",
                text_columns=["text"],
                label_column="label",
                labels=["a"],
                epsilon_cap=6.0,
                created_by="system:test",
            )
        )
    thread.join(timeout=30)
    assert outcome == [{"epsilon": 4.0, "delta": 0.0}]


@pytest.mark.parametrize("role", ["admin", "auditor"])
def test_released_corpora_are_not_downloadable_with_platform_keys(
    client: TestClient, world: factories.World, db: Database, role: str
) -> None:
    dataset_id = factories.dataset(client, world.owner)
    job_id = factories.job(client, world.owner, dataset_id)
    factories.run_job(db, job_id)
    release = factories.release(client, world, job_id)
    caller = getattr(world, role)
    response = client.get(f"/v1/releases/{release['id']}/download", headers=caller.headers)
    assert response.status_code == 403
    assert response.headers["content-type"] == "application/problem+json"
    # The download check itself refuses platform callers, whatever the role rules say.
    with db.session() as session:
        found, grantees = releases.get_release(
            session, _principal(caller), uuid.UUID(release["id"])
        )
        with pytest.raises(Forbidden):
            releases.ensure_downloadable(_principal(caller), found, grantees)
        releases.ensure_downloadable(_principal(world.client), found, grantees)


def _principal(caller: factories.Caller) -> Principal:
    return Principal("key", uuid.uuid4(), caller.role, caller.organisation_id)


# -- the migration ----------------------------------------------------------------------


def _typed(value: object) -> sa.types.TypeEngine[Any]:
    if isinstance(value, uuid.UUID):
        return sa.Uuid()
    if isinstance(value, (dict, list)):
        return sa.JSON()
    if isinstance(value, datetime):
        return sa.DateTime(timezone=True)
    return sa.types.NullType()


def _insert(connection: sa.Connection, name: str, rows: list[dict[str, Any]]) -> None:
    """Rows written as the old revision's schema had them, without today's models."""
    table = sa.table(name, *(sa.column(k, _typed(v)) for k, v in rows[0].items()))
    connection.execute(sa.insert(table), rows)


def _before_budgets() -> str:
    """The revision 0005 follows (whatever the chain is once branches are merged)."""
    script = ScriptDirectory.from_config(migrations.alembic_config("sqlite://"))
    previous = script.get_revision("0005").down_revision
    assert isinstance(previous, str)
    return previous


def _old_rows(connection: sa.Connection) -> None:
    """Two owners (one with datasets, one without), a client, and a reserved job."""
    now = datetime.now(UTC)
    busy, idle, lab = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    _insert(
        connection,
        "organisations",
        [
            {"id": i, "name": n, "kind": k, "created_at": now}
            for i, n, k in (
                (busy, "Busy", "owner"),
                (idle, "Idle", "owner"),
                (lab, "Lab", "client"),
            )
        ],
    )
    datasets = [uuid.uuid4(), uuid.uuid4()]
    _insert(
        connection,
        "datasets",
        [
            {
                "id": dataset_id,
                "organisation_id": busy,
                "name": f"notes {cap}",
                "format": "csv",
                "label_column": "label",
                "created_by": "system:test",
                "text_columns": ["text"],
                "labels": ["a"],
                "epsilon_cap": cap,
                "delta_cap": delta,
                "documents": 1,
                "skipped_empty": 0,
                "skipped_duplicate": 0,
                "upload_bytes": 10,
                "created_at": now,
            }
            for dataset_id, (cap, delta) in zip(datasets, ((30.5, 1e-7), (0.1, 2e-6)), strict=True)
        ],
    )
    job = uuid.uuid4()
    by_mechanism = {"vocabulary": 0.1, "kde": 0.2}
    _insert(
        connection,
        "jobs",
        [
            {
                "id": job,
                "dataset_id": datasets[1],
                "organisation_id": busy,
                "submitted_by": "system:test",
                "spec": {"vocabulary": "medical"},
                "state": "queued",
                "progress": 0.0,
                "cancel_requested": False,
                "epsilon": 0.3,
                "epsilon_by_mechanism": by_mechanism,
                "sequences_total": 0,
                "texts_done": 0,
                "texts_failed": 0,
                "llm_calls": 0,
                "task_ids": [],
                "created_at": now,
                "updated_at": now,
            }
        ],
    )
    _insert(
        connection,
        "ledger_entries",
        [
            {
                "dataset_id": datasets[1],
                "job_id": job,
                "kind": "reserve",
                "epsilon": 0.3,
                "delta": 0.0,
                "epsilon_by_mechanism": by_mechanism,
                "accountant": "basic composition",
                "actor": "system:test",
                "created_at": now,
            }
        ],
    )


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
def test_the_migration_gives_owners_budgets_entries_events_and_keeps_every_row(
    backend: str,
    scratch_postgres: str,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
) -> None:
    url = scratch_postgres if backend == "postgres" else f"sqlite:///{tmp_path / 'k.sqlite3'}"
    migrations.upgrade(url, _before_budgets())
    engine = sa.create_engine(url)
    try:
        with engine.begin() as connection:
            _old_rows(connection)
        migrations.upgrade(url, "0005")
        with engine.begin() as connection:
            budgets = connection.execute(
                sa.text("SELECT name, epsilon_budget, delta_budget FROM organisations")
            )
            assert {name: (e, d) for name, e, d in budgets} == {
                "Busy": (30_600_000_000_000, 2_100_000_000_000),  # the caps' exact sums
                "Idle": (10_000_000_000_000, 1_000_000_000_000),  # ε = 10, δ = 1e-6
                "Lab": (0, 0),
            }
            caps = connection.execute(sa.text("SELECT epsilon_cap, delta_cap FROM datasets"))
            assert sorted(tuple(r) for r in caps) == [  # exact: integers of 1e-12 and 1e-18
                (100_000_000_000, 2_000_000_000_000),
                (30_500_000_000_000, 100_000_000_000),
            ]
            entry = connection.execute(
                sa.text(
                    "SELECT job_id, dataset_id, kind, epsilon, delta, events FROM ledger_entries"
                )
            ).one()
            assert (entry.epsilon, entry.delta) == (300_000_000_000, 0)
            events = entry.events if isinstance(entry.events, list) else json.loads(entry.events)
            legacy = [PrivacyEvent.from_dict(e) for e in events]  # the accountant's events
            assert [(e.mechanism, e.noise, e.epsilon, e.partition) for e in legacy] == [
                ("vocabulary", "discrete_laplace", Decimal("0.1"), None),
                ("kde", "laplace", Decimal("0.2"), None),
            ]
            assert compose(legacy).epsilon(0) == Decimal("0.3")
            with pytest.raises(sa.exc.DBAPIError, match="append-only"), connection.begin_nested():
                connection.execute(sa.text("UPDATE ledger_entries SET actor = 'x'"))
            _insert(
                connection,
                "ledger_entries",
                [
                    {
                        "dataset_id": entry.dataset_id,
                        "job_id": entry.job_id,
                        "kind": kind,
                        "epsilon": 300_000_000_000,
                        "delta": 0,
                        "epsilon_by_mechanism": {},
                        "events": [],
                        "accountant": "basic composition",
                        "actor": "system:worker",
                        "created_at": datetime.now(UTC),
                    }
                    for kind in ("commit",)
                ],
            )
            _insert(
                connection,
                "ledger_reports",
                [
                    {
                        "dataset_id": entry.dataset_id,
                        "job_id": entry.job_id,
                        "epsilon": 300_000_000_000,
                        "delta": 0,
                        "events": events,
                        "accountant": "basic composition",
                        "actor": "system:worker",
                        "created_at": datetime.now(UTC),
                    }
                ],
            )
            with pytest.raises(sa.exc.DBAPIError, match="append-only"), connection.begin_nested():
                connection.execute(sa.text("DELETE FROM ledger_reports"))
        migrations.downgrade(url, _before_budgets())
        with engine.connect() as connection:
            names = connection.execute(sa.text("SELECT name FROM organisations")).scalars()
            caps = connection.execute(sa.text("SELECT epsilon_cap FROM datasets")).scalars()
            assert sorted(names) == ["Busy", "Idle", "Lab"] and sorted(caps) == [0.1, 30.5]
            kinds = connection.execute(
                sa.text("SELECT kind, epsilon, delta FROM ledger_entries ORDER BY id")
            )
            assert [tuple(r) for r in kinds] == [("reserve", 0.3, 0.0), ("commit", 0.3, 0.0)]
            floats = connection.execute(sa.text("SELECT delta_cap FROM datasets")).scalars()
            assert sorted(floats) == [1e-7, 2e-6]
            inspector = sa.inspect(connection)
            assert "ledger_reports" not in inspector.get_table_names()
            assert "epsilon_budget" not in {
                c["name"] for c in inspector.get_columns("organisations")
            }
            assert "events" not in {c["name"] for c in inspector.get_columns("ledger_entries")}
        with pytest.raises(sa.exc.DBAPIError, match="append-only"), engine.begin() as c:
            c.execute(sa.text("DELETE FROM ledger_entries"))
        migrations.upgrade(url)
    finally:
        engine.dispose()
