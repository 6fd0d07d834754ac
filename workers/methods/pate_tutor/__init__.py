"""PATE discriminator with a DP label tutor (Song et al. 2024), under keyseed's rules.

Entry points: :func:`run_pate_tutor` (the run: the released corpus, its privacy events,
a public manifest, LLM costs) and :func:`plan_pate_tutor` (the events of a run, from its
public parameters alone, so the whole (ε, δ) is reserved before the first private read).
Design: ``shared/design/pate-tutor.md`` §7–8; each module's docstring says which part it is.

The names are imported when first used (:func:`workers.methods.method_exports`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workers.methods import method_exports

if TYPE_CHECKING:
    from workers.methods.pate_tutor.accounting import plan_pate_tutor
    from workers.methods.pate_tutor.params import PateTutorParams
    from workers.methods.pate_tutor.runner import PateTutorResult, run_pate_tutor


__all__ = ["PateTutorParams", "PateTutorResult", "plan_pate_tutor", "run_pate_tutor"]

__getattr__ = method_exports(__name__, "PateTutor")
