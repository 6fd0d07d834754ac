"""Organisations and API keys as the API shows them (a key's secret only once)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from app.datasets.schemas import not_a_boolean

# A name is printable text on one line: no control character (C0, DEL, C1), and no
# invisible format character that makes one name display as another (zero-width
# spaces and joiners, bidirectional marks, overrides and isolates, the BOM). Letters of
# every script pass, right-to-left ones included. The same rule serves every name.
_NAME_CHARACTER = r"[^\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff\ufff9-\ufffb]"
NAME_PATTERN = rf"^{_NAME_CHARACTER}+$"
OPTIONAL_NAME_PATTERN = rf"^{_NAME_CHARACTER}*$"
# Free text (a reason, a prompt): no control character but tabs and line breaks.
TEXT_PATTERN = r"^[^\x00-\x08\x0b\x0c\x0e-\x1f\x7f]*$"
Name = Field(min_length=1, max_length=200, pattern=NAME_PATTERN)


class OrganisationIn(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = Name
    kind: Literal["owner", "client"]
    # An owner organisation's privacy budget; the server's default when not given.
    epsilon_budget: Annotated[float | None, Field(gt=0, le=1e6), BeforeValidator(not_a_boolean)] = (
        None
    )
    delta_budget: Annotated[float | None, Field(ge=0, lt=1), BeforeValidator(not_a_boolean)] = None


class OrganisationOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: uuid.UUID
    name: str
    kind: Literal["platform", "owner", "client"]
    epsilon_budget: float = Field(description="Owner organisations: the privacy budget's ε")
    delta_budget: float
    created_at: datetime


class KeyIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["owner", "client", "admin", "auditor"]
    organisation_id: uuid.UUID | None = Field(
        default=None, description="Required for owner and client keys"
    )
    name: str = Field(default="", max_length=200, pattern=OPTIONAL_NAME_PATTERN)


class KeyOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: uuid.UUID
    prefix: str
    name: str
    role: Literal["owner", "client", "admin", "auditor"]
    organisation_id: uuid.UUID
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None


class KeyCreated(KeyOut):
    key: str = Field(description="The API key. It is shown once and cannot be recovered.")
