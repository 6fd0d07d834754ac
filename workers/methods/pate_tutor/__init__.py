"""PATE discriminator with a DP label tutor (Song et al. 2024), under keyseed's rules.

Entry points: :func:`run_pate_tutor` (the run: the released corpus, its privacy events,
a public manifest, LLM costs) and :func:`plan_pate_tutor` (the events of a run, from its
public parameters alone, so the whole (ε, δ) is reserved before the first private read).
Design: ``shared/design/pate-tutor.md`` §7–8; each module's docstring says which part it is.

The names are imported when first used (PEP 562), so that importing
:mod:`workers.methods.pate_tutor.params` to validate a job spec or the command line's
options loads no numerical library.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workers.methods.pate_tutor.accounting import plan_pate_tutor
    from workers.methods.pate_tutor.params import PateTutorParams
    from workers.methods.pate_tutor.runner import PateTutorResult, run_pate_tutor

_WHERE = {
    "plan_pate_tutor": "workers.methods.pate_tutor.accounting",
    "PateTutorParams": "workers.methods.pate_tutor.params",
    "PateTutorResult": "workers.methods.pate_tutor.runner",
    "run_pate_tutor": "workers.methods.pate_tutor.runner",
}

__all__ = ["PateTutorParams", "PateTutorResult", "plan_pate_tutor", "run_pate_tutor"]


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value
    return value
