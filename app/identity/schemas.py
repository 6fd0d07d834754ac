"""Organisations and API keys as the API shows them (a key's secret only once)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, Field

from app.datasets.schemas import not_a_boolean
from app.schemas import with_examples

# A name is printable text on one line: no control character (C0, DEL, C1), and no
# invisible format character that makes one name display as another (zero-width
# spaces and joiners, bidirectional marks, overrides and isolates, the BOM). Letters of
# every script pass, right-to-left ones included. The same rule serves every name.
_NAME_CHARACTER = r"[^\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff\ufff9-\ufffb]"
NAME_PATTERN = rf"^{_NAME_CHARACTER}+$"
OPTIONAL_NAME_PATTERN = rf"^{_NAME_CHARACTER}*$"
# Free text (a reason, a prompt): no control character but tabs and line breaks.
TEXT_PATTERN = r"^[^\x00-\x08\x0b\x0c\x0e-\x1f\x7f]*$"


class OrganisationIn(BaseModel):
    model_config = with_examples(
        {
            "name": "St Mary's Hospital",
            "kind": "owner",
            "epsilon_budget": 20.0,
            "delta_budget": 1e-05,
        },
        extra="forbid",
        allow_inf_nan=False,
    )

    name: str = Field(
        min_length=1,
        max_length=200,
        pattern=NAME_PATTERN,
        description="The organisation's name, unique on the server (1 to 200 characters)",
    )
    kind: Literal["owner", "client"] = Field(
        description="owner (uploads corpora and holds a privacy budget) or client (receives "
        "releases)"
    )
    # An owner organisation's privacy budget; the server's default when not given.
    epsilon_budget: Annotated[float | None, Field(gt=0, le=1e6), BeforeValidator(not_a_boolean)] = (
        Field(
            default=None,
            description="Owner organisations: the privacy budget's ε, which dataset caps are "
            "carved out of (> 0 to 1e6); null: the server's default. A client holds none",
        )
    )
    delta_budget: Annotated[float | None, Field(ge=0, lt=1), BeforeValidator(not_a_boolean)] = (
        Field(
            default=None,
            description="Owner organisations: the privacy budget's δ (0 to < 1); null: the "
            "server's default",
        )
    )


class OrganisationOut(BaseModel):
    model_config = with_examples(
        {
            "id": "d10493bc-a2dd-4889-9869-62e66a6cae0d",
            "name": "St Mary's Hospital",
            "kind": "owner",
            "epsilon_budget": 20.0,
            "delta_budget": 1e-05,
            "created_at": "2026-12-07T05:31:37.680719Z",
        },
        from_attributes=True,
    )

    id: uuid.UUID = Field(description="The organisation's id")
    name: str = Field(description="Its name, unique on the server")
    kind: Literal["platform", "owner", "client"] = Field(
        description="platform (the admins' and auditors'), owner or client"
    )
    epsilon_budget: float = Field(description="Owner organisations: the privacy budget's ε")
    delta_budget: float = Field(description="Owner organisations: the privacy budget's δ")
    created_at: datetime = Field(description="When it was created (UTC)")


class KeyIn(BaseModel):
    model_config = with_examples(
        {
            "role": "owner",
            "organisation_id": "d10493bc-a2dd-4889-9869-62e66a6cae0d",
            "name": "ingest",
        },
        extra="forbid",
    )

    role: Literal["owner", "client", "admin", "auditor"] = Field(
        description=(
            "owner or client (keys of that kind of organisation), admin or auditor (platform "
            "keys, no organisation)"
        )
    )
    organisation_id: uuid.UUID | None = Field(
        default=None, description="Required for owner and client keys"
    )
    name: str = Field(
        description="A name to tell keys apart (0 to 200 characters)",
        default="",
        max_length=200,
        pattern=OPTIONAL_NAME_PATTERN,
    )


_KEY_EXAMPLE = {
    "id": "ede1d769-15a2-4e80-a6f1-bc2ff5122c2c",
    "prefix": "80a3ce03e791",
    "name": "ingest",
    "role": "owner",
    "organisation_id": "d10493bc-a2dd-4889-9869-62e66a6cae0d",
    "created_at": "2026-12-07T05:31:37.680719Z",
    "last_used_at": None,
    "revoked_at": None,
}


class KeyOut(BaseModel):
    model_config = with_examples(_KEY_EXAMPLE, from_attributes=True)

    id: uuid.UUID = Field(description="The key's id")
    prefix: str = Field(
        description="The 12 hex characters after 'ks_' that identify the key (not secret)"
    )
    name: str = Field(description="The key's name")
    role: Literal["owner", "client", "admin", "auditor"] = Field(
        description="What the key may do: owner, client, admin or auditor"
    )
    organisation_id: uuid.UUID = Field(
        description="The organisation the key acts for (the platform's for admin and auditor keys)"
    )
    created_at: datetime = Field(description="When the key was made (UTC)")
    last_used_at: datetime | None = Field(
        description="When it last authenticated a request (UTC); null: never"
    )
    revoked_at: datetime | None = Field(description="When it was revoked (UTC); null: it is valid")


class KeyCreated(KeyOut):
    model_config = with_examples(
        {**_KEY_EXAMPLE, "key": "ks_80a3ce03e791_EXAMPLE-not-a-real-secret-0000000000000000000"}
    )

    key: str = Field(description="The API key. It is shown once and cannot be recovered.")
