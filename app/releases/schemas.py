"""Releases: a finished job's corpus, granted to named client organisations."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from app.identity.schemas import NAME_PATTERN


class ReleaseIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    client_organisations: list[uuid.UUID] = Field(min_length=1, max_length=100)
    name: str | None = Field(default=None, min_length=1, max_length=200, pattern=NAME_PATTERN)


class ReleaseOut(BaseModel):
    id: uuid.UUID
    job_id: uuid.UUID
    dataset_id: uuid.UUID
    organisation_id: uuid.UUID
    name: str
    documents: int
    grantees: list[uuid.UUID] = Field(
        description="Client organisations granted the release (a client sees only its own)"
    )
    manifest: dict[str, Any]
    created_by: str
    created_at: datetime
