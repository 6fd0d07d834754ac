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

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from workers.errors import InputDataError


@dataclass(frozen=True)
class Unit:
    """One privacy unit: its class and the indices of its documents, in input order."""

    label: str
    documents: tuple[int, ...]


def group_units(
    labels: Sequence[str], units: Sequence[str] | None, label_set: Sequence[str]
) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
    """Privacy units and the class each is assigned to.

    Returns ``(unit_of_document, class_of_unit, votes)`` where ``votes[i]`` says whether
    document ``i`` votes. Without units every document is its own unit in its own class.
    With units, a unit is assigned to the class most of its documents carry (ties to the
    class declared first); only its documents of that class vote, the others are not
    used at all, so the unit's whole contribution lies in one class.
    """
    position = {label: i for i, label in enumerate(label_set)}
    classes = np.fromiter((position[label] for label in labels), dtype=np.int64, count=len(labels))
    if units is None:
        return np.arange(len(labels), dtype=np.int64), classes, np.ones(len(labels), dtype=bool)
    ids: dict[str, int] = {}
    unit_of = np.fromiter(
        (ids.setdefault(unit, len(ids)) for unit in units), dtype=np.int64, count=len(units)
    )
    tally = np.zeros((len(ids), len(label_set)), dtype=np.int64)
    np.add.at(tally, (unit_of, classes), 1)
    class_of_unit = np.argmax(tally, axis=1).astype(np.int64)  # first maximum: declared order
    return unit_of, class_of_unit, class_of_unit[unit_of] == classes


def pool(
    labels: Sequence[str], units: Sequence[str] | None, *, label_set: Sequence[str]
) -> list[Unit]:
    """The privacy units of a corpus (one per document when ``units`` is None), as
    :func:`group_units` assigns them.

    >>> [(u.label, u.documents) for u in pool(["a", "b", "b", "a"], ["p", "p", "p", "q"],
    ...                                      label_set=["a", "b"])]
    [('b', (1, 2)), ('a', (3,))]
    """
    if units is not None and len(units) != len(labels):
        raise InputDataError("units and labels differ in length", field="units")
    unit_of, class_of_unit, kept = group_units(labels, units, label_set)
    members: list[list[int]] = [[] for _ in range(len(class_of_unit))]
    for i in np.flatnonzero(kept):
        members[unit_of[i]].append(int(i))
    return [Unit(label_set[class_of_unit[u]], tuple(docs)) for u, docs in enumerate(members)]
