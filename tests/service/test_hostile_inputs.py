"""Inputs the database cannot hold or the parser should never see: clean 4xx, never 5xx."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.service import factories


def test_control_characters_and_nul_bytes_are_refused(
    client: TestClient, world: factories.World
) -> None:
    admin = world.admin.headers
    for name in ("bad\x00name", "tab\tname"):
        response = client.post(
            "/v1/organisations", json={"name": name, "kind": "owner"}, headers=admin
        )
        assert response.status_code == 422
    lone = client.post(
        "/v1/organisations",
        headers={**admin, "Content-Type": "application/json"},
        content=b'{"name": "\\ud800", "kind": "owner"}',
    )
    assert lone.status_code in (201, 422)
    assert factories.upload(client, world.owner, label_column="la\x00bel").status_code == 422
    assert factories.upload(client, world.owner, labels=("car\x00dio", "ortho")).status_code == 422
    events = client.get("/v1/audit/events", params={"actor": "key:\x00"}, headers=admin)
    assert events.status_code == 422
    huge = client.get("/v1/audit/events", params={"cursor": str(10**30)}, headers=admin)
    assert huge.status_code == 422


def test_keys_that_are_not_keys_are_401(client: TestClient) -> None:
    for token in (
        b"ks_\x01\x02_x",
        b"ks_" + b"a" * 12 + b"_" + b"b" * 43 + b"\x7f",
        "é".encode() * 80,
    ):
        response = client.get("/v1/datasets", headers={"Authorization": b"Bearer " + token})
        assert response.status_code == 401


def test_binary_late_in_a_file_is_refused_and_nothing_is_stored(
    client: TestClient, world: factories.World
) -> None:
    rows = factories.csv_bytes([(f"document number {i}", "cardio") for i in range(400)])
    document = factories.upload(client, world.owner, rows + b"late\x00binary,cardio\n")
    assert document.status_code == 422 and "binary" in document.json()["detail"]
    vocabulary = client.post(
        "/v1/vocabularies",
        headers=world.owner.headers,
        data={"name": "v"},
        files={"file": ("v.txt", b"heart\n" * 2000 + b"bad\x00phrase\n")},
    )
    assert vocabulary.status_code == 415
    assert client.get("/v1/datasets", headers=world.owner.headers).json() == []
