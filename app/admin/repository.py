"""SQL of the admin dashboard: its sessions, failed sign-ins, and the reads of a dataset
page that no API route needs (releases and downloads by dataset)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import delete, func, or_, select
from sqlalchemy.orm import Session

from app.db import add_row
from app.models import AdminSession, Download, Release, SignInFailure


def add_session(session: Session, record: AdminSession) -> AdminSession:
    return add_row(session, record)


def session_by_token_hash(session: Session, token_hash: str) -> AdminSession | None:
    return session.scalar(select(AdminSession).where(AdminSession.token_hash == token_hash))


def prune_sessions(session: Session, user_id: uuid.UUID, now: datetime) -> None:
    """Forget the user's ended or expired sessions (sign-ins and sign-outs stay audited)."""
    session.execute(
        delete(AdminSession).where(
            AdminSession.user_id == user_id,
            or_(AdminSession.ended_at.is_not(None), AdminSession.expires_at <= now),
        )
    )


def add_failure(session: Session, address: str, name: str, now: datetime) -> None:
    session.add(SignInFailure(address=address, name_digest=name, created_at=now))
    session.flush()


def failures_since(
    session: Session, address: str, since: datetime, *, name: str | None = None
) -> int:
    """Failed sign-ins from ``address`` since ``since`` (at the name of digest ``name``)."""
    query = select(func.count()).where(
        SignInFailure.address == address, SignInFailure.created_at >= since
    )
    if name is not None:
        query = query.where(SignInFailure.name_digest == name)
    return int(session.scalar(query) or 0)


def clear_failures(session: Session, address: str, name: str) -> None:
    session.execute(
        delete(SignInFailure).where(
            SignInFailure.address == address, SignInFailure.name_digest == name
        )
    )


def prune_failures(session: Session, before: datetime) -> None:
    session.execute(delete(SignInFailure).where(SignInFailure.created_at < before))


def releases_of_dataset(session: Session, dataset_id: uuid.UUID) -> Sequence[Release]:
    query = select(Release).where(Release.dataset_id == dataset_id)
    return session.scalars(query.order_by(Release.created_at.desc())).all()


def downloads_of_dataset(session: Session, dataset_id: uuid.UUID) -> Sequence[Download]:
    query = (
        select(Download)
        .join(Release, Release.id == Download.release_id)
        .where(Release.dataset_id == dataset_id)
        .order_by(Download.id.desc())
    )
    return session.scalars(query).all()
