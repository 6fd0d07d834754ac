"""Per-release privacy events on the ledger (issue 14, item 6; issue 15, items 3 and 6).

Every ledger entry lists the noisy releases it stands for as the shared accountant's
:class:`~workers.privacy.events.PrivacyEvent` (mechanism, noise and its scale,
sensitivity and its norm, dimension, partition, count, the ε of a pure release and the
δ a release spends outright, if any, as exact decimal strings):

* a reservation lists the **planned** releases (:func:`workers.methods.dpkps.plan.plan`, from
  the job's configuration and public facts, before anything private is read); the
  commit lists the same releases, now charged, and a release of the reservation the
  releases it frees. A planned exact-kernel density has sensitivity 1: its noise per
  unit of sensitivity is what the accountant reads, and the kernel's real sensitivity
  exists only once the private vocabulary is released;
* once the engine has run them, a report (``ledger_reports``) lists the **realised**
  releases as the engine recorded them (what OpenDP's map certifies for the scale it
  drew with).

So an auditor can reconcile every job from the ledger alone, released or not:
:func:`reconcile` names every mechanism and partition whose releases differ from the
plan. All of it is public: events are functions of the job's parameters, the declared
labels, the public vocabulary, and DP releases.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from workers.methods.dpkps.plan import matches
from workers.privacy.events import PrivacyEvent


def reported(privacy: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The events of the engine's privacy report (``PrivacyReport.to_dict()``), checked."""
    return [PrivacyEvent.from_dict(e).to_dict() for e in (privacy or {}).get("events", ())]


def _groups(events: Sequence[PrivacyEvent]) -> dict[tuple[str, str], list[PrivacyEvent]]:
    groups: dict[tuple[str, str], list[PrivacyEvent]] = {}
    for event in events:
        key = (event.mechanism, event.partition or "whole dataset")
        groups.setdefault(key, []).append(event)
    return groups


def reconcile(planned: Sequence[PrivacyEvent], realised: Sequence[PrivacyEvent]) -> list[str]:
    """How a job's realised releases differ from those it was charged for (empty: the
    same releases, at the same noise per unit of sensitivity and ε, as
    :func:`workers.methods.dpkps.plan.matches` compares them, and spending the same δ
    outright).

    >>> kde = dict(mechanism="kde", noise="laplace", scale=2.0, sensitivity=1.0, norm="l1",
    ...            dimension=8, epsilon="0.5")
    >>> plan = [PrivacyEvent(partition="a", count=2, **kde)]
    >>> reconcile(plan, [PrivacyEvent(partition="a", **kde)] * 2)
    []
    >>> reconcile(plan, [PrivacyEvent(partition="a", **kde)])
    ['kde (a): 2 releases planned, 1 made']
    """
    charged, made = _groups(planned), _groups(realised)
    problems = []
    for key in sorted(charged.keys() | made.keys()):
        mechanism, partition = key
        left, right = charged.get(key, []), made.get(key, [])
        count_planned = sum(e.count for e in left)
        count_made = sum(e.count for e in right)
        if count_planned != count_made:
            problems.append(
                f"{mechanism} ({partition}): {count_planned} releases planned, {count_made} made"
            )
        elif sum(e.total_delta for e in left) != sum(e.total_delta for e in right):
            problems.append(f"{mechanism} ({partition}): the δ spent differs from the plan")
        elif not matches(left, right):
            problems.append(f"{mechanism} ({partition}): the noise or ε differs from the plan")
    return problems
