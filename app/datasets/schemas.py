"""What the API shows of a dataset: metadata, declared labels, budget, and to its owner
alone the sizes of the upload; never text."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

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

    epsilon_cap: float
    delta_cap: float
    spent: float = Field(description="ε of the committed jobs' releases, composed")
    reserved: float = Field(
        description="ε of the committed and reserved jobs' releases composed, minus spent"
    )
    remaining: float
    accountant: str = Field(description="What composed the figures")


_RAW = "A raw count of the upload (not DP): the owning organisation's keys only, else null"
RAW_COUNTS = ("documents", "skipped_empty", "skipped_duplicate", "upload_bytes")


class DatasetOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: uuid.UUID
    organisation_id: uuid.UUID
    name: str
    format: str
    text_columns: list[str]
    label_column: str
    labels: list[str]
    unit_column: str | None
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
    created_at: datetime
    deleted_at: datetime | None
    budget: BudgetOut


class UploadOut(BaseModel):
    """Where a resumable upload stands: send the file on from byte ``offset``."""

    dataset_id: uuid.UUID
    state: Literal["uploading", "ready"] = Field(description="``ready``: sealed")
    offset: int = Field(description="Bytes of the file committed: the next chunk starts here")
    max_upload_bytes: int = Field(description="KEYSEED_MAX_UPLOAD_BYTES: the whole file's limit")
    max_upload_request_bytes: int = Field(
        description="The most bytes one chunk carries (KEYSEED_MAX_UPLOAD_REQUEST_BYTES, "
        "or less where the whole file's limit is lower)"
    )


class CapChange(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    epsilon_cap: Epsilon
    delta_cap: Annotated[float | None, Field(ge=0, lt=1), BeforeValidator(not_a_boolean)] = None
    reason: str = Field(min_length=3, max_length=1000, pattern=r"^[^\x00-\x08\x0b-\x1f\x7f]+$")


class LedgerEntryOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    job_id: uuid.UUID
    kind: str
    epsilon: float = Field(description="The job's releases composed at delta")
    delta: float
    epsilon_by_mechanism: dict[str, Any]
    events: list[dict[str, Any]] = Field(
        description="Every release the entry stands for: mechanism, noise and its scale, "
        "sensitivity and its norm, dimension, partition, count and the ε of each"
    )
    accountant: str = Field(description="What composed epsilon")
    actor: str
    created_at: datetime


class LedgerReportOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    job_id: uuid.UUID
    epsilon: float
    delta: float
    events: list[dict[str, Any]]
    accountant: str
    actor: str
    created_at: datetime
    differences: list[str] = Field(
        default_factory=list,
        description="Releases charged but not reported, reported but not charged, or "
        "costing more than charged (empty: the report matches the ledger)",
    )


class LedgerOut(BaseModel):
    dataset_id: uuid.UUID
    budget: BudgetOut
    entries: list[LedgerEntryOut]
    reports: list[LedgerReportOut] = Field(
        description="Per job, the releases its engine made as it recorded them, and how "
        "they differ from those the job was charged for"
    )
