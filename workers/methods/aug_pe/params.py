"""Every parameter of an Aug-PE run, validated with errors that name the field.

Names follow the PE library (aug-pe.md §2) where it has one: ``iterations`` is T,
``population`` the N_t of iterations 0 … T−1 (the schedule is constant, as in every
shipped example, so each iteration's population size is fixed by the parameters alone),
``num_released`` is N_T, ``initial_variation_folds``/``variation_folds`` are f_0/f,
``lookahead_degree`` d, ``nearest_neighbors`` k, ``selection`` the selection mode,
``histogram_threshold`` H.

Defaults are the library's text examples (aug-pe.md §4: rank selection, keep_selected,
f_0 = f = 3, d = 0, k = 1, L2 distance, T = 10, fill-in-the-blanks at 0.5, target word
count ± 30 words floored at 25, temperature 1.2) scaled down for a 2-core machine in the
population only: 100 seeds per iteration instead of 2,000 (3,100 LLM calls instead of
68,000), and 128 completion tokens instead of 1,000. T is kept, so σ is the paper's.

Privacy parameters: the total (ε, δ) of the run, class counts and all T iterations
together; δ comes from the job spec (the paper's 1/(N ln N) needs the private N,
caveat A6). ``count_share`` is the class counts' share of the budget, in the currency
Gaussian mechanisms add up in (μ², see :mod:`workers.methods.aug_pe.accounting`). σ is
never a parameter (caveat A4): it is derived from (ε, δ, T).

This module imports no numerical library, so an API process can validate job specs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from workers.methods.common import (
    MethodParams,
    max_tokens_field,
    share_field,
    temperature_field,
)

MAX_LLM_CALLS = 10_000_000  # per run, retries excluded: far above what a machine can serve


class AugPEParams(MethodParams):
    """The job's Aug-PE parameters (module docstring); frozen once validated."""

    iterations: int = Field(
        description=(
            "T, the Private Evolution iterations, each one released vote histogram per class; the"
            " noise σ grows with √T. Default 10, 1 to 100"
        ),
        default=10,
        ge=1,
        le=100,
    )
    initial_variation_folds: int = Field(
        description=(
            "f₀: LLM variations made of each initial sample (the first population is N·(1 + f₀))."
            " Default 3, 0 to 20"
        ),
        default=3,
        ge=0,
        le=20,
    )
    variation_folds: int = Field(
        description=(
            "f: LLM variations made of each selected sample in later iterations. Default 3, 0 to 20"
        ),
        default=3,
        ge=0,
        le=20,
    )
    keep_selected: bool = Field(
        default=True,
        description=(
            "Whether the selected samples themselves join the next population beside their "
            "variations (needed when variation_folds is 0). Default true"
        ),
    )
    lookahead_degree: int = Field(
        description=(
            "d: a candidate's embedding is the mean of d variations of it (0: its own embedding; "
            "each costs LLM calls, no budget). Default 0, 0 to 10"
        ),
        default=0,
        ge=0,
        le=10,
    )
    population: int = Field(
        description=(
            "N, the samples selected per iteration (per class, split by the class proportions); "
            "the number of LLM calls grows with it. Default 100, 1 to 100,000"
        ),
        default=100,
        ge=1,
        le=100_000,
    )
    num_released: int = Field(
        description=(
            "N_T, documents released at the end, selected from the last iteration's candidates "
            "(at most population × folds). Default 100, 1 to 2,100,000"
        ),
        default=100,
        ge=1,
        le=2_100_000,
    )
    nearest_neighbors: int = Field(
        description=(
            "k: each private document votes for its k nearest candidates, 1/√k each (L2 norm 1 "
            "per document). Default 1, 1 to 100"
        ),
        default=1,
        ge=1,
        le=100,
    )
    distance: Literal["l2", "cosine", "inner_product"] = Field(
        default="l2",
        description=(
            "The distance of the nearest-neighbour vote between embeddings: l2 (the default), "
            "cosine or inner_product"
        ),
    )
    selection: Literal["rank", "sample"] = Field(
        default="rank",
        description=(
            "rank (the default): keep the N candidates with the largest noisy votes; sample: draw"
            " N with probability ∝ noisy votes (post-processing)"
        ),
    )
    histogram_threshold: float | None = Field(
        description=(
            "H: H is subtracted from each noisy vote and the result clipped at 0 before selection"
            " (post-processing); null, the default: no threshold. 0 to 1e9"
        ),
        default=None,
        ge=0.0,
        le=1e9,
    )
    count_share: float = share_field(
        "The DP class counts' share of the budget, in μ² (the currency Gaussian mechanisms "
        "add up in); the rest goes to the T vote histograms",
        0.1,
    )
    variation: Literal["fill_in_blanks", "paraphrase"] = Field(
        default="fill_in_blanks",
        description=(
            "How the LLM varies a sample: fill_in_blanks (mask words, the LLM fills them; the "
            "default) or paraphrase"
        ),
    )
    blank_probability: float = Field(
        description="fill_in_blanks: the probability that a word is masked. Default 0.5, 0 to < 1",
        default=0.5,
        ge=0.0,
        lt=1.0,
    )
    word_count_std: float | None = Field(
        description=(
            "The target length of a variation is the sample's word count plus N(0, std²) words; "
            "null: no target length. Default 30, 0 to 10,000"
        ),
        default=30.0,
        ge=0.0,
        le=10_000.0,
    )
    min_word_count: int = Field(
        description="The target length's floor, in words. Default 25, 0 to 10,000",
        default=25,
        ge=0,
        le=10_000,
    )
    max_tokens: int = max_tokens_field(128)
    temperature: float = temperature_field(1.2)

    @field_validator("keep_selected")
    @classmethod
    def _population_not_empty(cls, value: bool, info: ValidationInfo) -> bool:
        if not value and info.data.get("variation_folds") == 0:
            raise ValueError(
                "with variation_folds = 0 the next population is empty unless keep_selected"
            )
        return value

    @field_validator("population")
    @classmethod
    def _calls_bounded(cls, value: int, info: ValidationInfo) -> int:
        schedule = _Schedule.of({**info.data, "population": value})
        if schedule is None or "lookahead_degree" not in info.data:
            return value  # an earlier field failed and is reported on its own
        calls = schedule.planned_calls(info.data["lookahead_degree"])
        if calls > MAX_LLM_CALLS:
            raise ValueError(f"the run would make {calls} LLM calls (at most {MAX_LLM_CALLS})")
        return value

    @field_validator("num_released")
    @classmethod
    def _within_last_population(cls, value: int, info: ValidationInfo) -> int:
        schedule = _Schedule.of(info.data)
        if schedule is None:
            return value  # an earlier field failed and is reported on its own
        candidates = schedule.candidates(schedule.iterations)
        if value > candidates:
            raise ValueError(
                f"must be at most the {candidates} candidates of the last iteration "
                "(population × folds)"
            )
        return value

    def candidates(self, iteration: int) -> int:
        """Size of the population whose histogram iteration ``iteration`` (1 … T) releases."""
        return _Schedule.of_params(self).candidates(iteration)

    def planned_calls(self) -> int:
        """LLM requests the run makes, retries excluded (aug-pe.md §4, without the unused
        variations of the last selection): N(1 + f_0) + Σ_t d·|population_t| + (T−1)·N·f."""
        return _Schedule.of_params(self).planned_calls(self.lookahead_degree)


# The parameters that decide how large each iteration's population is, by field name.
_SCHEDULE_FIELDS = (
    "population",
    "initial_variation_folds",
    "variation_folds",
    "keep_selected",
    "iterations",
)


@dataclass(frozen=True)
class _Schedule:
    """How large each iteration's population is (aug-pe.md §4): public sizes only."""

    population: int
    initial_variation_folds: int
    variation_folds: int
    keep_selected: bool
    iterations: int

    @classmethod
    def of(cls, fields: Mapping[str, Any]) -> _Schedule | None:
        """The schedule of the fields validated so far; None where one of those it reads
        is missing (it failed)."""
        if any(name not in fields for name in _SCHEDULE_FIELDS):
            return None
        return cls(**{name: fields[name] for name in _SCHEDULE_FIELDS})

    @classmethod
    def of_params(cls, params: AugPEParams) -> _Schedule:
        return cls(**{name: getattr(params, name) for name in _SCHEDULE_FIELDS})

    def candidates(self, iteration: int) -> int:
        if iteration <= 1:
            return self.population * (1 + self.initial_variation_folds)
        return self.population * (self.variation_folds + int(self.keep_selected))

    def planned_calls(self, lookahead: int) -> int:
        sizes = (self.candidates(t) for t in range(1, self.iterations + 1))
        initial = self.population * (1 + self.initial_variation_folds)
        folds = (self.iterations - 1) * self.population * self.variation_folds
        return initial + lookahead * sum(sizes) + folds
