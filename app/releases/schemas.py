"""Releases: a finished job's corpus, granted to named client organisations."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from app.identity.schemas import NAME_PATTERN


class ReleaseIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    client_organisations: list[uuid.UUID] = Field(
        description="The client organisations that may download the corpus (1 to 100 ids)",
        min_length=1,
        max_length=100,
    )
    name: str | None = Field(
        description="The release's name; null, the default: 'job <job id>'",
        default=None,
        min_length=1,
        max_length=200,
        pattern=NAME_PATTERN,
    )


class ReleaseOut(BaseModel):
    id: uuid.UUID = Field(description="The release's id")
    job_id: uuid.UUID = Field(description="The job whose synthetic corpus is released")
    dataset_id: uuid.UUID = Field(description="The dataset the job ran on")
    organisation_id: uuid.UUID = Field(description="The owner organisation that released it")
    name: str = Field(description="The release's name")
    documents: int = Field(description="Synthetic documents in the corpus")
    grantees: list[uuid.UUID] = Field(
        description="Client organisations granted the release (a client sees only its own)"
    )
    manifest: dict[str, Any] = Field(
        description=(
            "The public description of the corpus: method and parameters, privacy budget and "
            "accountant, models, labels, counts (DP outputs only)"
        )
    )
    created_by: str = Field(description="Who released it: 'key:<id>' or 'user:<id>'")
    created_at: datetime = Field(description="When it was released (UTC)")
