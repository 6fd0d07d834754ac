"""SQL of the privacy ledger and the audit trail. Both tables are append-only."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from app.db import add_row, first_row
from app.models import AuditEvent, Dataset, LedgerEntry, LedgerReport, Organisation


def add_entry(session: Session, entry: LedgerEntry) -> LedgerEntry:
    return add_row(session, entry)


def entries_of_dataset(session: Session, dataset_id: uuid.UUID) -> Sequence[LedgerEntry]:
    query = select(LedgerEntry).where(LedgerEntry.dataset_id == dataset_id).order_by(LedgerEntry.id)
    return session.scalars(query).all()


def entries_of_job(session: Session, job_id: uuid.UUID) -> dict[str, LedgerEntry]:
    query = select(LedgerEntry).where(LedgerEntry.job_id == job_id)
    return {entry.kind: entry for entry in session.scalars(query)}


def add_report(session: Session, report: LedgerReport) -> LedgerReport:
    return add_row(session, report)


def report_of_job(session: Session, job_id: uuid.UUID) -> LedgerReport | None:
    return session.scalar(select(LedgerReport).where(LedgerReport.job_id == job_id))


def reports_of_dataset(session: Session, dataset_id: uuid.UUID) -> Sequence[LedgerReport]:
    query = select(LedgerReport).where(LedgerReport.dataset_id == dataset_id)
    return session.scalars(query.order_by(LedgerReport.id)).all()


def organisation(
    session: Session, organisation_id: uuid.UUID, *, for_update: bool = False
) -> Organisation | None:
    """The organisation; with ``for_update`` its row is locked (every change to what its
    datasets carve out of its budget takes this lock first)."""
    query = select(Organisation).where(Organisation.id == organisation_id)
    return first_row(session, query, for_update=for_update)


def datasets_of_organisation(session: Session, organisation_id: uuid.UUID) -> Sequence[Dataset]:
    query = select(Dataset).where(Dataset.organisation_id == organisation_id)
    return session.scalars(query.order_by(Dataset.created_at, Dataset.id)).all()


def entries_of_organisation(session: Session, organisation_id: uuid.UUID) -> Sequence[LedgerEntry]:
    query = (
        select(LedgerEntry)
        .join(Dataset, Dataset.id == LedgerEntry.dataset_id)
        .where(Dataset.organisation_id == organisation_id)
        .order_by(LedgerEntry.id)
    )
    return session.scalars(query).all()


def committed_epsilons(session: Session) -> Sequence[Decimal]:
    query = select(LedgerEntry.epsilon).where(LedgerEntry.kind == "commit")
    return session.scalars(query).all()


def add_event(session: Session, event: AuditEvent) -> AuditEvent:
    return add_row(session, event)


def find_events(
    session: Session,
    *,
    organisation_id: uuid.UUID | None,
    actor: str | None,
    kinds: Sequence[str],
    target_id: str | None,
    since: datetime | None,
    until: datetime | None,
    before_id: int | None,
    limit: int,
) -> Sequence[AuditEvent]:
    query = select(AuditEvent)
    if organisation_id is not None:
        query = query.where(
            or_(
                AuditEvent.organisation_id == organisation_id,
                AuditEvent.actor_organisation_id == organisation_id,
            )
        )
    if actor is not None:
        query = query.where(AuditEvent.actor == actor)
    if kinds:
        query = query.where(AuditEvent.kind.in_(kinds))
    if target_id is not None:
        query = query.where(AuditEvent.target_id == target_id)
    if since is not None:
        query = query.where(AuditEvent.created_at >= since)
    if until is not None:
        query = query.where(AuditEvent.created_at < until)
    if before_id is not None:
        query = query.where(AuditEvent.id < before_id)
    return session.scalars(query.order_by(AuditEvent.id.desc()).limit(limit)).all()
