"""Audit events as the API lists them; organisation budgets as the API shows and sets them."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from app.datasets.schemas import not_a_boolean
from app.identity.schemas import TEXT_PATTERN


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


class AmountOut(BaseModel):
    epsilon: float
    delta: float


class OrganisationBudgetOut(BaseModel):
    organisation_id: uuid.UUID
    budget: AmountOut = Field(description="Set by admins")
    allocated: AmountOut = Field(
        description="Carved out by the organisation's datasets: the caps of live ones, "
        "what deleted ones spent"
    )
    remaining: AmountOut = Field(description="What new or raised dataset caps may take")
    datasets: int
    spent: float | None = Field(
        description="ε of every committed release of the organisation's datasets, composed "
        "sequentially at the budget's δ (null: no finite ε at that δ)"
    )
    reserved: float | None
    accountant: str = Field(description="What composed spent and reserved")


class BudgetChange(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    epsilon: Annotated[float, Field(gt=0, le=1e6), BeforeValidator(not_a_boolean)]
    delta: Annotated[float, Field(ge=0, lt=1), BeforeValidator(not_a_boolean)]
    reason: str = Field(min_length=3, max_length=1000, pattern=TEXT_PATTERN)
