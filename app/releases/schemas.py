"""Releases: a finished job's corpus, granted to named client organisations."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from app.identity.schemas import NAME_PATTERN
from app.schemas import with_examples


class ReleaseIn(BaseModel):
    model_config = with_examples(
        {
            "client_organisations": ["fcb94377-2577-44f9-a5b4-260219ff432f"],
            "name": "cardiology synthetic v1",
        },
        extra="forbid",
    )

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
    model_config = with_examples(
        {
            "id": "7c1e2b9a-3f4d-4e8a-9b6c-2d1f0e9a8b7c",
            "job_id": "523c53a8-ebfe-44c5-9e83-f3e18842f878",
            "dataset_id": "f46d80ee-c926-4bd9-bb6f-41353fbd3eb2",
            "organisation_id": "d10493bc-a2dd-4889-9869-62e66a6cae0d",
            "name": "cardiology synthetic v1",
            "documents": 100,
            "grantees": ["fcb94377-2577-44f9-a5b4-260219ff432f"],
            "manifest": {
                "method": "dpkps",
                "epsilon": 0.872469478,
                "delta": 1e-05,
                "accountant": "pld(dp-accounting 0.6.0)",
                "labels": ["cardio", "ortho"],
                "documents": 100,
            },
            "created_by": "key:cccfaeda-260b-4a37-8c96-00aca9e429c8",
            "created_at": "2026-12-07T05:31:37.680719Z",
        }
    )

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
