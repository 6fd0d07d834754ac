"""SQL for datasets and their (encrypted) documents."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from typing import Any

from sqlalchemy import delete, insert, select
from sqlalchemy.orm import Session

from app.db import add_row, first_row
from app.models import Dataset, Document, UploadDigest


def add(session: Session, dataset: Dataset) -> Dataset:
    return add_row(session, dataset)


def get(session: Session, dataset_id: uuid.UUID, *, for_update: bool = False) -> Dataset | None:
    return first_row(
        session, select(Dataset).where(Dataset.id == dataset_id), for_update=for_update
    )


def list_datasets(session: Session, organisation_id: uuid.UUID | None) -> Sequence[Dataset]:
    query = select(Dataset).order_by(Dataset.created_at.desc())
    if organisation_id is not None:
        query = query.where(Dataset.organisation_id == organisation_id)
    return session.scalars(query).all()


def deleted_ids(session: Session) -> Sequence[uuid.UUID]:
    return session.scalars(select(Dataset.id).where(Dataset.deleted_at.is_not(None))).all()


def insert_documents(session: Session, rows: Sequence[dict[str, Any]]) -> None:
    if rows:
        session.execute(insert(Document), list(rows))


def purge_documents(session: Session, dataset_id: uuid.UUID) -> int:
    purge_digests(session, dataset_id)
    result = session.execute(delete(Document).where(Document.dataset_id == dataset_id))
    return int(getattr(result, "rowcount", 0) or 0)


def iter_documents(
    session: Session, dataset_id: uuid.UUID, *, batch: int = 1000
) -> Iterator[Document]:
    """The dataset's documents in row order, a batch at a time (keyset pagination)."""
    last = 0
    while True:
        query = (
            select(Document)
            .where(Document.dataset_id == dataset_id, Document.row > last)
            .order_by(Document.row)
            .limit(batch)
        )
        chunk = session.scalars(query).all()
        if not chunk:
            return
        for document in chunk:
            yield document
            session.expunge(document)  # keep the identity map from growing with the corpus
        last = chunk[-1].row


DOCUMENT_COLUMNS = ("dataset_id", "row", "key_id", "nonce", "ciphertext", "unit")
_COPY_DOCUMENTS = f"COPY documents ({', '.join(DOCUMENT_COLUMNS)}) FROM STDIN (FORMAT BINARY)"
_DOCUMENT_TYPES = ["uuid", "int4", "varchar", "bytea", "bytea", "bytea"]


def _driver(session: Session) -> Any | None:
    """The psycopg connection of the session's transaction on Postgres (for COPY)."""
    connection = session.connection()
    if connection.dialect.name != "postgresql":
        return None
    return connection.connection.driver_connection


def copy_documents(session: Session, rows: Sequence[tuple[Any, ...]]) -> None:
    """Insert documents given as tuples of :data:`DOCUMENT_COLUMNS`: one binary COPY on
    Postgres, an executemany elsewhere."""
    if not rows:
        return
    driver = _driver(session)
    if driver is None:
        insert_documents(session, [dict(zip(DOCUMENT_COLUMNS, r, strict=True)) for r in rows])
        return
    with driver.cursor() as cursor, cursor.copy(_COPY_DOCUMENTS) as copy:
        copy.set_types(_DOCUMENT_TYPES)
        for values in rows:
            copy.write_row(values)


def known_digests(
    session: Session, dataset_id: uuid.UUID, digests: Sequence[bytes]
) -> dict[bytes, int]:
    """Which of ``digests`` the dataset's upload stored already, and their rows."""
    if not digests:
        return {}
    driver = _driver(session)
    if driver is not None:  # one array parameter, not one per digest
        with driver.cursor() as cursor:
            cursor.execute(
                "SELECT digest, row FROM upload_digests WHERE dataset_id = %s AND digest = ANY(%s)",
                (dataset_id, list(digests)),
            )
            return {bytes(digest): row for digest, row in cursor}
    query = select(UploadDigest.digest, UploadDigest.row).where(
        UploadDigest.dataset_id == dataset_id, UploadDigest.digest.in_(list(digests))
    )
    return {bytes(digest): row for digest, row in session.execute(query)}


def add_digests(session: Session, dataset_id: uuid.UUID, rows: Sequence[tuple[bytes, int]]) -> None:
    if not rows:
        return
    driver = _driver(session)
    if driver is None:
        session.execute(
            insert(UploadDigest),
            [{"dataset_id": dataset_id, "digest": d, "row": r} for d, r in rows],
        )
        return
    copy_sql = "COPY upload_digests (dataset_id, digest, row) FROM STDIN (FORMAT BINARY)"
    with driver.cursor() as cursor, cursor.copy(copy_sql) as copy:
        copy.set_types(["uuid", "bytea", "int4"])
        for digest, row in rows:
            copy.write_row((dataset_id, digest, row))


def purge_digests(session: Session, dataset_id: uuid.UUID) -> None:
    session.execute(delete(UploadDigest).where(UploadDigest.dataset_id == dataset_id))
