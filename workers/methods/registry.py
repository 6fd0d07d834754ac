"""The LLM methods keyseed runs besides DP-KPS, described once for the service and the CLI.

Each entry says, from public inputs only, what a caller needs before a run: the method's
parameter model, the events of its releases (reserved before the first private read),
the LLM calls it will make and the most documents it can release; and, to run it, its
entry point. The service's job specs, dry runs, manifests and the CLI's options are all
built from these entries, so a method plugs in here and in :mod:`workers.methods.catalog`,
which names its id and parameter model without loading any numerical library, so that
validating options and job specs stays fast.

"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from workers.methods import aug_pe, dp_eda, pate_tutor
from workers.methods.aug_pe.runner import DESCRIPTION as AUG_PE_DESCRIPTION
from workers.methods.catalog import AUG_PE, DP_EDA, METHOD_PARAMS, METHOD_VOCABULARY, PATE_TUTOR
from workers.methods.common import MethodParams, MethodResult
from workers.methods.dp_eda.runner import DESCRIPTION as DP_EDA_DESCRIPTION
from workers.methods.pate_tutor.runner import DESCRIPTION as PATE_TUTOR_DESCRIPTION
from workers.privacy.events import PrivacyEvent

__all__ = ["AUG_PE", "DP_EDA", "LLM_METHODS", "PATE_TUTOR", "LLMMethod", "llm_method"]


@dataclass(frozen=True)
class LLMMethod:
    """One method that writes its released texts with an LLM (module docstring)."""

    id: str  # the job spec's ``method`` and the CLI's ``--method``
    title: str  # for people: errors, help, the dashboard
    description: str  # what runs, in words (dry runs, manifests)
    params: type[MethodParams]
    plan: Callable[[Any, Sequence[str]], list[PrivacyEvent]]
    planned_calls: Callable[[Any, int], int]  # (params, classes) -> LLM requests
    max_released: Callable[[Any, int], int]  # (params, classes) -> documents, at most
    released_field: str  # the parameter that bounds the released documents
    calls_field: str  # the parameter that drives the LLM calls most
    run: Callable[..., MethodResult]  # the entry point, ``run_<method>``
    # the public vocabulary a run of ``params`` reads, by name (None: it reads none); a
    # run that reads one takes it as ``vocabulary=`` and an embedding cache as ``cache=``
    vocabulary: Callable[[Any], str | None] = lambda params: None


LLM_METHODS: Final[dict[str, LLMMethod]] = {
    m.id: m
    for m in (
        LLMMethod(
            id=AUG_PE,
            title="Aug-PE",
            description=AUG_PE_DESCRIPTION,
            params=METHOD_PARAMS[AUG_PE],
            plan=aug_pe.plan_aug_pe,
            planned_calls=lambda p, classes: p.planned_calls(),
            max_released=lambda p, classes: p.num_released,
            released_field="num_released",
            calls_field="population",
            run=aug_pe.run_aug_pe,
        ),
        LLMMethod(
            id=PATE_TUTOR,
            title="PATE-tutor",
            description=PATE_TUTOR_DESCRIPTION,
            params=METHOD_PARAMS[PATE_TUTOR],
            plan=pate_tutor.plan_pate_tutor,
            planned_calls=lambda p, classes: p.planned_calls(),
            max_released=lambda p, classes: p.num_released,
            released_field="num_released",
            calls_field="candidates",
            run=pate_tutor.run_pate_tutor,
        ),
        LLMMethod(
            id=DP_EDA,
            title="DP-EDA",
            description=DP_EDA_DESCRIPTION,
            params=METHOD_PARAMS[DP_EDA],
            plan=dp_eda.plan_dp_eda,
            planned_calls=lambda p, classes: p.planned_calls(classes),
            max_released=lambda p, classes: p.max_released(classes),
            released_field="parents",
            calls_field="initial_population",
            run=dp_eda.run_dp_eda,
            vocabulary=METHOD_VOCABULARY[DP_EDA],
        ),
    )
}


def llm_method(method_id: str) -> LLMMethod | None:
    """The entry of ``method_id``, or None for DP-KPS (and unknown ids)."""
    return LLM_METHODS.get(method_id)
