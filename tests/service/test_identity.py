"""Organisations, API keys, authentication and the admin command line."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from app.db import Database
from app.models import ApiKey, User
from tests.service import factories
from tests.service.conftest import DATA_KEY

REPO = Path(__file__).resolve().parents[2]


def test_missing_malformed_unknown_and_revoked_keys_are_401(
    client: TestClient, world: factories.World
) -> None:
    missing = client.get("/v1/datasets")
    assert missing.status_code == 401
    assert missing.headers["WWW-Authenticate"] == "Bearer"
    assert missing.headers["content-type"] == "application/problem+json"
    for token in ("nonsense", "ks_abc", f"ks_{'0' * 12}_secret", world.owner.key + "x"):
        response = client.get("/v1/datasets", headers=factories.auth(token))
        assert response.status_code == 401, token
        assert 'error="invalid_token"' in response.headers["WWW-Authenticate"]
    basic = client.get("/v1/datasets", headers={"Authorization": "Basic dXNlcjpwYXNz"})
    assert basic.status_code == 401

    keys = client.get("/v1/keys", headers=world.admin.headers).json()
    owner_key = next(k for k in keys if k["organisation_id"] == str(world.owner.organisation_id))
    revoked = client.post(f"/v1/keys/{owner_key['id']}/revoke", headers=world.admin.headers)
    assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
    after = client.get("/v1/datasets", headers=world.owner.headers)
    assert after.status_code == 401
    assert after.json()["detail"] == "the API key was revoked"


def test_admin_creates_organisations_others_may_not(
    client: TestClient, world: factories.World
) -> None:
    body = {"name": "New Clinic", "kind": "owner"}
    created = client.post("/v1/organisations", json=body, headers=world.admin.headers)
    assert created.status_code == 201
    assert created.json()["kind"] == "owner"
    again = client.post("/v1/organisations", json=body, headers=world.admin.headers)
    assert again.status_code == 409
    for name in ("auditor", "owner", "client"):
        caller = getattr(world, name)
        response = client.post("/v1/organisations", json=body, headers=caller.headers)
        assert response.status_code == 403, name
    bad = client.post(
        "/v1/organisations", json={"name": "X", "kind": "platform"}, headers=world.admin.headers
    )
    assert bad.status_code == 422


def test_organisations_are_listed_for_platform_roles_only(
    client: TestClient, world: factories.World
) -> None:
    for name in ("admin", "auditor"):
        response = client.get("/v1/organisations", headers=getattr(world, name).headers)
        assert response.status_code == 200
        assert {o["kind"] for o in response.json()} == {"platform", "owner", "client"}
    clients = client.get("/v1/organisations?kind=client", headers=world.admin.headers).json()
    assert {o["name"] for o in clients} == {"Research Lab", "Vendor Inc"}
    for name in ("owner", "client"):
        assert (
            client.get("/v1/organisations", headers=getattr(world, name).headers).status_code == 403
        )


def test_keys_are_random_shown_once_and_stored_hashed(
    client: TestClient, world: factories.World, db: Database
) -> None:
    body = {"role": "owner", "organisation_id": str(world.owner.organisation_id), "name": "ci"}
    first = client.post("/v1/keys", json=body, headers=world.admin.headers)
    second = client.post("/v1/keys", json=body, headers=world.admin.headers)
    assert first.status_code == second.status_code == 201
    key = first.json()["key"]
    assert key.startswith(f"ks_{first.json()['prefix']}_") and key != second.json()["key"]
    assert client.get("/v1/datasets", headers=factories.auth(key)).status_code == 200
    listed = client.get("/v1/keys", headers=world.admin.headers).json()
    assert all("key" not in k for k in listed)
    with db.session() as session:
        stored = session.scalars(select(ApiKey.secret_hash)).all()
    assert key not in stored and all(len(h) == 64 for h in stored)


@pytest.mark.parametrize(
    ("role", "organisation"),
    [("owner", "client"), ("client", "owner"), ("admin", "owner"), ("owner", None)],
)
def test_a_key_role_must_fit_its_organisation(
    client: TestClient, world: factories.World, role: str, organisation: str | None
) -> None:
    org = getattr(world, organisation).organisation_id if organisation else None
    body = {"role": role, "organisation_id": str(org) if org else None}
    response = client.post("/v1/keys", json=body, headers=world.admin.headers)
    assert response.status_code == 422
    assert response.json()["field"] in ("role", "organisation_id")


def test_only_admins_create_and_revoke_keys(client: TestClient, world: factories.World) -> None:
    body = {"role": "auditor"}
    for name in ("auditor", "owner", "client"):
        caller = getattr(world, name)
        assert client.post("/v1/keys", json=body, headers=caller.headers).status_code == 403
        missing = f"/v1/keys/{uuid.uuid4()}/revoke"
        assert client.post(missing, headers=caller.headers).status_code == 403
    unknown = client.post(f"/v1/keys/{uuid.uuid4()}/revoke", headers=world.admin.headers)
    assert unknown.status_code == 404


def test_key_listing_is_scoped_to_the_organisation(
    client: TestClient, world: factories.World
) -> None:
    everyone = client.get("/v1/keys", headers=world.auditor.headers).json()
    assert len(everyone) == 6
    for name in ("owner", "client"):
        caller = getattr(world, name)
        own = client.get(
            f"/v1/keys?organisation_id={world.other_owner.organisation_id}",
            headers=caller.headers,
        ).json()
        assert {k["organisation_id"] for k in own} == {str(caller.organisation_id)}


def test_key_events_are_audited(client: TestClient, world: factories.World) -> None:
    created = client.post("/v1/keys", json={"role": "auditor"}, headers=world.admin.headers)
    client.post(f"/v1/keys/{created.json()['id']}/revoke", headers=world.admin.headers)
    events = client.get(
        "/v1/audit/events?kind=key.created&kind=key.revoked", headers=world.auditor.headers
    ).json()["events"]
    assert [e["kind"] for e in events][:2] == ["key.revoked", "key.created"]
    assert events[0]["actor"] == f"key:{_key_id(client, world)}"
    assert events[0]["target_id"] == created.json()["id"]
    assert created.json()["key"] not in str(events)


def _key_id(client: TestClient, world: factories.World) -> str:
    keys = client.get("/v1/keys", headers=world.admin.headers).json()
    return str(next(k["id"] for k in keys if k["role"] == "admin"))


def _cli(database_url: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "DATABASE_URL": database_url, "KEYSEED_DATA_KEY": DATA_KEY, **env}
    environment.pop("KEYSEED_DATABASE_URL", None)
    return factories.keyseed("admin", *args, env=environment)


def test_admin_command_line(client: TestClient, database_url: str, db: Database) -> None:
    boot = _cli(database_url, "bootstrap")
    assert boot.returncode == 0, boot.stderr
    admin_key = boot.stdout.strip().splitlines()[-1]
    admin = factories.auth(admin_key)
    assert client.get("/v1/organisations", headers=admin).status_code == 200

    refused = _cli(database_url, "bootstrap")
    assert refused.returncode == 1 and "exists already" in refused.stderr
    assert _cli(database_url, "bootstrap", "--force").returncode == 0

    org = _cli(database_url, "create-org", "Clinic A", "--kind", "owner")
    org_id = uuid.UUID(org.stdout.strip())
    key = _cli(database_url, "create-key", "--org", str(org_id), "--role", "owner")
    owner_key = key.stdout.strip().splitlines()[-1]
    assert client.get("/v1/datasets", headers=factories.auth(owner_key)).status_code == 200
    mismatch = _cli(database_url, "create-key", "--org", str(org_id), "--role", "client")
    assert mismatch.returncode == 1 and "kind 'client'" in mismatch.stderr

    revoked = _cli(database_url, "revoke-key", owner_key)
    assert revoked.returncode == 0
    assert client.get("/v1/datasets", headers=factories.auth(owner_key)).status_code == 401

    user = _cli(
        database_url,
        "create-user",
        "--username",
        "privacy-officer",
        "--role",
        "auditor",
        KEYSEED_ADMIN_PASSWORD="correct horse battery staple",
    )
    assert user.returncode == 0, user.stderr
    short = _cli(
        database_url,
        "create-user",
        "--username",
        "x",
        "--role",
        "admin",
        KEYSEED_ADMIN_PASSWORD="short",
    )
    assert short.returncode == 1
    with db.session() as session:
        stored = session.scalar(select(User).where(User.username == "privacy-officer"))
    assert stored is not None and stored.role == "auditor"
    assert stored.password_hash.startswith("$argon2")


def test_admin_command_line_wants_a_current_schema(tmp_path: Path) -> None:
    empty = f"sqlite:///{tmp_path / 'empty.sqlite3'}"
    result = _cli(empty, "create-org", "X", "--kind", "owner")
    assert result.returncode == 1 and "keyseed admin migrate" in result.stderr
    assert _cli(empty, "migrate").returncode == 0
    assert _cli(empty, "create-org", "X", "--kind", "owner").returncode == 0
