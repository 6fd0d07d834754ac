"""The cumulative charts of the dashboard (a dataset's ε and δ, an organisation's spend
over time), drawn on the server as SVG geometry.

Each ledger entry moves the figures at its time; the figures after each entry come from
the ledger service (:func:`app.ledger.service.running_budgets` for a dataset,
:func:`~app.ledger.service.organisation_history` for an organisation), the arithmetic of
every other budget figure, so a chart's last point is the page's ``spent`` exactly. ε is
read on the left axis, the δ that the spent ε is stated at (0 while every noisy release
is pure ε-DP; the cap's δ once a Gaussian one is in) on the right one.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from app.admin.formatting import exact_text, significant
from app.ledger import service as ledger
from app.models import LedgerEntry

WIDTH, HEIGHT = 720, 240
LEFT, RIGHT, TOP, BOTTOM = 56, 76, 16, 40
FAR_BELOW = 4  # a cap more than this many times the spend is named, not drawn


@dataclass(frozen=True)
class Marker:
    x: float
    y: float
    title: str


@dataclass(frozen=True)
class Tick:
    at: float
    label: str
    exact: str = ""


@dataclass(frozen=True)
class Point:
    """The figures right after one ledger entry."""

    at: datetime
    spent: float
    held: float  # spent + reserved
    delta: float  # the δ spent is stated at
    marker: str | None = None  # a commit's words, for its marker


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
    delta: str  # the δ spent is stated at, on the right axis
    cap_y: float
    cap_label: str
    cap_shown: bool  # False: the cap is far above the spend, named but not drawn
    delta_cap_y: float
    delta_cap_label: str
    y_ticks: Sequence[Tick]
    delta_ticks: Sequence[Tick]
    x_ticks: Sequence[Tick]
    markers: Sequence[Marker]
    final_spent: float
    final_delta: float
    cap_delta: float
    pure: bool  # δ is 0 throughout


def _points(points: Sequence[tuple[float, float]]) -> str:
    return " ".join(f"{x:.1f},{y:.1f}" for x, y in points)


def _finite(value: float, ceiling: float) -> float:
    return ceiling if math.isinf(value) else value


def _chart(cap_epsilon: float, cap_delta: float, points: Sequence[Point], cap_name: str) -> Chart:
    start = points[0].at
    end = max(points[-1].at, start + timedelta(seconds=1))
    span = (end - start).total_seconds()
    held = max(_finite(p.held, cap_epsilon) for p in points)
    # a cap far above the spend (an organisation's budget, often) would flatten the
    # lines: the axis then ends above the spend and the cap is named, not drawn
    cap_shown = not 0 < held * FAR_BELOW < cap_epsilon
    top_value = max(cap_epsilon, held) * 1.08 if cap_shown else held * 1.25
    top_delta = max([cap_delta, *(p.delta for p in points)]) * 1.25 or 1.0
    right, bottom = WIDTH - RIGHT, HEIGHT - BOTTOM

    def x(at: datetime) -> float:
        return LEFT + (right - LEFT) * (at - start).total_seconds() / span

    def y(value: float) -> float:
        return bottom - (bottom - TOP) * _finite(value, top_value) / top_value

    def y_delta(value: float) -> float:
        return bottom - (bottom - TOP) * value / top_delta

    spent = [(float(LEFT), y(0.0))]
    committed = [(float(LEFT), y(0.0))]
    delta = [(float(LEFT), y_delta(0.0))]
    markers = []
    for point in points:
        at = x(point.at)
        spent += [(at, spent[-1][1]), (at, y(point.spent))]
        committed += [(at, committed[-1][1]), (at, y(point.held))]
        delta += [(at, delta[-1][1]), (at, y_delta(point.delta))]
        if point.marker is not None:
            markers.append(Marker(at, y(point.spent), point.marker))
    for line in (spent, committed, delta):
        line.append((right, line[-1][1]))
    top_tick = cap_epsilon if cap_shown else held
    y_ticks = [Tick(y(v), significant(v), exact_text(v)) for v in (0.0, top_tick / 2, top_tick)]
    delta_ticks = (
        [Tick(y_delta(v), significant(v), exact_text(v)) for v in (0.0, cap_delta)]
        if cap_delta > 0
        else [Tick(y_delta(0.0), "0", "0")]
    )
    return Chart(
        width=WIDTH,
        height=HEIGHT,
        left=LEFT,
        right=right,
        top=TOP,
        bottom=bottom,
        spent=_points(spent),
        committed=_points(committed),
        delta=_points(delta),
        cap_y=y(cap_epsilon) if cap_shown else TOP,
        cap_label=f"{cap_name} ε = {significant(cap_epsilon)}"
        + ("" if cap_shown else " (far above: not to scale)"),
        cap_shown=cap_shown,
        delta_cap_y=y_delta(cap_delta),
        delta_cap_label=f"{cap_name} δ = {significant(cap_delta)}",
        y_ticks=y_ticks,
        delta_ticks=delta_ticks,
        x_ticks=[
            Tick(float(LEFT), f"{start:%Y-%m-%d %H:%M} UTC"),
            Tick(right, f"{end:%Y-%m-%d %H:%M} UTC"),
        ],
        markers=markers,
        final_spent=points[-1].spent,
        final_delta=points[-1].delta,
        cap_delta=cap_delta,
        pure=all(p.delta == 0 for p in points) and cap_delta == 0,
    )


def _said(value: float | Decimal) -> str:
    """A figure in a marker's words: 3 significant figures and the exact value."""
    return f"{significant(value)} (exact {exact_text(value)})"


class PublicTimes:
    """Where the charts of the dashboard (admins and auditors: never a dataset's owner)
    place each ledger entry in time. An entry a request wrote (a reservation at
    submission, a release at a cancel) at its time; an entry a worker wrote (a commit, at
    the job's start: it follows the jobs before it on the worker, whose durations depend
    on their private corpora) at the time of its job's submission, or of the point
    before it if that is later (:func:`app.ledger.service.time_shown`): a function of
    public times only."""

    def __init__(self) -> None:
        self.submitted: dict[uuid.UUID, datetime] = {}
        self.last: datetime | None = None

    def at(self, entry: LedgerEntry) -> tuple[datetime, bool]:
        """The entry's place in time, and whether that is its own time."""
        if entry.kind == "reserve":
            self.submitted.setdefault(entry.job_id, entry.created_at)
        own = ledger.time_shown(entry.actor, owner=False)
        at = entry.created_at if own else self.submitted.get(entry.job_id, entry.created_at)
        if self.last is not None and at < self.last:
            at = self.last
        self.last = at
        return at, own


def _when(at: datetime, own: bool) -> str:
    return f"{at:%Y-%m-%d %H:%M:%S} UTC" if own else f"submitted {at:%Y-%m-%d %H:%M:%S} UTC"


def _point(
    times: PublicTimes,
    entry: LedgerEntry,
    spent: Decimal,
    held: Decimal,
    spent_delta: Decimal,
    accountant: str,
    *,
    whose: str,
    of: str = "",
) -> Point:
    """The chart's point after ``entry``, placed by ``times``; a commit's marker says what
    its job spent and ``whose`` spend it brings to (``of``: which dataset the job ran on)."""
    at, own = times.at(entry)
    marker = None
    if entry.kind == "commit":
        marker = (
            f"{_when(at, own)}: job {str(entry.job_id)[:8]}{of} spent ε = {_said(entry.epsilon)}; "
            f"{whose}, composed ({accountant}): {_said(spent)} at δ = {_said(spent_delta)}"
        )
    return Point(at, float(spent), float(held), float(spent_delta), marker)


def cumulative_chart(budget_cap: ledger.Amount, entries: Sequence[LedgerEntry]) -> Chart | None:
    """The step lines of ε spent and ε spent + reserved over time (each point the
    accountant's composition at the cap's δ), with the cap, and the δ spent is stated at;
    None when the ledger is empty. Worker-written entries are placed in time by
    :class:`PublicTimes`."""
    if not entries:
        return None
    times = PublicTimes()
    points = [
        _point(
            times,
            entry,
            f.spent,
            f.spent + f.reserved,
            f.spent_delta,
            entry.accountant,
            whose="ε spent in all",
        )
        for entry, f in zip(entries, ledger.running_budgets(budget_cap, entries), strict=True)
    ]
    return _chart(float(budget_cap.epsilon), float(budget_cap.delta), points, "cap")


def organisation_chart(
    budget: ledger.Amount,
    moments: Sequence[ledger.OrganisationMoment],
    dataset_names: Mapping[uuid.UUID, str],
) -> Chart | None:
    """An organisation's spend over time: ε of all its datasets' noisy releases composed
    (sequentially across datasets) at the budget's δ, against the budget; None before
    its first ledger entry."""
    if not moments:
        return None
    times = PublicTimes()
    points = [
        _point(
            times,
            m.entry,
            m.spent,
            m.held,
            m.spent_delta,
            m.accountant,
            whose="the organisation's ε spent",
            of=f" of {dataset_names.get(m.entry.dataset_id, '?')}",
        )
        for m in moments
    ]
    return _chart(float(budget.epsilon), float(budget.delta), points, "budget")
