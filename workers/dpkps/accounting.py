"""Privacy accounting for DP-KPS runs (method.md, "Step 2", "Step 4", class proportions).

Every mechanism that touches private data records a :class:`MechanismSpend` at the
moment it is built: the sensitivity it was built for, the noise scale it used, and the
ε that OpenDP's privacy map gives for that sensitivity. A :class:`PrivacyReport` adds the
spends up with basic composition:

* mechanisms on the whole corpus (the vocabulary histogram, the class counts) compose
  sequentially: their ε add up;
* per-class structures (one DP-KDE ensemble per label) are built on disjoint documents
  (each document has one label), so they compose in parallel: a run is charged the
  largest per-class sum, not the sum over classes.

All DP-KPS releases are pure ε-DP, so δ is 0.

>>> report = PrivacyReport((
...     MechanismSpend("vocabulary", "vocabulary", 1.0, 10.0, 10.0, "discrete_laplace", None, 5),
...     MechanismSpend("kde", "kde[a,B=1]", 2.5, 1.0, 0.4, "laplace", "a", 8),
...     MechanismSpend("kde", "kde[a,B=2]", 2.5, 1.0, 0.4, "laplace", "a", 8),
...     MechanismSpend("kde", "kde[b,B=1]", 2.5, 1.0, 0.4, "laplace", "b", 8),
...     MechanismSpend("kde", "kde[b,B=2]", 2.5, 1.0, 0.4, "laplace", "b", 8),
... ))
>>> report.total
6.0
>>> report.by_mechanism()
{'vocabulary': 1.0, 'kde': 5.0}
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any

ACCOUNTANT = "basic composition (pure ε-DP; sequential sum, parallel over disjoint classes)"


@dataclass(frozen=True)
class MechanismSpend:
    """One noisy release and what it cost."""

    mechanism: str  # "vocabulary" | "kde" | "class_counts"
    name: str  # unique within a run, e.g. "kde[label=World,blocks=4]"
    epsilon: float  # OpenDP privacy map at `sensitivity`
    sensitivity: float  # L1 sensitivity under add/remove-one-document adjacency
    scale: float  # Laplace scale the noise was drawn with
    noise: str  # "discrete_laplace" | "laplace"
    partition: str | None  # the label of a per-class structure, else None
    dimension: int  # number of noised coordinates

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PrivacyReport:
    """The exact spend of one run, by mechanism."""

    spends: tuple[MechanismSpend, ...]
    accountant: str = ACCOUNTANT

    @property
    def delta(self) -> float:
        return 0.0

    def partition_totals(self, mechanism: str | None = None) -> dict[str, float]:
        """Sum of ε per class for the per-class mechanisms (optionally of one kind)."""
        totals: dict[str, float] = defaultdict(float)
        for spend in self.spends:
            if spend.partition is not None and mechanism in (None, spend.mechanism):
                totals[spend.partition] += spend.epsilon
        return dict(totals)

    @property
    def total(self) -> float:
        sequential = sum(s.epsilon for s in self.spends if s.partition is None)
        parallel = max(self.partition_totals().values(), default=0.0)
        return sequential + parallel

    def by_mechanism(self) -> dict[str, float]:
        """ε charged per mechanism kind (per-class kinds charged at their largest class)."""
        out: dict[str, float] = {}
        for spend in self.spends:
            if spend.partition is None:
                out[spend.mechanism] = out.get(spend.mechanism, 0.0) + spend.epsilon
        kinds = {s.mechanism for s in self.spends if s.partition is not None}
        for kind in sorted(kinds):
            out[kind] = out.get(kind, 0.0) + max(self.partition_totals(kind).values())
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "accountant": self.accountant,
            "epsilon_total": self.total,
            "delta": self.delta,
            "epsilon_by_mechanism": self.by_mechanism(),
            "mechanisms": [s.to_dict() for s in self.spends],
        }
