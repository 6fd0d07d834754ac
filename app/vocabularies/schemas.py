"""Vocabularies as the API lists them (metadata only, not the phrases)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Literal

from pydantic import BaseModel


class VocabularyOut(BaseModel):
    id: str  # a built-in's name, or an uploaded vocabulary's id
    kind: Literal["builtin", "uploaded"]
    name: str
    size: int
    fingerprint: str
    description: str
    source: str
    licence: str
    organisation_id: uuid.UUID | None
    created_at: datetime | None
