"""The audit trail: one event per upload, job, release, download, key event, cap change,
organisation budget change, and dashboard sign-in, failed sign-in and sign-out.

``details`` holds ids, figures and names the caller chose (a dataset name, a reason),
never a document or a label of a private row.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy.orm import Session

from app.identity.policy import Actor
from app.ledger import repository
from app.logging import current_request_id
from app.models import AuditEvent, Organisation

EVENT_KINDS = (
    "organisation.created",
    "organisation.budget_changed",
    "key.created",
    "key.revoked",
    "user.created",
    "user.signed_in",
    "user.sign_in_failed",
    "user.signed_out",
    "dataset.uploaded",
    "dataset.deleted",
    "dataset.cap_changed",
    "vocabulary.uploaded",
    "job.submitted",
    "job.cancelled",
    "job.cancel_requested",
    "job.retried",
    "release.created",
    "release.downloaded",
)


def record(
    session: Session,
    kind: str,
    actor: Actor,
    *,
    organisation_id: uuid.UUID | None = None,
    target: tuple[str, uuid.UUID | str] | None = None,
    **details: Any,
) -> AuditEvent:
    if kind not in EVENT_KINDS:
        raise ValueError(f"unknown audit event kind {kind!r}")
    target_type, target_id = target if target else (None, None)
    return repository.add_event(
        session,
        AuditEvent(
            kind=kind,
            actor=actor.ref,
            actor_organisation_id=actor.organisation_id,
            organisation_id=organisation_id,
            target_type=target_type,
            target_id=str(target_id) if target_id is not None else None,
            details=details,
            request_id=current_request_id(),
        ),
    )


class Owned(Protocol):
    """A row that belongs to one organisation: a key, user, dataset, vocabulary, job or
    release."""

    @property
    def id(self) -> uuid.UUID: ...

    @property
    def organisation_id(self) -> uuid.UUID: ...


# The target type of an event whose kind's noun is not the type's name.
_TARGET_TYPES = {"key": "api_key"}


def record_about(
    session: Session, kind: str, actor: Actor, row: Owned | Organisation, /, **details: Any
) -> AuditEvent:
    """An event about one row: the row is its target, typed by the kind's noun
    (``job.submitted``: the job; ``key.revoked``: the api_key), and the row's organisation
    (an organisation's own id) is the organisation the event concerns."""
    noun = kind.partition(".")[0]
    owner = row.id if isinstance(row, Organisation) else row.organisation_id
    return record(
        session,
        kind,
        actor,
        organisation_id=owner,
        target=(_TARGET_TYPES.get(noun, noun), row.id),
        **details,
    )


@dataclass(frozen=True)
class EventFilter:
    organisation_id: uuid.UUID | None = None
    actor: str | None = None
    kinds: Sequence[str] = ()
    target_id: str | None = None
    since: datetime | None = None
    until: datetime | None = None


def list_events(
    session: Session, filters: EventFilter, *, before_id: int | None, limit: int
) -> tuple[Sequence[AuditEvent], int | None]:
    """A page of events, newest first, and the cursor of the next page (None: last)."""
    events = repository.find_events(
        session,
        organisation_id=filters.organisation_id,
        actor=filters.actor,
        kinds=filters.kinds,
        target_id=filters.target_id,
        since=filters.since,
        until=filters.until,
        before_id=before_id,
        limit=limit + 1,
    )
    if len(events) > limit:
        return events[:limit], events[limit - 1].id
    return events, None
