"""The cumulative-ε chart of a dataset page, drawn on the server as SVG geometry.

Each ledger entry moves the figures at its commit time; the figures after each entry
come from :func:`app.ledger.service.running_budgets`, the arithmetic of every other
budget figure, so the chart's last point is the dataset's ``spent`` exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from app.admin.formatting import epsilon
from app.ledger import service as ledger
from app.models import LedgerEntry

WIDTH, HEIGHT = 720, 240
LEFT, RIGHT, TOP, BOTTOM = 56, 20, 16, 40


@dataclass(frozen=True)
class Marker:
    x: float
    y: float
    title: str


@dataclass(frozen=True)
class Tick:
    at: float
    label: str


@dataclass(frozen=True)
class Chart:
    width: int
    height: int
    left: int
    right: float
    top: int
    bottom: float
    spent: str  # polyline points
    committed: str  # spent + reserved
    cap_y: float
    cap_label: str
    y_ticks: Sequence[Tick]
    x_ticks: Sequence[Tick]
    markers: Sequence[Marker]
    final_spent: float


def _points(points: Sequence[tuple[float, float]]) -> str:
    return " ".join(f"{x:.1f},{y:.1f}" for x, y in points)


def cumulative_chart(budget_cap: ledger.Amount, entries: Sequence[LedgerEntry]) -> Chart | None:
    """The step lines of ε spent and ε spent + reserved over time (each point the
    accountant's composition at the cap's δ), with the cap; None when the ledger is
    empty."""
    if not entries:
        return None
    history = [
        (float(f.spent), float(f.spent + f.reserved))
        for f in ledger.running_budgets(budget_cap, entries)
    ]
    cap = float(budget_cap.epsilon)
    start: datetime = entries[0].created_at
    end: datetime = max(entries[-1].created_at, start + timedelta(seconds=1))
    span = (end - start).total_seconds()
    top_value = max([cap, *(held for _, held in history)]) * 1.08
    right, bottom = WIDTH - RIGHT, HEIGHT - BOTTOM

    def x(at: datetime) -> float:
        return LEFT + (right - LEFT) * (at - start).total_seconds() / span

    def y(value: float) -> float:
        return bottom - (bottom - TOP) * value / top_value

    spent = [(float(LEFT), y(0.0))]
    committed = [(float(LEFT), y(0.0))]
    markers = []
    for entry, (spent_now, held_now) in zip(entries, history, strict=True):
        at = x(entry.created_at)
        spent += [(at, spent[-1][1]), (at, y(spent_now))]
        committed += [(at, committed[-1][1]), (at, y(held_now))]
        if entry.kind == "commit":
            markers.append(
                Marker(
                    at,
                    y(spent_now),
                    f"{entry.created_at:%Y-%m-%d %H:%M:%S} UTC: job {str(entry.job_id)[:8]} "
                    f"spent ε = {epsilon(float(entry.epsilon))}; ε spent in all, composed "
                    f"({entry.accountant}): {epsilon(spent_now)}",
                )
            )
    spent.append((right, spent[-1][1]))
    committed.append((right, committed[-1][1]))
    y_ticks = [Tick(y(v), epsilon(round(v, 6))) for v in (0.0, cap / 2, cap)]
    x_ticks = [
        Tick(float(LEFT), f"{start:%Y-%m-%d %H:%M} UTC"),
        Tick(right, f"{end:%Y-%m-%d %H:%M} UTC"),
    ]
    return Chart(
        width=WIDTH,
        height=HEIGHT,
        left=LEFT,
        right=right,
        top=TOP,
        bottom=bottom,
        spent=_points(spent),
        committed=_points(committed),
        cap_y=y(cap),
        cap_label=f"cap ε = {epsilon(cap)}",
        y_ticks=y_ticks,
        x_ticks=x_ticks,
        markers=markers,
        final_spent=history[-1][0],
    )
