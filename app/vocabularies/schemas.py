"""Vocabularies as the API lists them (metadata only, not the phrases)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field


class VocabularyOut(BaseModel):
    id: str = Field(
        description=(
            "A built-in's name, or an uploaded vocabulary's id: what a job spec's vocabulary names"
        )
    )
    kind: Literal["builtin", "uploaded"] = Field(
        description="builtin (shipped with the server) or uploaded (by an owner organisation)"
    )
    name: str = Field(description="Its name")
    size: int = Field(description="Phrases in it")
    fingerprint: str = Field(
        description=(
            "A hash of its phrases: the same list has the same fingerprint (it keys the embedding"
            " cache and is recorded in manifests)"
        )
    )
    description: str = Field(description="What the phrases are")
    source: str = Field(description="Where the phrases come from")
    licence: str = Field(description="The licence the phrases are under")
    organisation_id: uuid.UUID | None = Field(
        description="The organisation that uploaded it; null for built-ins"
    )
    created_at: datetime | None = Field(
        description="When it was uploaded (UTC); null for built-ins"
    )
