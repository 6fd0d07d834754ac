"""Every parameter of a DP-EDA run (dp-eda.md §4–§6), validated with errors naming the field.

Names: ``iterations`` is T, ``domain`` the limited domain K, ``parents`` k = N_par,
``initial_population`` N_pb, ``offspring`` N_cld, ``alpha`` α and ``top_r`` R of the EDA.
Defaults are the paper's (K = 300, N_par = 30, N_cld = 3000, α = 0.1, N_pb = 1000) except
T, which the paper does not state (7 is the smallest it discusses, §4.6).

Privacy: ``epsilon``/``delta`` are the run's total, every class and all T iterations
(classes compose in parallel). ``ld_delta_share`` of δ goes to the T domain restrictions
(δ_LD = δ·share/T per LimitedDomain call, dp-eda.md §9 Q3, carried by each call's event);
the rest is the δ at which the shared accountant composes the T·k Gumbel selections.
The per-selection ε_s is never a parameter: it is calibrated from (ε, δ, T, k)
(:mod:`.accounting`).

Public bounds the service plans with, for a run over a number of declared classes:
:meth:`DPEDAParams.planned_calls` (LLM requests) and :meth:`DPEDAParams.max_released`
(released documents).

``adjacency`` picks the calibration of dp-eda.md §5: ``"add_remove"`` (Durfee & Rogers's
own constants, keyseed's ledger) or ``"replace_one"`` (the paper's printed factor 2;
valid under add/remove as well, with twice the noise).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from workers.errors import ConfigError
from workers.methods.common import (
    MethodParams,
    bounded_field,
    max_tokens_field,
    share_field,
    temperature_field,
)


def _population_field(what: str, default: int) -> Any:
    """A population's size: at least domain + 1 (:meth:`DPEDAParams._above_domain`),
    checked when left at its default too."""
    return bounded_field(what, default, "2 to 100,000", validate_default=True, ge=2, le=100_000)


class DPEDAParams(MethodParams):
    """The job's DP-EDA parameters (module docstring); frozen once validated."""

    ld_delta_share: float = share_field(
        "The share of delta spent outright by the T LimitedDomain restrictions (δ·share/T "
        "each); the rest is the δ at which the Gumbel selections are composed",
        0.5,
    )
    adjacency: Literal["add_remove", "replace_one"] = Field(
        default="add_remove",
        description=(
            "The calibration of the selections: add_remove (Durfee & Rogers's constants, the "
            "ledger's neighbouring relation; the default) or replace_one (the paper's factor 2: "
            "valid too, with twice the noise)"
        ),
    )
    iterations: int = Field(
        description=(
            "T, the evolution iterations per class, each k noisy selections. Default 7, 1 to 100"
        ),
        default=7,
        ge=1,
        le=100,
    )
    domain: int = Field(
        description=(
            "K, the limited domain: the candidates a selection may return, by vote count. Default"
            " 300, 1 to 100,000"
        ),
        default=300,
        ge=1,
        le=100_000,
    )
    parents: int = Field(
        description=(
            "k (N_par), the parents selected per iteration, at most domain. Default 30, 2 to 10,000"
        ),
        default=30,
        validate_default=True,  # checked against domain when left at its default
        ge=2,
        le=10_000,
    )
    initial_population: int = _population_field(
        "N_pb, the public initial population per class, at least domain + 1", 1000
    )
    offspring: int = _population_field(
        "N_cld, the embeddings the EDA samples per iteration, at least domain + 1", 3000
    )
    alpha: float = Field(
        description=(
            "α, the EDA's smoothing: how far the Gaussian's mean and spread move towards the best"
            " parents each iteration (post-processing). Default 0.1, 0 to 1"
        ),
        default=0.1,
        ge=0.0,
        le=1.0,
    )
    top_r: int = Field(
        description=(
            "R, the top-ranked parents whose spread sets the EDA's σ. Default 5, 2 to 10,000"
        ),
        default=5,
        ge=2,
        le=10_000,
    )
    population_source: Literal["llm", "vocabulary"] = Field(
        default="llm",
        description=(
            "Where the initial population comes from: llm (texts the LLM writes for each class; "
            "the default) or vocabulary (the phrases of vocabulary nearest the class name, no LLM"
            " calls)"
        ),
    )
    decoder: Literal["llm_reconstruction", "retrieval"] = Field(
        default="llm_reconstruction",
        description=(
            "How a selected embedding becomes text: llm_reconstruction (the LLM writes candidates"
            " from the nearest vocabulary phrases, the closest re-embedding is kept; the default)"
            " or retrieval (the nearest text of the public pool)"
        ),
    )
    vocabulary: str = Field(
        default="english",
        description=(
            "The public vocabulary (a built-in name or an uploaded vocabulary's id) of the "
            "reconstruction decoder and the vocabulary population. Default 'english'"
        ),
    )
    nearest_phrases: int = Field(
        description=(
            "llm_reconstruction: the phrases nearest the target embedding given to the LLM. "
            "Default 8, 1 to 100"
        ),
        default=8,
        ge=1,
        le=100,
    )
    candidates: int = Field(
        description=(
            "llm_reconstruction: texts the LLM writes per round, of which the one whose embedding"
            " is nearest the target is kept. Default 4, 1 to 32"
        ),
        default=4,
        ge=1,
        le=32,
    )
    rounds: int = Field(
        description=(
            "llm_reconstruction: rounds per decode, each seeded by the best text so far. Default "
            "2, 1 to 10"
        ),
        default=2,
        ge=1,
        le=10,
    )
    perplexity_percentile: float = Field(
        description=(
            "The readability filter's threshold: a decoded text is dropped when its "
            "character-bigram perplexity is above this percentile of the public initial "
            "population's. Default 95, > 0 to 100"
        ),
        default=95.0,
        gt=0.0,
        le=100.0,
    )
    max_tokens: int = max_tokens_field(96)
    temperature: float = temperature_field(0.9)

    @field_validator("parents")
    @classmethod
    def _within_domain(cls, value: int, info: ValidationInfo) -> int:
        domain = info.data.get("domain")
        if domain is not None and value > domain:
            raise ValueError(f"must be at most the limited domain K = {domain}")
        return value

    @field_validator("initial_population", "offspring")
    @classmethod
    def _above_domain(cls, value: int, info: ValidationInfo) -> int:
        domain = info.data.get("domain")
        if domain is not None and value < domain + 1:
            raise ValueError(f"must be at least K + 1 = {domain + 1} (dp-eda.md §9 Q6)")
        return value

    def planned_calls(self, classes: int) -> int:
        """An upper bound of the LLM requests of a run over ``classes`` declared classes.

        Per class: the initial population (N_pb requests when ``population_source`` is
        ``"llm"``, none from the vocabulary), then in each of the T iterations the decoder
        on the at most k selected parents — ``candidates`` requests per parent in each of
        ``rounds`` rounds for ``llm_reconstruction``, none for ``retrieval``. Exact when
        every selection returns k parents and no class stops early; re-requests of failed
        calls and the client's retries are excluded.
        """
        _check_classes(classes)
        initial = self.initial_population if self.population_source == "llm" else 0
        per_iteration = (
            self.parents * self.candidates * self.rounds
            if self.decoder == "llm_reconstruction"
            else 0
        )
        return classes * (initial + self.iterations * per_iteration)

    def max_released(self, classes: int) -> int:
        """An upper bound of the documents a run over ``classes`` classes releases: each
        class releases the decoded survivors of its last productive iteration, at most
        its k selected parents."""
        _check_classes(classes)
        return classes * self.parents


def _check_classes(classes: int) -> None:
    if isinstance(classes, bool) or not isinstance(classes, int) or classes < 1:
        raise ConfigError("the number of declared classes must be an integer ≥ 1", field="labels")
