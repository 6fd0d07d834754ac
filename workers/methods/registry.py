"""Every method keyseed runs, described once for the service and the CLI.

Each entry says, from public inputs only, what a caller needs before a run: the method's
parameter model, the events of its releases (reserved before the first private read),
the LLM calls it will make and the most documents it can release; to run it, its entry
point, the inputs it takes and what it supports (a holdout, the audit's canaries); and
the adapter that gives its result as a :class:`~workers.methods.outcome.RunOutcome`. The
service's job specs, dry runs, worker stage, manifests and the CLI's options are all
built from these entries, so a method plugs in here and in :mod:`workers.methods.catalog`,
which names its id and parameter model without loading any numerical library, so that
validating options and job specs stays fast.

DP-KPS (the default) releases keyphrase sequences, which an LLM may write out as texts
afterwards (post-processing, outside the run); the other methods write their released
texts with an LLM within the run (:data:`LLM_METHODS`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from pydantic import BaseModel

from workers.methods import aug_pe, dp_eda, pate_tutor
from workers.methods.aug_pe.runner import DESCRIPTION as AUG_PE_DESCRIPTION
from workers.methods.catalog import (
    AUG_PE,
    DP_EDA,
    DPKPS,
    METHOD_PARAMS,
    METHOD_VOCABULARY,
    PATE_TUTOR,
)
from workers.methods.dp_eda.runner import DESCRIPTION as DP_EDA_DESCRIPTION
from workers.methods.dpkps.config import method_description
from workers.methods.dpkps.params import DPKPSParams
from workers.methods.dpkps.run import DESCRIPTION as DPKPS_DESCRIPTION
from workers.methods.dpkps.run import dpkps_outcome, dpkps_release, plan_dpkps, run_dpkps
from workers.methods.outcome import RunOutcome
from workers.methods.pate_tutor.runner import DESCRIPTION as PATE_TUTOR_DESCRIPTION
from workers.privacy.accountant import compose, epsilon_by_mechanism
from workers.privacy.events import PrivacyEvent

__all__ = [
    "AUG_PE",
    "DPKPS",
    "DP_EDA",
    "LLM_METHODS",
    "METHODS",
    "PATE_TUTOR",
    "Method",
    "RunOutcome",
]

Plan = Callable[..., list[PrivacyEvent]]  # (params, label_set, vocabulary_size=None)
# (the run's result, params, label_set, the unit column's name) -> the result, saved as is
Outcome = Callable[[Any, Any, Sequence[str], str | None], RunOutcome]
# (the job's stored spec, the manifest its run recorded, the declared labels' count, the
# sequences it saved) -> the method's part of a release's manifest: ``method`` (what ran,
# in words), ``parameters``, ``prompt`` and what else the method records; the service adds
# the method's id, the job, the models, the privacy block, LLM costs and the documents
Release = Callable[[Mapping[str, Any], Mapping[str, Any], int, int], dict[str, Any]]


@dataclass(frozen=True)
class Method:
    """One method (module docstring)."""

    id: str  # the job spec's ``method`` and the CLI's ``--method``
    title: str  # for people: errors, help, the dashboard
    description: str  # what runs, in words
    params: type[BaseModel]
    plan: Plan  # the size of the vocabulary the run reads, for a method that reads one
    planned_calls: Callable[[Any, int], int]  # (params, classes) -> LLM requests, with an LLM
    max_released: Callable[[Any, int], int]  # (params, classes) -> documents, at most
    released_field: Callable[[Any], str]  # the parameter that bounds the released documents
    calls_field: Callable[[Any], str]  # the parameter that drives the LLM calls most
    run: Callable[..., Any]  # the entry point, ``run_<method>``
    outcome: Outcome  # the run's result as a RunOutcome
    release: Release  # its part of a release's manifest
    # the public vocabulary a run of ``params`` reads, by name (None: it reads none); a
    # run that reads one takes it as ``vocabulary=`` and an embedding cache as ``cache=``
    vocabulary: Callable[[Any], str | None] = lambda params: None
    # what a run of ``params`` on ``classes`` declared labels does, in words (dry runs,
    # manifests); by default :attr:`description`
    describe: Callable[[Any, int], str] | None = None
    # ``params`` with the defaults that depend on them and ``classes`` resolved (dry runs;
    # None: the method resolves none)
    resolved: Callable[[Any, int], dict[str, Any] | None] = lambda params, classes: None
    # every parameter a run of ``params`` on ``classes`` declared labels uses, as its
    # manifest records them (the command line's dry run: the owner's own machine)
    engine_parameters: Callable[[Any, int], dict[str, Any]] = lambda params, classes: (
        params.to_dict()
    )
    # The run writes its released texts with an LLM (it takes ``llm=`` and resumes from
    # ``checkpoints=``; every prompt it sends is logged first). Otherwise it releases
    # keyphrase sequences, which a later stage prompts an LLM with (post-processing).
    writes_texts: bool = True
    # the run takes the unit column's name (``unit_name=``) and the worker's device
    # (``device=``)
    takes_unit_and_device: bool = False
    # a slice of the private units can be held out of the run and the released corpus
    # scored on it (docs/utility.md)
    supports_holdout: bool = False
    # the audit's canaries may join the run's input: their words are drawn from the first
    # ``canary_phrases(params, vocabulary size)`` phrases of the vocabulary the run reads
    # (None: the method takes no canaries)
    canary_phrases: Callable[[Any, int], int] | None = None
    # the built-in vocabulary the canaries' words come from when a run reads none (the
    # LLM methods: Aug-PE and PATE-tutor read none; DP-EDA reads one with some decoders)
    canary_words_from: str = "english"
    # raw facts about the private corpus that a run's result carries for its owner's
    # terminal alone (the command line's warnings; never saved nor sent); None: none
    owner_diagnostics: Callable[[Any], Any] = lambda result: None

    def described(self, params: Any, classes: int) -> str:
        """What a run of ``params`` on ``classes`` declared labels does, in words."""
        return self.description if self.describe is None else self.describe(params, classes)


def _without_vocabulary(plan: Callable[[Any, Sequence[str]], list[PrivacyEvent]]) -> Plan:
    """The plan of a method that reads no vocabulary, in the registry's shape."""

    def planned(
        params: Any, label_set: Sequence[str], vocabulary_size: int | None = None
    ) -> list[PrivacyEvent]:
        return plan(params, label_set)

    return planned


def _dpkps_parameters(params: DPKPSParams, classes: int) -> dict[str, Any]:
    """The engine's configuration of a run, the defaults that depend on the mode and the
    label set resolved (the research levers too)."""
    return params.generation_config().for_classes(classes).to_dict()


def _dpkps_resolved(params: DPKPSParams, classes: int) -> dict[str, Any]:
    """The spec's parameters as the run resolves them: the public ones (the device is the
    worker's business, the research levers the benchmarks'), and the levers a stored spec
    recorded."""
    resolved = _dpkps_parameters(params, classes)
    return {name: resolved[name] for name in params.parameter_names}


def _dpkps_canary_phrases(params: DPKPSParams, size: int) -> int:
    """The phrases a run can emit: a public Ṽ's candidates, else the whole vocabulary."""
    config = params.generation_config()
    return config.candidate_count if config.vocabulary_selection == "public" else size


# The English words an LLM method's canaries draw from when its run reads no vocabulary:
# the rare half (:data:`workers.privacy.audit.RARE_FROM`) of the built-in ``english``
# vocabulary's first 50,000 words (ranks 25,000 to 50,000: words an LLM writes, but that
# a class's documents seldom hold; benchmarks/notes/2026-12-07-llm-method-audit.md).
LLM_CANARY_WORDS: Final = 50_000


def _llm_canary_phrases(method_id: str) -> Callable[[Any, int], int]:
    """An LLM method's canary words: from the whole vocabulary its run reads (a decoder
    may write any of its phrases), else from :data:`LLM_CANARY_WORDS` English words."""

    def phrases(params: Any, size: int) -> int:
        reads = METHOD_VOCABULARY.get(method_id, lambda params: None)(params) is not None
        return size if reads else min(size, LLM_CANARY_WORDS)

    return phrases


def _llm_outcome(plan: Plan) -> Outcome:
    """The outcome of an LLM method's run (:class:`workers.methods.common.MethodResult`):
    its records as texts, its manifest with the privacy unit and the planned events."""

    def outcome(
        result: Any, params: Any, label_set: Sequence[str], unit_name: str | None = None
    ) -> RunOutcome:
        manifest = dict(result.manifest)
        manifest["privacy"] = {
            **manifest["privacy"],
            "unit": unit_name or "row",
            "planned": {"events": [e.to_dict() for e in result.events]},
        }
        return RunOutcome(
            sequences=[(label, ()) for label, _ in result.records],
            texts=[text for _, text in result.records],
            manifest=manifest,
            epsilon_by_mechanism=epsilon_by_mechanism(result.events, params.delta),
            epsilon=float(compose(result.events).epsilon(params.delta)),
            as_planned=list(result.events) == plan(params, label_set),
            llm_costs=result.llm_costs,
        )

    return outcome


# What an LLM method's manifest (:class:`workers.methods.common.MethodResult`) says that a
# release shows in its own place; its other keys are shown as recorded (e.g. DP-EDA's decoder).
_SHOWN = {"description", "parameters", "labels", "noise", "released_per_class", "models"}


def _llm_release(description: str) -> Release:
    """An LLM method's part of a release's manifest: its run's own public manifest
    (parameters, noise, released sizes and what else the method records)."""

    def release(
        spec: Mapping[str, Any], ran: Mapping[str, Any], classes: int, saved: int
    ) -> dict[str, Any]:
        own = {k: v for k, v in ran.items() if k not in _SHOWN and k != "privacy"}
        return {
            **own,
            "method": ran.get("description", description),
            "parameters": ran.get("parameters", {}),
            "labels": ran.get("labels", []),
            "noise": ran.get("noise", {}),
            "released_per_class": ran.get("released_per_class", {}),
            "prompt": {"document_type": spec.get("document_type")},
        }

    return release


def _llm_method(
    method_id: str,
    title: str,
    description: str,
    *,
    plan: Callable[[Any, Sequence[str]], list[PrivacyEvent]],
    run: Callable[..., Any],
    released_field: str,
    calls_field: str,
    planned_calls: Callable[[Any, int], int] = lambda p, classes: p.planned_calls(),
    max_released: Callable[[Any, int], int] = lambda p, classes: p.num_released,
) -> Method:
    """An LLM method's entry: its parameter model and vocabulary from the catalogue, its
    plan (from its parameters and label set: the vocabulary's size does not enter it), and
    the outcome and release every LLM method's run gives; ``released_field`` and
    ``calls_field`` name the parameters that bound its documents and drive its calls.
    Every LLM method takes a holdout (its slice is kept out of the run's input) and the
    audit's canaries (they join the run's input; :func:`_llm_canary_phrases`)."""
    planned = _without_vocabulary(plan)
    return Method(
        id=method_id,
        title=title,
        description=description,
        params=METHOD_PARAMS[method_id],
        plan=planned,
        planned_calls=planned_calls,
        max_released=max_released,
        released_field=lambda params: released_field,
        calls_field=lambda params: calls_field,
        run=run,
        outcome=_llm_outcome(planned),
        release=_llm_release(description),
        vocabulary=METHOD_VOCABULARY.get(method_id, lambda params: None),
        supports_holdout=True,
        canary_phrases=_llm_canary_phrases(method_id),
    )


METHODS: Final[dict[str, Method]] = {
    m.id: m
    for m in (
        Method(
            id=DPKPS,
            title="DP-KPS",
            description=DPKPS_DESCRIPTION,
            params=DPKPSParams,
            plan=plan_dpkps,
            planned_calls=lambda p, classes: p.sequences_requested(classes),
            max_released=lambda p, classes: p.sequences_requested(classes),
            released_field=lambda p: p.count_field,
            calls_field=lambda p: p.count_field,
            run=run_dpkps,
            outcome=dpkps_outcome,
            release=dpkps_release,
            vocabulary=METHOD_VOCABULARY[DPKPS],
            describe=lambda p, classes: method_description(
                p.generation_config().for_classes(classes)
            ),
            resolved=_dpkps_resolved,
            engine_parameters=_dpkps_parameters,
            writes_texts=False,
            takes_unit_and_device=True,
            supports_holdout=True,
            canary_phrases=_dpkps_canary_phrases,
            owner_diagnostics=lambda result: result.owner_diagnostics,
        ),
        _llm_method(
            AUG_PE,
            "Aug-PE",
            AUG_PE_DESCRIPTION,
            plan=aug_pe.plan_aug_pe,
            run=aug_pe.run_aug_pe,
            released_field="num_released",
            calls_field="population",
        ),
        _llm_method(
            PATE_TUTOR,
            "PATE-tutor",
            PATE_TUTOR_DESCRIPTION,
            plan=pate_tutor.plan_pate_tutor,
            run=pate_tutor.run_pate_tutor,
            released_field="num_released",
            calls_field="candidates",
        ),
        _llm_method(
            DP_EDA,
            "DP-EDA",
            DP_EDA_DESCRIPTION,
            plan=dp_eda.plan_dp_eda,
            run=dp_eda.run_dp_eda,
            released_field="parents",
            calls_field="initial_population",
            planned_calls=lambda p, classes: p.planned_calls(classes),
            max_released=lambda p, classes: p.max_released(classes),
        ),
    )
}
# The methods that write their released texts with an LLM within the run.
LLM_METHODS: Final[dict[str, Method]] = {k: m for k, m in METHODS.items() if m.writes_texts}
