"""DP-EDA (Zhao, Song, Zhou): public embeddings evolved toward the private distribution.

Entry points: :func:`run_dp_eda` and :func:`plan_dp_eda` (the events of a run from its
public parameters alone). Design: ``shared/design/dp-eda.md``.

The names are imported when first used (:func:`workers.methods.method_exports`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workers.methods import method_exports

if TYPE_CHECKING:
    from workers.methods.dp_eda.accounting import plan_dp_eda
    from workers.methods.dp_eda.params import DPEDAParams
    from workers.methods.dp_eda.runner import DPEDAResult, run_dp_eda


__all__ = ["DPEDAParams", "DPEDAResult", "plan_dp_eda", "run_dp_eda"]

__getattr__ = method_exports(__name__, "DPEDA")
