"""SQL for datasets and their (encrypted) documents."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from typing import Any

from sqlalchemy import delete, insert, select
from sqlalchemy.orm import Session

from app.models import Dataset, Document


def add(session: Session, dataset: Dataset) -> Dataset:
    session.add(dataset)
    session.flush()
    return dataset


def get(session: Session, dataset_id: uuid.UUID, *, for_update: bool = False) -> Dataset | None:
    query = select(Dataset).where(Dataset.id == dataset_id)
    if for_update:
        query = query.with_for_update()
        # The row may be in the identity map already: read the locked version.
        query = query.execution_options(populate_existing=True)
    return session.scalar(query)


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
