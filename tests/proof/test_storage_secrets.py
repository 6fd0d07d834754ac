"""What a stolen database reveals: no API key (only SHA-256 hashes of them), no document
text and no row's label (documents are AES-GCM sealed by the application), checked on a
raw ``pg_dump`` of the test database. Logs and responses are checked on the way.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Callable

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.engine import make_url

from app.crypto import DocumentCipher
from app.db import Database
from app.models import Base, Document
from tests.proof.conftest import nothing_stored
from tests.service import factories

_COPY = re.compile(r"^COPY public\.(\w+) \(.*\) FROM stdin;$")


def pg_dump(database_url: str) -> str:
    """The whole database (schema and rows) as ``pg_dump`` prints it."""
    url = make_url(database_url)
    env = {**os.environ}
    if url.password:
        env["PGPASSWORD"] = str(url.password)
    command = [
        "pg_dump",
        "--no-owner",
        "--no-privileges",
        "--host",
        url.host or "127.0.0.1",
        "--port",
        str(url.port or 5432),
        "--username",
        url.username or "postgres",
        url.database or "",
    ]
    result = subprocess.run(command, env=env, capture_output=True, timeout=120, check=True)
    return result.stdout.decode("utf-8")


def copy_dump(db: Database) -> str:
    """Every row of every table as ``COPY … TO STDOUT`` prints it, in pg_dump's layout."""
    parts: list[str] = []
    connection = db.engine.raw_connection()
    try:
        cursor = connection.cursor()
        for table in Base.metadata.sorted_tables:
            columns = ", ".join(c.name for c in table.columns)
            parts.append(f"COPY public.{table.name} ({columns}) FROM stdin;")
            with cursor.copy(f'COPY "{table.name}" TO STDOUT') as copy:  # type: ignore[attr-defined]
                parts.append(b"".join(bytes(chunk) for chunk in copy).decode("utf-8"))
            parts.append("\\.")
    finally:
        connection.close()
    return "\n".join(parts)


def raw_dumps(database_url: str, db: Database) -> list[str]:
    """The rows through ``COPY``, and ``pg_dump``'s whole dump when the client is
    installed (it is beside Postgres): the check never silently goes away."""
    dumps = [copy_dump(db)]
    if shutil.which("pg_dump"):
        dumps.append(pg_dump(database_url))
    return dumps


@pytest.fixture
def dumps(database_url: str, db: Database) -> Callable[[], list[str]]:
    """``dumps()``: :func:`raw_dumps` of the test's database as it is at the call."""
    return lambda: raw_dumps(database_url, db)


def tables_holding(dump: str, needle: str) -> set[str]:
    """The tables whose rows in ``dump`` contain ``needle`` (``schema`` for DDL)."""
    found: set[str] = set()
    table = "schema"
    for line in dump.splitlines():
        match = _COPY.match(line)
        if match:
            table = match.group(1)
            continue
        if line == "\\.":
            table = "schema"
            continue
        if needle in line:
            found.add(table)
    return found


def encodings(text: str) -> list[str]:
    """How ``text`` would show in a dump if it were stored as it is: as text (also
    JSON-escaped) or as bytea (pg_dump prints hex)."""
    raw = text.encode("utf-8")
    return [text, json.dumps(text)[1:-1], raw.hex(), raw.hex().upper()]


def test_api_keys_are_stored_only_as_hashes(
    client: TestClient,
    world: factories.World,
    dumps: Callable[[], list[str]],
    log_lines: list[str],
) -> None:
    created = client.post(
        "/v1/keys",
        headers=world.admin.headers,
        json={"role": "client", "organisation_id": str(world.client.organisation_id)},
    )
    assert created.status_code == 201
    keys = [caller.key for caller in world.callers().values()] + [created.json()["key"]]
    for key in keys:  # each key used once more, so that any request log would hold it
        assert client.get("/v1/keys", headers=factories.auth(key)).status_code == 200
    listed = client.get("/v1/keys", headers=world.admin.headers).text
    logs = "\n".join(log_lines)
    assert logs.count('"http.request"') >= len(keys)
    for dump in dumps():
        _no_key_in(dump, keys)
    for key in keys:
        for shown in _forms_of(key):
            assert shown not in listed and shown not in logs


def _forms_of(key: str) -> tuple[str, str]:
    """An API key as it is given out, and its secret part alone."""
    return key, key.split("_", 2)[2]


def _no_key_in(dump: str, keys: list[str]) -> None:
    assert "COPY public.api_keys" in dump
    for key in keys:
        for shown in _forms_of(key):
            for form in encodings(shown):
                assert form not in dump
        assert tables_holding(dump, hashlib.sha256(key.encode()).hexdigest()) == {"api_keys"}


def _canary_corpus(token: str, rows: int) -> tuple[bytes, list[str], tuple[str, str]]:
    labels = (f"lbl-{token}-alpha", f"lbl-{token}-beta")
    texts = [f"canary {token} patient {i} has a rare condition" for i in range(rows)]
    records = [(text, labels[i % 2]) for i, text in enumerate(texts)]
    return factories.csv_bytes(records), texts, labels


def test_a_raw_database_dump_holds_no_document_text_nor_row_label(
    app: FastAPI,
    client: TestClient,
    world: factories.World,
    db: Database,
    dumps: Callable[[], list[str]],
    log_lines: list[str],
) -> None:
    token = uuid.uuid4().hex
    content, texts, labels = _canary_corpus(token, 40)
    response = factories.upload(client, world.owner, content, labels=labels, cap=10)
    assert response.status_code == 201, response.text
    dataset_id = uuid.UUID(response.json()["id"])
    jsonl = "\n".join(
        json.dumps({"note": f"jsonl {text}", "label": labels[0]}) for text in texts[:5]
    ).encode()
    second = factories.upload(
        client, world.owner, jsonl, filename="n.jsonl", labels=labels, text_columns=("note",)
    )
    assert second.status_code == 201
    refused_text = f"refused {token} document"
    refused = factories.csv_bytes([(refused_text, f"undeclared-{token}")])
    with nothing_stored(db):
        failed = factories.upload(client, world.owner, refused, labels=labels)
    assert failed.status_code == 422 and token not in failed.text
    job_id = factories.job(client, world.owner, str(dataset_id), llm="vllm")
    factories.run_job(db, job_id, texts=["synthetic one", "synthetic two", "synthetic three"])
    for path in (f"/v1/datasets/{dataset_id}", f"/v1/datasets/{dataset_id}/ledger"):
        assert token not in client.get(path, headers=world.owner.headers).text.replace(
            labels[0], ""
        ).replace(labels[1], "")
    logs = "\n".join(log_lines)
    assert '"http.request"' in logs
    secrets = [*texts, refused_text, f"undeclared-{token}", *(f"jsonl {t}" for t in texts[:5])]
    assert token not in logs, "a log line quotes an upload"
    dumped = dumps()
    for dump in dumped:
        assert "COPY public.documents" in dump
        for text in secrets:
            assert token in text
            for form in encodings(text):
                assert form not in dump, "a document's text is in the dump"
        # A label set is declared by the uploader: public schema, on the dataset row;
        # the ledger's releases name the class they were made for (a declared label).
        # Which row has which label is private: no row-level table holds a label.
        per_class = {"datasets", "ledger_entries", "ledger_reports", "jobs"}
        for label in labels:
            holders = set().union(*(tables_holding(dump, form) for form in encodings(label)))
            assert "datasets" in holders and holders <= per_class, holders

    # The documents are there, sealed: they open with their dataset's key only.
    cipher: DocumentCipher = app.state.cipher
    with db.session() as session:
        stored = session.scalars(
            select(Document).where(Document.dataset_id == dataset_id).order_by(Document.row)
        ).all()
    assert len(stored) == 40
    opened = [cipher.open(d.dataset_id, d.row, d.key_id, d.nonce, d.ciphertext) for d in stored]
    assert [text for text, _ in opened] == texts
    assert [label for _, label in opened] == [labels[i % 2] for i in range(40)]
    # which key sealed them (the dataset's own), not the key; the master key never does
    dataset_key = cipher.dataset_key(dataset_id)
    assert all(dataset_key.key_id in dump for dump in dumped)
    assert {d.key_id for d in stored} == {dataset_key.key_id} != {cipher.key_id}
