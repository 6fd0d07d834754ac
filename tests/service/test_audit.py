"""``/v1/audit/events``: who may read it, filters, paging; no private text in it."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta

from fastapi.testclient import TestClient

from app.db import Database
from tests.service import factories


def test_audit_events_cover_the_life_of_a_dataset_and_hold_no_text(
    client: TestClient, world: factories.World, db: Database
) -> None:
    content = factories.csv_bytes([("CANARY-a93f heart", "cardio"), ("CANARY-a93f bone", "ortho")])
    dataset_id = factories.dataset(client, world.owner, content=content)
    job_id = factories.job(client, world.owner, dataset_id)
    factories.run_job(db, job_id)
    release = factories.release(client, world, job_id)
    client.get(f"/v1/releases/{release['id']}/download", headers=world.client.headers)
    client.delete(f"/v1/datasets/{dataset_id}", headers=world.owner.headers)
    response = client.get(
        f"/v1/audit/events?organisation_id={world.owner.organisation_id}",
        headers=world.admin.headers,
    )
    assert response.status_code == 200
    kinds = [e["kind"] for e in response.json()["events"]]
    assert kinds == [
        "dataset.deleted",
        "release.downloaded",
        "release.created",
        "job.submitted",
        "dataset.uploaded",
        "key.created",
        "organisation.created",
    ]
    assert "CANARY" not in response.text
    uploaded = response.json()["events"][-3]
    assert uploaded["request_id"]
    # no raw count of the private upload (a release's documents are DP outputs)
    for event in response.json()["events"]:
        if event["kind"].startswith("dataset."):
            assert not {"documents", "bytes", "documents_purged"} & set(event["details"]), event


def test_filters_and_paging(client: TestClient, world: factories.World) -> None:
    for i in range(5):
        client.post(
            "/v1/organisations",
            json={"name": f"org {i}", "kind": "client"},
            headers=world.admin.headers,
        )
    admin_actor = client.get(
        "/v1/audit/events?kind=organisation.created&limit=1", headers=world.auditor.headers
    ).json()["events"][0]["actor"]
    page = client.get(
        f"/v1/audit/events?kind=organisation.created&actor={admin_actor}&limit=2",
        headers=world.auditor.headers,
    ).json()
    assert [e["details"]["organisation_kind"] for e in page["events"]] == ["client", "client"]
    seen = [e["id"] for e in page["events"]]
    while page["next_cursor"] is not None:
        page = client.get(
            f"/v1/audit/events?kind=organisation.created&actor={admin_actor}&limit=2"
            f"&cursor={page['next_cursor']}",
            headers=world.auditor.headers,
        ).json()
        seen += [e["id"] for e in page["events"]]
    assert len(seen) == 5 and seen == sorted(seen, reverse=True)
    future = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    later = client.get("/v1/audit/events", params={"since": future}, headers=world.admin.headers)
    assert later.json()["events"] == []
    earlier = client.get("/v1/audit/events", params={"until": future}, headers=world.admin.headers)
    assert len(earlier.json()["events"]) == 5 + 6 + 4
    naive = client.get(
        "/v1/audit/events", params={"since": "2024-01-01T00:00:00"}, headers=world.admin.headers
    )
    assert naive.status_code == 422
    unknown = client.get("/v1/audit/events?kind=nothing", headers=world.admin.headers)
    assert unknown.status_code == 422


def test_only_the_platform_reads_the_audit_trail(
    client: TestClient, world: factories.World
) -> None:
    for name in ("owner", "client"):
        assert (
            client.get("/v1/audit/events", headers=getattr(world, name).headers).status_code == 403
        )
    assert client.get("/v1/audit/events").status_code == 401


def test_who_supplied_few_shot_examples_and_a_template_is_recorded_not_the_text(
    client: TestClient, world: factories.World
) -> None:
    dataset_id = factories.dataset(client, world.owner)
    example = "CANARY-5e1b an example note"
    template = "CANARY-77aa {examples} Write a {document_type} with {keyphrases}."
    factories.job(client, world.owner, dataset_id, few_shot=[example], template=template)
    factories.job(client, world.owner, dataset_id)
    response = client.get("/v1/audit/events?kind=job.submitted", headers=world.auditor.headers)
    assert "CANARY" not in response.text
    first, second = response.json()["events"][::-1]
    supplied, plain, key = first["details"], second["details"], first["actor"]
    assert key.startswith("key:")
    assert supplied["few_shot"] == {
        "supplied_by": key,
        "organisation_id": str(world.owner.organisation_id),
        "examples": 1,
        "sha256": hashlib.sha256(json.dumps([example]).encode()).hexdigest(),
    }
    assert supplied["template"] == {
        "supplied_by": key,
        "organisation_id": str(world.owner.organisation_id),
        "sha256": hashlib.sha256(template.encode()).hexdigest(),
    }
    assert "few_shot" not in plain and "template" not in plain
