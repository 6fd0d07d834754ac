"""Private Evolution for text (Aug-PE; Xie et al., ICML 2024), under keyseed's rules.

Entry points: :func:`run_aug_pe` (the run: DP outputs, their privacy events, a public
manifest, LLM costs) and :func:`plan_aug_pe` (the events of a run, from its public
parameters alone, so the whole (ε, δ) is reserved before the first private read).
Design: ``shared/design/aug-pe.md``; each module's docstring says which part it is.

The names are imported when first used (PEP 562), so that importing
:mod:`workers.methods.aug_pe.params` to validate a job spec or the command line's
options loads no numerical library.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workers.methods.aug_pe.accounting import plan_aug_pe
    from workers.methods.aug_pe.params import AugPEParams
    from workers.methods.aug_pe.runner import AugPEResult, run_aug_pe

_WHERE = {
    "plan_aug_pe": "workers.methods.aug_pe.accounting",
    "AugPEParams": "workers.methods.aug_pe.params",
    "AugPEResult": "workers.methods.aug_pe.runner",
    "run_aug_pe": "workers.methods.aug_pe.runner",
}

__all__ = ["AugPEParams", "AugPEResult", "plan_aug_pe", "run_aug_pe"]


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value
    return value
