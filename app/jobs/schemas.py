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
from workers.methods.aug_pe.params import AugPEParams
from workers.methods.common import MethodParams
from workers.methods.dp_eda.params import DPEDAParams
from workers.methods.dpkps.config import (
    CELLS_FROM_EPSILON,
    DEFAULT_CELLS,
    DEFAULT_EXTENSION_RATIO,
    DEFAULT_SELECTION,
    DELTA_CEILING,
    EMBEDDING_DIMENSION,
    EPSILON_CEILING,
    EPSILON_FLOOR,
    LIMITS,
    MAX_CELLS,
    MAX_DOCUMENT_WINDOW,
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
MaxLLMCalls = Annotated[int | None, Field(ge=1, le=10**9)]


class JobSpec(BaseModel):
    """A DP-KPS job (``method`` absent or ``dpkps``)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    method: Literal["dpkps"] = "dpkps"
    vocabulary: str = Field(
        min_length=1,
        max_length=64,
        description="A built-in vocabulary name ('english', 'medical') or the id of an "
        "uploaded vocabulary",
    )
    llm: LLMName = "local"
    document_type: str = Field(
        min_length=1, max_length=PROMPT_LIMITS["document_type_chars"], pattern=NAME_PATTERN
    )
    few_shot: list[Example] = Field(
        default_factory=list,
        max_length=PROMPT_LIMITS["few_shot"],
        description="PUBLIC example texts to imitate (never private documents)",
    )
    template: str | None = Field(
        default=None, max_length=PROMPT_LIMITS["template_chars"], pattern=TEXT_PATTERN
    )
    max_llm_calls: MaxLLMCalls = None

    # The budget: a total ``epsilon`` (and ``delta``: > 0 selects Gaussian noise) split
    # among the mechanisms by the shares, or per-mechanism ε (Laplace, pure).
    epsilon: MechanismEpsilon | None = None
    delta: float = Field(default=0.0, ge=0, le=DELTA_CEILING)
    noise: Literal["laplace", "gaussian"] | None = Field(
        default=None, description="default: gaussian when delta > 0, else laplace"
    )
    share_vocab: float = Field(default=_ENGINE["share_vocab"], gt=0, le=1000)
    share_kde: float = Field(default=_ENGINE["share_kde"], gt=0, le=1000)
    share_count: float = Field(default=_ENGINE["share_count"], gt=0, le=1000)
    epsilon_vocab: MechanismEpsilon | None = None
    epsilon_kde: MechanismEpsilon | None = None
    epsilon_count: MechanismEpsilon | None = None
    # Defaults are the engine's own (chosen by measurement; see benchmarks/notes/README.md).
    per_class: int | None = Field(default=_ENGINE["per_class"], ge=1, le=LIMITS["per_class"])
    total: int | None = Field(default=_ENGINE["total"], ge=1, le=LIMITS["total"])
    vocabulary_size: int = Field(
        default=_ENGINE["vocabulary_size"], ge=1, le=LIMITS["vocabulary_size"]
    )
    max_matches_per_document: int = Field(
        default=_ENGINE["max_matches_per_document"], ge=1, le=LIMITS["max_matches_per_document"]
    )
    sequence_length: int = Field(
        default=_ENGINE["sequence_length"], ge=1, le=LIMITS["sequence_length"]
    )
    mode: Literal["independent", "iterative"] = _ENGINE["mode"]
    ensemble: Literal["log", "linear"] = _ENGINE["ensemble"]
    num_features: int = Field(default=_ENGINE["num_features"], ge=1, le=LIMITS["num_features"])
    bandwidth: float = Field(default=_ENGINE["bandwidth"], gt=0, le=1e6)
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
    temperature: float | None = Field(default=_ENGINE["temperature"], gt=0, le=1e6)
    noise_floor: float = Field(default=_ENGINE["noise_floor"], ge=0, le=10)
    class_contrast: float = Field(default=_ENGINE["class_contrast"], ge=0, le=10)
    contribution_bound: float = Field(
        default=_ENGINE["contribution_bound"], gt=0, le=math.sqrt(2.0)
    )
    max_phrases_per_document: int = Field(
        default=_ENGINE["max_phrases_per_document"], ge=1, le=LIMITS["max_phrases_per_document"]
    )
    distinct: bool = _ENGINE["distinct"]
    # At most 2**53 - 1: beyond it a JSON number is not exact in most clients (I-JSON).
    seed: int = Field(default=_ENGINE["seed"], ge=0, le=2**53 - 1)

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

    method: str
    llm: LLMName = "local"
    max_llm_calls: MaxLLMCalls = None

    def params(self) -> MethodParams:
        """The method's own parameters (what the engine and its checkpoints see)."""
        fields = self.model_dump(exclude={"method", "llm", "max_llm_calls"})
        return LLM_METHODS[self.method].params.model_validate(fields)


class AugPEJobSpec(LLMMethodJob, AugPEParams):
    """An Aug-PE job (``method: aug-pe``): :class:`LLMMethodJob` and every
    :class:`~workers.methods.aug_pe.params.AugPEParams` field."""

    model_config = LLMMethodJob.model_config
    method: Literal["aug-pe"]


class PateTutorJobSpec(LLMMethodJob, PateTutorParams):
    """A PATE-tutor job (``method: pate-tutor``): :class:`LLMMethodJob` and every
    :class:`~workers.methods.pate_tutor.params.PateTutorParams` field."""

    model_config = LLMMethodJob.model_config
    method: Literal["pate-tutor"]


class DPEDAJobSpec(LLMMethodJob, DPEDAParams):
    """A DP-EDA job (``method: dp-eda``): :class:`LLMMethodJob` and every
    :class:`~workers.methods.dp_eda.params.DPEDAParams` field; ``vocabulary`` names a
    vocabulary of this server (built-in or uploaded), as a DP-KPS job's does."""

    model_config = LLMMethodJob.model_config
    method: Literal["dp-eda"]


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

    dry_run: Literal[True]
    dataset_id: uuid.UUID
    method: str
    epsilon: float
    delta: float
    accountant: str
    by_mechanism: dict[str, float]
    events: list[dict[str, Any]]
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


class JobCounts(BaseModel):
    sequences: int
    sequences_drawn: int = Field(
        description="keyphrase sequences drawn from the releases before the consistency "
        "filter kept `sequences` of them (equal when nothing was filtered; both are "
        "post-processing of the DP releases)"
    )
    texts_done: int
    texts_failed: int
    llm_calls: int


class JobError(BaseModel):
    code: str
    message: str | None


class JobCharge(BaseModel):
    """What the ledger charges the job: its releases composed at the dataset's δ cap."""

    epsilon: float
    delta: float
    accountant: str


class JobEpsilon(BaseModel):
    requested: float
    by_mechanism: dict[str, float]
    budget_state: Literal["reserved", "committed", "released"]
    charged: JobCharge | None = Field(
        default=None, description="The ledger's figure (null: not reserved, e.g. a dry run)"
    )


class JobLLMCosts(BaseModel):
    """LLM work of the job: HTTP calls (retries included), tokens the endpoint reported,
    wall time of the LLM stages (seconds)."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    wall_seconds: float = 0.0


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
    id: uuid.UUID
    dataset_id: uuid.UUID
    organisation_id: uuid.UUID
    method: str
    state: Literal["queued", "running", "succeeded", "failed", "cancelled"]
    stage: str | None
    progress: float
    current_stage: JobStage | None = Field(
        default=None,
        description="the running stage as stage k of n, with its fraction and a time "
        "estimate where its work is public (null before the first stage and after success)",
    )
    cancel_requested: bool
    counts: JobCounts
    llm_costs: JobLLMCosts
    error: JobError | None
    epsilon: JobEpsilon
    spec: dict[str, Any]
    submitted_by: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None = Field(
        description="when the job ended; to the owning organisation only (null for "
        "others: it would time the private stages)"
    )
    updated_at: datetime | None = Field(
        description="the job's last change; to the owning organisation only (null for "
        "others: during a private stage it is that stage's start)"
    )
