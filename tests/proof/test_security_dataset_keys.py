"""Deleted documents stay unreadable everywhere they linger (issue 14, item 13).

Deleting a dataset deletes its document rows, but copies of them linger: SQLite keeps
the pages in its WAL and free pages, Postgres keeps dead rows and WAL segments, and
every backup keeps them. They used to be sealed with the master key, which sits next to
the database file (``data.key``) and is needed by the service forever: anyone holding
the two could read a deleted dataset. Now each dataset's documents are sealed with a
data key of its own, kept (wrapped by the master key) in the keyring, and deleting the
dataset destroys that key. The proof plays the thief: every byte of the SQLite file, its
WAL, a backup taken before the deletion, the master key and the whole keyring, and
every key among them tried on every copy of every document.
"""

from __future__ import annotations

import base64
import os
import shutil
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import select

import migrations
from app.config import Settings
from app.crypto import DecryptionError, DocumentCipher, DocumentKey, KeyDestroyed
from app.db import Database
from app.main import create_app
from app.models import Document
from tests.service import factories


@pytest.fixture
def embedded(tmp_path: Path) -> Iterator[FastAPI]:
    settings = Settings(
        data_dir=tmp_path, database_url="", data_key="", broker_url="memory://"
    ).model_copy(update={"max_upload_bytes": 2**20})
    migrations.upgrade(settings.sqlalchemy_url)
    app = create_app(settings)
    yield app
    app.state.database.dispose()


def _corpus(token: str, rows: int) -> tuple[bytes, list[str]]:
    texts = [f"canary {token} patient {i} has a rare condition {'x' * 40}" for i in range(rows)]
    records = [(text, factories.LABELS[i % 2]) for i, text in enumerate(texts)]
    return factories.csv_bytes(records), texts


def _documents(db: Database, dataset_id: str) -> list[Document]:
    with db.session() as session:
        query = select(Document).where(Document.dataset_id == uuid.UUID(dataset_id))
        return list(session.scalars(query.order_by(Document.row)))


def _raw(*paths: Path) -> bytes:
    """Every byte of the files (those that exist), as a thief copying them would get."""
    return b"".join(path.read_bytes() for path in paths if path.exists())


def _every_key(data_dir: Path, keyring: Path) -> list[DocumentKey]:
    """Every key a thief of the data folder holds: the master key, and each data key
    the keyring still wraps (unwrapped with the master key)."""
    master = base64.b64decode((data_dir / "data.key").read_text())
    cipher = DocumentCipher(master, keyring)
    keys = [DocumentKey(master)]
    for path in sorted(keyring.glob("*.key")):
        keys.append(cipher.dataset_key(uuid.UUID(path.stem)))
    return keys


def _text(opener: DocumentCipher | DocumentKey, document: Any, key_id: str | None = None) -> str:
    """The text of ``document`` (a row, ORM or not) opened with ``opener``."""
    dataset_id = uuid.UUID(str(document.dataset_id))
    key = key_id or document.key_id
    return opener.open(dataset_id, document.row, key, document.nonce, document.ciphertext)[0]


def _opens(keys: list[DocumentKey], document: Document) -> bool:
    """Whether any of ``keys`` opens ``document`` (tried as the key that sealed it)."""
    for key in keys:
        try:
            _text(key, document, key.key_id)
        except DecryptionError:
            continue
        return True
    return False


def test_a_deleted_dataset_cannot_be_read_from_the_sqlite_file_its_wal_or_a_backup(
    embedded: FastAPI, tmp_path: Path
) -> None:
    client = TestClient(embedded)
    database: Database = embedded.state.database
    cipher: DocumentCipher = embedded.state.cipher
    world = factories.build_world(database)
    token = uuid.uuid4().hex
    content, texts = _corpus(token, 60)
    doomed = factories.dataset(client, world.owner, content=content, cap=5)
    kept = factories.dataset(client, world.owner, cap=5)
    stored = _documents(database, doomed)
    assert [_text(cipher, d) for d in stored] == texts
    assert {d.key_id for d in stored} == {cipher.dataset_key(uuid.UUID(doomed)).key_id}
    assert cipher.key_id not in {d.key_id for d in stored}  # not the master key

    files = [tmp_path / "keyseed.sqlite3", tmp_path / "keyseed.sqlite3-wal"]
    backup = tmp_path / "backup"
    backup.mkdir()
    for path in files:
        if path.exists():
            shutil.copy(path, backup / path.name)
    # before the deletion, a thief of the folder reads every document: the control
    keys = _every_key(tmp_path, cipher.keyring)
    raw = _raw(*files)
    assert all(d.ciphertext in raw and _opens(keys, d) for d in stored)

    deleted = client.delete(f"/v1/datasets/{doomed}", headers=world.owner.headers)
    assert deleted.status_code == 200, deleted.text
    assert _documents(database, doomed) == []
    assert not cipher.has_key(uuid.UUID(doomed))
    with pytest.raises(KeyDestroyed):
        cipher.dataset_key(uuid.UUID(doomed))

    raw_after = _raw(*files)
    raw_backup = _raw(*(backup / path.name for path in files))
    lingering = [d for d in stored if d.ciphertext in raw_after]
    assert lingering, "SQLite kept no copy: the proof would show nothing"
    assert all(d.ciphertext in raw_backup for d in stored)
    keys = _every_key(tmp_path, cipher.keyring)
    assert len(keys) == 2  # the master key and the kept dataset's key
    assert not any(_opens(keys, d) for d in stored)
    everything = raw_after + raw_backup + _raw(*sorted(tmp_path.rglob("*.key")))
    assert token.encode() not in everything
    # the other dataset is untouched
    others = _documents(database, kept)
    assert others and all(_opens(keys, d) for d in others)
    factories.job(client, world.owner, kept)


def test_a_backup_of_the_postgres_database_opens_no_deleted_document(
    app: FastAPI, client: TestClient, world: factories.World, db: Database
) -> None:
    cipher: DocumentCipher = app.state.cipher
    content, texts = _corpus(uuid.uuid4().hex, 20)
    doomed = factories.dataset(client, world.owner, content=content, cap=5)
    backup = _documents(db, doomed)  # the rows as a backup taken now holds them
    master = DocumentKey(base64.b64decode(factories_data_key(app)))
    assert [_text(cipher, d) for d in backup] == texts
    assert client.delete(f"/v1/datasets/{doomed}", headers=world.owner.headers).status_code == 200
    keys = [master] + [cipher.dataset_key(uuid.UUID(p.stem)) for p in cipher.keyring.glob("*.key")]
    assert not any(_opens(keys, d) for d in backup)


def factories_data_key(app: FastAPI) -> str:
    settings: Settings = app.state.settings
    return settings.data_key.get_secret_value()


def test_the_migration_moves_documents_to_dataset_keys_and_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    master = os.urandom(32)
    keyring = tmp_path / "keyring"
    monkeypatch.setenv("KEYSEED_DATA_KEY", base64.b64encode(master).decode())
    monkeypatch.setenv("KEYSEED_KEYRING_DIR", str(keyring))
    url = f"sqlite:///{tmp_path / 'keyseed.sqlite3'}"
    migrations.upgrade(url, "0002")
    legacy = DocumentKey(master)  # documents sealed with the master key, as before
    engine = sa.create_engine(url)
    tables = sa.MetaData()
    tables.reflect(engine)  # the schema of revision 0002 (ids are CHAR(32) hex on SQLite)
    organisation, datasets = uuid.uuid4(), [uuid.uuid4(), uuid.uuid4()]
    texts = {(d, row): f"note {i} of {d}" for i, d in enumerate(datasets) for row in (1, 2, 3)}
    now = datetime.now(UTC).replace(tzinfo=None)
    with engine.begin() as connection:
        connection.execute(
            tables.tables["organisations"].insert(),
            {"id": organisation.hex, "name": "h", "kind": "owner", "created_at": now},
        )
        for dataset_id in datasets:
            connection.execute(
                tables.tables["datasets"].insert(),
                {
                    "id": dataset_id.hex,
                    "organisation_id": organisation.hex,
                    "name": "d",
                    "format": "csv",
                    "text_columns": ["text"],
                    "label_column": "label",
                    "labels": ["a"],
                    "epsilon_cap": 1.0,
                    "delta_cap": 0.0,
                    "documents": 3,
                    "skipped_empty": 0,
                    "skipped_duplicate": 0,
                    "upload_bytes": 10,
                    "created_by": "system:test",
                    "created_at": now,
                },
            )
        for (dataset_id, row), text in texts.items():
            nonce, sealed = legacy.seal(dataset_id, row, text, "a")
            connection.execute(
                tables.tables["documents"].insert(),
                {
                    "dataset_id": dataset_id.hex,
                    "row": row,
                    "key_id": legacy.key_id,
                    "nonce": nonce,
                    "ciphertext": sealed,
                },
            )

    def stored() -> list[sa.Row[tuple[object, ...]]]:
        documents = sa.Table("documents", sa.MetaData(), autoload_with=engine)
        with engine.connect() as connection:
            return list(connection.execute(sa.select(documents).order_by(documents.c.id)))

    try:
        migrations.upgrade(url)
        cipher = DocumentCipher(master, keyring)
        after = stored()
        for document in after:
            dataset_id = uuid.UUID(str(document.dataset_id))
            key = cipher.dataset_key(dataset_id)
            assert document.key_id == key.key_id != legacy.key_id
            assert _text(key, document) == texts[(dataset_id, document.row)]
        assert sorted(p.stem for p in keyring.glob("*.key")) == sorted(map(str, datasets))

        migrations.downgrade(url, "0002")
        for document in stored():
            dataset_id = uuid.UUID(str(document.dataset_id))
            assert _text(legacy, document) == texts[(dataset_id, document.row)]
        assert list(keyring.glob("*.key")) == []
        migrations.upgrade(url)  # and up again
        assert len(list(keyring.glob("*.key"))) == 2
    finally:
        engine.dispose()
