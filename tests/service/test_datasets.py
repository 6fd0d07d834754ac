"""Uploads (formats, limits, row errors, policies), reading, deleting, caps, ledger."""

from __future__ import annotations

import gzip
import io
import json
import uuid
import zipfile

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from app.config import Settings
from app.crypto import DecryptionError, DocumentCipher
from app.db import Database
from app.jobs import runner, stages
from app.jobs.stages import WorkerContext
from app.models import Dataset, Document
from tests.service import factories
from tests.service.conftest import UPLOAD_LIMIT

CANARY = "CANARY-7c1e-private-text"


def _counts(db: Database) -> tuple[int, int]:
    with db.session() as session:
        datasets = session.scalar(select(func.count()).select_from(Dataset))
        documents = session.scalar(select(func.count()).select_from(Document))
    return int(datasets or 0), int(documents or 0)


def test_upload_csv_reports_sizes_labels_and_budget_never_text(
    client: TestClient, world: factories.World
) -> None:
    response = factories.upload(client, world.owner, cap=4)
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["documents"] == 4 and body["labels"] == ["cardio", "ortho"]
    assert body["format"] == "csv" and body["text_columns"] == ["text"]
    assert body["budget"] == {
        "epsilon_cap": 4.0,
        "delta_cap": 0.0,
        "spent": 0.0,
        "reserved": 0.0,
        "remaining": 4.0,
        "accountant": body["budget"]["accountant"],
    }
    assert "Chest pain" not in response.text


def test_raw_counts_of_an_upload_are_shown_to_its_owner_only(
    client: TestClient, world: factories.World
) -> None:
    rows = [*factories.ROWS, factories.ROWS[0], ("", "ortho")]
    dataset_id = factories.dataset(client, world.owner, content=factories.csv_bytes(rows))
    counts = ("documents", "skipped_empty", "skipped_duplicate", "upload_bytes")
    mine = client.get(f"/v1/datasets/{dataset_id}", headers=world.owner.headers).json()
    assert [mine[name] for name in counts[:3]] == [4, 1, 1] and mine["upload_bytes"] > 0
    for caller in (world.admin, world.auditor):
        for body in (
            client.get(f"/v1/datasets/{dataset_id}", headers=caller.headers).json(),
            client.get("/v1/datasets", headers=caller.headers).json()[0],
        ):
            assert body["id"] == dataset_id and body["labels"] == ["cardio", "ortho"]
            assert all(body[name] is None for name in counts), body
    deleted = client.delete(f"/v1/datasets/{dataset_id}", headers=world.admin.headers).json()
    assert all(deleted[name] is None for name in counts)


def test_upload_jsonl_with_several_text_columns(
    client: TestClient, world: factories.World, db: Database, app: FastAPI
) -> None:
    lines = [
        {"title": "Heart", "body": "failure  of\nthe heart", "label": 1},
        {"title": "Bone", "body": None, "label": 2},
    ]
    content = "\n".join(json.dumps(line) for line in lines).encode()
    response = factories.upload(
        client,
        world.owner,
        content,
        filename="notes.jsonl",
        labels=("1", "2"),
        text_columns=("title", "body"),
    )
    assert response.status_code == 201, response.text
    assert response.json()["format"] == "jsonl" and response.json()["documents"] == 2
    cipher: DocumentCipher = app.state.cipher
    with db.session() as session:
        rows = session.scalars(select(Document).order_by(Document.row)).all()
        opened = [cipher.open(d.dataset_id, d.row, d.key_id, d.nonce, d.ciphertext) for d in rows]
    assert opened == [("Heart. failure of the heart", "1"), ("Bone", "2")]


def test_documents_are_encrypted_and_bound_to_their_row(
    client: TestClient, world: factories.World, db: Database, app: FastAPI
) -> None:
    content = factories.csv_bytes([(f"{CANARY} one", "cardio"), (f"{CANARY} two", "ortho")])
    factories.dataset(client, world.owner, content=content)
    cipher: DocumentCipher = app.state.cipher
    with db.session() as session:
        first, second = session.scalars(select(Document).order_by(Document.row)).all()
    for document in (first, second):
        assert CANARY.encode() not in document.ciphertext
        assert b"cardio" not in document.ciphertext and b"ortho" not in document.ciphertext
    with pytest.raises(DecryptionError):  # a ciphertext moved to another row does not open
        cipher.open(second.dataset_id, second.row, first.key_id, first.nonce, first.ciphertext)
    with pytest.raises(DecryptionError):  # nor under another master key
        DocumentCipher(b"z" * 32, cipher.keyring).open(
            first.dataset_id, first.row, first.key_id, first.nonce, first.ciphertext
        )


@pytest.mark.parametrize(
    ("content", "field", "status"),
    [
        (b"", "file", 422),
        (b"   \n", "file", 422),
        (b"text,label\n", "file", 422),
        (b"body,label\nheart,cardio\n", "text_column", 422),
        (b"text,category\nheart,cardio\n", "label_column", 422),
    ],
)
def test_empty_files_and_missing_columns(
    client: TestClient,
    world: factories.World,
    db: Database,
    content: bytes,
    field: str,
    status: int,
) -> None:
    response = factories.upload(client, world.owner, content)
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["field"] == field
    assert _counts(db) == (0, 0)


def test_non_utf8_names_the_row_and_line(
    client: TestClient, world: factories.World, db: Database
) -> None:
    content = b'text,label\nfine,cardio\n"multi\nline",ortho\nbad \xff byte,cardio\n'
    response = factories.upload(client, world.owner, content)
    assert response.status_code == 422
    body = response.json()
    assert (body["row"], body["line"]) == (3, 5)
    assert "row 3" in body["detail"] and "UTF-8" in body["detail"]
    assert _counts(db) == (0, 0)


def test_undeclared_labels_are_refused_with_row_numbers_and_no_text(
    client: TestClient, world: factories.World, db: Database
) -> None:
    rows = [("ok", "cardio"), (f"{CANARY} a", "neuro"), ("ok too", "ortho"), (CANARY, "")]
    response = factories.upload(client, world.owner, factories.csv_bytes(rows))
    assert response.status_code == 422
    body = response.json()
    assert body["error_count"] == 2
    assert [(e["row"], e["message"]) for e in body["errors"]] == [
        (2, "the label is not one of the declared labels"),
        (4, "the label is empty"),
    ]
    assert CANARY not in response.text and "neuro" not in response.text
    assert _counts(db) == (0, 0)


def test_row_errors_are_listed_up_to_a_limit(client: TestClient, world: factories.World) -> None:
    rows = [(f"doc {i}", "unknown") for i in range(120)]
    response = factories.upload(client, world.owner, factories.csv_bytes(rows))
    body = response.json()
    assert body["error_count"] == 120 and len(body["errors"]) == 50
    assert body["errors"][-1]["row"] == 50


def test_duplicates_and_empties_are_skipped_by_default_and_counted(
    client: TestClient, world: factories.World
) -> None:
    rows = [("heart", "cardio"), ("  heart ", "cardio"), ("", "cardio"), ("bone", "ortho")]
    response = factories.upload(client, world.owner, factories.csv_bytes(rows))
    assert response.status_code == 201
    body = response.json()
    assert (body["documents"], body["skipped_duplicate"], body["skipped_empty"]) == (2, 1, 1)


def _stored(db: Database, cipher: DocumentCipher, dataset_id: str) -> list[tuple[str, str]]:
    with db.session() as session:
        rows = session.scalars(
            select(Document).where(Document.dataset_id == uuid.UUID(dataset_id))
        ).all()
        return sorted(
            cipher.open(d.dataset_id, d.row, d.key_id, d.nonce, d.ciphertext) for d in rows
        )


def test_a_repeat_is_the_same_text_with_the_same_label(
    client: TestClient, world: factories.World, db: Database, app: FastAPI
) -> None:
    """One row removed from the file changes at most one stored document: a text given
    with two labels is two documents, so removing the first row cannot relabel it."""
    rows = [("heart", "cardio"), ("heart", "ortho"), ("heart", "cardio"), ("bone", "ortho")]
    cipher: DocumentCipher = app.state.cipher
    whole = factories.dataset(client, world.owner, content=factories.csv_bytes(rows))
    stored = _stored(db, cipher, whole)
    assert stored == [("bone", "ortho"), ("heart", "cardio"), ("heart", "ortho")]
    for removed in range(len(rows)):
        neighbour = rows[:removed] + rows[removed + 1 :]
        dataset_id = factories.dataset(client, world.owner, content=factories.csv_bytes(neighbour))
        smaller = _stored(db, cipher, dataset_id)
        difference = [d for d in stored if d not in smaller]
        assert len(smaller) >= len(stored) - 1 and len(difference) <= 1
        assert set(smaller) <= set(stored)


def test_duplicates_and_empties_can_be_refused(
    client: TestClient, world: factories.World, db: Database
) -> None:
    rows = [("heart", "cardio"), ("heart", "cardio"), ("", "ortho")]
    content = factories.csv_bytes(rows)
    dup = factories.upload(client, world.owner, content, on_duplicate="reject")
    assert dup.status_code == 422
    assert dup.json()["errors"] == [
        {"row": 2, "column": None, "message": "the document repeats row 1"}
    ]
    empty = factories.upload(client, world.owner, content, on_empty="reject")
    assert [e["row"] for e in empty.json()["errors"]] == [3]
    both = factories.upload(client, world.owner, content, on_empty="reject", on_duplicate="reject")
    assert both.json()["error_count"] == 2
    only_empty = factories.upload(client, world.owner, factories.csv_bytes([("", "cardio")]))
    assert only_empty.status_code == 422 and only_empty.json()["skipped_empty"] == 1
    assert _counts(db) == (0, 0)


def test_malformed_rows_are_row_errors(client: TestClient, world: factories.World) -> None:
    csv_extra = b"text,label\nheart,cardio,extra\nbone,ortho\n"
    response = factories.upload(client, world.owner, csv_extra)
    assert response.json()["errors"][0]["row"] == 1
    jsonl = (
        b'{"text": "heart", "label": "cardio"}\n{not json\n[1, 2]\n'
        b'{"text": ["x"], "label": "cardio"}\n'
    )
    response = factories.upload(client, world.owner, jsonl, filename="n.jsonl")
    assert [e["row"] for e in response.json()["errors"]] == [2, 3, 4]


def _zip() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("notes.csv", factories.csv_bytes(factories.ROWS))
    return buffer.getvalue()


@pytest.mark.parametrize(
    "content",
    [
        _zip(),
        gzip.compress(factories.csv_bytes(factories.ROWS)),
        b"%PDF-1.7 ...",
        "text,label\nheart,cardio\n".encode("utf-16"),
        b"text,label\n\x00\x01\x02,cardio\n",
    ],
)
def test_archives_and_binary_files_are_refused(
    client: TestClient, world: factories.World, db: Database, content: bytes
) -> None:
    response = factories.upload(client, world.owner, content)
    assert response.status_code == 415
    assert response.headers["content-type"] == "application/problem+json"
    assert _counts(db) == (0, 0)


def test_uploads_over_the_limit_are_413(
    client: TestClient, world: factories.World, db: Database
) -> None:
    row = ("x" * 1000, "cardio")
    over_file_limit = factories.csv_bytes([(f"{i} {row[0]}", "cardio") for i in range(80)])
    assert UPLOAD_LIMIT < len(over_file_limit) < 2**20
    response = factories.upload(client, world.owner, over_file_limit)
    assert response.status_code == 413
    over_body_limit = factories.csv_bytes([(f"{i} {row[0]}", "cardio") for i in range(1200)])
    response = factories.upload(client, world.owner, over_body_limit)
    assert response.status_code == 413
    assert response.json()["title"] == "Content Too Large"
    assert _counts(db) == (0, 0)


@pytest.mark.parametrize(
    ("form", "field"),
    [
        ({"labels": ("cardio", "cardio")}, "labels"),
        ({"labels": ("cardio", " ")}, "labels"),
        ({"label_column": "text"}, "label_column"),
        ({"cap": "0"}, "epsilon_cap"),
        ({"cap": "inf"}, "epsilon_cap"),
        ({"cap": "nan"}, "epsilon_cap"),
        ({"format": "xml"}, "format"),
        ({"on_empty": "keep"}, "on_empty"),
    ],
)
def test_bad_upload_forms_are_422(
    client: TestClient, world: factories.World, form: dict[str, object], field: str
) -> None:
    response = factories.upload(client, world.owner, **form)  # type: ignore[arg-type]
    assert response.status_code == 422
    assert response.json()["field"] == field


def test_labels_may_be_one_comma_separated_value(
    client: TestClient, world: factories.World
) -> None:
    response = factories.upload(client, world.owner, labels=("cardio, ortho",))
    assert response.status_code == 201
    assert response.json()["labels"] == ["cardio", "ortho"]


def test_only_owners_upload(client: TestClient, world: factories.World) -> None:
    for name in ("admin", "auditor", "client"):
        assert factories.upload(client, getattr(world, name)).status_code == 403


def test_reading_datasets_by_role_and_organisation(
    client: TestClient, world: factories.World
) -> None:
    mine = factories.dataset(client, world.owner)
    theirs = factories.dataset(client, world.other_owner)
    listed = client.get("/v1/datasets", headers=world.owner.headers).json()
    assert [d["id"] for d in listed] == [mine]
    for name in ("admin", "auditor"):
        everything = client.get("/v1/datasets", headers=getattr(world, name).headers).json()
        assert {d["id"] for d in everything} == {mine, theirs}
        assert client.get(f"/v1/datasets/{mine}", headers=getattr(world, name).headers).is_success
    assert client.get(f"/v1/datasets/{mine}", headers=world.owner.headers).status_code == 200
    assert client.get(f"/v1/datasets/{theirs}", headers=world.owner.headers).status_code == 404
    assert (
        client.get(f"/v1/datasets/{uuid.uuid4()}", headers=world.owner.headers).status_code == 404
    )
    assert client.get("/v1/datasets", headers=world.client.headers).status_code == 403
    assert client.get(f"/v1/datasets/{mine}", headers=world.client.headers).status_code == 403
    assert client.get("/v1/datasets/not-a-uuid", headers=world.owner.headers).status_code == 422


def test_delete_purges_documents_and_keeps_the_ledger(
    client: TestClient, world: factories.World, db: Database
) -> None:
    dataset_id = factories.dataset(client, world.owner, cap=3)
    queued = factories.job(client, world.owner, dataset_id)
    running = factories.job(client, world.owner, dataset_id)
    from app.jobs import runner

    with db.transaction() as session:
        assert runner.start_sequences(session, uuid.UUID(running)) is not None
    for name in ("client", "auditor"):
        caller = getattr(world, name)
        assert (
            client.delete(f"/v1/datasets/{dataset_id}", headers=caller.headers).status_code == 403
        )
    other = client.delete(f"/v1/datasets/{dataset_id}", headers=world.other_owner.headers)
    assert other.status_code == 404
    response = client.delete(f"/v1/datasets/{dataset_id}", headers=world.owner.headers)
    assert response.status_code == 200
    body = response.json()
    assert body["deleted_at"] is not None
    assert body["budget"]["spent"] == 1.0 and body["budget"]["reserved"] == 0.0
    assert _counts(db) == (1, 0)
    assert client.get(f"/v1/jobs/{queued}", headers=world.owner.headers).json()["state"] == (
        "cancelled"
    )
    assert client.get(f"/v1/jobs/{running}", headers=world.owner.headers).json()["cancel_requested"]
    ledger = client.get(f"/v1/datasets/{dataset_id}/ledger", headers=world.owner.headers).json()
    assert [e["kind"] for e in ledger["entries"]] == ["reserve", "reserve", "commit", "release"]
    again = client.post(
        f"/v1/datasets/{dataset_id}/jobs", headers=world.owner.headers, json=factories.spec()
    )
    assert again.status_code == 409
    assert client.delete(f"/v1/datasets/{dataset_id}", headers=world.admin.headers).is_success


def test_admin_changes_a_cap_with_a_reason_as_an_audit_event(
    client: TestClient, world: factories.World
) -> None:
    dataset_id = factories.dataset(client, world.owner, cap=2)
    factories.job(client, world.owner, dataset_id)  # reserves 1.0
    path = f"/v1/datasets/{dataset_id}"
    body = {"epsilon_cap": 6, "reason": "privacy board decision 2024-17"}
    for name in ("owner", "auditor", "client"):
        assert (
            client.patch(path, json=body, headers=getattr(world, name).headers).status_code == 403
        )
    assert (
        client.patch(path, json={"epsilon_cap": 6}, headers=world.admin.headers).status_code == 422
    )
    too_low = client.patch(path, json={**body, "epsilon_cap": 0.5}, headers=world.admin.headers)
    assert too_low.status_code == 409
    response = client.patch(path, json=body, headers=world.admin.headers)
    assert response.status_code == 200
    assert response.json()["budget"]["remaining"] == 5.0
    events = client.get(
        f"/v1/audit/events?kind=dataset.cap_changed&target_id={dataset_id}",
        headers=world.auditor.headers,
    ).json()["events"]
    assert len(events) == 1
    assert events[0]["details"] == {
        "previous": 2.0,
        "epsilon_cap": 6.0,
        "reason": "privacy board decision 2024-17",
    }


def test_ledger_is_readable_by_the_owner_and_the_platform(
    client: TestClient, world: factories.World
) -> None:
    dataset_id = factories.dataset(client, world.owner)
    job_id = factories.job(client, world.owner, dataset_id, epsilon_count=0.25, total=10)
    path = f"/v1/datasets/{dataset_id}/ledger"
    for name in ("owner", "admin", "auditor"):
        response = client.get(path, headers=getattr(world, name).headers)
        assert response.status_code == 200
    entry = response.json()["entries"][0]
    assert entry["job_id"] == job_id and entry["kind"] == "reserve"
    assert entry["epsilon"] == 1.25
    assert entry["epsilon_by_mechanism"] == {"vocabulary": 0.5, "kde": 0.5, "class_counts": 0.25}
    assert entry["actor"].startswith("key:") and entry["accountant"] == "exact-sum"
    assert client.get(path, headers=world.other_owner.headers).status_code == 404
    assert client.get(path, headers=world.client.headers).status_code == 403


# ------------------------------------------------------------------ privacy units


def _units(db: Database, cipher: DocumentCipher, dataset_id: str) -> list[str | None]:
    with db.session() as session:
        rows = session.scalars(
            select(Document)
            .where(Document.dataset_id == uuid.UUID(dataset_id))
            .order_by(Document.row)
        ).all()
        key = cipher.dataset_key(uuid.UUID(dataset_id))
        return [
            None if d.unit is None else key.open_unit(d.dataset_id, d.row, d.key_id, d.unit)
            for d in rows
        ]


def test_a_unit_column_is_stored_sealed_per_document(
    client: TestClient, world: factories.World, db: Database, app: FastAPI
) -> None:
    rows = [
        ("heart", "cardio", "P-17"),
        ("heart", "cardio", "P-18"),  # another patient's identical note: a document
        ("heart", "cardio", " P-17 "),  # a repeat of row 1 (same text, label and unit)
        ("bone", "ortho", "P-17"),
    ]
    content = factories.csv_bytes(rows, header=("text", "label", "patient"))
    response = factories.upload(client, world.owner, content, unit_column="patient")
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["unit_column"] == "patient" and body["documents"] == 3
    cipher: DocumentCipher = app.state.cipher
    assert _units(db, cipher, body["id"]) == ["P-17", "P-18", "P-17"]
    with db.session() as session:
        sealed = session.scalars(select(Document.unit)).all()
    assert all(unit is not None and b"P-1" not in unit for unit in sealed)
    without = factories.dataset(client, world.owner)
    assert _units(db, cipher, without) == [None] * len(factories.ROWS)


def test_a_sealed_unit_is_bound_to_its_row(
    client: TestClient, world: factories.World, db: Database, app: FastAPI
) -> None:
    content = factories.csv_bytes(
        [("heart", "cardio", "P-1"), ("bone", "ortho", "P-2")], header=("text", "label", "id")
    )
    factories.dataset(client, world.owner, content=content, unit_column="id")
    cipher: DocumentCipher = app.state.cipher
    with db.session() as session:
        first, second = session.scalars(select(Document).order_by(Document.row)).all()
    assert first.unit is not None
    with pytest.raises(DecryptionError):
        cipher.open_unit(second.dataset_id, second.row, first.key_id, first.unit)


def test_the_worker_loads_the_units_with_the_documents(
    client: TestClient, world: factories.World, db: Database, app: FastAPI, settings: Settings
) -> None:
    rows = [("heart", "cardio", "P-1"), ("bone", "ortho", "P-2"), ("knee", "ortho", "P-1")]
    content = factories.csv_bytes(rows, header=("text", "label", "patient"))
    with_units = factories.dataset(client, world.owner, content=content, unit_column="patient")
    without = factories.dataset(client, world.owner)
    worker = WorkerContext(settings, db, app.state.cipher)
    corpora = {}
    for dataset_id in (with_units, without):
        job_id = uuid.UUID(factories.job(client, world.owner, dataset_id))
        with db.transaction() as session:
            assert runner.start_sequences(session, job_id) is not None
        corpora[dataset_id] = stages.load_corpus(worker, job_id)
    assert corpora[with_units] == stages.PrivateCorpus(
        ["heart", "bone", "knee"], ["cardio", "ortho", "ortho"], ["P-1", "P-2", "P-1"]
    )
    assert corpora[without].units is None
    assert corpora[without].texts == [text for text, _ in factories.ROWS]


@pytest.mark.parametrize(
    ("content", "filename", "errors"),
    [
        (b"text,label,patient\nheart,cardio,P-1\nbone,ortho,  \n", "n.csv", [(2, "empty")]),
        (
            b'{"text": "heart", "label": "cardio", "patient": 7}\n'
            b'{"text": "bone", "label": "ortho"}\n'
            b'{"text": "knee", "label": "ortho", "patient": ""}\n'
            b'{"text": "hip", "label": "ortho", "patient": ["x"]}\n',
            "n.jsonl",
            [(2, "missing"), (3, "empty"), (4, "missing")],
        ),
    ],
)
def test_rows_without_a_unit_are_row_errors_naming_the_column(
    client: TestClient,
    world: factories.World,
    db: Database,
    content: bytes,
    filename: str,
    errors: list[tuple[int, str]],
) -> None:
    response = factories.upload(
        client, world.owner, content, filename=filename, unit_column="patient"
    )
    assert response.status_code == 422
    body = response.json()
    assert body["field"] == "file"
    assert [(e["row"], e["column"]) for e in body["errors"]] == [
        (row, "patient") for row, _ in errors
    ]
    assert all(word in e["message"] for e, (_, word) in zip(body["errors"], errors, strict=True))
    assert _counts(db) == (0, 0)


@pytest.mark.parametrize(
    ("unit_column", "header"),
    [("patient", ("text", "label")), ("label", ("text", "label")), ("text", ("text", "label"))],
)
def test_a_bad_unit_column_is_refused_naming_the_field(
    client: TestClient,
    world: factories.World,
    db: Database,
    unit_column: str,
    header: tuple[str, ...],
) -> None:
    content = factories.csv_bytes(factories.ROWS, header=header)
    response = factories.upload(client, world.owner, content, unit_column=unit_column)
    assert response.status_code == 422
    assert response.json()["field"] == "unit_column"
    assert _counts(db) == (0, 0)
