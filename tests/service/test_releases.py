"""Releases: created by the owner for client organisations; listed, read and downloaded
(streamed, audited) by the owner and the grantees only."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import uuid
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import func, select

from app.db import Database
from app.models import Download, Job
from app.releases.export import escape_cell
from tests.service import factories


def _release(client: TestClient, world: factories.World, job_id: str) -> dict[str, Any]:
    """The owner releases a succeeded job to the client organisation: the new release."""
    return factories.release(client, world, job_id, name="cardio v1")


def _released(
    client: TestClient, world: factories.World, db: Database, **job: Any
) -> tuple[str, str]:
    """A job run to success and released: (its id, the release id)."""
    return factories.released(client, world, db, name="cardio v1", **job)


def test_only_a_succeeded_job_is_released_to_client_organisations(
    client: TestClient, world: factories.World, db: Database
) -> None:
    dataset_id = factories.dataset(client, world.owner)
    job_id = factories.job(client, world.owner, dataset_id)
    path = f"/v1/jobs/{job_id}/release"
    body = {"client_organisations": [str(world.client.organisation_id)]}
    assert client.post(path, json=body, headers=world.owner.headers).status_code == 409
    factories.run_job(db, job_id)
    for name in ("admin", "auditor", "client"):
        assert client.post(path, json=body, headers=getattr(world, name).headers).status_code == 403
    assert client.post(path, json=body, headers=world.other_owner.headers).status_code == 404
    for bad in ([str(world.other_owner.organisation_id)], [str(uuid.uuid4())], []):
        response = client.post(
            path, json={"client_organisations": bad}, headers=world.owner.headers
        )
        assert response.status_code == 422
        assert response.json()["field"].startswith("client_organisations")
    created = client.post(path, json=body, headers=world.owner.headers)
    assert created.status_code == 201
    assert client.post(path, json=body, headers=world.owner.headers).status_code == 409


def test_a_release_carries_its_manifest(
    client: TestClient, world: factories.World, db: Database
) -> None:
    job_id, release_id = _released(client, world, db, llm="vllm", texts=["one", "two", None])
    release = client.get(f"/v1/releases/{release_id}", headers=world.client.headers).json()
    assert release["job_id"] == job_id and release["documents"] == 2
    manifest = release["manifest"]
    # what ran, from the job's configuration: the default is the exact kernel
    assert manifest["method"] == (
        "DP-KPS (Nagesh et al., 2024) with DP-KDE by "
        "the exact Gaussian kernel density on the private vocabulary"
    )
    assert manifest["density"] == {"method": "exact", "kernel": "gaussian", "bandwidth": 0.3}
    assert manifest["parameters"]["kde_method"] == "exact"
    assert manifest["privacy"]["adjacency"] == "one row of the uploaded file added or removed"
    assert manifest["parameters"]["epsilon_kde"] == 0.5
    assert manifest["parameters"]["vocabulary_size"] == 50
    assert manifest["privacy"]["epsilon_charged"] == 1.0
    assert manifest["privacy"]["epsilon_by_mechanism"] == {"vocabulary": 0.5, "kde": 0.5}
    assert manifest["privacy"]["delta"] == 0.0 and manifest["privacy"]["accountant"]
    assert manifest["models"] == {
        "embedding": {"name": "test-model"},  # neither packaged nor a local folder
        "llm": {"endpoint": "vllm", "model": "open-model"},
    }
    vocabulary = client.get("/v1/vocabularies", headers=world.owner.headers).json()
    medical = next(v for v in vocabulary if v["id"] == "medical")
    assert manifest["vocabulary"] == {
        "source": "built in",
        "id": "medical",
        "name": "medical",
        "size": medical["size"],
        "fingerprint": medical["fingerprint"],
        "fingerprint_algorithm": "sha256 of the normalised phrases joined by newlines",
    }
    assert manifest["created_at"]
    assert "api_key" not in json.dumps(manifest)


def test_the_manifest_names_random_features_and_an_uploaded_vocabulary(
    client: TestClient, world: factories.World, db: Database
) -> None:
    phrases = "heart failure\nfracture\nchest pain\n"
    uploaded = client.post(
        "/v1/vocabularies",
        headers=world.owner.headers,
        data={"name": "wards"},
        files={"file": ("v.txt", phrases.encode())},
    ).json()
    _, release_id = _released(
        client,
        world,
        db,
        vocabulary=uploaded["id"],
        vocabulary_size=3,
        sequence_length=2,
        kde_method="random_features",
        mode="iterative",
        num_features=64,
    )
    manifest = client.get(f"/v1/releases/{release_id}", headers=world.auditor.headers).json()[
        "manifest"
    ]
    assert manifest["method"] == (
        "DP-KPS (Nagesh et al., 2024) with DP-KDE by random Fourier features (iterative sequences)"
    )
    assert manifest["density"] == {
        "method": "random_features",
        "kernel": "gaussian",
        "bandwidth": 0.3,
        "num_features": 64,
        "contribution_bound": 0.5,
    }
    expected = hashlib.sha256(b"heart failure\nfracture\nchest pain").hexdigest()
    assert manifest["vocabulary"]["source"] == "uploaded"
    assert manifest["vocabulary"]["id"] == uploaded["id"]
    assert manifest["vocabulary"]["fingerprint"] == expected == uploaded["fingerprint"]


def test_releases_are_listed_and_read_by_owner_grantees_and_platform(
    client: TestClient, world: factories.World, db: Database
) -> None:
    _, release_id = _released(client, world, db)
    for name in ("owner", "client", "admin", "auditor"):
        caller = getattr(world, name)
        listed = client.get("/v1/releases", headers=caller.headers).json()
        assert [r["id"] for r in listed] == [release_id], name
        assert client.get(f"/v1/releases/{release_id}", headers=caller.headers).status_code == 200
    for name in ("other_owner", "other_client"):
        caller = getattr(world, name)
        assert client.get("/v1/releases", headers=caller.headers).json() == []
        assert client.get(f"/v1/releases/{release_id}", headers=caller.headers).status_code == 404
    seen = client.get(f"/v1/releases/{release_id}", headers=world.client.headers).json()
    assert seen["grantees"] == [str(world.client.organisation_id)]
    assert (
        client.get(f"/v1/releases/{uuid.uuid4()}", headers=world.owner.headers).status_code == 404
    )
    assert client.get("/v1/releases").status_code == 401


def test_download_jsonl_streams_the_corpus(
    client: TestClient, world: factories.World, db: Database
) -> None:
    _, release_id = _released(client, world, db)
    response = client.get(f"/v1/releases/{release_id}/download", headers=world.client.headers)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/jsonl")
    assert "attachment" in response.headers["content-disposition"]
    records = [json.loads(line) for line in response.text.splitlines()]
    assert records == [
        {"label": label, "text": None, "keyphrases": list(phrases)}
        for label, phrases in factories.SEQUENCES
    ]


def test_download_csv_escapes_formulas(
    client: TestClient, world: factories.World, db: Database
) -> None:
    _, release_id = _released(
        client, world, db, llm="vllm", texts=["=cmd|' /C calc'!A0", "+1", "@SUM(A1)"]
    )
    response = client.get(
        f"/v1/releases/{release_id}/download?format=csv", headers=world.owner.headers
    )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(response.text)))
    assert rows[0] == ["label", "text", "keyphrases"]
    assert [r[1] for r in rows[1:]] == ["'=cmd|' /C calc'!A0", "'+1", "'@SUM(A1)"]
    assert rows[2][2] == 'fracture; =HYPERLINK("http://x")'  # not at the start of the cell
    assert escape_cell("-2") == "'-2" and escape_cell("\t=1") == "'\t=1"
    assert escape_cell("＝1") == "'＝1" and escape_cell("plain") == "plain"


def test_downloads_are_granted_and_audited(
    client: TestClient, world: factories.World, db: Database
) -> None:
    _, release_id = _released(client, world, db)
    path = f"/v1/releases/{release_id}/download"
    for name in ("admin", "auditor"):
        assert client.get(path, headers=getattr(world, name).headers).status_code == 403
    for name in ("other_owner", "other_client"):
        assert client.get(path, headers=getattr(world, name).headers).status_code == 404
    assert client.get(path).status_code == 401
    assert client.get(path + "?format=xml", headers=world.client.headers).status_code == 422
    assert client.get(path + "?format=csv", headers=world.client.headers).status_code == 200
    assert client.get(path, headers=world.owner.headers).status_code == 200
    events = client.get(
        f"/v1/audit/events?kind=release.downloaded&target_id={release_id}",
        headers=world.auditor.headers,
    ).json()["events"]
    assert [(e["details"]["format"], e["actor_organisation_id"]) for e in events] == [
        ("jsonl", str(world.owner.organisation_id)),
        ("csv", str(world.client.organisation_id)),
    ]
    with db.session() as session:
        assert session.scalar(select(func.count()).select_from(Download)) == 2


def test_large_releases_stream_in_batches(
    client: TestClient, world: factories.World, db: Database
) -> None:
    sequences = [("cardio" if i % 2 else "ortho", (f"phrase {i}",)) for i in range(2500)]
    dataset_id = factories.dataset(client, world.owner)
    job_id = factories.job(client, world.owner, dataset_id)
    factories.run_job(db, job_id, sequences=sequences)
    release = factories.release(client, world, job_id, to=world.other_client)
    with client.stream(
        "GET",
        f"/v1/releases/{release['id']}/download?format=csv",
        headers=world.other_client.headers,
    ) as response:
        chunks = list(response.iter_bytes())
    lines = b"".join(chunks).decode().splitlines()
    assert len(lines) == 2501 and lines[-1] == "cardio,,phrase 2499"
    assert release["documents"] == 2500


def test_a_release_manifest_names_the_subspace_the_declared_labels_chose(
    client: TestClient, world: factories.World, db: Database
) -> None:
    # class centroids with a total Gaussian budget: the default subspace is resolved by
    # the dataset's declared labels (20 or more: the top 128 public directions)
    labels = [*factories.LABELS, *(f"extra {i}" for i in range(20))]
    dataset_id = factories.dataset(client, world.owner, cap=50, delta_cap="1e-5", labels=labels)
    gaussian = {"epsilon_vocab": None, "epsilon_kde": None, "epsilon": 1.0, "delta": 1e-6}
    job_id = factories.job(client, world.owner, dataset_id, **gaussian)
    factories.run_job(db, job_id)
    manifest = _release(client, world, job_id)["manifest"]
    assert manifest["parameters"]["subspace"] == 128
    assert "top 128 principal directions" in manifest["method"]
    # one cell a class: the consistency filter too, and how many sequences were drawn
    assert manifest["parameters"]["consistency_filter"] is True
    assert "own class's released direction is the nearest" in manifest["method"]
    assert manifest["sequences_drawn"] == len(factories.SEQUENCES)  # the engine's, else stored
    # a job stored before the options existed (neither in its spec) ran in the whole space
    # and kept every sequence drawn
    old = factories.job(client, world.owner, dataset_id, **gaussian)
    with db.transaction() as session:
        job = session.get(Job, uuid.UUID(old))
        assert job is not None
        job.spec = {
            k: v for k, v in job.spec.items() if k not in ("subspace", "consistency_filter")
        }
    factories.run_job(db, old)
    parameters = _release(client, world, old)["manifest"]["parameters"]
    assert parameters["subspace"] == 384 and parameters["consistency_filter"] is False
    # with cells (ε ≥ 4) the filter is on by default; a job that ran when it was off there
    # (its engine's manifest says so) keeps being described as it ran
    cells = {**gaussian, "epsilon": 6.0}
    for ran_before in (False, True):
        job_id = factories.job(client, world.owner, dataset_id, **cells)
        factories.run_job(db, job_id)
        if ran_before:  # the engine's manifest of such a job says what it ran
            with db.transaction() as session:
                job = session.get(Job, uuid.UUID(job_id))
                assert job is not None and job.spec["consistency_filter"] is None
                job.manifest = {**(job.manifest or {}), "parameters": {"consistency_filter": False}}
        manifest = _release(client, world, job_id)["manifest"]
        assert manifest["parameters"]["consistency_filter"] is not ran_before
        assert ("nearest cell is one of its own class's" in manifest["method"]) is not ran_before
