"""The batched engine's thread governor (``workers.llm.engine.ThreadGovernor``, ``CpuMeter``).

What is shown: a lane runs on every CPU while nothing else works, on one when another
process keeps a core busy, and back on every CPU when it leaves; readings are taken once
an interval and smoothed over two; nothing readable leaves the count alone; a lane's
share follows ``most``; a one-thread lane never switches. And the meter leaves out its own
process's work, and niced work unless it is niced itself (on a written /proc/stat), and on
this machine reads a busy-looping child process as about one CPU.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workers.llm.engine import CpuMeter, ThreadGovernor


class FakeMeter(CpuMeter):
    def __init__(self, readings: list[float | None]) -> None:
        self.readings = readings

    def others(self) -> float | None:
        return self.readings.pop(0)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def governor(readings: list[float | None], most: int = 2, cpus: int = 2) -> ThreadGovernor:
    clock = FakeClock()
    g = ThreadGovernor(most, cpus=cpus, meter=FakeMeter(readings), interval=0.25, clock=clock)
    g.clock_ = clock  # type: ignore[attr-defined]
    return g


def step(g: ThreadGovernor, seconds: float = 0.25) -> int:
    g.clock_.now += seconds  # type: ignore[attr-defined]
    return g.choose()


def test_the_lane_gives_way_to_other_processes_and_takes_the_cores_back() -> None:
    g = governor([0.02, 0.05, 1.0, 1.0, 0.95, 0.0, 0.0])
    assert g.choose() == 2  # before the first interval: every CPU
    assert [step(g) for _ in range(7)] == [2, 2, 1, 1, 1, 2, 2]
    assert g.switches == 2


def test_readings_are_taken_once_an_interval() -> None:
    g = governor([1.0, 1.0])
    assert [step(g, 0.05) for _ in range(4)] == [2, 2, 2, 2]  # 0.2 s: no reading yet
    assert step(g, 0.05) == 1  # 0.25 s: the first reading
    assert g.meter.readings == [1.0]  # type: ignore[attr-defined]


def test_nothing_readable_keeps_the_count() -> None:
    g = governor([None, None, 1.0, 1.0, None])
    assert [step(g) for _ in range(5)] == [2, 2, 1, 1, 1]


def test_a_lane_takes_its_share_of_what_is_free() -> None:
    g = governor([0.0, 2.0, 2.0, 6.0, 6.0], most=4, cpus=8)  # one of two lanes on 8 CPUs
    assert [step(g) for _ in range(5)] == [4, 4, 3, 2, 2]


def test_a_single_thread_lane_never_switches() -> None:
    g = governor([0.0, 1.0, 0.0], most=1)
    assert [step(g) for _ in range(3)] == [1, 1, 1]
    assert g.switches == 0
    with pytest.raises(ValueError):
        ThreadGovernor(0, meter=FakeMeter([]))


def test_the_meter_leaves_out_this_process_and_niced_work(tmp_path: Path) -> None:
    """A /proc/stat whose busy time grows by exactly this process's own CPU time, plus
    0.2 s of niced work, reads as nobody else; 0.1 s more of user time over 0.2 s, as
    half a CPU."""
    stat = tmp_path / "stat"
    meter = CpuMeter(stat, count_niced=False)  # as in an unniced server
    ticks = meter.ticks

    def write(busy_ticks: int, nice_ticks: int) -> None:
        stat.write_text(f"cpu  {busy_ticks} {nice_ticks} 0 5000 0 0 0 0 0 0\ncpu0 0\n")

    own = sum(os.times()[:2])
    write(1000, 0)
    meter.others()
    deadline = time.monotonic() + 0.3
    while time.monotonic() < deadline:  # this process works
        pass
    spent = sum(os.times()[:2]) - own
    write(1000 + round(spent * ticks), round(0.2 * ticks))
    reading = meter.others()
    assert reading is not None and reading < 0.05
    time.sleep(0.2)  # another process works 0.1 s meanwhile
    write(1000 + round(spent * ticks) + round(0.1 * ticks), round(0.2 * ticks))
    reading = meter.others()
    assert reading is not None and 0.2 <= reading <= 0.5  # 0.1 s over 0.2 s and a bit
    assert CpuMeter(tmp_path / "absent").others() is None


def test_a_niced_meter_counts_niced_work(tmp_path: Path) -> None:
    """Run niced, the server competes with niced processes on equal terms (and its own
    user time is in /proc/stat's nice column): 0.1 s of niced work over 0.2 s reads as
    half a CPU; a process started with ``nice`` counts niced work by default."""
    stat = tmp_path / "stat"
    meter = CpuMeter(stat, count_niced=True)
    ticks = meter.ticks

    def write(nice_ticks: int) -> None:
        own = sum(os.times()[:2])  # this process's time, as if it were niced
        stat.write_text(f"cpu  0 {round(own * ticks) + nice_ticks} 0 5000 0 0 0 0 0 0\n")

    write(0)
    meter.others()
    time.sleep(0.2)
    write(round(0.1 * ticks))
    reading = meter.others()
    assert reading is not None and 0.2 <= reading <= 0.6
    probe = "from workers.llm.engine import CpuMeter; print(CpuMeter().count_niced)"
    niced = subprocess.run(
        ["nice", "-n", "19", sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])},
    )
    assert niced.stdout.strip() == "True"


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="reads Linux's /proc/stat")
def test_the_meter_reads_a_busy_process() -> None:
    meter = CpuMeter()
    spin = "print('spinning', flush=True)\nwhile True: pass"
    spinner = subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE)
    try:
        assert spinner.stdout is not None
        assert spinner.stdout.readline() == b"spinning\n"  # it loops from now on
        meter.others()
        time.sleep(0.6)  # the interval the meter reads over
        reading = meter.others()
        assert reading is not None and reading > 0.6
    finally:
        spinner.kill()
        spinner.wait()
        if spinner.stdout is not None:
            spinner.stdout.close()
