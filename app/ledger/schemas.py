"""Audit events as the API lists them; organisation budgets as the API shows and sets them."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from app.datasets.schemas import not_a_boolean
from app.identity.schemas import TEXT_PATTERN
from app.schemas import with_examples


class AuditEventOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int = Field(description="The event's id, increasing (the cursor of the next page)")
    kind: str = Field(
        description=(
            "What happened: organisation.created, key.revoked, dataset.created, job.submitted, "
            "release.downloaded, …"
        )
    )
    actor: str = Field(description="Who did it: 'key:<id>', 'user:<id>' or 'system:<name>'")
    actor_organisation_id: uuid.UUID | None = Field(
        description="The actor's organisation; null for the system"
    )
    organisation_id: uuid.UUID | None = Field(
        description="The organisation whose object the event is about"
    )
    target_type: str | None = Field(
        description="The kind of object acted on (dataset, job, release, key, …)"
    )
    target_id: str | None = Field(description="The id of the object acted on")
    details: dict[str, Any] = Field(
        description=(
            "Ids, figures and names the caller chose (a dataset name, a reason); never a document"
            " or a private label"
        )
    )
    request_id: str | None = Field(description="The X-Request-ID of the request that caused it")
    created_at: datetime = Field(description="When it happened (UTC)")


class AuditPage(BaseModel):
    model_config = with_examples(
        {
            "events": [
                {
                    "id": 12,
                    "kind": "job.submitted",
                    "actor": "key:cccfaeda-260b-4a37-8c96-00aca9e429c8",
                    "actor_organisation_id": "d10493bc-a2dd-4889-9869-62e66a6cae0d",
                    "organisation_id": "d10493bc-a2dd-4889-9869-62e66a6cae0d",
                    "target_type": "job",
                    "target_id": "523c53a8-ebfe-44c5-9e83-f3e18842f878",
                    "details": {
                        "dataset_id": "f46d80ee-c926-4bd9-bb6f-41353fbd3eb2",
                        "epsilon": 0.999999289,
                        "epsilon_by_mechanism": {"kde": 0.999999289},
                        "method": "dpkps",
                        "llm": "local",
                    },
                    "request_id": "bce4f090d5a548b6b38d970649c2137c",
                    "created_at": "2026-12-07T05:31:37.680719Z",
                }
            ],
            "next_cursor": 12,
        }
    )

    events: list[AuditEventOut] = Field(description="The page's events, newest first")
    next_cursor: int | None = Field(
        description="Pass as cursor= for the next page (older events); null: this is the last"
    )


class AmountOut(BaseModel):
    epsilon: float = Field(description="ε of the amount")
    delta: float = Field(description="δ of the amount")


class OrganisationBudgetOut(BaseModel):
    model_config = with_examples(
        {
            "organisation_id": "d10493bc-a2dd-4889-9869-62e66a6cae0d",
            "budget": {"epsilon": 20.0, "delta": 1e-05},
            "allocated": {"epsilon": 5.0, "delta": 1e-05},
            "remaining": {"epsilon": 15.0, "delta": 0.0},
            "datasets": 1,
            "spent": 0.0,
            "reserved": 0.872469478,
            "accountant": "pld(dp-accounting 0.6.0)",
        }
    )

    organisation_id: uuid.UUID = Field(description="The organisation")
    budget: AmountOut = Field(description="Set by admins")
    allocated: AmountOut = Field(
        description="Carved out by the organisation's datasets: the caps of live ones, "
        "what deleted ones spent"
    )
    remaining: AmountOut = Field(description="What new or raised dataset caps may take")
    datasets: int = Field(description="Its datasets counted in allocated (live and deleted)")
    spent: float | None = Field(
        description="ε of every committed release of the organisation's datasets, composed "
        "sequentially at the budget's δ (null: no finite ε at that δ)"
    )
    reserved: float | None = Field(
        description=(
            "ε of the committed and reserved releases of its datasets composed as spent is, "
            "minus spent (null: no finite ε at the budget's δ)"
        )
    )
    accountant: str = Field(description="What composed spent and reserved")


class BudgetChange(BaseModel):
    model_config = with_examples(
        {
            "epsilon": 30.0,
            "delta": 1e-05,
            "reason": "budget for 2027 agreed with the privacy office",
        },
        extra="forbid",
        allow_inf_nan=False,
    )

    epsilon: Annotated[float, Field(gt=0, le=1e6), BeforeValidator(not_a_boolean)] = Field(
        description="The organisation's new budget ε, > 0 to 1e6; at least what its datasets hold"
    )
    delta: Annotated[float, Field(ge=0, lt=1), BeforeValidator(not_a_boolean)] = Field(
        description="The new budget δ, 0 to < 1"
    )
    reason: str = Field(
        description="Why the budget changes, recorded in the audit trail",
        min_length=3,
        max_length=1000,
        pattern=TEXT_PATTERN,
    )
