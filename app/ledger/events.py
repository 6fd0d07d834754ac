"""Per-release privacy events on the ledger (issue 14, item 6).

Every ledger entry lists the noisy releases it stands for, one event each: the mechanism,
its name within the job, the noise and its scale, the sensitivity (and its norm) the
noise was calibrated for, the number of noised coordinates, the partition (a class of
the declared label set, or ``None`` for the whole dataset) and its ε, written as a
decimal string so it reads back exactly. The shape is the one the shared accountant
composes (``workers/privacy``).

* A reservation lists the **planned** events, derived from the job's configuration
  before anything private is read; the commit lists the same events, now charged, and a
  release of the reservation the events it frees. One figure is not known in advance:
  the sensitivity of the exact kernel density, the largest column sum of the kernel over
  the private vocabulary Ṽ, which is itself a DP release; the plan leaves it (and the
  scale) empty, and the ε charged does not depend on it.
* Once the engine has run its mechanisms, a ``report`` entry lists the **realised**
  events as the engine recorded them (OpenDP's own ε for the scale it drew with).

So an auditor can reconcile every job from the ledger alone, released or not:
:func:`reconcile` names every planned release the engine did not report, every
reported one that was not planned, and every one that cost more than was charged.

All of it is public: events are functions of the job's parameters, the declared labels
and the public vocabulary (the exact kernel's sensitivity of the released Ṽ).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from app.ledger import amounts
from workers.dpkps.config import GenerationConfig
from workers.dpkps.kde import ensemble_block_counts, kde_sensitivity

Event = dict[str, Any]
_NORM = {"laplace": "l1", "discrete_laplace": "l1"}


def event(
    *,
    mechanism: str,
    name: str,
    noise: str,
    epsilon: float | Decimal,
    sensitivity: float | None,
    dimension: int,
    partition: str | None = None,
    scale: float | None = None,
) -> Event:
    """One event in its stored form; a planned scale is ``sensitivity / ε``."""
    exact = amounts.exact(epsilon)
    if scale is None and sensitivity is not None:
        scale = float(sensitivity) / float(exact)
    return {
        "mechanism": mechanism,
        "name": name,
        "noise": noise,
        "scale": scale,
        "sensitivity": None if sensitivity is None else float(sensitivity),
        "norm": _NORM.get(noise, "l1"),
        "dimension": int(dimension),
        "partition": partition,
        "count": 1,
        "epsilon": str(exact),
    }


def planned(
    config: GenerationConfig, *, labels: Sequence[str], vocabulary_size: int
) -> list[Event]:
    """The releases a DP-KPS run of ``config`` makes (``pipeline.generate_sequences``):
    the vocabulary histogram over the whole public vocabulary, the class counts if asked,
    and per declared label the DP-KDE structures (one bag or exact density in the
    independent mode, one per block count of the ensemble in the iterative mode, sharing
    ε_kde evenly as the engine does, in floating point), which compose in parallel across
    labels."""
    events = [
        event(
            mechanism="vocabulary",
            name="vocabulary",
            noise="discrete_laplace",
            epsilon=config.epsilon_vocab,
            sensitivity=config.max_matches_per_document,
            dimension=vocabulary_size,
        )
    ]
    if config.epsilon_count is not None:
        events.append(
            event(
                mechanism="class_counts",
                name="class_counts",
                noise="discrete_laplace",
                epsilon=config.epsilon_count,
                sensitivity=1,
                dimension=len(labels),
            )
        )
    for label in labels:
        if config.density_method == "exact":
            events.append(
                event(
                    mechanism="kde",
                    name=f"kde[label={label},exact]",
                    noise="laplace",
                    epsilon=config.epsilon_kde,
                    sensitivity=None,  # the kernel's largest column sum over Ṽ
                    dimension=config.vocabulary_size,
                    partition=label,
                )
            )
            continue
        blocks = (
            [0]
            if config.mode == "independent"
            else ensemble_block_counts(config.ensemble, config.sequence_length)
        )
        share = float(config.epsilon_kde) / len(blocks)  # the engine's own share
        events += [
            event(
                mechanism="kde",
                name=f"kde[label={label},blocks={b}]",
                noise="laplace",
                epsilon=share,
                sensitivity=kde_sensitivity(config.num_features, config.contribution_bound),
                dimension=config.num_features,
                partition=label,
            )
            for b in blocks
        ]
    return events


def reported(privacy: Mapping[str, Any] | None) -> list[Event]:
    """The events of the engine's privacy report (``PrivacyReport.to_dict()``)."""
    return [
        event(
            mechanism=spend["mechanism"],
            name=spend["name"],
            noise=spend["noise"],
            epsilon=spend["epsilon"],
            sensitivity=spend["sensitivity"],
            dimension=spend["dimension"],
            partition=spend["partition"],
            scale=spend["scale"],
        )
        for spend in (privacy or {}).get("mechanisms", ())
    ]


def reconcile(planned: Sequence[Event], realised: Sequence[Event]) -> list[str]:
    """Differences between what a job was charged for and what its engine reported
    (empty: every planned release ran, nothing else did, none cost more)."""
    plan = {e["name"]: e for e in planned}
    ran = {e["name"]: e for e in realised}
    problems = [f"{name}: planned, not reported" for name in plan if name not in ran]
    problems += [f"{name}: reported, not planned" for name in ran if name not in plan]
    for name in plan.keys() & ran.keys():
        charged, cost = Decimal(plan[name]["epsilon"]), Decimal(ran[name]["epsilon"])
        if cost > charged:
            problems.append(f"{name}: cost ε = {cost}, charged ε = {charged}")
        if plan[name]["partition"] != ran[name]["partition"]:
            problems.append(f"{name}: partition {ran[name]['partition']!r} differs from the plan")
    return sorted(problems)
