"""Private Evolution for text (Aug-PE; Xie et al., ICML 2024), under keyseed's rules.

Entry points: :func:`run_aug_pe` (the run: DP outputs, their privacy events, a public
manifest, LLM costs) and :func:`plan_aug_pe` (the events of a run, from its public
parameters alone, so the whole (ε, δ) is reserved before the first private read).
Design: ``shared/design/aug-pe.md``; each module's docstring says which part it is.

The names are imported when first used (:func:`workers.methods.method_exports`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workers.methods import method_exports

if TYPE_CHECKING:
    from workers.methods.aug_pe.accounting import plan_aug_pe
    from workers.methods.aug_pe.params import AugPEParams
    from workers.methods.aug_pe.runner import AugPEResult, run_aug_pe


__all__ = ["AugPEParams", "AugPEResult", "plan_aug_pe", "run_aug_pe"]

__getattr__ = method_exports(__name__, "AugPE")
