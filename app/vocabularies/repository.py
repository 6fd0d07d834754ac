"""SQL for uploaded vocabularies."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db import add_row
from app.models import Vocabulary


def add(session: Session, vocabulary: Vocabulary) -> Vocabulary:
    return add_row(session, vocabulary)


def get(session: Session, vocabulary_id: uuid.UUID) -> Vocabulary | None:
    return session.get(Vocabulary, vocabulary_id)


def by_fingerprint(
    session: Session, organisation_id: uuid.UUID, fingerprint: str
) -> Vocabulary | None:
    query = select(Vocabulary).where(
        Vocabulary.organisation_id == organisation_id, Vocabulary.fingerprint == fingerprint
    )
    return session.scalar(query)


def list_vocabularies(session: Session, organisation_id: uuid.UUID | None) -> Sequence[Vocabulary]:
    query = select(Vocabulary).order_by(Vocabulary.created_at)
    if organisation_id is not None:
        query = query.where(Vocabulary.organisation_id == organisation_id)
    return session.scalars(query).all()
