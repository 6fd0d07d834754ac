"""What the API shows of a dataset: metadata, declared labels, budget, and to its owner
alone the sizes of the upload; never text."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from app.schemas import BUDGET_EXAMPLE, KDE_EVENTS_EXAMPLE, with_examples

MAX_EPSILON = 1000.0


def not_a_boolean(value: Any) -> Any:
    """Refuse ``true``/``false`` where a number is asked (pydantic would read 1 and 0)."""
    if isinstance(value, bool):
        raise ValueError("true or false is not accepted here")
    return value


# A privacy parameter: finite (``allow_inf_nan=False`` on the models), positive, bounded.
# (The bounds come first: after a validator they would be missing from the JSON schema.)
# A cap below the smallest ε one mechanism may spend could never hold a job; and stored
# in the ledger's fixed units it could round to nothing.
MIN_EPSILON_CAP = 1e-3
Epsilon = Annotated[
    float, Field(ge=MIN_EPSILON_CAP, le=MAX_EPSILON), BeforeValidator(not_a_boolean)
]


class BudgetOut(BaseModel):
    """Every ε is the accountant's composition at the cap's δ."""

    epsilon_cap: float = Field(description="The dataset's cap ε: what its jobs may spend in all")
    delta_cap: float = Field(description="The cap's δ, at which every ε here is composed")
    spent: float = Field(description="ε of the committed jobs' releases, composed")
    reserved: float = Field(
        description="ε of the committed and reserved jobs' releases composed, minus spent"
    )
    remaining: float = Field(
        description=(
            "ε left for new jobs: the cap minus spent and reserved (may be below 0 after an admin"
            " lowered the cap)"
        )
    )
    accountant: str = Field(description="What composed the figures")


_RAW = "A raw count of the upload (not DP): the owning organisation's keys only, else null"
RAW_COUNTS = ("documents", "skipped_empty", "skipped_duplicate", "upload_bytes")


class DatasetOut(BaseModel):
    model_config = with_examples(
        {
            "id": "f46d80ee-c926-4bd9-bb6f-41353fbd3eb2",
            "organisation_id": "d10493bc-a2dd-4889-9869-62e66a6cae0d",
            "name": "cardiology notes 2025",
            "format": "csv",
            "text_columns": ["text"],
            "label_column": "label",
            "labels": ["cardio", "ortho"],
            "unit_column": "patient_id",
            "documents": 1840,
            "skipped_empty": 3,
            "skipped_duplicate": 12,
            "upload_bytes": 2351904,
            "state": "ready",
            "created_at": "2026-12-07T05:31:37.680719Z",
            "deleted_at": None,
            "budget": BUDGET_EXAMPLE,
        },
        from_attributes=True,
    )

    id: uuid.UUID = Field(description="The dataset's id")
    organisation_id: uuid.UUID = Field(description="The owner organisation")
    name: str = Field(description="The name given at upload")
    format: str = Field(description="csv or jsonl")
    text_columns: list[str] = Field(
        description="The columns whose text makes each document (joined in this order)"
    )
    label_column: str = Field(description="The column holding each row's label")
    labels: list[str] = Field(description="The declared label set (public schema)")
    unit_column: str | None = Field(
        description="The column naming each row's privacy unit; null: each row is its own unit"
    )
    # Raw facts about the private upload (not DP): shown to the owning organisation only,
    # null for everyone else (docs/privacy.md).
    documents: int | None = Field(description=_RAW)
    skipped_empty: int | None = Field(description=_RAW)
    skipped_duplicate: int | None = Field(description=_RAW)
    upload_bytes: int | None = Field(description=_RAW)
    state: Literal["uploading", "ready"] = Field(
        description="``uploading`` while a resumable upload appends chunks (no job runs "
        "on it), ``ready`` once sealed"
    )
    created_at: datetime = Field(description="When the dataset was uploaded (UTC)")
    deleted_at: datetime | None = Field(
        description="When its documents were destroyed (UTC); null while it is live"
    )
    budget: BudgetOut = Field(description="The cap and what jobs have spent and reserved of it")


class UploadOut(BaseModel):
    """Where a resumable upload stands: send the file on from byte ``offset``."""

    model_config = with_examples(
        {
            "dataset_id": "f46d80ee-c926-4bd9-bb6f-41353fbd3eb2",
            "state": "uploading",
            "offset": 268435456,
            "max_upload_bytes": 17179869184,
            "max_upload_request_bytes": 268435456,
        }
    )

    dataset_id: uuid.UUID = Field(description="The dataset the upload fills")
    state: Literal["uploading", "ready"] = Field(description="``ready``: sealed")
    offset: int = Field(description="Bytes of the file committed: the next chunk starts here")
    max_upload_bytes: int = Field(description="KEYSEED_MAX_UPLOAD_BYTES: the whole file's limit")
    max_upload_request_bytes: int = Field(
        description="The most bytes one chunk carries (KEYSEED_MAX_UPLOAD_REQUEST_BYTES, "
        "or less where the whole file's limit is lower)"
    )


class CapChange(BaseModel):
    model_config = with_examples(
        {"epsilon_cap": 8.0, "reason": "second study approved by the board"},
        extra="forbid",
        allow_inf_nan=False,
    )

    epsilon_cap: Epsilon = Field(
        description=(
            "The new cap ε, 0.001 to 1000; lowering it below what is spent and reserved refuses "
            "new jobs, raising it takes from the organisation's budget"
        )
    )
    delta_cap: Annotated[float | None, Field(ge=0, lt=1), BeforeValidator(not_a_boolean)] = Field(
        default=None, description="The new cap δ, 0 to < 1; null, the default: unchanged"
    )
    reason: str = Field(
        description="Why the cap changes, recorded in the audit trail (3 to 1000 characters)",
        min_length=3,
        max_length=1000,
        pattern=r"^[^\x00-\x08\x0b-\x1f\x7f]+$",
    )


class LedgerEntryOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int = Field(description="The entry's id (entries are appended, never edited)")
    job_id: uuid.UUID = Field(description="The job the entry charges")
    kind: str = Field(
        description=(
            "reserve (held at submission), commit (spent at the first private read) or release (a"
            " reservation handed back)"
        )
    )
    epsilon: float = Field(description="The job's releases composed at delta")
    delta: float = Field(description="The δ at which epsilon is composed (the cap's)")
    epsilon_by_mechanism: dict[str, Any] = Field(
        description="ε of each mechanism of the job (vocabulary, kde, count, …)"
    )
    events: list[dict[str, Any]] = Field(
        description="Every release the entry stands for: mechanism, noise and its scale, "
        "sensitivity and its norm, dimension, partition, count and the ε of each"
    )
    accountant: str = Field(description="What composed epsilon")
    actor: str = Field(
        description="Who caused the entry: 'key:<id>', 'user:<id>' or 'system:<name>'"
    )
    created_at: datetime | None = Field(
        description=(
            "When the entry was written (UTC). Null to others than the dataset's owner for an "
            "entry a worker wrote (a commit, at the job's start: it follows the jobs before it, "
            "whose durations depend on their private corpora)"
        )
    )


class LedgerReportOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int = Field(description="The report's id")
    job_id: uuid.UUID = Field(description="The job whose engine recorded these releases")
    epsilon: float = Field(description="ε of the reported releases composed at delta")
    delta: float = Field(description="The δ at which epsilon is composed (the cap's)")
    events: list[dict[str, Any]] = Field(
        description="Every release the engine made, as it recorded them (public figures)"
    )
    accountant: str = Field(description="The accountant that composed epsilon")
    actor: str = Field(description="Who wrote the report (a worker: 'system:<name>')")
    created_at: datetime | None = Field(
        description=(
            "When the report was written (UTC), at the end of the job's private stages; null "
            "to others than the dataset's owner (it would time them)"
        )
    )
    differences: list[str] = Field(
        default_factory=list,
        description="Releases charged but not reported, reported but not charged, or "
        "costing more than charged (empty: the report matches the ledger)",
    )


class LedgerOut(BaseModel):
    model_config = with_examples(
        {
            "dataset_id": "f46d80ee-c926-4bd9-bb6f-41353fbd3eb2",
            "budget": BUDGET_EXAMPLE,
            "entries": [
                {
                    "id": 1,
                    "job_id": "523c53a8-ebfe-44c5-9e83-f3e18842f878",
                    "kind": "reserve",
                    "epsilon": 0.872469478,
                    "delta": 1e-05,
                    "epsilon_by_mechanism": {"kde": 0.999999289},
                    "events": KDE_EVENTS_EXAMPLE,
                    "accountant": "pld(dp-accounting 0.6.0)",
                    "actor": "key:cccfaeda-260b-4a37-8c96-00aca9e429c8",
                    "created_at": "2026-12-07T05:31:37.680719Z",
                }
            ],
            "reports": [],
        }
    )

    dataset_id: uuid.UUID = Field(description="The dataset")
    budget: BudgetOut = Field(description="The dataset's cap and what is spent and reserved of it")
    entries: list[LedgerEntryOut] = Field(
        description="Every ledger entry of the dataset, oldest first"
    )
    reports: list[LedgerReportOut] = Field(
        description="Per job, the releases its engine made as it recorded them, and how "
        "they differ from those the job was charged for"
    )
