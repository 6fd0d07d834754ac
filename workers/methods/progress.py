"""The stages a run goes through, in order, from its public configuration only.

Every method reports progress as ``(stage, fraction)`` calls (:data:`ProgressFn`): a
stage's start (``fraction`` 0), points within it, its end (1). Which stages a run has,
their order and their number are a function of the method and public parameters, so
"stage k of n" may be shown to anyone who may see the job. A stage is *public work*
when the amount of work in it is public (embedding the phrases of Ṽ with the public
model, sampling a public or DP number of sequences from DP releases, prompting the LLM
with the DP sequences): only then may a fraction within it, and a time estimate from the
rate so far, be shown. The other stages read the private corpus, so how far along they
are and how long they take depend on its size: they show their start and end only.

Nothing here imports the service: the CLI renders the same stages as progress bars
(:mod:`workers.progress_bars`), the service stores them on the job.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

DPKPS = "dpkps"
TICK_EVERY = 256  # documents (or texts) a run reads between two ticks


def ticker(progress: Callable[[str, float], None]) -> Callable[[], None] | None:
    """The ``tick`` of a progress callback, if it has one: a method of the callback that
    a run calls between progress reports where the work between two of them can be long
    (after each LLM call, every :data:`TICK_EVERY` documents read or embedded), at which
    the callback may stop the run by raising (the service's stage tracker checks there,
    at most every few seconds, whether the job was cancelled). A tick shows nothing and
    writes nothing. A plain function has none: nothing is called."""
    tick = getattr(progress, "tick", None)
    return tick if callable(tick) else None


@dataclass(frozen=True)
class Stage:
    """One stage of a run: its name (as reported), a title for people, and whether the
    amount of its work is public (a fraction and a time estimate may be shown)."""

    name: str
    title: str
    public_work: bool


LOAD = Stage("load", "reading the corpus", False)
PROMPTS = Stage("prompts", "prompting the LLM", True)
# Stages several LLM methods share; each ends with RELEASE.
INITIAL_POPULATION = Stage("initial_population", "initial population (LLM)", True)
RELEASE = Stage("release", "releasing the texts", True)

_DPKPS = (
    Stage("extract", "extracting keyphrases", False),
    Stage("private_vocabulary", "private vocabulary (DP)", False),
    Stage("embed", "embedding the vocabulary", True),
    Stage("dp_kde", "DP density per class", False),
    Stage("sequences", "sampling sequences", True),
)
# In iterative mode each class's sequences are sampled right after its density is
# built, between private reads: the sampling is shown as part of ``dp_kde``, and the
# ``sequences`` stage (the rest, after the last private read) has no fraction.
_DPKPS_ITERATIVE = (*_DPKPS[:4], Stage("sequences", "sampling sequences", False))
# The stage a round of a sharded DP-KPS run (workers/methods/dpkps/shards.py: its map and
# reduce) is shown in; private stages, their start and end shown only.
ROUND_STAGES = {"counts": "private_vocabulary", "sums": "dp_kde", "cells": "dp_kde"}

_LLM_METHODS: dict[str, tuple[Stage, ...]] = {
    "aug-pe": (
        LOAD,
        Stage("class_counts", "class counts (DP)", False),
        INITIAL_POPULATION,
        Stage("iteration", "DP votes and variations", False),
        RELEASE,
    ),
    "pate-tutor": (
        LOAD,
        Stage("public_pools", "public candidate pools (LLM)", True),
        Stage("tutor", "DP tutor counts", False),
        Stage("votes", "DP teacher votes", False),
        RELEASE,
    ),
    "dp-eda": (
        LOAD,
        INITIAL_POPULATION,
        Stage("iteration", "DP selections and decoding", False),
        RELEASE,
    ),
}


def run_stages(method: str, *, mode: str = "independent", llm: str = "local") -> tuple[Stage, ...]:
    """The stages of a run of ``method``, in order: DP-KPS's engine stages and, when it
    names an LLM (``llm`` not ``none``), the prompting stage; an LLM method's own.
    ``mode`` is DP-KPS's (``independent`` or ``iterative``)."""
    if method == DPKPS:
        engine = _DPKPS_ITERATIVE if mode == "iterative" else _DPKPS
        return engine if llm == "none" else (*engine, PROMPTS)
    try:
        return _LLM_METHODS[method]
    except KeyError:
        raise ValueError(f"no stages known for method {method!r}") from None


def stage_number(stages: tuple[Stage, ...], name: str) -> int | None:
    """The 1-based number of stage ``name`` in ``stages`` (None if it is not one)."""
    for number, stage in enumerate(stages, start=1):
        if stage.name == name:
            return number
    return None


def time_left(fraction: float, base: float, elapsed: float) -> float | None:
    """Seconds left in a public-work stage at ``fraction`` done, ``elapsed`` seconds after
    it (re)started at ``base``: the rate over the work done so far times the work left;
    None until some work is done."""
    done = fraction - base
    if done <= 0 or elapsed < 0:
        return None
    return max(0.0, elapsed * (1.0 - fraction) / done)
