"""Privacy events: one record per noisy release, the unit every accountant composes.

A :class:`PrivacyEvent` says what was released and how it was protected: the mechanism
(``"vocabulary-histogram"``, ``"kde"``, ``"pe-histogram"``), the noise distribution and
its scale, the sensitivity the noise was calibrated for and its norm, the number of
noised coordinates, the partition of the data it read (a class, or ``None`` for the
whole dataset), how many identical releases it stands for (``count``, e.g. T
iterations), for pure-ε mechanisms the ε one release spends and, for approximate
mechanisms, the δ one release spends outright (``delta``, below). Events carry no data
and no private quantity: they are functions of the job's public parameters, so they may
be shown to anyone who may see the job.

Adjacency is add/remove one privacy unit (a document, or a patient when the dataset has
a unit column). ``sensitivity`` bounds how far one unit moves the released aggregate in
the event's ``norm``.

Noise distributions and what the fields mean for each:

=====================  ========================  ===================  ==================
``noise``              ``scale``                 ``norm``             ``epsilon``
=====================  ========================  ===================  ==================
``laplace``            Laplace b                 ``l1``               ε of one release
``discrete_laplace``   discrete Laplace b        ``l1``               ε of one release
``gaussian``           standard deviation σ      ``l2``               ``None``
``discrete_gaussian``  discrete Gaussian σ       ``l2``               ``None``
``gumbel_top_k``       Gumbel scale              any                  ε of one release
``exponential``        exponential-mech. scale   any                  ε of one release
=====================  ========================  ===================  ==================

The Gaussian events have no ε of their own: what they cost depends on δ and on what
they are composed with, which is the accountant's business (``accountant.py``).

``delta`` (optional, any noise; ``None`` means 0): the δ one release spends outright, for
a mechanism that is the one described by the other fields except on a failure of
probability at most δ — LimitedDomain's noisy threshold (Durfee & Rogers 2019), which
restricts a selection to the top K at a cost δ, is one. Exactly: its privacy loss
distribution is the described one's with mass δ moved to +∞; for a pure event that is
the same as being (ε, δ)-DP, since every (ε, δ)-DP mechanism is dominated so (Kairouz,
Oh & Viswanath 2015). Composed, these δ add up (``count`` × δ per event, the worst
partition's sum for a parallel group) and are taken off the target δ before the rest is
composed: ε(δ) of the whole is ε(δ − Σ δ_i) of the events without them
(``accountant.py``).

========================  =============================================================
``delta``                 meaning
========================  =============================================================
``None`` (absent)         δ = 0: the release is exactly the described mechanism
``0 < δ < 1``             δ of one release, spent outright; decimal string in JSON
========================  =============================================================

A vector ``discrete_gaussian`` event (dimension > 1) describes integer counts where one
unit changes each coordinate by at most 1 (class counts, phrase-presence counts), so
``sensitivity²`` is the number of coordinates one unit can move and must be an integer;
a one-dimensional one takes an integer sensitivity. The accountant relies on this shape.

Composition structure (:func:`plan_composition`): the events of one mechanism on
disjoint partitions compose **in parallel** (a unit lies in one class, so only that
class's releases see it: the cost is the worst partition's), everything else composes
**sequentially**. Different mechanisms compose sequentially even when both are split by
class: conservative, and it keeps each mechanism's share readable. Partition names are
parts of the dataset's one split by its label column; a mechanism may declare
partitions only if each unit's contribution stays within one of them.

Splits (``split`` and ``side``, optional, together): a job that holds out a slice of the
units (``workers/evaluation/holdout.py``) divides them into two sides by a keyed hash
of the unit — a public rule, and a unit lies wholly on one side. Its generation's
releases read only the ``"rest"`` side, its evaluation's only the ``"slice"`` side, both
under the split's name (a digest of the key and the fraction, so two jobs with the same
key and fraction share one split). A unit added or removed is on one side of each split,
so only that side's releases see it: the accountant composes, for every choice of one
side per split, the untagged events with the chosen sides' events, and charges the
worst choice (parallel composition of the two sides, the same worst-case as classes).

``to_dict``/``from_dict`` give the JSON form stored in the ledger and manifests. ε and δ
are written as decimal strings, so that a stored spend reads back exactly; ``delta`` is
left out when it is absent, so events stored before it existed read back unchanged; so are
``split`` and ``side``.

>>> e = PrivacyEvent(mechanism="vocabulary-histogram", noise="discrete_laplace", scale=4.0,
...                  sensitivity=4, norm="l1", dimension=1000, epsilon="1")
>>> e.to_dict()["epsilon"], PrivacyEvent.from_dict(e.to_dict()) == e
('1', True)
>>> ld = PrivacyEvent(mechanism="limited-domain", noise="gumbel_top_k", scale=10.0,
...                   sensitivity=3, norm="linf", dimension=301, epsilon="0.3", delta="1e-7")
>>> ld.to_dict()["delta"], ld.total_delta, "delta" in e.to_dict()
('1E-7', Decimal('1E-7'), False)
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any

from workers.errors import ConfigError

PURE_NOISES = ("laplace", "discrete_laplace", "gumbel_top_k", "exponential")
GAUSSIAN_NOISES = ("gaussian", "discrete_gaussian")
NOISES = PURE_NOISES + GAUSSIAN_NOISES
NORMS = ("l1", "l2", "linf")
SIDES = ("slice", "rest")  # the two sides of a split (module docstring)
_NORM_OF = {
    "laplace": "l1",
    "discrete_laplace": "l1",
    "gaussian": "l2",
    "discrete_gaussian": "l2",
}
# OpenDP's maps round ε up by a few ulps; a recorded ε may not fall below Δ/b by more.
_PURE_TOLERANCE = 1e-9


def exact_decimal(value: object, *, field: str = "epsilon") -> Decimal:
    """A finite number > 0 as an exact :class:`~decimal.Decimal`.

    Integers, decimal strings and ``Decimal`` are taken as they are. A float is read as
    the shortest decimal that round-trips to it (``0.1`` → ``Decimal("0.1")``): the
    number a person or an OpenDP map wrote, within 1e-16 relative of the binary value —
    eleven orders below the accountant's discretization.

    >>> sum([exact_decimal("0.0001")] * 10_000)
    Decimal('1.0000')
    """
    if isinstance(value, bool):
        raise ConfigError("must be a number", field=field)
    number: Decimal
    if isinstance(value, Decimal):
        number = value
    elif isinstance(value, int):
        number = Decimal(value)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(f"must be finite and > 0 (got {value})", field=field)
        number = Decimal(repr(value))
    elif isinstance(value, str):
        try:
            number = Decimal(value.strip())
        except InvalidOperation:
            raise ConfigError("must be a decimal number", field=field) from None
    else:
        raise ConfigError("must be a number", field=field)
    if not number.is_finite() or number <= 0:
        raise ConfigError(f"must be finite and > 0 (got {number})", field=field)
    return number


def _positive_finite(value: object, *, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError("must be a number", field=field)
    number = float(value)
    if not (math.isfinite(number) and number > 0):
        raise ConfigError(f"must be finite and > 0 (got {value})", field=field)
    return number


def _positive_int(value: object, *, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError("must be an integer ≥ 1", field=field)
    return value


@dataclass(frozen=True)
class PrivacyEvent:
    """One noisy release (or ``count`` identical ones); see the module docstring."""

    mechanism: str
    noise: str
    scale: float
    sensitivity: float
    norm: str
    dimension: int
    partition: str | None = None
    count: int = 1
    epsilon: Decimal | None = field(default=None)
    name: str | None = None  # the release within its job, for display only
    delta: Decimal | None = None  # δ of one release, spent outright (module docstring)
    split: str | None = None  # a public split of the units into two sides (module docstring)
    side: str | None = None  # which side of ``split`` the release reads: "slice" or "rest"

    def __post_init__(self) -> None:
        if not isinstance(self.mechanism, str) or not self.mechanism.strip():
            raise ConfigError("must be a non-empty string", field="mechanism")
        if self.noise not in NOISES:
            raise ConfigError(f"must be one of {', '.join(NOISES)}", field="noise")
        if self.norm not in NORMS:
            raise ConfigError(f"must be one of {', '.join(NORMS)}", field="norm")
        expected = _NORM_OF.get(self.noise)
        if expected is not None and self.norm != expected:
            raise ConfigError(
                f"{self.noise} noise is calibrated to an {expected} sensitivity", field="norm"
            )
        object.__setattr__(self, "scale", _positive_finite(self.scale, field="scale"))
        object.__setattr__(
            self, "sensitivity", _positive_finite(self.sensitivity, field="sensitivity")
        )
        _positive_int(self.dimension, field="dimension")
        _positive_int(self.count, field="count")
        if self.partition is not None and (
            not isinstance(self.partition, str) or not self.partition
        ):
            raise ConfigError("must be a non-empty string or null", field="partition")
        if self.noise in PURE_NOISES:
            if self.epsilon is None:
                raise ConfigError(f"{self.noise} events record their ε", field="epsilon")
            epsilon = exact_decimal(self.epsilon)
            object.__setattr__(self, "epsilon", epsilon)
            if self.noise in ("laplace", "discrete_laplace"):
                floor = self.sensitivity / self.scale
                if float(epsilon) < floor * (1 - _PURE_TOLERANCE):
                    raise ConfigError(
                        f"ε {epsilon} is below sensitivity/scale = {floor:.12g}", field="epsilon"
                    )
        elif self.epsilon is not None:
            raise ConfigError(
                "Gaussian events have no ε of their own; the accountant computes it",
                field="epsilon",
            )
        if self.noise == "discrete_gaussian":
            self._check_discrete_gaussian()
        self._check_split()
        if self.delta is not None:
            delta = exact_decimal(self.delta, field="delta")
            if delta >= 1:
                raise ConfigError(f"must be in (0, 1) (got {delta})", field="delta")
            object.__setattr__(self, "delta", delta)

    def _check_split(self) -> None:
        if (self.split is None) != (self.side is None):
            raise ConfigError("split and side are given together or not at all", field="side")
        if self.split is not None:
            if not isinstance(self.split, str) or not self.split:
                raise ConfigError("must be a non-empty string or null", field="split")
            if self.side not in SIDES:
                raise ConfigError(f"must be one of {', '.join(SIDES)}", field="side")

    def _check_discrete_gaussian(self) -> None:
        if self.dimension == 1:
            if self.sensitivity != round(self.sensitivity):
                raise ConfigError(
                    "a discrete Gaussian count takes an integer sensitivity", field="sensitivity"
                )
        elif not _is_integer(self.sensitivity**2):
            raise ConfigError(
                "a discrete Gaussian vector moves each coordinate by at most 1: "
                "sensitivity² (coordinates moved) must be an integer",
                field="sensitivity",
            )

    @property
    def is_pure(self) -> bool:
        """Whether the event is pure ε-DP (δ = 0): a pure noise, and no δ spent outright."""
        return self.noise in PURE_NOISES and self.delta is None

    @property
    def total_delta(self) -> Decimal:
        """``count × δ`` spent outright, exactly (0 without a ``delta``)."""
        return Decimal(0) if self.delta is None else self.count * self.delta

    @property
    def total_epsilon(self) -> Decimal:
        """``count × ε`` of a pure event, exactly."""
        if self.epsilon is None:
            raise ConfigError("a Gaussian event has no ε of its own", field="epsilon")
        return self.count * self.epsilon

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form; ε and δ as decimal strings (exact), δ only when there is one."""
        out = {
            "mechanism": self.mechanism,
            "name": self.name,
            "noise": self.noise,
            "scale": self.scale,
            "sensitivity": self.sensitivity,
            "norm": self.norm,
            "dimension": self.dimension,
            "partition": self.partition,
            "count": self.count,
            "epsilon": None if self.epsilon is None else str(self.epsilon),
        }
        if self.delta is not None:
            out["delta"] = str(self.delta)
        if self.split is not None:
            out["split"], out["side"] = self.split, self.side
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PrivacyEvent:
        """The inverse of :meth:`to_dict`; unknown keys are refused (they hide typos)."""
        if not isinstance(data, Mapping):
            raise ConfigError("an event must be an object", field="event")
        unknown = sorted(set(data) - _FIELDS)
        if unknown:
            raise ConfigError(f"unknown field(s) {', '.join(unknown)}", field="event")
        missing = sorted(_REQUIRED - set(data))
        if missing:
            raise ConfigError(f"missing field(s) {', '.join(missing)}", field="event")
        return cls(**dict(data))


_FIELDS = frozenset(PrivacyEvent.__dataclass_fields__)
_REQUIRED = frozenset(("mechanism", "noise", "scale", "sensitivity", "norm", "dimension"))


def _is_integer(value: float) -> bool:
    return abs(value - round(value)) <= 1e-9 * max(1.0, abs(value))


@dataclass(frozen=True)
class ParallelGroup:
    """The events of one mechanism on disjoint partitions.

    One unit lies in one partition, so a neighbouring dataset changes the input of one
    partition's releases only: the group costs what its worst partition costs (the
    partition's own events compose sequentially).
    """

    mechanism: str
    partitions: tuple[tuple[str, tuple[PrivacyEvent, ...]], ...]  # sorted by partition


@dataclass(frozen=True)
class CompositionPlan:
    """Which events compose sequentially and which in parallel (module docstring)."""

    sequential: tuple[PrivacyEvent, ...]  # events on the whole dataset
    parallel: tuple[ParallelGroup, ...]  # one group per partitioned mechanism

    @property
    def events(self) -> tuple[PrivacyEvent, ...]:
        inner = (e for g in self.parallel for _, events in g.partitions for e in events)
        return (*self.sequential, *inner)

    def pure_epsilon(self) -> Fraction:
        """Exact ε of the events' own ε: sequential sum, plus each group's worst partition sum.

        Only meaningful when every event has an ε (a pure noise); Gaussian events are
        skipped, and so are the δ the events spend outright.
        """
        return self._worst(lambda e: Fraction(e.total_epsilon) if e.epsilon is not None else 0)

    def added_delta(self) -> Fraction:
        """Exact δ spent outright (``delta`` fields): sequential sum, plus each group's
        worst partition sum (a bound: the accountant pairs ε and δ per partition)."""
        return self._worst(lambda e: Fraction(e.total_delta))

    def _worst(self, cost: Callable[[PrivacyEvent], Fraction | int]) -> Fraction:
        total = sum((Fraction(cost(e)) for e in self.sequential), Fraction())
        for group in self.parallel:
            total += max(
                sum((Fraction(cost(e)) for e in events), Fraction())
                for _, events in group.partitions
            )
        return total


def plan_composition(events: Iterable[PrivacyEvent]) -> CompositionPlan:
    """Split events into whole-dataset ones and per-mechanism parallel groups.

    >>> kde = dict(mechanism="kde", noise="laplace", scale=2.0, sensitivity=1.0, norm="l1",
    ...            dimension=8, epsilon="0.5")
    >>> plan = plan_composition([PrivacyEvent(partition="a", **kde),
    ...                          PrivacyEvent(partition="b", **kde, count=3)])
    >>> [(p, len(ev)) for p, ev in plan.parallel[0].partitions], plan.pure_epsilon()
    ([('a', 1), ('b', 1)], Fraction(3, 2))
    """
    sequential: list[PrivacyEvent] = []
    grouped: dict[str, dict[str, list[PrivacyEvent]]] = defaultdict(lambda: defaultdict(list))
    for event in events:
        if not isinstance(event, PrivacyEvent):
            raise ConfigError("not a PrivacyEvent", field="events")
        if event.partition is None:
            sequential.append(event)
        else:
            grouped[event.mechanism][event.partition].append(event)
    parallel = tuple(
        ParallelGroup(
            mechanism=mechanism,
            partitions=tuple((p, tuple(evs)) for p, evs in sorted(parts.items())),
        )
        for mechanism, parts in sorted(grouped.items())
    )
    return CompositionPlan(sequential=tuple(sequential), parallel=parallel)
