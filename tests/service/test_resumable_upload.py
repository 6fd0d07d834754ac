"""Resumable uploads: a dataset opened in state ``uploading``, its file appended in
chunks (``PUT …/upload`` with Content-Range), resumed from the committed offset, then
sealed; the one-shot upload's documents, counts, policies and errors, chunk by chunk."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from httpx import Response
from sqlalchemy import func, select

import migrations
from app.config import Settings
from app.crypto import DocumentCipher
from app.datasets import repository
from app.db import Database
from app.main import create_app
from app.models import Dataset, Document, UploadDigest
from tests.proof.conftest import assert_problem
from tests.service import factories
from tests.service.conftest import UPLOAD_LIMIT

CANARY = "CANARY-91f3-private-text"
ROWS = [
    ("Chest pain and heart failure", "cardio"),
    ('A note "quoted", with\na line break and a comma, é ü 漢字', "ortho"),
    ("Fracture of the femur after a fall", "ortho"),
    ("   ", "cardio"),  # empty once whitespace is collapsed
    ("Chest pain and heart failure", "cardio"),  # a repeat of row 1
    ("Chest pain and heart failure", "ortho"),  # not a repeat: another label
    ("Knee arthritis with joint pain", "ortho"),
]
FORM = {"name": "notes", "text_column": "text", "label_column": "label", "labels": "cardio,ortho"}


def _open(client: TestClient, caller: factories.Caller, **form: str) -> str:
    data = {**FORM, "epsilon_cap": "5", "format": "csv", **form}
    response = client.post("/v1/datasets/uploads", headers=caller.headers, data=data)
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["state"] == "uploading" and body["upload_bytes"] == 0
    return str(body["id"])


def _put(
    client: TestClient,
    caller: factories.Caller,
    dataset_id: str,
    start: int,
    chunk: bytes,
    *,
    total: int | str = "*",
    declared: int | None = None,
) -> Response:
    end = start + (len(chunk) if declared is None else declared) - 1
    headers = {
        **caller.headers,
        "Content-Type": "application/octet-stream",
        "Content-Range": f"bytes {start}-{end}/{total}",
    }
    return client.put(f"/v1/datasets/{dataset_id}/upload", headers=headers, content=chunk)


def _send(
    client: TestClient, caller: factories.Caller, dataset_id: str, content: bytes, size: int
) -> None:
    for start in range(0, len(content), size):
        response = _put(client, caller, dataset_id, start, content[start : start + size])
        assert response.status_code == 200, response.text
        assert response.json()["offset"] == min(start + size, len(content))


def _seal(client: TestClient, caller: factories.Caller, dataset_id: str) -> Response:
    return client.post(f"/v1/datasets/{dataset_id}/seal", headers=caller.headers)


def _stored(db: Database, app: FastAPI, dataset_id: str) -> list[tuple[int, str, str, str | None]]:
    cipher: DocumentCipher = app.state.cipher
    key = cipher.dataset_key(uuid.UUID(dataset_id))
    out = []
    with db.session() as session:
        for d in repository.iter_documents(session, uuid.UUID(dataset_id)):
            text, label = key.open(d.dataset_id, d.row, d.key_id, d.nonce, d.ciphertext)
            unit = None if d.unit is None else key.open_unit(d.dataset_id, d.row, d.key_id, d.unit)
            out.append((d.row, text, label, unit))
    return out


def _counts(body: dict[str, Any]) -> tuple[int, int, int, int]:
    return (
        body["documents"],
        body["skipped_empty"],
        body["skipped_duplicate"],
        body["upload_bytes"],
    )


@pytest.mark.parametrize("size", [7, 50, 333, 10_000])
def test_a_file_in_chunks_stores_what_one_upload_stores(
    client: TestClient, world: factories.World, db: Database, app: FastAPI, size: int
) -> None:
    """Chunks cut anywhere (inside a row, a quoted line break, a UTF-8 character)."""
    content = factories.csv_bytes(ROWS)
    whole = factories.upload(client, world.owner, content)
    assert whole.status_code == 201, whole.text
    dataset_id = _open(client, world.owner)
    _send(client, world.owner, dataset_id, content, size)
    sealed = _seal(client, world.owner, dataset_id)
    assert sealed.status_code == 200, sealed.text
    assert sealed.json()["state"] == "ready"
    assert _counts(sealed.json()) == _counts(whole.json()) == (5, 1, 1, len(content))
    assert _stored(db, app, dataset_id) == _stored(db, app, whole.json()["id"])
    with db.session() as session:  # the digests go with the upload's end, the tail too
        digests = select(func.count()).select_from(UploadDigest)
        assert session.scalar(digests) == 0
        dataset = session.get(Dataset, uuid.UUID(dataset_id))
        assert dataset is not None and dataset.upload_tail is None


def test_jsonl_with_units_and_no_final_newline(
    client: TestClient, world: factories.World, db: Database, app: FastAPI
) -> None:
    lines = [
        json.dumps({"text": text, "label": label, "patient": f"p{i % 3}"})
        for i, (text, label) in enumerate(ROWS)
    ]
    content = "\n".join(lines).encode()  # the last row ends with the file
    form = {"unit_column": "patient", "filename": "notes.jsonl"}
    whole = factories.upload(client, world.owner, content, **form)
    assert whole.status_code == 201, whole.text
    dataset_id = _open(client, world.owner, format="jsonl", unit_column="patient")
    _send(client, world.owner, dataset_id, content, 64)
    sealed = _seal(client, world.owner, dataset_id)
    assert sealed.status_code == 200, sealed.text
    assert _counts(sealed.json()) == _counts(whole.json())
    stored = _stored(db, app, dataset_id)
    assert stored == _stored(db, app, whole.json()["id"]) and stored[0][3] == "p0"


def test_a_dropped_chunk_resumes_from_the_committed_offset(
    client: TestClient, world: factories.World, db: Database, app: FastAPI
) -> None:
    content = factories.csv_bytes(ROWS)
    dataset_id = _open(client, world.owner)
    first = content[:60]
    assert _put(client, world.owner, dataset_id, 0, first).status_code == 200
    # The connection drops halfway through the second chunk: nothing of it is stored.
    rest = content[60:]
    cut = _put(client, world.owner, dataset_id, 60, rest[: len(rest) // 2], declared=len(rest))
    body = assert_problem(cut, 400, field="body")
    assert CANARY not in cut.text and "femur" not in cut.text
    upload = client.get(f"/v1/datasets/{dataset_id}/upload", headers=world.owner.headers)
    assert upload.status_code == 200, upload.text
    assert upload.json()["offset"] == 60 and upload.json()["state"] == "uploading"
    assert body["detail"].startswith(f"the chunk ended after {len(rest) // 2} of its")
    # The client resumes from the offset it is given, resending a little it had sent
    # (overlapping bytes are skipped), and a chunk sent twice changes nothing.
    again = _put(client, world.owner, dataset_id, 40, content[40:], total=len(content))
    assert again.status_code == 200 and again.json()["offset"] == len(content)
    twice = _put(client, world.owner, dataset_id, 40, content[40:], total=len(content))
    assert twice.status_code == 200 and twice.json()["offset"] == len(content)
    ahead = _put(client, world.owner, dataset_id, len(content) + 5, b"x\n")
    assert assert_problem(ahead, 409)["offset"] == len(content)
    sealed = _seal(client, world.owner, dataset_id)
    assert sealed.status_code == 200, sealed.text
    whole = factories.upload(client, world.owner, content)
    assert _counts(sealed.json()) == _counts(whole.json())
    assert _stored(db, app, dataset_id) == _stored(db, app, whole.json()["id"])


def test_a_repeat_in_a_later_chunk_is_a_repeat(
    client: TestClient, world: factories.World, db: Database
) -> None:
    first = factories.csv_bytes([(CANARY, "cardio"), ("other", "ortho")])
    second = f"{CANARY},cardio\n".encode()
    dataset_id = _open(client, world.owner)
    assert _put(client, world.owner, dataset_id, 0, first).status_code == 200
    assert _put(client, world.owner, dataset_id, len(first), second).status_code == 200
    sealed = _seal(client, world.owner, dataset_id).json()
    assert (sealed["documents"], sealed["skipped_duplicate"]) == (2, 1)
    # With on_duplicate=reject the repeat is a row error naming the rows, not the text.
    rejecting = _open(client, world.owner, on_duplicate="reject")
    assert _put(client, world.owner, rejecting, 0, first).status_code == 200
    refused = _put(client, world.owner, rejecting, len(first), second)
    body = assert_problem(refused, 422, field="file")
    assert body["errors"] == [{"row": 3, "column": None, "message": "the document repeats row 1"}]
    assert CANARY not in refused.text
    status = client.get(f"/v1/datasets/{rejecting}/upload", headers=world.owner.headers)
    assert status.json()["offset"] == len(first)


def test_a_bad_chunk_loses_nothing_already_stored(
    client: TestClient, world: factories.World, db: Database, app: FastAPI
) -> None:
    good = factories.csv_bytes(ROWS[:3])
    dataset_id = _open(client, world.owner)
    assert _put(client, world.owner, dataset_id, 0, good).status_code == 200
    before = _stored(db, app, dataset_id)
    assert len(before) == 3
    bad = f"fine row,cardio\n{CANARY},not-a-label\nx,y,z\n".encode()
    refused = _put(client, world.owner, dataset_id, len(good), bad)
    body = assert_problem(refused, 422, field="file")
    assert [e["row"] for e in body["errors"]] == [5, 6]
    assert body["errors"][0]["column"] == "label"
    assert CANARY not in refused.text and "not-a-label" not in refused.text
    binary = _put(client, world.owner, dataset_id, len(good), b"ok,cardio\n\xff\xfe,ortho\n")
    assert_problem(binary, 422, field="file")
    assert _stored(db, app, dataset_id) == before
    status = client.get(f"/v1/datasets/{dataset_id}/upload", headers=world.owner.headers)
    assert status.json()["offset"] == len(good)
    fixed = _put(client, world.owner, dataset_id, len(good), b"fine row,cardio\n")
    assert fixed.status_code == 200
    sealed = _seal(client, world.owner, dataset_id)
    assert sealed.json()["documents"] == 4


def test_jobs_wait_for_the_seal_and_a_sealed_dataset_takes_no_chunk(
    client: TestClient, world: factories.World, db: Database
) -> None:
    content = factories.csv_bytes(factories.ROWS)
    dataset_id = _open(client, world.owner)
    assert _put(client, world.owner, dataset_id, 0, content).status_code == 200
    path = f"/v1/datasets/{dataset_id}/jobs"
    refused = client.post(path, headers=world.owner.headers, json=factories.spec())
    assert "seal" in assert_problem(refused, 409)["detail"]
    assert _seal(client, world.owner, dataset_id).status_code == 200
    factories.job(client, world.owner, dataset_id)
    more = _put(client, world.owner, dataset_id, len(content), b"more,cardio\n")
    assert "sealed" in assert_problem(more, 409)["detail"]
    assert_problem(_seal(client, world.owner, dataset_id), 409)
    with db.session() as session:
        stored = select(func.count()).select_from(Document)
        assert session.scalar(stored) == len(factories.ROWS)
    # A one-shot dataset is sealed from the start.
    whole = factories.dataset(client, world.owner)
    assert_problem(_put(client, world.owner, whole, 0, content), 409)


def test_the_size_limit_is_named(client: TestClient, world: factories.World, db: Database) -> None:
    row = b"x" * 900 + b",cardio\n"
    content = b"text,label\n" + row * (UPLOAD_LIMIT // len(row) + 5)
    dataset_id = _open(client, world.owner)
    size = 40 * 1024
    assert _put(client, world.owner, dataset_id, 0, content[:size]).status_code == 200
    over = _put(client, world.owner, dataset_id, size, content[size : 2 * size])
    body = assert_problem(over, 413)
    assert "KEYSEED_MAX_UPLOAD_BYTES" in body["detail"]
    status = client.get(f"/v1/datasets/{dataset_id}/upload", headers=world.owner.headers)
    assert status.json() == {
        "dataset_id": dataset_id,
        "state": "uploading",
        "offset": size,
        "max_upload_bytes": UPLOAD_LIMIT,
        "max_upload_request_bytes": UPLOAD_LIMIT,
    }
    whole = factories.upload(client, world.owner, content[: UPLOAD_LIMIT + 10])
    assert "KEYSEED_MAX_UPLOAD_BYTES" in assert_problem(whole, 413)["detail"]


def test_refusals_of_the_protocol(client: TestClient, world: factories.World) -> None:
    dataset_id = _open(client, world.owner)
    no_range = client.put(
        f"/v1/datasets/{dataset_id}/upload",
        headers={**world.owner.headers, "Content-Type": "application/octet-stream"},
        content=b"text,label\n",
    )
    assert_problem(no_range, 400, field="Content-Range")
    empty = client.put(
        f"/v1/datasets/{dataset_id}/upload",
        headers=world.owner.headers,
        params={"offset": 0},
        content=b"",
    )
    assert_problem(empty, 400, field="body")
    zipped = _put(client, world.owner, dataset_id, 0, b"PK\x03\x04rest")
    assert_problem(zipped, 415)
    assert_problem(_seal(client, world.owner, dataset_id), 422, field="file")
    # Without Content-Range, ?offset= places the chunk (its length is the body's).
    content = factories.csv_bytes(factories.ROWS)
    for start in (0, 30):  # the second overlaps: its first bytes are skipped
        response = client.put(
            f"/v1/datasets/{dataset_id}/upload",
            headers=world.owner.headers,
            params={"offset": start},
            content=content[start:],
        )
        assert response.status_code == 200 and response.json()["offset"] == len(content)
    assert _seal(client, world.owner, dataset_id).json()["documents"] == len(factories.ROWS)
    other = _put(client, world.other_owner, dataset_id, 0, b"text,label\n")
    assert other.status_code == 404
    missing = _open(client, world.owner, label_column="nope")
    assert _put(client, world.owner, missing, 0, b"text,label\n").status_code == 422


def test_chunks_on_the_embedded_sqlite_database(tmp_path: Path) -> None:
    """The same protocol without Postgres' COPY (executemany, digests looked up by IN)."""
    settings = Settings(data_dir=tmp_path, database_url="", data_key="", broker_url="memory://")
    migrations.upgrade(settings.sqlalchemy_url)
    app = create_app(settings)
    try:
        world = factories.build_world(app.state.database)
        client = TestClient(app)
        content = factories.csv_bytes(ROWS)
        whole = factories.upload(client, world.owner, content)
        assert whole.status_code == 201, whole.text
        dataset_id = _open(client, world.owner)
        _send(client, world.owner, dataset_id, content, 40)
        again = _put(client, world.owner, dataset_id, 0, content[:40])  # already committed
        assert again.status_code == 200 and again.json()["offset"] == len(content)
        sealed = _seal(client, world.owner, dataset_id)
        assert sealed.status_code == 200, sealed.text
        assert _counts(sealed.json()) == _counts(whole.json())
        db = app.state.database
        assert _stored(db, app, dataset_id) == _stored(db, app, whole.json()["id"])
    finally:
        app.state.database.dispose()
