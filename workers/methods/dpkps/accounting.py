"""What a DP-KPS run spent: its realised releases, composed by the shared accountant.

Every mechanism that touches private data returns the
:class:`~workers.privacy.events.PrivacyEvent` of its release (the sensitivity it met,
the noise scale it drew with, and for pure mechanisms the ε OpenDP's map certifies). A
:class:`PrivacyReport` holds them with the plan they were drawn from and composes them
with :func:`workers.privacy.accountant.compose` — sequential across mechanisms, parallel
over the per-class KDE releases — at the run's δ. No formula here: the figure and the
accountant's name come from the accountant.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from workers.methods.dpkps.plan import Plan, matches
from workers.privacy.accountant import compose, epsilon_by_mechanism
from workers.privacy.events import PrivacyEvent


@dataclass(frozen=True)
class PrivacyReport:
    """The releases of one run and the (ε, δ) they compose to."""

    events: tuple[PrivacyEvent, ...]
    plan: Plan

    @property
    def delta(self) -> float:
        return self.plan.delta

    @property
    def epsilon(self) -> Decimal:
        """The accountant's ε of the realised releases at the run's δ (a thresholded
        vocabulary's δ_thr is in its event: the accountant takes it off δ)."""
        return compose(self.events).epsilon(self.delta)

    @property
    def accountant(self) -> str:
        return compose(self.events).name

    def by_mechanism(self) -> dict[str, float]:
        return epsilon_by_mechanism(self.events, self.delta)

    @property
    def as_planned(self) -> bool:
        """Whether the run made exactly the releases its ledger reservation holds."""
        return matches(self.plan.events, self.events)

    def to_dict(self) -> dict[str, Any]:
        return {
            "epsilon": float(self.epsilon),
            "delta": self.delta,
            "accountant": self.accountant,
            "epsilon_by_mechanism": self.by_mechanism(),
            "planned": self.plan.to_dict(),
            "events": [e.to_dict() for e in self.events],
        }
