"""What every generation method's run shares, written once.

* :class:`MethodParams`: the parameters every LLM method takes (public document type,
  total (ε, δ), the client's concurrency, the public seed), validated strictly, and
:func:`max_tokens_field`, :func:`temperature_field`: the sampling parameters each
  method declares with its own default, :func:`share_field`, a share of its budget, and
  :func:`bounded_field`, any parameter whose description ends with its default and bounds;
* :class:`MethodResult`: what a run releases (records, the events of its releases, a
  public manifest, its LLM costs);
* :func:`check_label_set`, :func:`check_units`, :func:`check_inputs`: the input checks
  made before any private read (errors name rows, never ids or text);
* :func:`cached_plan`: a method's ``noise_plan`` (its releases, from public inputs);
* :func:`checkpoint_json`, :func:`run_identity`, :func:`claim_checkpoints`,
  :func:`save_costs`, :func:`load_costs`: how a run writes its checkpoints and refuses
  another run's;
* :func:`complete_texts`: one completion per public request through the shared client,
  cleaned of the model's talk about the request.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from workers.errors import ConfigError, InputDataError
from workers.methods.checkpoints import Checkpoints
from workers.privacy.events import PrivacyEvent
from workers.privacy.limits import EPSILON_CEILING, EPSILON_FLOOR
from workers.text.cleanup import clean_completion
from workers.text.corpus import check_corpus

if TYPE_CHECKING:  # types only: the LLM client loads asyncio and tenacity, embeddings numpy
    from workers.llm.attestation import Source
    from workers.llm.client import LLMCosts, LLMEndpoint, Messages
    from workers.text.embeddings import Embedder

DOCUMENT_TYPE_CHARS = 200


class MethodParams(BaseModel):
    """Parameters every LLM method shares; each method's model adds its own."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    document_type: str = Field(
        description=(
            "What kind of document the LLM writes, in words ('clinical note'); public, in every "
            "prompt. One line, 1 to 200 characters"
        ),
        min_length=1,
        max_length=DOCUMENT_TYPE_CHARS,
    )
    epsilon: float = Field(
        description=(
            "The run's total ε: every release of every class and iteration together, charged to "
            "the dataset's cap. 0.001 to 100"
        ),
        ge=EPSILON_FLOOR,
        le=EPSILON_CEILING,
    )
    delta: float = Field(
        description=(
            "The run's total δ (Gaussian noise; > 0 required), at most the dataset's delta_cap. >"
            " 0 to 0.001"
        ),
        gt=0.0,
        le=1e-3,
    )
    concurrency: int = Field(
        description=(
            "LLM requests in flight at once; capped by the server's own LLM concurrency. Default "
            "8, 1 to 1024"
        ),
        default=8,
        ge=1,
        le=1024,
    )
    seed: int = Field(
        description=(
            "Seed of the public randomness (sampling, prompts); the DP noise is never seeded. "
            "Default 0, 0 to 2⁵³ − 1"
        ),
        default=0,
        ge=0,
        le=2**53 - 1,
    )

    @field_validator("document_type")
    @classmethod
    def _visible(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be blank")
        if any(ch in value for ch in "\r\n\t\x00"):
            raise ValueError("must be one line of text")
        return value.strip()

    def to_dict(self) -> dict[str, Any]:
        """The JSON form recorded in manifests."""
        return self.model_dump(mode="json")


def bounded_field(what: str, default: float, bounds: str, **limits: Any) -> Any:
    """A method's parameter described as ``what``, then its default and its ``bounds``
    in words (``limits``, as pydantic checks them)."""
    return Field(description=f"{what}. Default {default:,g}, {bounds}", default=default, **limits)


def max_tokens_field(default: int) -> Any:
    """A method's ``max_tokens`` parameter, with the method's default."""
    return bounded_field(
        "The most tokens the LLM writes per call", default, "8 to 32,768", ge=8, le=32_768
    )


def temperature_field(default: float) -> Any:
    """A method's ``temperature`` parameter, with the method's default."""
    return bounded_field("The LLM's sampling temperature", default, "0 to 2", ge=0.0, le=2.0)


def share_field(what: str, default: float) -> Any:
    """A share of the run's budget (``what``), strictly between 0 and 1, with the
    method's default."""
    return bounded_field(what, default, "> 0 to < 1", gt=0.0, lt=1.0)


@dataclass
class MethodResult:
    """What a run releases: records, the events of its releases, a public manifest."""

    records: list[tuple[str, str]]  # (label, text)
    events: list[PrivacyEvent]
    manifest: dict[str, Any]
    llm_costs: LLMCosts


def check_label_set(label_set: Sequence[str]) -> tuple[str, ...]:
    """The declared labels: non-empty strings, none repeated."""
    labels = tuple(label_set)
    if not labels:
        raise ConfigError("the label set is empty", field="labels")
    if any(not isinstance(label, str) or not label for label in labels):
        raise ConfigError("labels must be non-empty strings", field="labels")
    if len(set(labels)) != len(labels):
        raise ConfigError("the label set repeats a label", field="labels")
    return labels


ParamsT = TypeVar("ParamsT", bound=MethodParams)
PlanT = TypeVar("PlanT")


def cached_plan(
    build: Callable[[ParamsT, tuple[str, ...]], PlanT],
) -> Callable[[ParamsT, Sequence[str]], PlanT]:
    """A method's ``noise_plan(params, label_set)``: ``build``, its plan from its
    parameters and declared labels, on the label set :func:`check_label_set` checks,
    computed once per parameters and labels (the last 32 asked for are kept)."""
    cached = lru_cache(maxsize=32)(build)

    def noise_plan(params: ParamsT, label_set: Sequence[str]) -> PlanT:
        return cached(params, check_label_set(label_set))

    noise_plan.__doc__ = build.__doc__
    return noise_plan


def check_units(units: Sequence[str], documents: int) -> None:
    """A unit id per document, each a non-empty string; errors name rows, never ids."""
    if isinstance(units, str) or len(units) != documents:
        raise InputDataError("give one unit per document", field="units")
    bad = [i + 1 for i, u in enumerate(units) if not isinstance(u, str) or not u]
    if bad:
        rows = ", ".join(map(str, bad[:10])) + (" …" if len(bad) > 10 else "")
        raise InputDataError(f"empty or non-string unit (rows {rows})", field="units")


class Sampling(Protocol):
    """A method's completion settings (its parameters carry them)."""

    @property
    def max_tokens(self) -> int: ...

    @property
    def temperature(self) -> float: ...


def check_inputs(
    documents: Sequence[str],
    labels: Sequence[str],
    label_set: Sequence[str],
    units: Sequence[str] | None,
    llm: LLMEndpoint,
    sampling: Sampling,
) -> tuple[tuple[str, ...], LLMEndpoint]:
    """What an LLM method checks before its first private read: the declared labels,
    the corpus against them, the units, and the endpoint with the method's sampling
    settings. Returns the declared labels and that endpoint."""
    declared = check_label_set(label_set)
    check_corpus(documents, labels, list(declared))
    if units is not None:
        check_units(units, len(documents))
    endpoint = replace(llm, max_tokens=sampling.max_tokens, temperature=sampling.temperature)
    endpoint.validate()
    return declared, endpoint


def checkpoint_json(data: Any) -> bytes:
    """A checkpoint's bytes: strict JSON (no NaN), UTF-8."""
    return json.dumps(data, ensure_ascii=False, allow_nan=False).encode()


def no_progress(stage: str, fraction: float) -> None:
    return None


def complete_texts(
    requests: Sequence[Messages],
    *,
    endpoint: LLMEndpoint,
    concurrency: int,
    costs: LLMCosts,
    sources: Sequence[Source],
    tick: Callable[[], None] | None = None,
) -> list[str | None]:
    """One completion per request, cleaned of the model's talk about the request
    (:func:`workers.text.cleanup.clean_completion`: every request of these methods asks
    for a document); ``None`` where the endpoint failed. ``sources[i]`` says what request
    i was built from, for the job's prompt log (:mod:`workers.llm.attestation`); the
    model is added to its refs. ``tick`` (:func:`workers.methods.progress.ticker`) is
    called after each request; if it raises, the run stops and the exception propagates."""
    from workers.llm.client import complete, run_sync

    if len(sources) != len(requests):
        raise ValueError("give one source per request")  # a bug in the method, never data

    if not requests:
        return []
    outcomes = run_sync(
        complete(
            requests.__getitem__,
            len(requests),
            endpoint=endpoint,
            concurrency=concurrency,
            costs=costs,
            describe=lambda i, messages: replace(
                sources[i], refs={**sources[i].refs, "model": endpoint.model}
            ).prompt(messages),
            progress=None if tick is None else lambda done, total: tick(),
        )
    )
    return [None if o.text is None else clean_completion(o.text) for o in outcomes]


def random_source(key: str, params: MethodParams, label: str) -> Source:
    """What a random-document request (Aug-PE's RANDOM_API, PATE-tutor's public pool) is
    built from: the public document type and a declared label, nothing else."""
    from workers.llm.attestation import RANDOM, Source

    return Source(
        key=key, kind=RANDOM, refs={"document_type": params.document_type, "label": label}
    )


class RunConfiguration(Protocol):
    """What a method's run holds of its public configuration."""

    @property
    def params(self) -> MethodParams: ...

    @property
    def labels(self) -> tuple[str, ...]: ...

    @property
    def endpoint(self) -> LLMEndpoint: ...

    @property
    def embedder(self) -> Embedder: ...


def run_identity(
    method: str, run: RunConfiguration, *, unit_level: bool, **extra: Any
) -> dict[str, Any]:
    """A run's public configuration as :func:`claim_checkpoints` fingerprints it: the
    method, its parameters (less ``concurrency``, which changes nothing a checkpoint
    holds), the declared labels, whether units are the privacy unit, the models, and the
    method's ``extra`` public inputs.

    >>> from types import SimpleNamespace
    >>> run = SimpleNamespace(
    ...     params=MethodParams(document_type="note", epsilon=1.0, delta=1e-6, concurrency=4),
    ...     labels=("a",),
    ...     endpoint=SimpleNamespace(model="l"),
    ...     embedder=SimpleNamespace(name="e"),
    ... )
    >>> identity = run_identity("m", run, unit_level=False, pool=None)
    >>> sorted(identity)
    ['embedding_model', 'labels', 'llm_model', 'method', 'parameters', 'pool', 'unit_level']
    >>> "concurrency" in identity["parameters"]
    False
    """
    settings = run.params.to_dict()
    settings.pop("concurrency")
    return {
        "method": method,
        "parameters": settings,
        "labels": list(run.labels),
        "unit_level": unit_level,
        "llm_model": run.endpoint.model,
        "embedding_model": run.embedder.name,
        **extra,
    }


def claim_checkpoints(checkpoints: Checkpoints, key: str, identity: dict[str, Any]) -> None:
    """Tie ``checkpoints`` to a run's public configuration (``identity``, with its
    ``method``): the first run writes its fingerprint, a run of another configuration is
    refused (its saved DP outputs are not this run's)."""
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
    stored = checkpoints.load(key)
    if stored is None:
        record = {"method": identity["method"], "fingerprint": digest}
        checkpoints.save(key, checkpoint_json(record))
    elif json.loads(stored).get("fingerprint") != digest:
        raise ConfigError(
            "the checkpoints belong to a run with other parameters", field="checkpoints"
        )


def save_costs(checkpoints: Checkpoints, key: str, costs: LLMCosts, **extra: Any) -> None:
    """The run's LLM costs so far (a resumed run adds to them), with ``extra`` counters."""
    data: dict[str, Any] = dict(costs.as_dict())
    data["wall_seconds"] = costs.wall_seconds
    data.update(extra)
    checkpoints.save(key, checkpoint_json(data))


def load_costs(checkpoints: Checkpoints, key: str) -> dict[str, Any] | None:
    """What :func:`save_costs` saved, or None."""
    saved = checkpoints.load(key)
    return None if saved is None else dict(json.loads(saved))
