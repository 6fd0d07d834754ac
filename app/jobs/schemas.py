"""A job spec carries its method's parameters, the LLM and, for DP-KPS, the prompt.

A method's parameters are its own model's (:mod:`workers.methods.registry`); a job adds
the LLM and a cap on its calls. Bounds give early, typed 422s; the engine's own
:meth:`GenerationConfig.validate` and :meth:`PromptSpec.validate` run as well, so a spec
the engine would refuse is never queued. The LLM is named (``none``, ``local`` or an
endpoint configured on the server): a spec never carries a URL or a key.
``device`` is the worker's business, not the spec's.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    ModelWrapValidatorHandler,
    StringConstraints,
    Tag,
    TypeAdapter,
    ValidationInfo,
    field_validator,
    model_validator,
)

from app.datasets.schemas import not_a_boolean
from app.identity.schemas import NAME_PATTERN, TEXT_PATTERN
from app.schemas import KDE_EVENTS_EXAMPLE, with_examples
from workers.evaluation.holdout import DEFAULT_FRACTION as HOLDOUT_FRACTION
from workers.evaluation.holdout import MAX_FRACTION as HOLDOUT_MAX_FRACTION
from workers.methods.aug_pe.params import AugPEParams
from workers.methods.catalog import METHOD_PARAMS
from workers.methods.common import MethodParams
from workers.methods.dp_eda.params import DPEDAParams
from workers.methods.dpkps.params import DPKPSParams, MechanismEpsilon, stored_levers
from workers.methods.dpkps.prompting import DEFAULT_TEMPLATE, PromptSpec
from workers.methods.dpkps.prompting import LIMITS as PROMPT_LIMITS
from workers.methods.pate_tutor.params import PateTutorParams
from workers.methods.registry import AUG_PE, DP_EDA, DPKPS, METHODS, PATE_TUTOR
from workers.privacy.audit import DEFAULT_CANARIES, MAX_CANARIES

Example = Annotated[
    str,
    StringConstraints(
        min_length=1, max_length=PROMPT_LIMITS["example_chars"], pattern=TEXT_PATTERN
    ),
]

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

# the job spec a hospital submits most: a total ε and δ on the medical vocabulary (the
# spec's example and the stored job's)
SPEC_EXAMPLE: dict[str, Any] = {
    "vocabulary": "medical",
    "llm": "local",
    "document_type": "clinical note",
    "epsilon": 1.0,
    "delta": 1e-06,
    "per_class": 50,
}


class HoldoutSpec(BaseModel):
    """A slice of the private units held out from generation, on which a classifier trained
    on the released corpus is scored, its accuracy published with noise (docs/utility.md)."""

    model_config = with_examples(
        {"fraction": 0.1}, {"fraction": 0.2, "epsilon": 0.5}, extra="forbid", allow_inf_nan=False
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


def holdout_field() -> Any:
    """A job spec's ``holdout`` (every method that supports one: its registry entry)."""
    return Field(
        default=None,
        description="Hold out a slice of the private units and publish the accuracy, with "
        "noise, of a classifier trained on the released corpus on it (docs/utility.md). "
        "Null, the default: off; the dry run says whether the corpus is large enough for a "
        "useful interval",
        examples=[None, {"fraction": 0.1}],
    )


def canaries_field() -> Any:
    """A job spec's ``audit_canaries`` (every method: docs/privacy.md, the canary audit)."""
    return Field(
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


class JobSpec(DPKPSParams):
    """A DP-KPS job (``method`` absent or ``dpkps``): its :class:`DPKPSParams`, the LLM that
    writes the texts and its prompt, a holdout and the privacy audit's canaries."""

    model_config = with_examples(
        SPEC_EXAMPLE,
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
        extra="forbid",
        allow_inf_nan=False,
    )

    method: Literal["dpkps"] = Field(
        default="dpkps",
        description="The generation method: 'dpkps' (DP keyphrase prompt seeding, the default "
        "when absent); 'aug-pe', 'pate-tutor' and 'dp-eda' select the other methods' specs",
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
    holdout: HoldoutSpec | None = holdout_field()
    audit_canaries: int = canaries_field()

    def params(self) -> DPKPSParams:
        """The method's own parameters (what the engine sees), checked as the engine
        checks them (``ConfigError`` naming the field)."""
        params = DPKPSParams.model_validate(self.model_dump(include=set(DPKPSParams.model_fields)))
        params._stored_levers = dict(self._stored_levers)
        params.generation_config()
        return params

    def prompt(self) -> PromptSpec:
        """The prompt that writes each sequence out (public)."""
        return PromptSpec(
            self.document_type, tuple(self.few_shot), self.template or DEFAULT_TEMPLATE
        )


class StoredJobSpec(JobSpec):
    """A DP-KPS job as it was stored at submission, read back by the worker (a run, a
    retry) and the release: a job submitted while the research levers were public
    (:data:`~workers.methods.dpkps.params.RESEARCH_FIELDS`) recorded each of them, and it
    reads and runs with the values it recorded. A new spec naming one is refused
    (:class:`JobSpec` forbids unknown fields)."""

    @model_validator(mode="wrap")
    @classmethod
    def _read_research_levers(cls, data: Any, handler: ModelWrapValidatorHandler[Any]) -> Any:
        if not isinstance(data, Mapping):
            return handler(data)
        public, levers = stored_levers(data)
        # stored before embed_sample existed (2026-12-07): the run embedded every unit
        public.setdefault("embed_sample", 0)
        spec = handler(public)
        spec._stored_levers = levers
        return spec


class LLMMethodJob(BaseModel):
    """What a job of an LLM method (:mod:`workers.methods.registry`) adds to the method's
    own parameters: the LLM, a cap on its calls, a holdout and the privacy audit's
    canaries (as a DP-KPS job's; neither reaches the method's parameters). ``epsilon``
    and ``delta`` are the run's total; ``concurrency`` is capped by the server's LLM
    concurrency.

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
    holdout: HoldoutSpec | None = holdout_field()
    audit_canaries: int = canaries_field()

    @field_validator("audit_canaries", mode="before")
    @classmethod
    def _canaries_are_not_booleans(cls, value: Any) -> Any:
        return not_a_boolean(value)

    def params(self) -> MethodParams:
        """The method's own parameters (what the engine and its checkpoints see)."""
        fields = self.model_dump(
            exclude={"method", "llm", "max_llm_calls", "holdout", "audit_canaries"}
        )
        return METHOD_PARAMS[self.method].model_validate(fields)

    def prompt(self) -> None:
        """None: the method's prompts are its own (:mod:`workers.methods.registry`)."""
        return None


def _llm_job_config(method: str, epsilon: float, **levers: Any) -> ConfigDict:
    """An LLM method's job spec configuration: :class:`LLMMethodJob`'s, and an example job
    of the method on the local LLM (``levers``: its own parameters)."""
    example = {
        "method": method,
        "llm": "local",
        "document_type": "clinical note",
        "epsilon": epsilon,
        "delta": 1e-06,
        **levers,
    }
    return with_examples(example, **LLMMethodJob.model_config)


class AugPEJobSpec(LLMMethodJob, AugPEParams):
    """An Aug-PE job (``method: aug-pe``): :class:`LLMMethodJob` and every
    :class:`~workers.methods.aug_pe.params.AugPEParams` field."""

    model_config = _llm_job_config("aug-pe", 1.0, iterations=5, population=40, num_released=40)
    method: Literal["aug-pe"] = Field(
        description="'aug-pe': Private Evolution for text (Xie et al. 2024)"
    )


class PateTutorJobSpec(LLMMethodJob, PateTutorParams):
    """A PATE-tutor job (``method: pate-tutor``): :class:`LLMMethodJob` and every
    :class:`~workers.methods.pate_tutor.params.PateTutorParams` field."""

    model_config = _llm_job_config("pate-tutor", 2.0, teachers=15, queries=100)
    method: Literal["pate-tutor"] = Field(
        description="'pate-tutor': a PATE discriminator with a DP label tutor (Song et al. 2024)"
    )


class DPEDAJobSpec(LLMMethodJob, DPEDAParams):
    """A DP-EDA job (``method: dp-eda``): :class:`LLMMethodJob` and every
    :class:`~workers.methods.dp_eda.params.DPEDAParams` field; ``vocabulary`` names a
    vocabulary of this server (built-in or uploaded), as a DP-KPS job's does."""

    model_config = _llm_job_config("dp-eda", 1.0, vocabulary="medical", iterations=7)
    method: Literal["dp-eda"] = Field(
        description="'dp-eda': DP evolution of embeddings, decoded to text"
    )


def _method(value: Any) -> str:
    """The branch of a job spec: its ``method``, DP-KPS when it names none."""
    method = value.get("method", DPKPS) if isinstance(value, dict) else DPKPS
    return f"method={method}"


def _by_method(dpkps: type[JobSpec]) -> Any:
    """The job specs of every method, told apart by ``method`` (``dpkps``: its model)."""
    return Annotated[
        Annotated[dpkps, Tag(f"method={DPKPS}")]
        | Annotated[AugPEJobSpec, Tag(f"method={AUG_PE}")]
        | Annotated[PateTutorJobSpec, Tag(f"method={PATE_TUTOR}")]
        | Annotated[DPEDAJobSpec, Tag(f"method={DP_EDA}")],
        Discriminator(
            _method,
            custom_error_type="unknown_method",
            custom_error_message=f"method must be one of {', '.join(METHODS)}",
        ),
    ]


AnyJobSpec = _by_method(JobSpec)
AnySpec = JobSpec | AugPEJobSpec | PateTutorJobSpec | DPEDAJobSpec
# A stored spec (the worker's, the release's reader): as a new one, but a DP-KPS job may
# name the research levers it was submitted with (:class:`StoredJobSpec`).
StoredSpec = _by_method(StoredJobSpec)
JOB_SPEC: TypeAdapter[AnySpec] = TypeAdapter(StoredSpec)


class JobPlanOut(BaseModel):
    """A dry run: what a job would release and spend (nothing stored, nothing read)."""

    model_config = with_examples(
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
            "events": KDE_EVENTS_EXAMPLE,
            "parameters": {
                "kde_method": "centroid",
                "vocabulary_method": "public",
                "temperature": 2.0,
                "per_class": 50,
            },
            "noise": [
                {
                    "mechanism": "kde",
                    "partition": "cardio",
                    "noise": "gaussian",
                    "noise_std": 4.245749841569569,
                    "unit_contribution": 1.0,
                    "norm": "l2",
                    "documents": 920,
                    "noise_share": 0.004615,
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
                "signal_to_noise": 216.687,
                "level": "strong",
                "observed_fraction_of_real": [0.85, 0.99],
                "epsilon_for_strong": None,
                "summary": "The class signal is about 217× the noise on each released "
                "score (920 documents a class on average against a noise σ of 4.25): "
                "expect class separation close to real text's. On the benchmark "
                "corpora a ratio in this band kept 0.85-0.99 of real-text accuracy "
                "(BENCHMARKS.md).",
            },
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
        description="DP-KPS: every parameter of the spec, with the defaults that depend on the "
        "budget and mode resolved (kde_method, vocabulary_method, temperature)",
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


class ShardOut(BaseModel):
    """One shard of one round of a sharded job (the owner's view)."""

    shard: int = Field(description="the shard's number, 0 to count - 1")
    state: Literal["pending", "running", "done"] = Field(
        description="pending (sent), running (a worker process claimed it), done (stored)"
    )
    attempts: int = Field(description="how often a worker process claimed it (a retry adds 1)")
    finished_at: datetime | None = Field(description="when its part was stored (UTC)")


class ShardRoundOut(BaseModel):
    """One round of a sharded job: its shards' maps, then one reduce that adds the noise."""

    name: str = Field(description="the round (public: counts, sums)")
    reduced: bool = Field(description="whether the round's release (its noise) is drawn")
    done: int = Field(description="its shards stored so far")
    shards: list[ShardOut] = Field(description="each shard's state (empty until it is sent)")


class JobShardsOut(BaseModel):
    """How a sharded job's private stages are split (the owner's view)."""

    count: int = Field(description="the number of shards (the server's KEYSEED_JOB_SHARDS)")
    rounds: list[ShardRoundOut] = Field(description="the engine's rounds, in order")


class JobOut(BaseModel):
    model_config = with_examples(
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
            "spec": SPEC_EXAMPLE,
            "submitted_by": "key:cccfaeda-260b-4a37-8c96-00aca9e429c8",
            "created_at": "2026-12-07T05:31:37.680719Z",
            "started_at": "2026-12-07T05:31:39.102311Z",
            "finished_at": None,
            "updated_at": "2026-12-07T05:32:40.511902Z",
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
    shards: JobShardsOut | None = Field(
        default=None,
        description="A sharded job's shards, round by round (issue 65): to the owning "
        "organisation only (when a shard ends depends on its rows); null for others and "
        "for a job that runs whole",
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
