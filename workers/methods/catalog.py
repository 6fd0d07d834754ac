"""The methods' ids, the LLM methods' parameter models and the public vocabulary each
method's run reads, importable without the numerical stack.

:mod:`workers.methods.registry` describes each method in full (its plan and entry
point, which load numpy, OpenDP and torch); this module names only what validating a
job spec or the command line's options and vocabulary needs, so both stay fast.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from workers.methods.aug_pe.params import AugPEParams
from workers.methods.common import MethodParams
from workers.methods.dp_eda.params import DPEDAParams
from workers.methods.pate_tutor.params import PateTutorParams

DPKPS: Final = "dpkps"  # the default method
AUG_PE: Final = "aug-pe"
PATE_TUTOR: Final = "pate-tutor"
DP_EDA: Final = "dp-eda"

# Each LLM method's parameter model, in the registry's order.
METHOD_PARAMS: Final[dict[str, type[MethodParams]]] = {
    AUG_PE: AugPEParams,
    PATE_TUTOR: PateTutorParams,
    DP_EDA: DPEDAParams,
}


def _dp_eda_vocabulary(params: DPEDAParams) -> str | None:
    reads = params.decoder == "llm_reconstruction" or params.population_source == "vocabulary"
    return params.vocabulary if reads else None


# The public vocabulary a run of a method's parameters reads, by name (None: none).
METHOD_VOCABULARY: Final[dict[str, Callable[[Any], str | None]]] = {
    DPKPS: lambda params: params.vocabulary,
    DP_EDA: _dp_eda_vocabulary,
}


def _dpkps_vocabulary_check(params: Any, name: str, size: int) -> None:
    params.generation_config().check_vocabulary(name, size)


# What a run of a method's parameters asks of the vocabulary it reads (the phrases it
# draws), checked against the vocabulary's name and size; errors name the option.
VOCABULARY_CHECKS: Final[dict[str, Callable[[Any, str, int], None]]] = {
    DPKPS: _dpkps_vocabulary_check,
}


def vocabulary_of(method: str, params: Any) -> str | None:
    """The name of the public vocabulary a run of ``method`` with ``params`` reads."""
    reader = METHOD_VOCABULARY.get(method)
    return reader(params) if reader is not None else None


def check_vocabulary(method: str, params: Any, name: str, size: int) -> None:
    """A run of ``method`` with ``params`` asks no more of the vocabulary ``name`` it
    reads than its ``size`` phrases (:data:`VOCABULARY_CHECKS`; raises ``ConfigError``)."""
    check = VOCABULARY_CHECKS.get(method)
    if check is not None:
        check(params, name, size)
