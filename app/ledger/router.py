"""``/v1/audit/events`` (the per-dataset ledger is served under ``/v1/datasets``)."""

from __future__ import annotations

import uuid
from typing import Annotated, Literal

from fastapi import APIRouter, Query
from pydantic import AwareDatetime

from app.deps import SessionDep, allowed
from app.errors import problems
from app.identity.policy import Action, Principal
from app.ledger import audit
from app.ledger.schemas import AuditEventOut, AuditPage

router = APIRouter(prefix="/v1/audit", tags=["audit"], responses=problems(401, 403, 422))
_PRINTABLE = r"^[^\x00-\x1f\x7f]+$"
EventKind = Literal[audit.EVENT_KINDS]  # type: ignore[valid-type]


@router.get("/events", response_model=AuditPage)
def list_events(
    session: SessionDep,
    principal: Annotated[Principal, allowed(Action.AUDIT_READ)],
    organisation_id: Annotated[
        uuid.UUID | None, Query(description="Events by or about this organisation")
    ] = None,
    actor: Annotated[
        str | None, Query(max_length=80, pattern=_PRINTABLE, description="e.g. key:<id>")
    ] = None,
    kind: Annotated[list[EventKind] | None, Query()] = None,
    target_id: Annotated[str | None, Query(max_length=64, pattern=_PRINTABLE)] = None,
    since: Annotated[AwareDatetime | None, Query()] = None,
    until: Annotated[AwareDatetime | None, Query()] = None,
    cursor: Annotated[
        int | None, Query(ge=1, le=2**63 - 1, description="next_cursor of the last page")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> AuditPage:
    """Newest first. Uploads, jobs, releases, downloads, key events and cap changes."""
    filters = audit.EventFilter(
        organisation_id=organisation_id,
        actor=actor,
        kinds=kind or (),
        target_id=target_id,
        since=since,
        until=until,
    )
    events, next_cursor = audit.list_events(session, filters, before_id=cursor, limit=limit)
    return AuditPage(
        events=[AuditEventOut.model_validate(e) for e in events], next_cursor=next_cursor
    )
