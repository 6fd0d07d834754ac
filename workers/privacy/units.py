"""Privacy units: whose contribution every mechanism bounds.

Adjacency in keyseed is one privacy unit added or removed. Without a unit column a unit
is one row (one document); with one (a patient id, say) it is every document of that
patient. Every mechanism bounds one unit's contribution, so its documents are pooled
into one contribution, and a unit must lie in one class for the per-class releases to
compose in parallel: :func:`pool` assigns each unit to its most frequent label (ties:
the first in the declared label order, a public order) and keeps only its documents of
that label. Dropping a unit's other documents is a function of that unit's own data
alone, so adding or removing the unit still changes exactly one pooled unit.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from workers.errors import InputDataError


@dataclass(frozen=True)
class Unit:
    """One privacy unit: its class and the indices of its documents, in input order."""

    label: str
    documents: tuple[int, ...]


def pool(
    labels: Sequence[str], units: Sequence[str] | None, *, label_set: Sequence[str]
) -> list[Unit]:
    """The privacy units of a corpus (one per document when ``units`` is None).

    >>> [(u.label, u.documents) for u in pool(["a", "b", "b", "a"], ["p", "p", "p", "q"],
    ...                                      label_set=["a", "b"])]
    [('b', (1, 2)), ('a', (3,))]
    """
    if units is None:
        return [Unit(label, (i,)) for i, label in enumerate(labels)]
    if len(units) != len(labels):
        raise InputDataError("units and labels differ in length", field="units")
    order = {label: i for i, label in enumerate(label_set)}
    members: dict[str, list[int]] = {}
    for i, unit in enumerate(units):
        members.setdefault(unit, []).append(i)
    pooled: list[Unit] = []
    for docs in members.values():
        counts = Counter(labels[i] for i in docs)
        label = min(counts, key=lambda k: (-counts[k], order.get(k, len(order))))
        pooled.append(Unit(label, tuple(i for i in docs if labels[i] == label)))
    return pooled
