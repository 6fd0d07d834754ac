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

from pydantic import Field, ValidationInfo, field_validator

from workers.methods.common import (
    MethodParams,
    max_tokens_field,
    share_field,
    temperature_field,
)

MAX_POOL = 1_000_000


class PateTutorParams(MethodParams):
    """The job's PATE-tutor parameters (module docstring); frozen once validated."""

    teachers: int = Field(
        description=(
            "M, the teachers: each a classifier on one keyed-hash shard of the private corpus. "
            "Default 15, 2 to 1,000"
        ),
        default=15,
        ge=2,
        le=1_000,
    )
    queries: int = Field(
        description=(
            "Q, the public candidates (pool B) the teachers label with noisy votes; the vote "
            "noise grows with √Q. Fixed before any private read. Default 100, 1 to 100,000"
        ),
        default=100,
        ge=1,
        le=100_000,
    )
    negatives: int = Field(
        description=(
            "Size of pool A, the LLM-generated public texts the teachers learn as negatives. "
            "Default 200, 1 to 1,000,000"
        ),
        default=200,
        ge=1,
        le=MAX_POOL,
    )
    candidates: int = Field(
        description=(
            "Size of pool C, the LLM-generated texts the student scores to pick the released "
            "ones. Default 300, 1 to 1,000,000"
        ),
        default=300,
        ge=1,
        le=MAX_POOL,
    )
    num_released: int = Field(
        description=(
            "n, the documents released: the best of pool C by the student's score (at most "
            "candidates). Default 100, 1 to 1,000,000"
        ),
        default=100,
        ge=1,
        le=MAX_POOL,
    )
    tutor_share: float = share_field(
        "The DP label tutor's (class counts') share of the budget in μ²; the rest goes to the"
        " Q teacher votes",
        0.1,
    )
    regularization: float = Field(
        description=(
            "C, the inverse L2 strength of the logistic-regression teachers and student. Default "
            "1, > 0 to 1e6"
        ),
        default=1.0,
        gt=0.0,
        le=1e6,
    )
    max_tokens: int = max_tokens_field(256)
    temperature: float = temperature_field(1.0)

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
