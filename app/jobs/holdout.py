"""A job's held-out slice and its DP-measured accuracy (issue 66, item 2; docs/utility.md).

The mathematics is :mod:`workers.evaluation.holdout`'s; here it meets the job:

* :func:`with_key` gives a spec with a holdout its key (drawn at submission when the spec
  names none; the key is public and stored in the spec and the manifest);
* :func:`plan` adds the evaluation's event to the generation's planned events, the
  generation's marked as reading the rest side of the split and the evaluation's the
  slice: the ledger reserves and composes them in parallel;
* :func:`evaluate` (worker) scores a classifier trained on the released corpus on the
  slice and returns the noisy figure and the realised event;
* :func:`dry_run_block` is the dry run's ``utility`` block: the evaluation's cost, the
  interval it would give (from the owner's raw count, to the owner only) and why it is
  off, or worth turning on.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from workers.evaluation import holdout as maths
from workers.methods.dpkps.plan import Plan
from workers.privacy.accountant import compose
from workers.privacy.events import PrivacyEvent

MECHANISM = maths.MECHANISM
DRY_RUN_KEY = "dry-run-key"  # a dry run has no job: its split's name is a placeholder


def with_key(spec: Any) -> Any:
    """``spec`` with its holdout's key drawn when it has none (a submission)."""
    holdout = getattr(spec, "holdout", None)
    if holdout is None or holdout.key is not None:
        return spec
    key = secrets.token_hex(16)
    return spec.model_copy(update={"holdout": holdout.model_copy(update={"key": key})})


def split_of(holdout: Any) -> str:
    return maths.split_name(holdout.key or DRY_RUN_KEY, holdout.fraction)


def evaluation_epsilon(holdout: Any, generation: Plan) -> float:
    """ε of the evaluation: the spec's, or the generation's own (free in parallel), as
    the largest float not above it (a composed ε such as DP-EDA's 0.99999999999999995
    would round up to 1.0 and make the slice the dearer side by a rounding error)."""
    if holdout.epsilon is not None:
        return float(holdout.epsilon)
    epsilon = float(generation.epsilon)
    if Decimal(epsilon) > Decimal(generation.epsilon):
        epsilon = math.nextafter(epsilon, 0.0)
    return epsilon


def plan(spec: Any, generation: Plan, classes: int) -> Plan:
    """The job's planned events: the generation's on the rest side, the evaluation's on
    the slice; composed by the accountant, which takes the worse side (not the sum)."""
    holdout = getattr(spec, "holdout", None)
    if holdout is None:
        return generation
    split = split_of(holdout)
    event = maths.planned_event(
        epsilon=evaluation_epsilon(holdout, generation), classes=classes, split=split
    )
    events = (*maths.on_rest(generation.events, split), event)
    composition = compose(events)
    return Plan(
        events=events,
        epsilon=composition.epsilon(generation.delta),
        delta=generation.delta,
        accountant=composition.name,
    )


def generation_only(by_mechanism: Mapping[str, float]) -> dict[str, float]:
    """The reserved ε by mechanism without the evaluation's (what the engine reports)."""
    return {name: eps for name, eps in by_mechanism.items() if name != MECHANISM}


def privacy_block(
    privacy: Mapping[str, Any], split: str, event: PrivacyEvent, delta: float
) -> dict[str, Any]:
    """The manifest's privacy block with the generation's events on the rest side and
    the evaluation's realised event beside them, recomposed."""
    stored = (PrivacyEvent.from_dict(e) for e in privacy.get("events", ()))
    generation = [e for e in stored if e.mechanism != MECHANISM]  # a planned one is replaced
    events = (*maths.on_rest(generation, split), event)
    composition = compose(events)
    by_mechanism = dict(privacy.get("epsilon_by_mechanism") or {})
    by_mechanism[MECHANISM] = float(compose([event]).epsilon(delta))
    return {
        **privacy,
        "epsilon": float(composition.epsilon(delta)),
        "accountant": composition.name,
        "epsilon_by_mechanism": by_mechanism,
        "events": [e.to_dict() for e in events],
    }


def evaluate(
    *,
    texts: Sequence[str],
    labels: Sequence[str],
    units: Sequence[str] | None,
    label_set: Sequence[str],
    synthetic: Sequence[tuple[str, str]],
    holdout: Mapping[str, Any],
    epsilon: float,
    seed: int = 0,
) -> tuple[dict[str, Any], PrivacyEvent]:
    """The figure (DP outputs and public inputs only) and the realised event.

    ``synthetic`` are the released ``(label, text)`` pairs; ``texts``/``labels``/``units``
    the private corpus, of which only the slice's evaluated documents are read here.
    """
    key, fraction = str(holdout["key"]), float(holdout["fraction"])
    split = maths.split_name(key, fraction)
    chosen = maths.select(
        texts, labels, units, key=key, fraction=fraction, label_set=label_set
    ).evaluated
    predicted = maths.predict(
        [text for _, text in synthetic],
        [label for label, _ in synthetic],
        [texts[i] for i in chosen],
        seed=seed,
    )
    cells = maths.cell_counts([labels[i] for i in chosen], predicted, label_set)
    noisy, event = maths.release(cells, epsilon=epsilon, split=split)
    del cells, predicted, chosen
    found = maths.figure(noisy, epsilon=epsilon, label_set=label_set)
    return {
        **found.to_dict(),
        "fraction": fraction,
        "key": key,
        "split": split,
        "classifier": "tfidf",
        "cells": {
            "correct": noisy[: len(label_set)].tolist(),
            "wrong": noisy[len(label_set) :].tolist(),
        },
    }, event


def dry_run_block(
    spec: Any, the_plan: Plan, generation: Plan, documents: int | None, classes: int
) -> dict[str, Any] | None:
    """The dry run's ``utility`` block (None for a method without a holdout).

    Its cost is public; the expected interval uses the upload's raw document count, so it
    (and the verdict on it) is given to the dataset's owner only (``documents`` None
    otherwise). With a unit column the slice holds fewer units than ``fraction`` × the
    documents: the width is then a lower bound."""
    if "holdout" not in type(spec).model_fields:
        return None  # the method's job spec has no holdout
    holdout = spec.holdout
    fraction = holdout.fraction if holdout is not None else maths.DEFAULT_FRACTION
    epsilon = (
        evaluation_epsilon(holdout, generation)
        if holdout is not None
        else float(generation.epsilon)
    )
    extra = float(the_plan.epsilon) - float(generation.epsilon)
    block: dict[str, Any] = {
        "holdout": holdout is not None,
        "fraction": fraction,
        "epsilon": epsilon,
        "confidence": maths.CONFIDENCE,
        "extra_epsilon": max(extra, 0.0),
        "cost": (
            f"the evaluation's noisy counts cost ε = {epsilon:g} on the held-out units; they "
            "compose in parallel with the generation (disjoint units), so the job costs "
            f"ε = {float(the_plan.epsilon):g}, "
            + (
                "the same as the generation alone"
                if extra <= 0
                else f"{extra:g} more than the generation alone ({float(generation.epsilon):g})"
            )
            if holdout is not None
            else "no holdout: nothing is held out and nothing is charged for it"
        ),
    }
    if documents is None:
        return block
    slice_units = fraction * documents
    half = maths.expected_half_width(slice_units=slice_units, epsilon=epsilon, classes=classes)
    useful = half <= maths.USEFUL_HALF_WIDTH
    block.update(
        expected_slice_units=int(slice_units),
        expected_half_width=half,
        useful=useful,
    )
    width = (
        f"a slice of about {int(slice_units)} units (fraction {fraction:g} of "
        f"{documents} documents) would measure accuracy to ±{half:.3f} "
        f"({maths.CONFIDENCE:.0%}, noise only) at ε = {epsilon:g}"
    )
    limit = f"±{maths.USEFUL_HALF_WIDTH:g}"
    if holdout is None:
        block["summary"] = f"Holdout off (the default). {width[0].upper()}{width[1:]}: " + (
            f'useful (within {limit}); add "holdout": {{"fraction": {fraction:g}}} '
            "to publish it, at the cost of those units in generation."
            if useful
            else f"wider than {limit}, so the corpus is too small for a useful figure "
            "and the holdout stays off."
        )
    else:
        block["summary"] = f"Holdout on. {width[0].upper()}{width[1:]}" + (
            "."
            if useful
            else f": wider than {limit}: the corpus is too small for a useful figure; "
            "leave the holdout off (its units would be lost to generation for little)."
        )
    return block
