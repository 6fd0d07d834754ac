"""DP-EDA (Zhao, Song, Zhou): public embeddings evolved toward the private distribution.

Entry points: :func:`run_dp_eda` and :func:`plan_dp_eda` (the events of a run from its
public parameters alone). Design: ``shared/design/dp-eda.md``.

The names are imported when first used (PEP 562), so that importing
:mod:`workers.methods.dp_eda.params` to validate a job spec or the command line's
options loads no numerical library.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workers.methods.dp_eda.accounting import plan_dp_eda
    from workers.methods.dp_eda.params import DPEDAParams
    from workers.methods.dp_eda.runner import DPEDAResult, run_dp_eda

_WHERE = {
    "plan_dp_eda": "workers.methods.dp_eda.accounting",
    "DPEDAParams": "workers.methods.dp_eda.params",
    "DPEDAResult": "workers.methods.dp_eda.runner",
    "run_dp_eda": "workers.methods.dp_eda.runner",
}

__all__ = ["DPEDAParams", "DPEDAResult", "plan_dp_eda", "run_dp_eda"]


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value
    return value
