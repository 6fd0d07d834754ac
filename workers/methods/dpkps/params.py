"""Every parameter of a DP-KPS run, as one typed model (the job spec's and the CLI's).

The fields are :class:`~workers.methods.dpkps.config.GenerationConfig`'s public ones
(:data:`PUBLIC_FIELDS`: every engine parameter but the device, which is the worker's
business, and the research levers, :data:`RESEARCH_FIELDS`, which the benchmarks vary
through ``benchmarks/experiments.py``) and the public vocabulary the run reads, each with
its bounds, its default (the engine's own, chosen by measurement) and a description for
the API docs and the command line's help. ``docs/parameters.md`` says, per option and per
lever, its default, the rule that sets it and the study that chose it. A stored spec that
recorded the levers reads with them (:func:`stored_levers`, the stored specs' reader), and
one that names a lever since removed from the engine (:data:`RETIRED_LEVERS`) still reads
and runs.
:meth:`DPKPSParams.generation_config` maps them to the engine's configuration, whose own
checks (the options that go together) run there, with errors that name the field.

Numbers are read as JSON Schema reads them (``2.0`` is the integer 2), never ``true`` or
``false`` for a number. This module imports no numerical library, so an API process can
validate job specs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from workers.methods.dpkps.config import (
    CELLS_FROM_EPSILON,
    DEFAULT_CELLS,
    DEFAULT_EMBED_SAMPLE,
    DEFAULT_SELECTION,
    DEFAULT_TEMPERATURE,
    EMBEDDING_DIMENSION,
    LIMITS,
    MAX_CELLS,
    MAX_EMBED_SAMPLE,
    MAX_SELECTION,
    PUBLIC_VOCABULARY_DEFAULTS,
    SUBSPACE_FROM_CLASSES,
    SUGGESTED_SUBSPACE,
    GenerationConfig,
)
from workers.privacy.limits import DELTA_CEILING, EPSILON_CEILING, EPSILON_FLOOR

# Every engine parameter but the device, which is the worker's business.
ENGINE_FIELDS: Final = tuple(
    f.name for f in dataclasses.fields(GenerationConfig) if f.name != "device"
)
_ENGINE: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(GenerationConfig)}
# The research levers (issue 64): engine parameters that no default rule moves and no
# user need asks for (docs/parameters.md says, per lever, the study that fixed it). They
# stay :class:`GenerationConfig` fields at their measured defaults, which the benchmarks
# vary by name (benchmarks/experiments.py); a job spec or the command line names none.
RESEARCH_FIELDS: Final = frozenset(
    {
        "bandwidth",
        "cell_kappa",
        "cell_share",
        "class_contrast",
        "contribution_bound",
        "distinct",
        "kde_weighting",
        "label_prior",
        "max_phrases_per_document",
        "noise_floor",
    }
)
# Levers removed from the engine (issue 64): they measured no gain, no default reached them
# and no benchmark used them (docs/parameters.md). A spec stored while they were job options
# may name them, each with the values at which it changed nothing: there the name is read
# and dropped. At another value the job runs as the engine now does and its manifest lists
# the setting under ``settings_not_applied`` (:func:`retired_settings`). None of them
# changed what a run charges: the names' lead and the extension were post-processing, and
# a document read in windows was still one vector of norm ≤ 1 per unit (same noise).
RETIRED_LEVERS: Final[dict[str, tuple[Any, ...]]] = {
    "document_window": (0,),  # documents read whole, in windows of this many words
    "label_prior_lead": (0,),  # the label names' lead, L
    "public_extension": (0,),  # |Ṽ⁺|, a larger public Ṽ for large classes
    "extension_ratio": (15,),  # r, the released count over σ from which a class used Ṽ⁺
}
# Values of public fields that left with them (no default chooses them, and they measured
# no gain): the moments density and the thresholded vocabulary.
RESEARCH_VALUES: Final = {"kde_method": ("moments",), "vocabulary_method": ("threshold",)}
# What a job spec and the command line offer: every engine parameter but the levers.
PUBLIC_FIELDS: Final = tuple(name for name in ENGINE_FIELDS if name not in RESEARCH_FIELDS)
_BOOLEAN_FIELDS = frozenset({"consistency_filter"})


def not_a_boolean(value: Any) -> Any:
    """Refuse ``true``/``false`` where a number is asked (pydantic would read 1 and 0)."""
    if isinstance(value, bool):
        raise ValueError("true or false is not accepted here")
    return value


# ε of one mechanism, within the floor and ceiling (:func:`workers.privacy.limits.check_epsilon`):
# a job at a negligible ε could only serve to probe the data at no charge.
MechanismEpsilon = Annotated[
    float, Field(ge=EPSILON_FLOOR, le=EPSILON_CEILING), BeforeValidator(not_a_boolean)
]


def stored_levers(stored: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A stored spec split into what the public model reads and the research levers it
    names (:data:`RESEARCH_FIELDS`, :data:`RETIRED_LEVERS`, or a field at one of
    :data:`RESEARCH_VALUES`).

    A job submitted while the levers were public recorded every one of them; it reads
    and runs with the values it recorded, a retired lever's excepted.

    >>> stored_levers({"epsilon": 1.0, "noise_floor": 0.0, "kde_method": "moments"})
    ({'epsilon': 1.0}, {'noise_floor': 0.0, 'kde_method': 'moments'})
    """
    public: dict[str, Any] = {}
    levers: dict[str, Any] = {}
    for name, value in stored.items():
        research = (
            name in RESEARCH_FIELDS
            or name in RETIRED_LEVERS
            or value in RESEARCH_VALUES.get(name, ())
        )
        (levers if research else public)[name] = value
    return public, levers


def retired_settings(values: Mapping[str, Any]) -> dict[str, Any]:
    """The retired levers (:data:`RETIRED_LEVERS`) that ``values`` sets to a value that
    changed a run: the ratio only with an extension, which alone read it.

    >>> retired_settings({"document_window": 0, "label_prior_lead": 32.0, "extension_ratio": 9})
    {'label_prior_lead': 32.0}
    """
    asked = {
        name: values[name]
        for name, inert in RETIRED_LEVERS.items()
        if name in values and values[name] not in inert
    }
    if "public_extension" not in asked:
        asked.pop("extension_ratio", None)
    return asked


class DPKPSParams(BaseModel):
    """A DP-KPS run's parameters (module docstring)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    # The research levers a stored spec recorded (:func:`stored_levers`); empty for a new one.
    _stored_levers: dict[str, Any] = PrivateAttr(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _research_levers_are_not_parameters(
        cls, data: Any, handler: ModelWrapValidatorHandler[DPKPSParams]
    ) -> DPKPSParams:
        """A research lever named in new parameters: an error that says so, per lever."""
        if not isinstance(data, Mapping) or not stored_levers(data)[1]:
            return handler(data)
        errors = [
            InitErrorDetails(
                type=PydanticCustomError(
                    "retired_option",
                    "{field} was removed from the engine: it measured no gain (docs/parameters.md)",
                    {"field": name},
                )
                if name in RETIRED_LEVERS
                else PydanticCustomError(
                    "research_option",
                    "{field}{value} is a research setting, not a parameter of the product "
                    "(docs/parameters.md)",
                    {"field": name, "value": "" if name in RESEARCH_FIELDS else f" {value}"},
                ),
                loc=(name,),
                input=value,
            )
            for name, value in stored_levers(data)[1].items()
        ]
        raise ValidationError.from_exception_data(cls.__name__, errors)

    vocabulary: str = Field(
        min_length=1,
        max_length=64,
        description="A built-in vocabulary name ('english', 'medical') or the id of an "
        "uploaded vocabulary",
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
    kde_method: Literal["exact", "random_features", "centroid"] | None = Field(
        default=_ENGINE["kde_method"],
        description="default: centroid for a total Gaussian budget in independent mode, "
        "exact for Laplace, random_features in iterative mode; centroid needs Gaussian "
        "noise and independent mode",
    )
    vocabulary_method: Literal["histogram", "public"] | None = Field(
        default=_ENGINE["vocabulary_method"],
        description="how Ṽ is chosen: a noisy histogram over the vocabulary, or the first "
        "public_vocabulary_size phrases (no release); default: public for centroid, else "
        "histogram",
    )
    public_vocabulary_size: int | None = Field(
        default=_ENGINE["public_vocabulary_size"],
        ge=1,
        le=LIMITS["vocabulary_size"],
        description=f"|Ṽ| of a public Ṽ; default {PUBLIC_VOCABULARY_DEFAULTS}",
    )
    centroid_cells: int | None = Field(
        default=_ENGINE["centroid_cells"],
        ge=1,
        le=MAX_CELLS,
        description="cells per class with kde_method centroid: the class sum places up to "
        "this many, whose sums a second release gives (1: the class sum alone); default "
        f"{DEFAULT_CELLS} from epsilon {CELLS_FROM_EPSILON:g} on, else 1",
    )
    sequence_selection: int | None = Field(
        default=_ENGINE["sequence_selection"],
        ge=1,
        le=MAX_SELECTION,
        description="with kde_method centroid: draw this many times the sequences "
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
    embed_sample: int | None = Field(
        default=_ENGINE["embed_sample"],
        ge=0,
        le=MAX_EMBED_SAMPLE,
        description="with kde_method centroid: embed only a Poisson sample of "
        "about this many units of each class (each unit kept independently with probability "
        "min(1, m / the class's released count)), so the embedding work is bounded whatever "
        "the corpus holds; each class sum is charged as before, and the class counts are "
        "released for the rate (a small share of the budget, unless a total releases them "
        f"anyway). 0: every unit; null, the default: {DEFAULT_EMBED_SAMPLE:,} (every class "
        "of every reported corpus is smaller, so they are embedded whole)",
    )
    temperature: float | None = Field(
        default=_ENGINE["temperature"],
        gt=0,
        le=1e6,
        description="τ: a phrase is drawn with probability ∝ clip(score)^(1/τ) (lower: "
        "sharper, fewer distinct phrases; post-processing); null, the default: per "
        f"kde_method ({', '.join(f'{k} {v:g}' for k, v in DEFAULT_TEMPERATURE.items())})",
    )
    # At most 2**53 - 1: beyond it a JSON number is not exact in most clients (I-JSON).
    seed: int = Field(
        default=_ENGINE["seed"],
        ge=0,
        le=2**53 - 1,
        description="Seed of the public randomness (random features, sampling); the DP "
        "noise is never seeded. Default 0, 0 to 2⁵³ − 1",
    )

    @field_validator("*", mode="before")
    @classmethod
    def _numbers_are_not_booleans(cls, value: Any, info: ValidationInfo) -> Any:
        return value if info.field_name in _BOOLEAN_FIELDS else not_a_boolean(value)

    @model_validator(mode="after")
    def _counts_replace_per_class(self) -> DPKPSParams:
        # With noisy class counts, `total` is split by them and `per_class` means nothing.
        if self.total is not None and "per_class" not in self.model_fields_set:
            self.per_class = None
        if self.noise is None:
            self.noise = "gaussian" if self.delta > 0 else "laplace"
        return self

    @property
    def count_field(self) -> str:
        """The field that sets how many sequences the run draws: ``total`` or ``per_class``."""
        return "total" if self.total is not None else "per_class"

    def sequences_requested(self, labels: int) -> int:
        """How many keyphrase sequences the run asks for over ``labels`` declared labels."""
        if self.total is not None:
            return self.total
        return (self.per_class or 0) * labels

    @property
    def parameter_names(self) -> tuple[str, ...]:
        """The engine parameters these parameters set: the public ones, and the research
        levers a stored spec recorded."""
        return tuple(n for n in ENGINE_FIELDS if n in PUBLIC_FIELDS or n in self._stored_levers)

    @property
    def settings_not_applied(self) -> dict[str, Any]:
        """The retired levers a stored spec asked for that a run no longer applies
        (:func:`retired_settings`): it runs with the engine's behaviour in their place."""
        return retired_settings(self._stored_levers)

    def engine_parameters(self) -> dict[str, Any]:
        """Every engine parameter (:data:`ENGINE_FIELDS`): the public fields, and each
        research lever at its engine default or at the value a stored spec recorded."""
        values = {name: _ENGINE[name] for name in RESEARCH_FIELDS}
        values |= {name: getattr(self, name) for name in PUBLIC_FIELDS}
        values |= self._stored_levers
        return {name: values[name] for name in ENGINE_FIELDS}

    def generation_config(self, device: str | None = None) -> GenerationConfig:
        """The engine's configuration on ``device``; raises ``ConfigError`` naming the field."""
        return GenerationConfig(**self.engine_parameters(), device=device).validate()
