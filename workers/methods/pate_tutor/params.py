"""Every parameter of a PATE-tutor run, validated with errors that name the field.

Names (pate-tutor.md §7 rule 1): ``teachers`` is M, ``queries`` is Q — the size of the
public pool B the teachers label, fixed here, before any private read; ``negatives`` is
the size of pool A (the teachers' negatives), ``candidates`` the size of pool C (what the
student scores for the final selection), ``num_released`` the kept n. Pools are split
evenly over the declared classes (largest remainders), from public prompts only.

Privacy parameters: the total (ε, δ) of the run — the Q teacher votes and the tutor's
class counts together (rule 2: the tutor's budget is part of the total, never reported
beside it). ``tutor_share`` is the tutor's share of the budget in μ², the currency
Gaussian mechanisms add up in (:mod:`workers.methods.pate_tutor.accounting`). σ is never
a parameter: it is derived from (ε, δ, Q, share).

Defaults: M = 15 as in the paper; the paper's ε_KD = 4, ε_tutor = 0.4 becomes one total
and a 10 % μ² share for the tutor. Q = 100 (the paper does not state Q; §6 P1: with
Q ≫ 40 the vote noise dwarfs any margin of 15 teachers). ``regularization`` is the
inverse L2 strength C of the logistic-regression teachers and student (the machine's
variant, §8: linear classifiers on sentence embeddings, not RoBERTa-large).

This module imports no numerical library, so an API process can validate job specs.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from workers.methods.dpkps.config import EPSILON_CEILING, EPSILON_FLOOR

DOCUMENT_TYPE_CHARS = 200
MAX_POOL = 1_000_000


class PateTutorParams(BaseModel):
    """The job's PATE-tutor parameters (module docstring); frozen once validated."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    document_type: str = Field(min_length=1, max_length=DOCUMENT_TYPE_CHARS)
    epsilon: float = Field(ge=EPSILON_FLOOR, le=EPSILON_CEILING)
    delta: float = Field(gt=0.0, le=1e-3)
    teachers: int = Field(default=15, ge=2, le=1_000)
    queries: int = Field(default=100, ge=1, le=100_000)
    negatives: int = Field(default=200, ge=1, le=MAX_POOL)
    candidates: int = Field(default=300, ge=1, le=MAX_POOL)
    num_released: int = Field(default=100, ge=1, le=MAX_POOL)
    tutor_share: float = Field(default=0.1, gt=0.0, lt=1.0)
    regularization: float = Field(default=1.0, gt=0.0, le=1e6)
    max_tokens: int = Field(default=256, ge=8, le=32_768)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    concurrency: int = Field(default=8, ge=1, le=1024)
    seed: int = Field(default=0, ge=0, le=2**53 - 1)

    @field_validator("document_type")
    @classmethod
    def _visible(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be blank")
        if any(ch in value for ch in "\r\n\t\x00"):
            raise ValueError("must be one line of text")
        return value.strip()

    @field_validator("num_released")
    @classmethod
    def _within_candidates(cls, value: int, info: ValidationInfo) -> int:
        candidates = info.data.get("candidates")
        if candidates is not None and value > candidates:
            raise ValueError(f"must be at most the {candidates} candidates of pool C")
        return value

    def planned_calls(self) -> int:
        """LLM requests of the three pools, retries and re-requests excluded."""
        return self.negatives + self.queries + self.candidates

    def to_dict(self) -> dict[str, Any]:
        """The JSON form recorded in manifests."""
        return self.model_dump(mode="json")
