"""The shape every LLM method's run shares, written once: :class:`MethodRun`.

A run of Aug-PE, PATE-tutor or DP-EDA goes the same way around its own steps:

1. **Before any private read** (:meth:`MethodRun.start`): the inputs are checked
   (:func:`~workers.methods.common.check_inputs`), every release is planned from public
   parameters (the method's ``noise_plan``), the checkpoints are claimed for this run's
   public configuration (a run of another configuration is refused) and the LLM costs of
   earlier attempts are loaded, so a resumed run adds to them.
2. **The method's steps** (:meth:`MethodRun.execute`, the method's own), each a progress
   stage (:meth:`MethodRun.stage`): public LLM work through :meth:`MethodRun.generate`
   and :meth:`MethodRun.complete_all`, each DP release saved with its event before
   anything uses it (:meth:`MethodRun.save_release`) and loaded instead of drawn again on
   a re-run (:meth:`MethodRun.saved_release`).
3. **The end**: the events checked against the plan (:meth:`MethodRun.check_plan`) and a
   :class:`~workers.methods.common.MethodResult` with a public manifest, whose shared
   entries :meth:`MethodRun.describe`, :meth:`MethodRun.models` and
   :meth:`MethodRun.release_summary` write.

Checkpoint keys every run has: ``<method>-run`` (the fingerprint of its public
configuration) and ``<method>-llm-costs`` (its LLM costs with the method's counters).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import (
    TYPE_CHECKING,
    Any,
    ClassVar,
    Generic,
    NotRequired,
    Protocol,
    TypedDict,
    TypeVar,
    cast,
)

import numpy as np

from workers.errors import LLMError
from workers.llm.client import LLMCosts, LLMEndpoint, Messages
from workers.methods.checkpoints import Checkpoints
from workers.methods.common import (
    MethodParams,
    MethodResult,
    check_inputs,
    checkpoint_json,
    claim_checkpoints,
    complete_texts,
    load_costs,
    no_progress,
    run_identity,
    save_costs,
)
from workers.methods.progress import ticker
from workers.privacy.accountant import compose
from workers.privacy.events import PrivacyEvent
from workers.text.embeddings import Embedder

if TYPE_CHECKING:
    from workers.llm.attestation import Source
    from workers.methods.common import Sampling

ProgressFn = Callable[[str, float], None]
RANDOM_ROUNDS = 3  # rounds of re-requests for failed public generations before giving up


def run_key(method: str) -> str:
    """The checkpoint key of a run's fingerprint (:func:`~.common.claim_checkpoints`)."""
    return f"{method}-run"


def costs_key(method: str) -> str:
    """The checkpoint key of a run's LLM costs (:func:`~.common.save_costs`)."""
    return f"{method}-llm-costs"


class RunInputs(TypedDict):
    """What every method's entry point takes beside the corpus and its parameters.

    ``label_set`` the declared labels; ``units`` one id per document (e.g. a patient),
    which makes the unit the privacy unit, or None; ``llm`` the endpoint (the method's
    sampling settings replace its own); ``embedder`` the public embedding model;
    ``checkpoints`` where the run's DP outputs are kept (a re-run with the same
    checkpoints resumes without spending again); ``progress`` the stage callback."""

    label_set: Sequence[str]
    units: Sequence[str] | None
    llm: LLMEndpoint
    embedder: Embedder
    checkpoints: Checkpoints
    progress: NotRequired[ProgressFn | None]


class Planned(Protocol):
    """A method's noise plan: at least the events of every release, in order."""

    @property
    def events(self) -> tuple[PrivacyEvent, ...]: ...


ParamsT = TypeVar("ParamsT", bound=MethodParams)
PlanT = TypeVar("PlanT", bound=Planned)


@dataclass
class MethodRun(ABC, Generic[ParamsT, PlanT]):
    """One run of an LLM method (module docstring); a method subclasses it with its
    ``method`` id, ``description`` and :meth:`execute`."""

    method: ClassVar[str]
    description: ClassVar[str]

    params: ParamsT
    labels: tuple[str, ...]  # the declared labels, in order
    plan: PlanT
    endpoint: LLMEndpoint
    embedder: Embedder
    checkpoints: Checkpoints
    progress: ProgressFn
    unit_level: bool = False
    costs: LLMCosts = field(default_factory=LLMCosts)

    @classmethod
    def start(
        cls,
        noise_plan: Callable[[ParamsT, tuple[str, ...]], PlanT],
        documents: Sequence[str],
        labels: Sequence[str],
        params: ParamsT,
        inputs: RunInputs,
        **public: Any,
    ) -> MethodResult:
        """Check the inputs, plan the releases, claim the checkpoints, then run. Bad
        input raises before anything private is read. ``public`` are the method's own
        public inputs, fields of its run (:meth:`prepare` loads what they need)."""
        units = inputs["units"]
        sampling = cast("Sampling", params)  # every LLM method's parameters carry them
        declared, endpoint = check_inputs(
            documents, labels, inputs["label_set"], units, inputs["llm"], sampling
        )
        plan = noise_plan(params, declared)
        run = cls(
            params,
            declared,
            plan,
            endpoint,
            inputs["embedder"],
            inputs["checkpoints"],
            inputs.get("progress") or no_progress,
            unit_level=units is not None,
            **public,
        )
        run.prepare()
        run.claim()
        return run.execute(documents, labels, units)

    def prepare(self) -> None:
        """Load what the method's public inputs need, before the claim (none here)."""

    @abstractmethod
    def execute(
        self, documents: Sequence[str], labels: Sequence[str], units: Sequence[str] | None
    ) -> MethodResult:
        """The method's steps, from the first private read to the result."""

    # ------------------------------------------------------------ checkpoints

    def identity(self) -> dict[str, Any]:
        """The method's public inputs beside its parameters that a checkpoint depends on."""
        return {}

    def claim(self) -> None:
        """Tie the checkpoints to this run's public configuration (refuse another's) and
        load the costs of earlier attempts."""
        identity = run_identity(self.method, self, unit_level=self.unit_level, **self.identity())
        claim_checkpoints(self.checkpoints, run_key(self.method), identity)
        saved = load_costs(self.checkpoints, costs_key(self.method))
        if saved is not None:
            self.restore_counters(saved)
            self.costs = LLMCosts(**saved)

    def counters(self) -> dict[str, int]:
        """The method's counters saved with its LLM costs (and shown in the manifest)."""
        return {}

    def restore_counters(self, saved: dict[str, Any]) -> None:
        """Take the method's :meth:`counters` out of ``saved`` costs."""

    def save_costs(self) -> None:
        save_costs(self.checkpoints, costs_key(self.method), self.costs, **self.counters())

    def saved_release(self, key: str, events: list[PrivacyEvent]) -> dict[str, Any] | None:
        """A release :meth:`save_release` saved under ``key`` (its event recorded in
        ``events`` again), or None if it was never drawn."""
        stored = self.checkpoints.load(key)
        if stored is None:
            return None
        data: dict[str, Any] = json.loads(stored)
        events.append(PrivacyEvent.from_dict(data["event"]))
        return data

    def save_release(
        self,
        key: str,
        record: Mapping[str, Any],
        event: PrivacyEvent,
        events: list[PrivacyEvent],
    ) -> None:
        """Save a DP output with its event before anything uses it; record the event."""
        self.checkpoints.save(key, checkpoint_json({**record, "event": event.to_dict()}))
        events.append(event)

    def check_plan(self, events: Sequence[PrivacyEvent]) -> None:
        if list(events) != list(self.plan.events):
            raise RuntimeError("the run's events differ from its plan")  # a bug, never data

    # ------------------------------------------------------------ the run

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Report stage ``name``'s start and, if it ends without an error, its end."""
        self.progress(name, 0.0)
        yield
        self.progress(name, 1.0)

    def rng(self, *stream: int) -> np.random.Generator:
        """The public random stream ``stream`` of the run's seed."""
        return np.random.default_rng([self.params.seed, *stream])

    # ------------------------------------------------------------ public work (LLM)

    def generate(self, requests: Sequence[Messages], sources: Sequence[Source]) -> list[str | None]:
        """One completion per request; ``None`` where the endpoint failed. ``sources``
        say what each request was built from (the job's prompt log)."""
        return complete_texts(
            requests,
            endpoint=self.endpoint,
            concurrency=self.params.concurrency,
            costs=self.costs,
            sources=sources,
            tick=ticker(self.progress),
        )

    def complete_all(
        self,
        count: int,
        request: Callable[[int], Messages],
        source: Callable[[int], Source],
        *,
        what: str,
    ) -> list[str]:
        """``count`` completions of public requests (``request(i)``, built from
        ``source(i)``), failed ones asked again for up to :data:`RANDOM_ROUNDS` rounds; if
        some still fail, the costs are saved and :class:`~workers.errors.LLMError` raised
        (a re-run resumes)."""
        texts: list[str | None] = [None] * count
        for _ in range(RANDOM_ROUNDS):
            missing = [i for i, text in enumerate(texts) if text is None]
            if not missing:
                break
            answers = self.generate([request(i) for i in missing], [source(i) for i in missing])
            for i, answer in zip(missing, answers, strict=True):
                texts[i] = answer
        failures = sum(text is None for text in texts)
        if failures:
            self.save_costs()
            raise LLMError(
                f"the LLM failed {failures} of {count} {what} {RANDOM_ROUNDS} times; "
                "re-run to resume",
                field="llm",
            )
        return [text for text in texts if text is not None]

    # ------------------------------------------------------------ manifest

    def describe(
        self, *, unit_adjacency: str, document_adjacency: str = "add/remove one document"
    ) -> dict[str, Any]:
        """The manifest's first entries: the method, its parameters and labels, and the
        neighbouring relation its privacy holds for."""
        return {
            "method": self.method,
            "description": self.description,
            "parameters": self.params.to_dict(),
            "labels": list(self.labels),
            "adjacency": unit_adjacency if self.unit_level else document_adjacency,
        }

    def models(self, **extra: str) -> dict[str, str]:
        return {"llm": self.endpoint.model, "embedding": self.embedder.name, **extra}

    def llm_costs(self, **extra: int) -> dict[str, Any]:
        """The run's LLM costs with the method's counters and ``extra``."""
        return {**self.costs.as_dict(), **self.counters(), **extra}

    def release_summary(
        self, events: Sequence[PrivacyEvent], records: Sequence[tuple[str, str]], **costs: int
    ) -> dict[str, Any]:
        """The manifest's last entries: the privacy spent, the released sizes (overall
        and per class) and the LLM costs (with ``costs``)."""
        per_class = {label: 0 for label in self.labels}
        for label, _ in records:
            per_class[label] += 1
        return {
            "privacy": compose(events).to_dict(delta=self.params.delta),
            "released": len(records),
            "released_per_class": per_class,
            "llm_costs": self.llm_costs(**costs),
        }
