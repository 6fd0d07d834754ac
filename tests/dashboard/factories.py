"""People who sign in, the sign-in dance, and a small platform with figures worth a look.

:func:`seed` drives everything through the API and the worker-side functions, as in the
service tests: datasets of two hospitals, jobs spent, reserved, released and running,
a release granted to two client organisations, and downloads.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

from fastapi import FastAPI
from fastapi.testclient import TestClient
from httpx import Response

from app.db import Database
from app.identity import service as identity
from app.jobs import runner
from tests.service import factories
from tests.service.factories import SYSTEM, World

PASSWORD = "correct horse battery staple"
_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


def person(db: Database, username: str, role: str, password: str = PASSWORD) -> uuid.UUID:
    with db.transaction() as session:
        return identity.create_user(
            session, SYSTEM, username=username, role=role, password=password
        ).id


def csrf_token(html: str) -> str:
    found = _CSRF.search(html)
    assert found is not None, "no CSRF token in the page"
    return found.group(1)


def sign_in(
    client: TestClient, username: str, password: str = PASSWORD, *, next_page: str = ""
) -> Response:
    """Fetch the sign-in form (its cookie and token) and post it; no redirect followed."""
    form = client.get("/admin/sign-in")
    assert form.status_code == 200, form.text
    return client.post(
        "/admin/sign-in",
        data={
            "username": username,
            "password": password,
            "csrf_token": csrf_token(form.text),
            "next": next_page,
        },
        follow_redirects=False,
    )


def signed_in(app: FastAPI, db: Database, username: str, role: str) -> TestClient:
    """A new browser (its own cookie jar) signed in as a new person of ``role``."""
    person(db, username, role)
    browser = TestClient(app)
    assert sign_in(browser, username).status_code == 303
    return browser


@dataclass(frozen=True)
class Seeded:
    cardiology: str  # spent 1, reserved 0.5 (a queued job), released to two clients
    orthopaedics: str  # of the other hospital: 0.05 of 1.05 left, near its cap
    oncology: str  # a job cancelled before any read: its reservation released
    discharge: str  # two jobs spent, one still running
    released_job: str
    release: str


def seed(client: TestClient, db: Database, world: World) -> Seeded:
    cardiology = factories.dataset(client, world.owner, cap=5.0, name="Cardiology notes")
    released_job = factories.job(client, world.owner, cardiology)
    factories.run_job(db, released_job)
    factories.job(client, world.owner, cardiology, epsilon_vocab=0.25, epsilon_kde=0.25)
    grantees = [str(world.client.organisation_id), str(world.other_client.organisation_id)]
    release = client.post(
        f"/v1/jobs/{released_job}/release",
        headers=world.owner.headers,
        json={"client_organisations": grantees, "name": "Cardiology synthetic v1"},
    )
    assert release.status_code == 201, release.text
    release_id = str(release.json()["id"])
    for caller, fmt in ((world.client, "csv"), (world.other_client, "jsonl")):
        download = client.get(
            f"/v1/releases/{release_id}/download?format={fmt}", headers=caller.headers
        )
        assert download.status_code == 200, download.text

    orthopaedics = factories.dataset(client, world.other_owner, cap=1.05, name="Orthopaedics 2024")
    factories.run_job(db, factories.job(client, world.other_owner, orthopaedics))

    oncology = factories.dataset(client, world.owner, cap=2.0, name="Oncology pilot")
    cancelled = factories.job(client, world.owner, oncology)
    response = client.post(f"/v1/jobs/{cancelled}/cancel", headers=world.owner.headers)
    assert response.status_code == 200, response.text

    discharge = factories.dataset(client, world.owner, cap=3.0, name="Discharge summaries")
    factories.run_job(
        db, factories.job(client, world.owner, discharge, epsilon_vocab=0.3, epsilon_kde=0.7)
    )
    running = factories.job(client, world.owner, discharge, epsilon_vocab=0.2, epsilon_kde=0.4)
    with db.transaction() as session:
        assert runner.start_sequences(session, uuid.UUID(running)) is not None
    with db.transaction() as session:
        runner.report_progress(session, uuid.UUID(running), "embed", 0.4)
    return Seeded(
        cardiology=cardiology,
        orthopaedics=orthopaedics,
        oncology=oncology,
        discharge=discharge,
        released_job=released_job,
        release=release_id,
    )
