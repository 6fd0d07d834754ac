"""Every method keyseed runs, described once for the service and the CLI.

Each entry says, from public inputs only, what a caller needs before a run: the method's
parameter model, the events of its releases (reserved before the first private read),
the LLM calls it will make and the most documents it can release; and, to run it, its
entry point. The service's job specs, dry runs, manifests and the CLI's options are all
built from these entries, so a method plugs in here and in :mod:`workers.methods.catalog`,
which names its id and parameter model without loading any numerical library, so that
validating options and job specs stays fast.

DP-KPS (the default) releases keyphrase sequences, which an LLM may write out as texts
afterwards (post-processing, outside the run); the other methods write their released
texts with an LLM within the run (:data:`LLM_METHODS`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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
from workers.methods.dpkps.run import plan_dpkps, run_dpkps
from workers.methods.pate_tutor.runner import DESCRIPTION as PATE_TUTOR_DESCRIPTION
from workers.privacy.events import PrivacyEvent

__all__ = [
    "AUG_PE",
    "DPKPS",
    "DP_EDA",
    "LLM_METHODS",
    "METHODS",
    "PATE_TUTOR",
    "Method",
]

Plan = Callable[..., list[PrivacyEvent]]  # (params, label_set, vocabulary_size=None)


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
    # the public vocabulary a run of ``params`` reads, by name (None: it reads none); a
    # run that reads one takes it as ``vocabulary=`` and an embedding cache as ``cache=``
    vocabulary: Callable[[Any], str | None] = lambda params: None
    # what a run of ``params`` on ``classes`` declared labels does, in words (dry runs,
    # manifests); by default :attr:`description`
    describe: Callable[[Any, int], str] | None = None
    # ``params`` with the defaults that depend on them and ``classes`` resolved (dry runs;
    # None: the method resolves none)
    resolved: Callable[[Any, int], dict[str, Any] | None] = lambda params, classes: None
    writes_texts: bool = True  # the run writes its released texts with an LLM

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


def _dpkps_resolved(params: DPKPSParams, classes: int) -> dict[str, Any]:
    """The spec's parameters as the run resolves them: the public ones (the device is the
    worker's business, the research levers the benchmarks'), and the levers a stored spec
    recorded."""
    resolved = params.generation_config().for_classes(classes).to_dict()
    return {name: resolved[name] for name in params.parameter_names}


def _field(name: str) -> Callable[[Any], str]:
    return lambda params: name


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
            vocabulary=lambda p: p.vocabulary,
            describe=lambda p, classes: method_description(
                p.generation_config().for_classes(classes)
            ),
            resolved=_dpkps_resolved,
            writes_texts=False,
        ),
        Method(
            id=AUG_PE,
            title="Aug-PE",
            description=AUG_PE_DESCRIPTION,
            params=METHOD_PARAMS[AUG_PE],
            plan=_without_vocabulary(aug_pe.plan_aug_pe),
            planned_calls=lambda p, classes: p.planned_calls(),
            max_released=lambda p, classes: p.num_released,
            released_field=_field("num_released"),
            calls_field=_field("population"),
            run=aug_pe.run_aug_pe,
        ),
        Method(
            id=PATE_TUTOR,
            title="PATE-tutor",
            description=PATE_TUTOR_DESCRIPTION,
            params=METHOD_PARAMS[PATE_TUTOR],
            plan=_without_vocabulary(pate_tutor.plan_pate_tutor),
            planned_calls=lambda p, classes: p.planned_calls(),
            max_released=lambda p, classes: p.num_released,
            released_field=_field("num_released"),
            calls_field=_field("candidates"),
            run=pate_tutor.run_pate_tutor,
        ),
        Method(
            id=DP_EDA,
            title="DP-EDA",
            description=DP_EDA_DESCRIPTION,
            params=METHOD_PARAMS[DP_EDA],
            plan=_without_vocabulary(dp_eda.plan_dp_eda),
            planned_calls=lambda p, classes: p.planned_calls(classes),
            max_released=lambda p, classes: p.max_released(classes),
            released_field=_field("parents"),
            calls_field=_field("initial_population"),
            run=dp_eda.run_dp_eda,
            vocabulary=METHOD_VOCABULARY[DP_EDA],
        ),
    )
}
# The methods that write their released texts with an LLM within the run.
LLM_METHODS: Final[dict[str, Method]] = {k: m for k, m in METHODS.items() if m.writes_texts}
