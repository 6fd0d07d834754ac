"""A job spec carries every engine parameter, the vocabulary, the LLM and the prompt.

Bounds here give early, typed 422s; the engine's own :meth:`GenerationConfig.validate`
and :meth:`PromptSpec.validate` run as well, so a spec the engine would refuse is never
queued. The LLM is named (``none``, ``local`` or an endpoint configured on the server):
a spec never carries a URL or a key. ``device`` is the worker's business, not the spec's.
"""

from __future__ import annotations

import dataclasses
import math
import uuid
from datetime import datetime
from typing import Annotated, Any, Final, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    StringConstraints,
    Tag,
    TypeAdapter,
    ValidationInfo,
    field_validator,
    model_validator,
)

from app.datasets.schemas import not_a_boolean
from app.identity.schemas import NAME_PATTERN, TEXT_PATTERN
from workers.evaluation.holdout import DEFAULT_FRACTION as HOLDOUT_FRACTION
from workers.evaluation.holdout import MAX_FRACTION as HOLDOUT_MAX_FRACTION
from workers.methods.aug_pe.params import AugPEParams
from workers.methods.common import MethodParams
from workers.methods.dp_eda.params import DPEDAParams
from workers.methods.dpkps.config import (
    CELLS_FROM_EPSILON,
    DEFAULT_CELLS,
    DEFAULT_EXTENSION_RATIO,
    DEFAULT_SELECTION,
    DEFAULT_TEMPERATURE,
    EMBEDDING_DIMENSION,
    LIMITS,
    MAX_CELLS,
    MAX_DOCUMENT_WINDOW,
    MAX_EMBED_SAMPLE,
    MAX_EXTENSION_RATIO,
    MAX_LABEL_PRIOR,
    MAX_SELECTION,
    PUBLIC_VOCABULARY_DEFAULTS,
    SUBSPACE_FROM_CLASSES,
    SUGGESTED_SUBSPACE,
    GenerationConfig,
)
from workers.methods.dpkps.prompting import LIMITS as PROMPT_LIMITS
from workers.methods.pate_tutor.params import PateTutorParams
from workers.methods.registry import AUG_PE, DP_EDA, LLM_METHODS, PATE_TUTOR
from workers.privacy.audit import DEFAULT_CANARIES, MAX_CANARIES
from workers.privacy.limits import DELTA_CEILING, EPSILON_CEILING, EPSILON_FLOOR

Example = Annotated[
    str,
    StringConstraints(
        min_length=1, max_length=PROMPT_LIMITS["example_chars"], pattern=TEXT_PATTERN
    ),
]

_BOOLEAN_FIELDS = frozenset({"distinct", "consistency_filter"})

# ε of one mechanism, within the engine's floor and ceiling (see ``check_epsilon``): a
# job at a negligible ε could only serve to probe the data at no charge.
MechanismEpsilon = Annotated[
    float, Field(ge=EPSILON_FLOOR, le=EPSILON_CEILING), BeforeValidator(not_a_boolean)
]

# Every engine parameter but the device, which is the worker's business.
ENGINE_FIELDS = tuple(f.name for f in dataclasses.fields(GenerationConfig) if f.name != "device")
_ENGINE: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(GenerationConfig)}


DPKPS: Final = "dpkps"
METHODS = (DPKPS, *LLM_METHODS)

LLMName = Annotated[
    str,
    Field(
        min_length=1,
        max_length=64,
        description="'none' (keyphrase sequences only, DP-KPS), 'local' (the packaged "
        "model) or the name of an endpoint configured on the server",
    ),
]
MaxLLMCalls = Annotated[
    int | None,
    Field(
        ge=1,
        le=10**9,
        description="The most LLM calls (retries included) the job may make; the job is refused "
        "at submission if its plan needs more. At most the server's own limit, which also "
        "applies when this is null (the default)",
    ),
]


class HoldoutSpec(BaseModel):
    """A slice of the private units held out from generation, on which a classifier trained
    on the released corpus is scored, its accuracy published with noise (docs/utility.md)."""

    model_config = ConfigDict(
        extra="forbid",
        allow_inf_nan=False,
        json_schema_extra={"examples": [{"fraction": 0.1}, {"fraction": 0.2, "epsilon": 0.5}]},
    )

    fraction: float = Field(
        default=HOLDOUT_FRACTION,
        gt=0,
        le=HOLDOUT_MAX_FRACTION,
        description="The share of the privacy units held out (by a keyed hash of the unit, so "
        "a unit lies wholly on one side); generation never reads them. Default "
        f"{HOLDOUT_FRACTION:g}, > 0 to {HOLDOUT_MAX_FRACTION:g}",
        examples=[0.1],
    )
    epsilon: MechanismEpsilon | None = Field(
        default=None,
        description="ε of the noisy accuracy counts. The slice and the generation's units are "
        "disjoint, so the two compose in parallel: up to the generation's own ε it costs "
        "nothing more. Null, the default: the generation's ε (its total at the job's delta)",
        examples=[None, 0.5],
    )
    key: str | None = Field(
        default=None,
        min_length=8,
        max_length=128,
        pattern=r"^[A-Za-z0-9_.:-]+$",
        description="The public key of the keyed hash that chooses the slice (recorded in the "
        "job's spec and manifest). Null, the default: the server draws one at submission; the "
        "same key and fraction hold out the same units in every job",
        examples=[None, "holdout-2026-12"],
    )

    @field_validator("*", mode="before")
    @classmethod
    def _numbers_are_not_booleans(cls, value: Any, info: ValidationInfo) -> Any:
        return not_a_boolean(value)


class JobSpec(BaseModel):
    """A DP-KPS job (``method`` absent or ``dpkps``)."""

    model_config = ConfigDict(
        extra="forbid",
        allow_inf_nan=False,
        json_schema_extra={
            "examples": [
                {
                    "vocabulary": "medical",
                    "llm": "local",
                    "document_type": "clinical note",
                    "epsilon": 1.0,
                    "delta": 1e-06,
                    "per_class": 50,
                },
                {
                    "vocabulary": "medical",
                    "llm": "none",
                    "document_type": "clinical note",
                    "epsilon_vocab": 0.5,
                    "epsilon_kde": 0.5,
                    "epsilon_count": 0.1,
                    "total": 200,
                    "vocabulary_size": 2000,
                },
            ]
        },
    )

    method: Literal["dpkps"] = Field(
        default="dpkps",
        description="The generation method: 'dpkps' (DP keyphrase prompt seeding, the default "
        "when absent); 'aug-pe', 'pate-tutor' and 'dp-eda' select the other methods' specs",
    )
    vocabulary: str = Field(
        min_length=1,
        max_length=64,
        description="A built-in vocabulary name ('english', 'medical') or the id of an "
        "uploaded vocabulary",
    )
    llm: LLMName = "local"
    document_type: str = Field(
        min_length=1,
        max_length=PROMPT_LIMITS["document_type_chars"],
        pattern=NAME_PATTERN,
        description="What kind of document the LLM writes, in words ('clinical note', 'news "
        f"article'); put into every prompt. Public; 1 to {PROMPT_LIMITS['document_type_chars']} "
        "characters",
    )
    few_shot: list[Example] = Field(
        default_factory=list,
        max_length=PROMPT_LIMITS["few_shot"],
        description="PUBLIC example texts to imitate (never private documents)",
    )
    template: str | None = Field(
        default=None,
        max_length=PROMPT_LIMITS["template_chars"],
        pattern=TEXT_PATTERN,
        description="The prompt, a Python format string with the placeholders {keyphrases} "
        "(required), {document_type} and {examples} (required when few_shot is given; "
        "write {{ and }} for literal braces); public. Null, the default: the engine's own "
        f"template. At most {PROMPT_LIMITS['template_chars']} characters",
    )
    max_llm_calls: MaxLLMCalls = None
    holdout: HoldoutSpec | None = Field(
        default=None,
        description="Hold out a slice of the private units and publish the accuracy, with "
        "noise, of a classifier trained on the released corpus on it (docs/utility.md). "
        "Null, the default: off; the dry run says whether the corpus is large enough for a "
        "useful interval",
        examples=[None, {"fraction": 0.1}],
    )

    # The budget: a total ``epsilon`` (and ``delta``: > 0 selects Gaussian noise) split
    # among the mechanisms by the shares, or per-mechanism ε (Laplace, pure).
    epsilon: MechanismEpsilon | None = Field(
        default=None,
        description="The job's total privacy budget ε, split among the mechanisms "
        "(vocabulary, density, class counts) by the shares. Give either this or the "
        f"per-mechanism epsilon_vocab and epsilon_kde (Laplace). {EPSILON_FLOOR:g} to "
        f"{EPSILON_CEILING:g}; charged to the dataset's cap when the job is submitted",
    )
    delta: float = Field(
        default=0.0,
        ge=0,
        le=DELTA_CEILING,
        description="With epsilon: the total δ of the (ε, δ) guarantee, a probability of "
        "failure per record; > 0 selects Gaussian noise (noise null), 0 (the default) pure "
        f"ε-DP with Laplace noise. 0 to {DELTA_CEILING:g}; at most the dataset's delta_cap",
    )
    noise: Literal["laplace", "gaussian"] | None = Field(
        default=None, description="default: gaussian when delta > 0, else laplace"
    )
    share_vocab: float = Field(
        default=_ENGINE["share_vocab"],
        gt=0,
        le=1000,
        description="With epsilon: the vocabulary histogram's share of the total (of ε with "
        "Laplace noise, of the Gaussian μ² otherwise), relative to the other shares; "
        f"> 0 to 1000, default {_ENGINE['share_vocab']:g}. Unused when Ṽ is public",
    )
    share_kde: float = Field(
        default=_ENGINE["share_kde"],
        gt=0,
        le=1000,
        description="With epsilon: the density release's (kernel density, class centroids) "
        f"share of the total; > 0 to 1000, default {_ENGINE['share_kde']:g}",
    )
    share_count: float = Field(
        default=_ENGINE["share_count"],
        gt=0,
        le=1000,
        description="With epsilon and a total: the noisy class counts' share of the total; "
        f"> 0 to 1000, default {_ENGINE['share_count']:g}",
    )
    epsilon_vocab: MechanismEpsilon | None = Field(
        default=None,
        description="Instead of epsilon: ε of the vocabulary histogram alone (Laplace noise); "
        f"{EPSILON_FLOOR:g} to {EPSILON_CEILING:g}",
    )
    epsilon_kde: MechanismEpsilon | None = Field(
        default=None,
        description="Instead of epsilon: ε of the kernel density release alone (Laplace "
        "noise; classes are disjoint, so each class's structures share the whole of it); "
        f"{EPSILON_FLOOR:g} to {EPSILON_CEILING:g}",
    )
    epsilon_count: MechanismEpsilon | None = Field(
        default=None,
        description="Instead of epsilon: ε of the noisy class counts (Laplace noise); given, "
        f"total is split among the classes by them. {EPSILON_FLOOR:g} to {EPSILON_CEILING:g}",
    )
    # Defaults are the engine's own (chosen by measurement; see benchmarks/notes/README.md).
    per_class: int | None = Field(
        default=_ENGINE["per_class"],
        ge=1,
        le=LIMITS["per_class"],
        description="Keyphrase sequences (so documents) per declared label; default "
        f"{_ENGINE['per_class']}, cleared when total is given; 1 to {LIMITS['per_class']:,}",
    )
    total: int | None = Field(
        default=_ENGINE["total"],
        ge=1,
        le=LIMITS["total"],
        description="Instead of per_class: sequences in all, split among the classes by noisy "
        "class counts (epsilon_count, or the count share of epsilon); null, the default: "
        f"per_class. 1 to {LIMITS['total']:,}",
    )
    vocabulary_size: int = Field(
        default=_ENGINE["vocabulary_size"],
        ge=1,
        le=LIMITS["vocabulary_size"],
        description="N, the phrases the noisy vocabulary histogram keeps as the private "
        f"vocabulary Ṽ; default {_ENGINE['vocabulary_size']:,}, 1 to "
        f"{LIMITS['vocabulary_size']:,}, at most the vocabulary's size",
    )
    max_matches_per_document: int = Field(
        default=_ENGINE["max_matches_per_document"],
        ge=1,
        le=LIMITS["max_matches_per_document"],
        description="S, the most vocabulary phrases one document (unit) counts in the "
        "histogram: the histogram's sensitivity, so its noise grows with it; default "
        f"{_ENGINE['max_matches_per_document']}, 1 to {LIMITS['max_matches_per_document']:,}",
    )
    sequence_length: int = Field(
        default=_ENGINE["sequence_length"],
        ge=1,
        le=LIMITS["sequence_length"],
        description=f"L, keyphrases per sequence (per prompt); default "
        f"{_ENGINE['sequence_length']}, 1 to {LIMITS['sequence_length']}",
    )
    mode: Literal["independent", "iterative"] = Field(
        default=_ENGINE["mode"],
        description="independent (the default): each phrase of a sequence is drawn from its "
        "class's density alone; iterative: conditioned on the sequence's prefix (random "
        "features and an ensemble of structures; see ensemble)",
    )
    ensemble: Literal["log", "linear"] = Field(
        default=_ENGINE["ensemble"],
        description="Iterative mode: the block counts of each class's ensemble of "
        "structures, which share epsilon_kde equally: log (1, 2, 4, … up to L; the default) "
        "or linear (1, 2, …, L: more structures, more noise in each)",
    )
    num_features: int = Field(
        default=_ENGINE["num_features"],
        ge=1,
        le=LIMITS["num_features"],
        description="I, random Fourier features of the density with kde_method "
        f"random_features; default {_ENGINE['num_features']:,}, 1 to "
        f"{LIMITS['num_features']:,}",
    )
    bandwidth: float = Field(
        default=_ENGINE["bandwidth"],
        gt=0,
        le=1e6,
        description="σ of the Gaussian kernel on unit embedding vectors (exact kernel and "
        f"random features); default {_ENGINE['bandwidth']:g}, > 0 to 1e6",
    )
    kde_method: Literal["exact", "random_features", "centroid", "moments"] | None = Field(
        default=_ENGINE["kde_method"],
        description="default: centroid for a total Gaussian budget in independent mode, "
        "exact for Laplace, random_features in iterative mode; centroid and moments need "
        "Gaussian noise and independent mode",
    )
    vocabulary_method: Literal["histogram", "threshold", "public"] | None = Field(
        default=_ENGINE["vocabulary_method"],
        description="how Ṽ is chosen: a noisy histogram over the vocabulary, a thresholded "
        "Gaussian histogram over the phrases that occur (Gaussian noise; spends half of "
        "delta outright), or the first public_vocabulary_size phrases (no release); "
        "default: public for centroid and moments, else histogram",
    )
    kde_weighting: Literal["l1", "l2"] | None = Field(
        default=_ENGINE["kde_weighting"],
        description="a document's weights in the exact kernel density: l1 (default) or l2 "
        "(Gaussian noise, kde_method exact)",
    )
    public_vocabulary_size: int | None = Field(
        default=_ENGINE["public_vocabulary_size"],
        ge=1,
        le=LIMITS["vocabulary_size"],
        description=f"|Ṽ| of a public Ṽ; default {PUBLIC_VOCABULARY_DEFAULTS}",
    )
    public_extension: int = Field(
        default=_ENGINE["public_extension"],
        ge=0,
        le=LIMITS["vocabulary_size"],
        description="with kde_method centroid, one cell and a total: a class whose released "
        "count is at least extension_ratio times its sum's noise sigma samples from this many "
        "public phrases instead of public_vocabulary_size (0, the default: off)",
    )
    extension_ratio: float = Field(
        default=_ENGINE["extension_ratio"],
        ge=0,
        le=MAX_EXTENSION_RATIO,
        description="the released class count, over the class sum's noise sigma, from which "
        f"a class samples from public_extension's phrases (default {DEFAULT_EXTENSION_RATIO:g})",
    )
    centroid_cells: int | None = Field(
        default=_ENGINE["centroid_cells"],
        ge=1,
        le=MAX_CELLS,
        description="cells per class with kde_method centroid: the class sum places up to "
        "this many, whose sums a second release gives (1: the class sum alone); default "
        f"{DEFAULT_CELLS} from epsilon {CELLS_FROM_EPSILON:g} on, else 1",
    )
    cell_share: float = Field(
        default=_ENGINE["cell_share"],
        gt=0,
        lt=1,
        description="with cells: the class sum's share of the density's budget",
    )
    cell_kappa: float = Field(
        default=_ENGINE["cell_kappa"],
        gt=0,
        le=1000,
        description="with cells: a class gets as many as keep each cell's sum this many "
        "noise norms above its noise",
    )
    label_prior: float = Field(
        default=_ENGINE["label_prior"],
        ge=0,
        le=MAX_LABEL_PRIOR,
        description="with kde_method centroid: how far the declared label names' embeddings "
        "pull each class's released direction, in noise-matched units, when the released "
        "sums agree with them (0: off)",
    )
    label_prior_lead: float = Field(
        default=_ENGINE["label_prior_lead"],
        ge=0,
        le=MAX_LABEL_PRIOR,
        description="with kde_method centroid: how far the label names may lead each class's "
        "released direction, in the same units, as the released sums' agreement with them "
        "grows from 1 to 2 standard deviations of its noise (0, the default: no lead)",
    )
    sequence_selection: int | None = Field(
        default=_ENGINE["sequence_selection"],
        ge=1,
        le=MAX_SELECTION,
        description="with kde_method centroid or moments: draw this many times the sequences "
        "and keep those whose phrases lie nearest their class's (or cell's) released "
        "direction (1: keep every draw); post-processing, no budget; default "
        f"{DEFAULT_SELECTION} with cells, else 1",
    )
    consistency_filter: bool | None = Field(
        default=_ENGINE["consistency_filter"],
        description="with kde_method centroid: keep a sequence only where its own class's "
        "released direction (with cells: one of its class's cells) is the nearest to its "
        "embedding (post-processing, no budget; the job returns fewer sequences than asked "
        "for, in proportions the releases decide, and counts.sequences_drawn says how many "
        "were drawn); null, the default: on with class centroids, else off",
    )
    subspace: int | None = Field(
        default=_ENGINE["subspace"],
        ge=0,
        le=EMBEDDING_DIMENSION,
        description="with kde_method centroid: release each class sum in this many top "
        "principal directions of the public phrases' embeddings, each unit rescaled there to "
        "its own norm (same noise, same budget; 0: the whole embedding space; null, the "
        f"default: {SUGGESTED_SUBSPACE} with {SUBSPACE_FROM_CLASSES} or more declared labels "
        "and one cell per class, else the whole space)",
    )
    document_window: int = Field(
        default=_ENGINE["document_window"],
        ge=0,
        le=MAX_DOCUMENT_WINDOW,
        description="with kde_method centroid or moments: a document longer than this many "
        "words is embedded in windows of it, their embeddings averaged, so that the whole "
        "document counts and not only the first 256 word pieces the embedding model reads "
        "(same noise, same budget; 0: one piece, the model's first tokens only)",
    )
    embed_sample: int = Field(
        default=_ENGINE["embed_sample"],
        ge=0,
        le=MAX_EMBED_SAMPLE,
        description="with kde_method centroid or moments: embed only a Poisson sample of "
        "about this many units of each class (each unit kept independently with probability "
        "min(1, m / the class's released count)), so the embedding work is bounded whatever "
        "the corpus holds; the class counts are released for the rate (a small share of the "
        "budget, unless a total releases them anyway) and each class sum is charged as "
        "before (0, the default: every unit)",
    )
    temperature: float | None = Field(
        default=_ENGINE["temperature"],
        gt=0,
        le=1e6,
        description="τ: a phrase is drawn with probability ∝ clip(score)^(1/τ) (lower: "
        "sharper, fewer distinct phrases; post-processing); null, the default: per "
        f"kde_method ({', '.join(f'{k} {v:g}' for k, v in DEFAULT_TEMPERATURE.items())})",
    )
    noise_floor: float = Field(
        default=_ENGINE["noise_floor"],
        ge=0,
        le=10,
        description="Scores lose this many noise standard deviations before they are "
        "clipped at 0 (post-processing); default 0, 0 to 10",
    )
    class_contrast: float = Field(
        default=_ENGINE["class_contrast"],
        ge=0,
        le=10,
        description="β: a class's phrase scores are weighted by the class's share of the "
        "phrase to the power β, so words every class uses fade (independent mode; "
        f"post-processing); default {_ENGINE['class_contrast']:g}, 0 (off) to 10",
    )
    contribution_bound: float = Field(
        default=_ENGINE["contribution_bound"],
        gt=0,
        le=math.sqrt(2.0),
        description="c: each document's random-feature vector is clipped to L1 norm c·I, "
        "so the density's sensitivity is c·I (kde_method random_features); default "
        f"{_ENGINE['contribution_bound']:g}, > 0 to √2",
    )
    max_phrases_per_document: int = Field(
        default=_ENGINE["max_phrases_per_document"],
        ge=1,
        le=LIMITS["max_phrases_per_document"],
        description="M, the most private-vocabulary phrases of one document averaged into "
        f"its density contribution (independent mode); default "
        f"{_ENGINE['max_phrases_per_document']}, 1 to {LIMITS['max_phrases_per_document']:,}",
    )
    distinct: bool = Field(
        default=_ENGINE["distinct"],
        description="No phrase twice in one sequence (post-processing); default true",
    )
    # At most 2**53 - 1: beyond it a JSON number is not exact in most clients (I-JSON).
    seed: int = Field(
        default=_ENGINE["seed"],
        ge=0,
        le=2**53 - 1,
        description="Seed of the public randomness (random features, sampling); the DP "
        "noise is never seeded. Default 0, 0 to 2⁵³ − 1",
    )
    audit_canaries: int = Field(
        default=DEFAULT_CANARIES,
        ge=0,
        le=MAX_CANARIES,
        description="The empirical privacy audit (Steinke, Nasr & Jagielski 2023): this many "
        "public canary documents (a public prefix naming a class, then rare words of the "
        "public vocabulary) each join the generation input by a fair coin, drawn by a seed "
        "the worker keeps with the job; at release a membership test on the released corpus "
        "alone gives a lower bound on ε, shown next to the claimed ε in the release report. "
        "Canaries are never stored as dataset rows and never released as documents; the "
        f"budget is unchanged. Default {DEFAULT_CANARIES}, 0 turns the audit off, at most "
        f"{MAX_CANARIES}",
        examples=[DEFAULT_CANARIES, 0],
    )

    @field_validator("*", mode="before")
    @classmethod
    def _numbers_are_not_booleans(cls, value: Any, info: ValidationInfo) -> Any:
        return value if info.field_name in _BOOLEAN_FIELDS else not_a_boolean(value)

    @model_validator(mode="after")
    def _counts_replace_per_class(self) -> JobSpec:
        # With noisy class counts, `total` is split by them and `per_class` means nothing.
        if self.total is not None and "per_class" not in self.model_fields_set:
            self.per_class = None
        if self.noise is None:
            self.noise = "gaussian" if self.delta > 0 else "laplace"
        return self

    def sequences_requested(self, labels: int) -> int:
        """How many keyphrase sequences the job asks for over ``labels`` declared labels."""
        if self.total is not None:
            return self.total
        return (self.per_class or 0) * labels

    def engine_parameters(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in ENGINE_FIELDS}

    def generation_config(self) -> GenerationConfig:
        """The engine's configuration; raises ``ConfigError`` naming the field."""
        return GenerationConfig(**self.engine_parameters()).validate()


class LLMMethodJob(BaseModel):
    """What a job of an LLM method (:mod:`workers.methods.registry`) adds to the method's
    own parameters: the LLM and a cap on its calls. ``epsilon`` and ``delta`` are the
    run's total; ``concurrency`` is capped by the server's LLM concurrency.

    Over JSON, numbers are read as JSON Schema reads them (``2.0`` is the integer 2), not
    strictly as the engine's own models do."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False, allow_inf_nan=False)

    method: str = Field(
        description=(
            "The generation method of the job: 'aug-pe', 'pate-tutor' or 'dp-eda' (a DP-KPS job "
            "is 'dpkps' or has no method)"
        )
    )
    llm: LLMName = "local"
    max_llm_calls: MaxLLMCalls = None

    def params(self) -> MethodParams:
        """The method's own parameters (what the engine and its checkpoints see)."""
        fields = self.model_dump(exclude={"method", "llm", "max_llm_calls"})
        return LLM_METHODS[self.method].params.model_validate(fields)


class AugPEJobSpec(LLMMethodJob, AugPEParams):
    """An Aug-PE job (``method: aug-pe``): :class:`LLMMethodJob` and every
    :class:`~workers.methods.aug_pe.params.AugPEParams` field."""

    model_config = ConfigDict(
        **LLMMethodJob.model_config,
        json_schema_extra={
            "examples": [
                {
                    "method": "aug-pe",
                    "llm": "local",
                    "document_type": "clinical note",
                    "epsilon": 1.0,
                    "delta": 1e-06,
                    "iterations": 5,
                    "population": 40,
                    "num_released": 40,
                }
            ]
        },
    )
    method: Literal["aug-pe"] = Field(
        description="'aug-pe': Private Evolution for text (Xie et al. 2024)"
    )


class PateTutorJobSpec(LLMMethodJob, PateTutorParams):
    """A PATE-tutor job (``method: pate-tutor``): :class:`LLMMethodJob` and every
    :class:`~workers.methods.pate_tutor.params.PateTutorParams` field."""

    model_config = ConfigDict(
        **LLMMethodJob.model_config,
        json_schema_extra={
            "examples": [
                {
                    "method": "pate-tutor",
                    "llm": "local",
                    "document_type": "clinical note",
                    "epsilon": 2.0,
                    "delta": 1e-06,
                    "teachers": 15,
                    "queries": 100,
                }
            ]
        },
    )
    method: Literal["pate-tutor"] = Field(
        description="'pate-tutor': a PATE discriminator with a DP label tutor (Song et al. 2024)"
    )


class DPEDAJobSpec(LLMMethodJob, DPEDAParams):
    """A DP-EDA job (``method: dp-eda``): :class:`LLMMethodJob` and every
    :class:`~workers.methods.dp_eda.params.DPEDAParams` field; ``vocabulary`` names a
    vocabulary of this server (built-in or uploaded), as a DP-KPS job's does."""

    model_config = ConfigDict(
        **LLMMethodJob.model_config,
        json_schema_extra={
            "examples": [
                {
                    "method": "dp-eda",
                    "llm": "local",
                    "document_type": "clinical note",
                    "epsilon": 1.0,
                    "delta": 1e-06,
                    "vocabulary": "medical",
                    "iterations": 7,
                }
            ]
        },
    )
    method: Literal["dp-eda"] = Field(
        description="'dp-eda': DP evolution of embeddings, decoded to text"
    )


def _method(value: Any) -> str:
    """The branch of a job spec: its ``method``, DP-KPS when it names none."""
    method = value.get("method", DPKPS) if isinstance(value, dict) else DPKPS
    return f"method={method}"


AnyJobSpec = Annotated[
    Annotated[JobSpec, Tag(f"method={DPKPS}")]
    | Annotated[AugPEJobSpec, Tag(f"method={AUG_PE}")]
    | Annotated[PateTutorJobSpec, Tag(f"method={PATE_TUTOR}")]
    | Annotated[DPEDAJobSpec, Tag(f"method={DP_EDA}")],
    Discriminator(
        _method,
        custom_error_type="unknown_method",
        custom_error_message=f"method must be one of {', '.join(METHODS)}",
    ),
]
AnySpec = JobSpec | AugPEJobSpec | PateTutorJobSpec | DPEDAJobSpec
JOB_SPEC: TypeAdapter[AnySpec] = TypeAdapter(AnyJobSpec)


class JobPlanOut(BaseModel):
    """A dry run: what a job would release and spend (nothing stored, nothing read)."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "dry_run": True,
                    "dataset_id": "f46d80ee-c926-4bd9-bb6f-41353fbd3eb2",
                    "method": "DP-KPS (Nagesh et al., 2024) with DP-KDE by the class "
                    "centroids of the document embeddings (linear kernel); a sequence kept "
                    "only where its own class's released direction is the nearest to its "
                    "embedding; Ṽ: the first 30,000 phrases of the public vocabulary",
                    "epsilon": 0.872469478,
                    "delta": 1e-05,
                    "accountant": "pld(dp-accounting 0.6.0)",
                    "by_mechanism": {"kde": 0.999999289},
                    "events": [
                        {
                            "mechanism": "kde",
                            "name": None,
                            "noise": "gaussian",
                            "scale": 4.224681681995382,
                            "sensitivity": 1.0,
                            "norm": "l2",
                            "dimension": 384,
                            "partition": "cardio",
                            "count": 1,
                            "epsilon": None,
                        },
                        {
                            "mechanism": "kde",
                            "name": None,
                            "noise": "gaussian",
                            "scale": 4.224681681995382,
                            "sensitivity": 1.0,
                            "norm": "l2",
                            "dimension": 384,
                            "partition": "ortho",
                            "count": 1,
                            "epsilon": None,
                        },
                    ],
                    "parameters": {
                        "kde_method": "centroid",
                        "vocabulary_method": "public",
                        "kde_weighting": "l1",
                        "temperature": 2.0,
                        "per_class": 50,
                    },
                    "noise": [
                        {
                            "mechanism": "kde",
                            "partition": "cardio",
                            "noise": "gaussian",
                            "noise_std": 4.224681681995382,
                            "unit_contribution": 1.0,
                            "norm": "l2",
                            "documents": 920,
                            "noise_share": 0.004592,
                        }
                    ],
                    "budget_after": {
                        "epsilon_cap": 10.0,
                        "delta_cap": 1e-05,
                        "spent": 0.0,
                        "reserved": 0.872469478,
                        "remaining": 9.127530522,
                        "accountant": "pld(dp-accounting 0.6.0)",
                    },
                    "verdict": {
                        "signal_to_noise": 217.766,
                        "level": "strong",
                        "observed_fraction_of_real": [0.85, 0.99],
                        "epsilon_for_strong": None,
                        "summary": "The class signal is about 218× the noise on each released "
                        "score (920 documents a class on average against a noise σ of 4.22): "
                        "expect class separation close to real text's. On the benchmark "
                        "corpora a ratio in this band kept 0.85-0.99 of real-text accuracy "
                        "(BENCHMARKS.md).",
                    },
                }
            ]
        }
    )

    dry_run: Literal[True] = Field(description="Always true: nothing was stored, reserved or read")
    dataset_id: uuid.UUID = Field(description="The dataset the job would run on")
    method: str = Field(
        description="The method as it would run, in words (for DP-KPS: its density estimate, "
        "filter and vocabulary as the budget and mode resolve them)"
    )
    epsilon: float = Field(
        description=(
            "ε of the job's releases composed at delta by the accountant: what submitting the job"
            " would reserve against the dataset's cap"
        )
    )
    delta: float = Field(description="The δ at which epsilon is composed: the dataset's delta_cap")
    accountant: str = Field(
        description=(
            "The accountant that composed epsilon ('exact-sum': pure ε summed; "
            "'pld(dp-accounting …)': privacy loss distributions)"
        )
    )
    by_mechanism: dict[str, float] = Field(
        description="ε of each mechanism (vocabulary, kde, count, …) as the job spec allots it"
    )
    events: list[dict[str, Any]] = Field(
        description=(
            "Every release the job would make: mechanism, noise and its scale, sensitivity, "
            "dimension, partition and the ε of each (public figures)"
        )
    )
    parameters: dict[str, Any] | None = Field(
        default=None,
        description="DP-KPS: every engine parameter, with the defaults that depend on the "
        "budget and mode resolved (kde_method, vocabulary_method, kde_weighting, temperature)",
    )
    noise: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Each release's noise per score (noise_std) beside the signal one "
        "unit adds (unit_contribution); for the dataset's owner, also the documents of "
        "its partition and noise_share = noise_std ÷ documents: a phrase, feature or class "
        "held by fewer than about 3 × noise_share of them is lost in the noise",
    )
    budget_after: dict[str, Any] = Field(
        description="The dataset's figures as they would stand with this job reserved "
        "(cap, spent, reserved, remaining ε at the cap's δ, and the accountant). A job that "
        "would not fit is answered 409 instead, with the same problem a submission gets",
    )
    verdict: dict[str, Any] | None = Field(
        default=None,
        description="For the dataset's owner and a DP-KPS spec: the class signal against "
        "the noise (signal_to_noise = documents per class ÷ the density release's noise σ), "
        "its band (strong ≥ 25, moderate ≥ 10, weak), the fraction of real-text accuracy "
        "the benchmark corpora kept in that band, the smallest ε that would make it strong "
        "(total budgets only) and a summary in words",
    )
    utility: dict[str, Any] | None = Field(
        default=None,
        description="For a DP-KPS spec: the held-out accuracy figure (docs/utility.md): "
        "whether the spec holds out a slice (holdout), its fraction, the evaluation's epsilon, "
        "what it adds to the job's cost (extra_epsilon: 0 up to the generation's own ε, the "
        "two compose in parallel) and cost in words; for the dataset's owner also the "
        "expected slice size and interval half-width (expected_half_width, at confidence), "
        "whether that is useful (within ±0.05) and a summary saying why the holdout is off "
        "or worth turning on",
    )


class JobCounts(BaseModel):
    sequences: int = Field(
        description=(
            "Keyphrase sequences (or, for the other methods, released candidates) the job kept; "
            "DP outputs"
        )
    )
    sequences_drawn: int = Field(
        description="keyphrase sequences drawn from the releases before the consistency "
        "filter kept `sequences` of them (equal when nothing was filtered; both are "
        "post-processing of the DP releases)"
    )
    texts_done: int = Field(description="Synthetic documents written so far")
    texts_failed: int = Field(
        description="Prompts whose LLM call failed after its retries (no document for them)"
    )
    llm_calls: int = Field(description="LLM calls made so far, retries included")


class JobError(BaseModel):
    code: str = Field(
        description=(
            "A stable code of the failure (llm_unavailable, time_limit, accounting_mismatch, "
            "internal_error, …)"
        )
    )
    message: str | None = Field(
        description="What failed, for people: ids, counts and codes only, never private text"
    )


class JobCharge(BaseModel):
    """What the ledger charges the job: its releases composed at the dataset's δ cap."""

    epsilon: float = Field(
        description="ε the ledger charges the job: its releases composed at delta"
    )
    delta: float = Field(description="The dataset's δ cap, at which epsilon is composed")
    accountant: str = Field(
        description=(
            "The accountant that composed the charge ('exact-sum' or 'pld(dp-accounting …)')"
        )
    )


class JobEpsilon(BaseModel):
    requested: float = Field(
        description="The total ε the job spec asks for (the sum over its mechanisms)"
    )
    by_mechanism: dict[str, float] = Field(
        description="ε of each mechanism (vocabulary, kde, count, …)"
    )
    budget_state: Literal["reserved", "committed", "released"] = Field(
        description=(
            "reserved: held against the cap, no private read yet (released if the job is "
            "cancelled or fails now); committed: spent for good, the worker read the private "
            "documents; released: handed back unspent"
        )
    )
    charged: JobCharge | None = Field(
        default=None, description="The ledger's figure (null: not reserved, e.g. a dry run)"
    )


class JobLLMCosts(BaseModel):
    """LLM work of the job: HTTP calls (retries included), tokens the endpoint reported,
    wall time of the LLM stages (seconds)."""

    calls: int = Field(default=0, description="HTTP calls to the LLM, retries included")
    prompt_tokens: int = Field(default=0, description="Prompt tokens the endpoint reported")
    completion_tokens: int = Field(default=0, description="Completion tokens the endpoint reported")
    wall_seconds: float = Field(
        default=0.0, description="Wall-clock seconds of the job's LLM stages"
    )


class JobStage(BaseModel):
    """The stage a running job is in, as stage ``number`` of ``count``; the stage where a
    failed or cancelled job stopped."""

    name: str = Field(description="the stage that runs now (not the one that ended)")
    title: str = Field(description="what the stage does, in words")
    number: int = Field(description="k in 'stage k of n': this stage's place in the run")
    count: int = Field(
        description="n in 'stage k of n': the stages of the job's method and parameters"
    )
    public_work: bool = Field(
        description="whether the stage's amount of work is public (embedding public "
        "phrases, sampling from DP releases, prompting the DP sequences); a stage that "
        "reads the private corpus shows no fraction and no time estimate"
    )
    fraction: float | None = Field(
        description="share of the stage done (public-work stages only; null in a stage "
        "that reads the private corpus, whose share would depend on its size)"
    )
    seconds_left: float | None = Field(
        description="estimated seconds left in the stage, while it runs: the rate over "
        "its public work so far times the work left (public-work stages only)"
    )
    started_at: datetime | None = Field(
        description="when the stage started; to the owning organisation only (a private "
        "stage's start times the private work before it)"
    )


class JobOut(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "id": "523c53a8-ebfe-44c5-9e83-f3e18842f878",
                    "dataset_id": "f46d80ee-c926-4bd9-bb6f-41353fbd3eb2",
                    "organisation_id": "d10493bc-a2dd-4889-9869-62e66a6cae0d",
                    "method": "dpkps",
                    "state": "running",
                    "stage": "prompts",
                    "progress": 0.25,
                    "current_stage": {
                        "name": "prompts",
                        "title": "prompting the LLM",
                        "number": 6,
                        "count": 6,
                        "public_work": True,
                        "fraction": 0.25,
                        "seconds_left": 183.2,
                        "started_at": "2026-12-07T05:31:59.301125Z",
                    },
                    "cancel_requested": False,
                    "counts": {
                        "sequences": 100,
                        "sequences_drawn": 112,
                        "texts_done": 25,
                        "texts_failed": 0,
                        "llm_calls": 26,
                    },
                    "llm_costs": {
                        "calls": 26,
                        "prompt_tokens": 5720,
                        "completion_tokens": 4810,
                        "wall_seconds": 61.4,
                    },
                    "error": None,
                    "epsilon": {
                        "requested": 0.999999289,
                        "by_mechanism": {"kde": 0.999999289},
                        "budget_state": "committed",
                        "charged": {
                            "epsilon": 0.872469478,
                            "delta": 1e-05,
                            "accountant": "pld(dp-accounting 0.6.0)",
                        },
                    },
                    "spec": {
                        "vocabulary": "medical",
                        "llm": "local",
                        "document_type": "clinical note",
                        "epsilon": 1.0,
                        "delta": 1e-06,
                        "per_class": 50,
                    },
                    "submitted_by": "key:cccfaeda-260b-4a37-8c96-00aca9e429c8",
                    "created_at": "2026-12-07T05:31:37.680719Z",
                    "started_at": "2026-12-07T05:31:39.102311Z",
                    "finished_at": None,
                    "updated_at": "2026-12-07T05:32:40.511902Z",
                }
            ]
        }
    )

    id: uuid.UUID = Field(description="The job's id")
    dataset_id: uuid.UUID = Field(description="The dataset the job runs on")
    organisation_id: uuid.UUID = Field(description="The owner organisation of the dataset")
    method: str = Field(description="The generation method: dpkps, aug-pe, pate-tutor or dp-eda")
    state: Literal["queued", "running", "succeeded", "failed", "cancelled"] = Field(
        description="queued → running → succeeded | failed | cancelled"
    )
    stage: str | None = Field(
        description=(
            "The stage running or last run (extract, private_vocabulary, embed, dp_kde, "
            "sequences, prompts for DP-KPS; each method names its own); null before the start"
        )
    )
    progress: float = Field(
        description="Fraction of the current stage done, 0 to 1 (a stage that reads the "
        "private corpus: 0 at its start, 1 at its end)"
    )
    current_stage: JobStage | None = Field(
        default=None,
        description="the running stage as stage k of n, with its fraction and a time "
        "estimate where its work is public (null before the first stage and after success)",
    )
    cancel_requested: bool = Field(
        description="A cancel was asked and the worker will stop at its next check"
    )
    counts: JobCounts = Field(description="What the job made so far")
    llm_costs: JobLLMCosts = Field(description="The job's LLM work")
    error: JobError | None = Field(description="Why the job failed; null unless state is failed")
    epsilon: JobEpsilon = Field(
        description="The job's privacy budget and the state of its reservation"
    )
    spec: dict[str, Any] = Field(
        description="The job spec as submitted, with its defaults filled in"
    )
    submitted_by: str = Field(
        description="Who submitted the job: 'key:<key id>' or 'user:<user id>' (a dashboard user)"
    )
    created_at: datetime = Field(description="When the job was submitted (UTC)")
    started_at: datetime | None = Field(
        description="When a worker started it (UTC); null while queued, and for others than "
        "the owning organisation (it follows the jobs before it on the worker, whose "
        "durations depend on their private corpora)"
    )
    finished_at: datetime | None = Field(
        description="When it ended (UTC); null until it does, and for others than the "
        "owning organisation (it would time the private stages)"
    )
    updated_at: datetime | None = Field(
        description="When its state or progress last changed (UTC); null for others than "
        "the owning organisation (during a private stage it is that stage's start)"
    )
