"""Audit events as the API lists them."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict


class AuditEventOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    kind: str
    actor: str
    actor_organisation_id: uuid.UUID | None
    organisation_id: uuid.UUID | None
    target_type: str | None
    target_id: str | None
    details: dict[str, Any]
    request_id: str | None
    created_at: datetime


class AuditPage(BaseModel):
    events: list[AuditEventOut]
    next_cursor: int | None
