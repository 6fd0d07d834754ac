"""The batched engine's thread tuner (``workers.llm.engine.ThreadTuner``): pure bookkeeping.

What is shown: each candidate (all of the lane's threads, one thread) is measured at a
batch size before either is trusted there; the cheaper one then runs, the other only in
its probe window; a change of costs (another process takes a core, or leaves it) moves
the choice within one probe; costs are kept per batch size, so a cheap small step does
not pass for a cheap thread count; a prefill step keeps the current count and teaches
nothing; a one-thread lane never switches.
"""

from __future__ import annotations

import pytest

from workers.llm.engine import ThreadTuner


def run(tuner: ThreadTuner, steps: int, cost: dict[int, float], tokens: int = 8) -> list[int]:
    """``steps`` generation steps of ``tokens`` tokens; a step on n threads takes cost[n] s."""
    chosen = []
    for _ in range(steps):
        threads = tuner.choose(tokens)
        chosen.append(threads)
        tuner.record(threads, cost[threads], tokens, generation_only=True)
    return chosen


def test_each_candidate_is_measured_then_the_cheaper_runs_and_the_other_is_probed() -> None:
    tuner = ThreadTuner(2, probe_every=20, probe_steps=2)
    chosen = run(tuner, 100, {2: 0.022, 1: 0.041})  # an idle machine: two threads win
    assert chosen[:2] == [2, 1]  # both measured first
    assert chosen.count(1) == 1 + 2 * 5  # then one thread only in the probe windows
    windows = [i for i, n in enumerate(chosen) if n == 1][1:]
    assert all(i % 20 >= 18 for i in windows)
    assert tuner.best(8) == 2


def test_the_choice_follows_the_machine_load() -> None:
    tuner = ThreadTuner(2, probe_every=16, probe_steps=2)
    run(tuner, 40, {2: 0.022, 1: 0.041})
    assert tuner.best(8) == 2
    # another process takes a core: two threads wait at every barrier
    busy = run(tuner, 40, {2: 0.100, 1: 0.042})
    assert tuner.best(8) == 1
    assert busy[-10:].count(1) >= 8
    # it leaves again
    run(tuner, 40, {2: 0.022, 1: 0.041})
    assert tuner.best(8) == 2


def test_costs_are_compared_at_the_same_batch_size() -> None:
    tuner = ThreadTuner(2, probe_every=100, probe_steps=2)
    run(tuner, 10, {2: 0.022, 1: 0.041}, tokens=8)
    run(tuner, 10, {2: 0.012, 1: 0.009}, tokens=1)  # one slot left: one thread is cheaper
    assert tuner.best(8) == 2 and tuner.best(1) == 1
    assert tuner.choose(8) == 2
    assert tuner.choose(1) == 1


def test_a_prefill_step_keeps_the_count_and_teaches_nothing() -> None:
    tuner = ThreadTuner(2)
    first = tuner.choose(150, generation_only=False)
    assert first == 2
    tuner.record(first, 10.0, 150, generation_only=False)
    assert tuner.cost == {} and tuner.switches == 0


def test_a_single_thread_lane_never_switches() -> None:
    tuner = ThreadTuner(1)
    assert run(tuner, 20, {1: 0.04}) == [1] * 20
    assert tuner.switches == 0
    with pytest.raises(ValueError):
        ThreadTuner(0)
