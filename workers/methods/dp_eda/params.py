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

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator

from workers.errors import ConfigError
from workers.methods.common import MethodParams


class DPEDAParams(MethodParams):
    """The job's DP-EDA parameters (module docstring); frozen once validated."""

    ld_delta_share: float = Field(default=0.5, gt=0.0, lt=1.0)
    adjacency: Literal["add_remove", "replace_one"] = "add_remove"
    iterations: int = Field(default=7, ge=1, le=100)
    domain: int = Field(default=300, ge=1, le=100_000)
    parents: int = Field(default=30, ge=2, le=10_000)
    initial_population: int = Field(default=1000, ge=2, le=100_000)
    offspring: int = Field(default=3000, ge=2, le=100_000)
    alpha: float = Field(default=0.1, ge=0.0, le=1.0)
    top_r: int = Field(default=5, ge=2, le=10_000)
    population_source: Literal["llm", "vocabulary"] = "llm"
    decoder: Literal["llm_reconstruction", "retrieval"] = "llm_reconstruction"
    vocabulary: str = "english"
    nearest_phrases: int = Field(default=8, ge=1, le=100)
    candidates: int = Field(default=4, ge=1, le=32)
    rounds: int = Field(default=2, ge=1, le=10)
    perplexity_percentile: float = Field(default=95.0, gt=0.0, le=100.0)
    max_tokens: int = Field(default=96, ge=8, le=32_768)
    temperature: float = Field(default=0.9, ge=0.0, le=2.0)

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
