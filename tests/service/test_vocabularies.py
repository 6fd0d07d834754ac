"""Built-in and uploaded public vocabularies."""

from __future__ import annotations

import gzip

from fastapi.testclient import TestClient

from tests.service import factories


def _upload(client: TestClient, caller: factories.Caller, content: bytes, **form: str):  # type: ignore[no-untyped-def]
    data = {"name": "cardiology terms", "licence": "CC0", **form}
    return client.post(
        "/v1/vocabularies",
        headers=caller.headers,
        data=data,
        files={"file": ("terms.txt", content)},
    )


def test_builtins_are_listed_with_size_and_licence(
    client: TestClient, world: factories.World
) -> None:
    for name in ("owner", "admin", "auditor"):
        response = client.get("/v1/vocabularies", headers=getattr(world, name).headers)
        assert response.status_code == 200
    builtins = {v["id"]: v for v in response.json() if v["kind"] == "builtin"}
    assert set(builtins) == {"english", "medical"}
    assert builtins["medical"]["size"] > 100_000 and "HPO" in builtins["medical"]["licence"]
    assert client.get("/v1/vocabularies", headers=world.client.headers).status_code == 403


def test_upload_a_public_vocabulary_and_use_it_in_a_job(
    client: TestClient, world: factories.World
) -> None:
    content = "\ufeffHeart Failure\nchest  pain\n\nheart failure\nAtrial fibrillation\n".encode()
    response = _upload(client, world.owner, content)
    assert response.status_code == 201, response.text
    vocabulary = response.json()
    assert vocabulary["size"] == 3 and vocabulary["kind"] == "uploaded"
    assert len(vocabulary["fingerprint"]) == 64
    assert _upload(client, world.owner, content).status_code == 409
    listed = client.get("/v1/vocabularies", headers=world.owner.headers).json()
    assert vocabulary["id"] in [v["id"] for v in listed]
    others = client.get("/v1/vocabularies", headers=world.other_owner.headers).json()
    assert vocabulary["id"] not in [v["id"] for v in others]

    dataset_id = factories.dataset(client, world.owner)
    spec = factories.spec(vocabulary=vocabulary["id"], vocabulary_size=3, sequence_length=2)
    ok = client.post(f"/v1/datasets/{dataset_id}/jobs", headers=world.owner.headers, json=spec)
    assert ok.status_code == 202, ok.text
    too_many = {**spec, "vocabulary_size": 4}
    refused = client.post(
        f"/v1/datasets/{dataset_id}/jobs", headers=world.owner.headers, json=too_many
    )
    assert refused.status_code == 422 and refused.json()["field"] == "vocabulary_size"
    theirs = factories.dataset(client, world.other_owner)
    foreign = client.post(
        f"/v1/datasets/{theirs}/jobs", headers=world.other_owner.headers, json=spec
    )
    assert foreign.status_code == 422 and foreign.json()["field"] == "vocabulary"


def test_bad_vocabulary_files(client: TestClient, world: factories.World) -> None:
    not_utf8 = _upload(client, world.owner, b"fine\nbad \xfe\n")
    assert not_utf8.status_code == 422 and not_utf8.json()["line"] == 2
    assert _upload(client, world.owner, b"\n \n").status_code == 422
    assert _upload(client, world.owner, gzip.compress(b"heart\n")).status_code == 415
    assert _upload(client, world.owner, b"heart\n", name="").status_code == 422
    for name in ("auditor", "client"):
        assert _upload(client, getattr(world, name), b"heart\n").status_code == 403
    assert _upload(client, world.admin, b"heart\n").status_code == 201
