"""The one accountant: privacy events in, (ε, δ) out, with the name of what computed it.

Two regimes, chosen by the events alone:

* **exact-sum** — every event has an ε of its own (Laplace, discrete Laplace, Gumbel
  top-k, exponential). ε is the exact sum (:class:`fractions.Fraction` arithmetic on the
  events' decimal ε: 10,000 spends of 0.0001 make exactly 1), parallel groups charged at
  their worst partition; δ = 0, or the δ the events spend outright (below). The saving
  advanced composition could give many pure events at δ > 0 is not taken: a pure ledger
  reads as the sum its owner can check.
* **pld(dp-accounting x.y)** — at least one Gaussian event. Google's ``dp-accounting``
  privacy loss distributions (PLD), pessimistic estimate, value discretization 1e-4,
  add/remove adjacency. Continuous Gaussian events are merged first into one Gaussian
  of sensitivity μ = √Σ count·(Δ₂/σ)² (Gaussians compose exactly so: Dong, Roth & Su,
  GDP, Cor. 3.3), whose curve the library gives in closed form (``GaussianPrivacyLoss``,
  ``get_epsilon_gaussian``: what its PLD discretizes, to 3e-8 in ε below, and fast at
  any μ); discrete Gaussian events use the library's discrete Gaussian PLD
  (a vector one as its coordinates' 1-D PLDs composed, see ``events.py``), pure events
  the library's pessimistic PLD of an ε-DP mechanism (randomized response, valid for any
  ε-DP mechanism). ε at δ is the smaller of two valid bounds: the PLD of everything, and
  the exact pure sum plus the Gaussian part (the second wins when many pure events each
  pay a discretization step; the first is skipped when μ > 3, where its PLD gets slow).

Parallel composition (``events.plan_composition``): for each choice of one partition per
parallel group the sequential events and the chosen partitions are composed, and the
figure is the worst choice. Identical partitions are evaluated once and a partition whose
events are a sub-multiset of another's is dropped (it cannot be worse).

δ spent outright (an event's ``delta``, ``events.py``): such an event's privacy loss
distribution is the described one's with mass δ at +∞. Composing, the mass at +∞ of the
whole is 1 − Π(1 − δ_i) ≤ Σ δ_i and the rest is the composition of the described
mechanisms, so the whole meets (ε, Σ δ_i + δ_rest(ε)): **ε at a target δ is the ε of the
events without their δ at δ − Σ δ_i** (and δ at ε is Σ δ_i plus the rest's δ). The sum
runs over the events of each choice of partitions above, so a parallel group adds its
worst partition's δ. When the δ's reach the target no finite ε holds below it: with
Σ δ_i > δ the answer is ``Infinity``; with Σ δ_i = δ exactly it is the pure sum when no
Gaussian event is composed (a pure part spends no δ), ``Infinity`` otherwise.

Why PLD and not RDP (measured with dp-accounting 0.6.0, T = 10 Gaussian releases, Δ₂ = 1,
δ = 1/(N ln N), the Aug-PE settings of ``aug-pe.md`` §3):

=========  ======  ===================  =================  ==========  ==========
N          σ       exact GDP ε          PLD ε (1e-4)       RDP ε       RDP excess
=========  ======  ===================  =================  ==========  ==========
75,316     13.26   0.999232005          0.999232026        1.0781      +7.9 %
8,396      11.60   0.999985550          0.999985559        1.0943      +9.4 %
1,939,290  15.34   1.004455372          1.004455403        1.0688      +6.4 %
=========  ======  ===================  =================  ==========  ==========

PLD reproduces the exact curve to 3e-8 in ε; RDP overstates ε by 6–9 % (so a calibrated
σ would be ~7 % larger for nothing). With a pure part: one ε = 1 release plus ten
Gaussians of σ = 5 at δ = 1e-6 cost 3.879 (PLD), 3.922 (exact sum + PLD Gaussian) and
4.047 (RDP with a Laplace event). A merged-Gaussian PLD builds in ~0.09 s, composing 30
distinct pure events with it in ~0.2 s.

Splits (``events.py``, "Splits"): a job that holds out a slice of the units releases its
generation from one side of a keyed split and its evaluation from the other. A unit lies
on one side of each split, so the events it can meet are the untagged ones and one side's
per split: the figure is the worst over every choice of sides (2^splits choices, each
composed as above; beyond MAX_SPLIT_CHOICES the sides compose sequentially, an upper
bound). So a job whose evaluation costs no more than its generation is charged what the
generation alone costs: the two act on disjoint units and compose in parallel.

Sets of jobs: a dataset's ledger is the union of its jobs' events
(:func:`compose_jobs`): one composition, so parallel groups of the same mechanism
across jobs share their partitions (class ``a`` of job 1 and of job 2 compose
sequentially, classes in parallel). An organisation's datasets are composed
**sequentially** by default (:func:`compose_datasets` with ``disjoint=False``): one
patient can have notes in several datasets of one hospital (a radiology upload and a
discharge-letter upload), and the service cannot verify otherwise. Only when the owner
attests that the datasets hold disjoint units may they compose in parallel (the worst
dataset, ``disjoint=True``).

>>> e = PrivacyEvent(mechanism="counts", noise="laplace", scale=1e4, sensitivity=1.0,
...                  norm="l1", dimension=3, epsilon="0.0001", count=10_000)
>>> c = compose([e])
>>> c.name, c.epsilon(0)
('exact-sum', Decimal('1'))
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from decimal import ROUND_CEILING, Decimal
from fractions import Fraction
from functools import cached_property, lru_cache
from importlib.metadata import version
from itertools import product
from typing import Any, TypeAlias

import dp_accounting
from dp_accounting.pld import common as pld_common
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.pld.privacy_loss_mechanism import GaussianPrivacyLoss

from workers.errors import ConfigError
from workers.privacy.events import (
    SIDES,
    CompositionPlan,
    PrivacyEvent,
    exact_decimal,
    plan_composition,
)

DISCRETIZATION = 1e-4  # PLD value discretization interval (privacy-loss units)
EXACT_SUM = "exact-sum"
PLD_NAME = f"pld(dp-accounting {version('dp-accounting')})"
# A PLD ε is rounded up to this quantum when it becomes a Decimal figure.
EPSILON_QUANTUM = Decimal("1e-9")
# The whole-composition PLD is skipped when the merged Gaussian is stronger than this
# (its PLD builds in ~1 s at μ = 3 and grows with μ); the sum bound stays valid.
FULL_PLD_MU_LIMIT = 3.0
# dp-accounting's closed-form Gaussian ε is a root found to 1e-12: margin above it.
GAUSSIAN_TOL = 1e-9
MAX_CHOICES = 256  # partition choices evaluated before a group is composed sequentially
MAX_SPLIT_CHOICES = 64  # side choices (2^splits) evaluated before splits compose sequentially
INFINITY = Decimal("Infinity")

PLD: TypeAlias = Any  # dp_accounting.pld.privacy_loss_distribution.PrivacyLossDistribution


# ------------------------------------------------------------------ number helpers


def _float_up(value: Decimal | Fraction) -> float:
    """The smallest float ≥ value."""
    f = float(value)
    return f if Fraction(f) >= Fraction(value) else math.nextafter(f, math.inf)


def _to_decimal(value: Fraction) -> Decimal:
    """An exact Decimal for a fraction whose denominator is 2^a·5^b (a sum of decimals)."""
    den, twos, fives = value.denominator, 0, 0
    while den % 2 == 0:
        den, twos = den // 2, twos + 1
    while den % 5 == 0:
        den, fives = den // 5, fives + 1
    if den != 1:  # cannot happen for sums of decimals; stay conservative anyway
        return Decimal(_float_up(value)).quantize(EPSILON_QUANTUM, rounding=ROUND_CEILING)
    k = max(twos, fives)
    scaled = value * 10**k
    return _plain(Decimal(scaled.numerator // scaled.denominator).scaleb(-k))


def _plain(value: Decimal) -> Decimal:
    """Drop trailing zeros without switching to exponent notation."""
    if value == value.to_integral_value():
        return value.quantize(Decimal(1))
    return value.normalize()


def _pld_epsilon(value: float) -> Decimal:
    if math.isinf(value):
        return INFINITY
    return _plain(Decimal(value).quantize(EPSILON_QUANTUM, rounding=ROUND_CEILING))


def _check_delta(delta: float | Decimal | str) -> float:
    try:
        value = float(delta)
    except (TypeError, ValueError):
        raise ConfigError("must be a number", field="delta") from None
    if isinstance(delta, bool) or not (0 <= value < 1):
        raise ConfigError(f"must be in [0, 1) (got {delta})", field="delta")
    return value


def _float_down(value: Fraction) -> float:
    """The largest float ≤ value (a δ left for the rest: never rounded up)."""
    f = float(value)
    return f if Fraction(f) <= value else math.nextafter(f, -math.inf)


def _exact_delta(delta: float | Decimal | str) -> Fraction:
    """A checked δ exactly as given: a decimal string or ``Decimal`` (a ledger's cap) is
    not rounded to a float before the δ spent outright are taken off it."""
    if isinstance(delta, (Decimal, str)):
        return Fraction(Decimal(str(delta).strip()))
    return Fraction(delta)


def _remaining_delta(delta: float, exact: Fraction, spent: Fraction) -> float | None:
    """δ less the δ spent outright, rounded down; None when ``spent`` exceeds it.

    ``delta`` is the target as a float, ``exact`` the same target exactly.
    """
    if not spent:
        return delta
    rest = exact - spent
    return None if rest < 0 else _float_down(rest)


# ------------------------------------------------------------------ PLD building blocks


# The caches hold privacy loss distributions, whose size grows as the noise shrinks (a
# discrete Gaussian at ε near 100 takes hundreds of MB): a few entries keep a ledger's
# repeated figures fast without letting a calibration's many trial σ pile up in memory.
PLD_CACHE = 4


@lru_cache(maxsize=PLD_CACHE)
def _pure_pld(epsilon: float, times: int) -> PLD:
    params = pld_common.DifferentialPrivacyParameters(epsilon, 0.0)
    pld = pld_lib.from_privacy_parameters(params, value_discretization_interval=DISCRETIZATION)
    return pld if times == 1 else pld.self_compose(times)


@lru_cache(maxsize=PLD_CACHE)
def _gaussian_pld(mu: float) -> PLD:
    return pld_lib.from_gaussian_mechanism(
        1.0, sensitivity=mu, value_discretization_interval=DISCRETIZATION
    )


@lru_cache(maxsize=PLD_CACHE)
def _discrete_gaussian_pld(sigma: float, sensitivity: int, times: int) -> PLD:
    pld = pld_lib.from_discrete_gaussian_mechanism(
        sigma, sensitivity=sensitivity, value_discretization_interval=DISCRETIZATION
    )
    return pld if times == 1 else pld.self_compose(times)


def _compose_all(plds: Sequence[PLD]) -> PLD | None:
    out: PLD | None = None
    for pld in plds:
        out = pld if out is None else out.compose(pld)
    return out


# ------------------------------------------------------------------ signatures


@dataclass(frozen=True)
class _Signature:
    """What a set of events costs, up to order: the accountant's view of them."""

    pure: tuple[tuple[Decimal, int], ...] = ()  # (ε of one release, how many), sorted
    mu_squared: float = 0.0  # Σ count·(Δ₂/σ)² of the continuous Gaussian events
    discrete: tuple[tuple[float, int, int], ...] = ()  # (σ, 1-D sensitivity, how many)
    added_delta: Fraction = Fraction(0)  # Σ count·δ spent outright (module docstring)

    @classmethod
    def of(cls, events: Iterable[PrivacyEvent]) -> _Signature:
        pure: Counter[Decimal] = Counter()
        discrete: Counter[tuple[float, int]] = Counter()
        mu_terms: list[float] = []
        added = Fraction(0)
        for e in events:
            added += Fraction(e.total_delta)
            if e.epsilon is not None:
                pure[e.epsilon] += e.count
            elif e.noise == "gaussian":
                mu_terms.append(e.count * (e.sensitivity / e.scale) ** 2)
            elif e.dimension == 1:
                discrete[(e.scale, round(e.sensitivity))] += e.count
            else:  # a count vector moving round(Δ₂²) coordinates by at most 1
                discrete[(e.scale, 1)] += e.count * round(e.sensitivity**2)
        return cls(
            pure=tuple(sorted(pure.items())),
            mu_squared=math.fsum(mu_terms),
            discrete=tuple(sorted((s, d, n) for (s, d), n in discrete.items())),
            added_delta=added,
        )

    def __add__(self, other: _Signature) -> _Signature:
        pure = Counter(dict(self.pure))
        pure.update(dict(other.pure))
        discrete: Counter[tuple[float, int]] = Counter({(s, d): n for s, d, n in self.discrete})
        discrete.update({(s, d): n for s, d, n in other.discrete})
        return _Signature(
            pure=tuple(sorted(pure.items())),
            mu_squared=self.mu_squared + other.mu_squared,
            discrete=tuple(sorted((s, d, n) for (s, d), n in discrete.items())),
            added_delta=self.added_delta + other.added_delta,
        )

    def within(self, other: _Signature) -> bool:
        """Whether these events are a sub-multiset of ``other``'s (so never costlier)."""
        mine, theirs = dict(self.pure), dict(other.pure)
        d_mine = {(s, d): n for s, d, n in self.discrete}
        d_theirs = {(s, d): n for s, d, n in other.discrete}
        return (
            all(theirs.get(k, 0) >= n for k, n in mine.items())
            and all(d_theirs.get(k, 0) >= n for k, n in d_mine.items())
            and self.mu_squared <= other.mu_squared
            and self.added_delta <= other.added_delta
        )

    @property
    def pure_sum(self) -> Fraction:
        return sum((Fraction(eps) * n for eps, n in self.pure), Fraction())

    @property
    def has_gaussian(self) -> bool:
        return self.mu_squared > 0 or bool(self.discrete)

    @property
    def mu(self) -> float:
        return math.sqrt(self.mu_squared)

    @property
    def core(self) -> _Signature:
        """The same events without the δ they spend outright (what the PLDs are of)."""
        return replace(self, added_delta=Fraction(0)) if self.added_delta else self

    def gaussian_epsilon(self, delta: float) -> float:
        """ε at δ of the Gaussian part alone."""
        if not self.discrete:  # one Gaussian of sensitivity μ: its exact curve
            return float(dp_accounting.get_epsilon_gaussian(1 / self.mu, delta)) + GAUSSIAN_TOL
        return float(self._discrete_pld().get_epsilon_for_delta(delta))

    def gaussian_delta(self, epsilon: float) -> float:
        """δ at ε of the Gaussian part alone."""
        if not self.discrete:
            return float(
                GaussianPrivacyLoss(1.0, sensitivity=self.mu).get_delta_for_epsilon(epsilon)
            )
        return float(self._discrete_pld().get_delta_for_epsilon(epsilon))

    def _discrete_pld(self) -> PLD:
        pld = _plds(self.core)[0]
        assert pld is not None  # built whenever there are discrete Gaussians
        return pld

    @property
    def full_pld(self) -> PLD | None:
        return _plds(self.core)[1]

    def epsilon(self, target: float, exact: Fraction) -> Decimal:
        """ε at ``target`` (``exact``: the same δ exactly): the rest's ε at the target
        less the δ spent outright (module docstring)."""
        delta = _remaining_delta(target, exact, self.added_delta)
        if delta is None:  # the δ spent outright exceed the target
            return INFINITY
        pure = self.pure_sum
        if not self.has_gaussian:
            return _to_decimal(pure)
        if delta == 0:
            return INFINITY
        gaussian = _pld_epsilon(self.gaussian_epsilon(delta))
        split = INFINITY
        if not gaussian.is_infinite():  # exact sum, then rounded up
            split = _plain(
                _to_decimal(pure + Fraction(gaussian)).quantize(
                    EPSILON_QUANTUM, rounding=ROUND_CEILING
                )
            )
        if self.full_pld is None:
            return split
        return min(split, _pld_epsilon(self.full_pld.get_epsilon_for_delta(delta)))

    def delta(self, epsilon: Fraction) -> float:
        """δ at ``epsilon``: the rest's δ plus the δ spent outright (at most 1)."""
        rest = self._rest_delta(epsilon)
        if not self.added_delta:
            return rest
        return min(1.0, math.nextafter(rest + _float_up(self.added_delta), math.inf))

    def _rest_delta(self, epsilon: Fraction) -> float:
        pure = self.pure_sum
        if not self.has_gaussian:
            if epsilon >= pure:
                return 0.0
            full = self.full_pld
            return 1.0 if full is None else float(full.get_delta_for_epsilon(float(epsilon)))
        bounds = [1.0]
        if epsilon >= pure:
            bounds.append(self.gaussian_delta(float(epsilon - pure)))
        if self.full_pld is not None:
            bounds.append(float(self.full_pld.get_delta_for_epsilon(float(epsilon))))
        return min(bounds)


@lru_cache(maxsize=PLD_CACHE)
def _plds(signature: _Signature) -> tuple[PLD | None, PLD | None]:
    """PLDs of a signature's Gaussian part and of all of it (cached across ledgers).

    The Gaussian part's PLD is built only when it holds discrete Gaussians (a lone
    Gaussian has an exact closed form); the whole is built only when it has pure events
    beside Gaussian ones and μ ≤ FULL_PLD_MU_LIMIT, where it builds in about a second —
    beyond that the sum bound (pure + Gaussian) is used alone.
    """
    gaussian_pld = None
    if signature.discrete:
        parts = [_gaussian_pld(signature.mu)] if signature.mu_squared else []
        parts += [_discrete_gaussian_pld(s, d, n) for s, d, n in signature.discrete]
        gaussian_pld = _compose_all(parts)
    if not signature.pure or signature.mu > FULL_PLD_MU_LIMIT:
        return gaussian_pld, None
    parts = [_pure_pld(_float_up(eps), n) for eps, n in signature.pure]
    if gaussian_pld is not None:
        parts.append(gaussian_pld)
    elif signature.mu_squared:
        parts.append(_gaussian_pld(signature.mu))
    return gaussian_pld, _compose_all(parts)


def _choices(plan: CompositionPlan) -> tuple[_Signature, ...]:
    """One signature per choice of a partition in every parallel group (module docstring)."""
    base = _Signature.of(plan.sequential)
    options: list[list[_Signature]] = []
    for group in plan.parallel:
        distinct = list(dict.fromkeys(_Signature.of(events) for _, events in group.partitions))
        kept = [
            s
            for i, s in enumerate(distinct)
            if not any(j != i and s.within(o) and s != o for j, o in enumerate(distinct))
        ]
        options.append(kept)
    # Too many combinations: compose the groups with the most options sequentially.
    while math.prod(len(o) for o in options) > MAX_CHOICES:
        widest = max(range(len(options)), key=lambda i: len(options[i]))
        merged = options[widest][0]
        for s in options[widest][1:]:
            merged = merged + s
        options[widest] = [merged]
    out = []
    for combo in product(*options):
        total = base
        for s in combo:
            total = total + s
        out.append(total)
    return tuple(dict.fromkeys(out))


def _side_choices(events: tuple[PrivacyEvent, ...]) -> tuple[tuple[PrivacyEvent, ...], ...]:
    """The events a unit can meet, one tuple per choice of a side in every split (module
    docstring, "Splits"): the untagged events and the chosen sides' events. Beyond
    MAX_SPLIT_CHOICES choices every split's two sides compose sequentially (all events):
    never less than any choice, so still an upper bound."""
    splits = sorted({e.split for e in events if e.split is not None})
    if not splits or len(SIDES) ** len(splits) > MAX_SPLIT_CHOICES:
        return (events,)
    out = []
    for sides in product(SIDES, repeat=len(splits)):
        chosen = dict(zip(splits, sides, strict=True))
        out.append(tuple(e for e in events if e.split is None or chosen[e.split] == e.side))
    return tuple(out)


# ------------------------------------------------------------------ public API


class Guarantee(ABC):
    """An (ε, δ) curve with the name of the accountant that produced it."""

    @property
    @abstractmethod
    def name(self) -> str: ...

    @property
    @abstractmethod
    def events(self) -> tuple[PrivacyEvent, ...]: ...

    @abstractmethod
    def epsilon(self, delta: float | Decimal | str = 0.0) -> Decimal:
        """The smallest ε (rounded up to 1e-9) the events satisfy at ``delta``.

        ``Decimal("Infinity")`` when no finite ε holds: Gaussian events at δ = 0, or a
        ``delta`` below what the events spend outright (module docstring).
        """

    @abstractmethod
    def delta(self, epsilon: float | Decimal | str | int) -> float:
        """The δ the events satisfy at ``epsilon``."""

    def to_dict(self, *, delta: float | Decimal | str) -> dict[str, Any]:
        """The privacy block of a ledger entry or manifest (JSON-safe)."""
        eps = self.epsilon(delta)
        return {
            "accountant": self.name,
            "epsilon": None if eps.is_infinite() else str(eps),
            "delta": str(delta) if isinstance(delta, (Decimal, str)) else delta,
            "events": [e.to_dict() for e in self.events],
        }


class Composition(Guarantee):
    """Sequential composition of events, with their parallel groups (module docstring)."""

    def __init__(self, events: Iterable[PrivacyEvent]) -> None:
        listed = tuple(events)
        self.plan = plan_composition(listed)
        # one plan per choice of a side in every split (module docstring, "Splits")
        self.plans = tuple(plan_composition(kept) for kept in _side_choices(listed))

    @property
    def events(self) -> tuple[PrivacyEvent, ...]:
        return self.plan.events

    @property
    def is_pure(self) -> bool:
        """Whether the events are pure ε-DP together (δ = 0 at their ε)."""
        return all(e.is_pure for e in self.events)

    @property
    def spends_delta(self) -> Fraction:
        """The δ the events spend outright (``delta`` fields), exactly: the sequential sum
        plus each parallel group's worst partition, the most any choice of partitions
        takes off a target δ. Below it no finite ε holds."""
        return max(p.added_delta() for p in self.plans)

    @property
    def name(self) -> str:
        return EXACT_SUM if all(e.epsilon is not None for e in self.events) else PLD_NAME

    @cached_property
    def _choices(self) -> tuple[_Signature, ...]:
        found = (s for plan in self.plans for s in _choices(plan))
        return tuple(dict.fromkeys(found))

    def epsilon(self, delta: float | Decimal | str = 0.0) -> Decimal:
        d = _check_delta(delta)
        if self.is_pure:
            return _to_decimal(max(p.pure_epsilon() for p in self.plans))
        exact = _exact_delta(delta)
        return max(s.epsilon(d, exact) for s in self._choices)

    def delta(self, epsilon: float | Decimal | str | int) -> float:
        eps = Fraction(_check_epsilon(epsilon))
        return max((s.delta(eps) for s in self._choices), default=0.0)


class WorstOf(Guarantee):
    """Parallel composition of guarantees on disjoint data: the worst one."""

    def __init__(self, parts: Iterable[Guarantee]) -> None:
        self.parts = tuple(parts)

    @property
    def events(self) -> tuple[PrivacyEvent, ...]:
        return tuple(e for p in self.parts for e in p.events)

    @property
    def name(self) -> str:
        names = {p.name for p in self.parts}
        return PLD_NAME if PLD_NAME in names else EXACT_SUM

    def epsilon(self, delta: float | Decimal | str = 0.0) -> Decimal:
        _check_delta(delta)
        return max((p.epsilon(delta) for p in self.parts), default=Decimal(0))

    def delta(self, epsilon: float | Decimal | str | int) -> float:
        return max((p.delta(epsilon) for p in self.parts), default=0.0)


def _check_epsilon(epsilon: float | Decimal | str | int) -> Decimal:
    """ε ≥ 0 as an exact Decimal (0 is allowed here: δ at ε = 0)."""
    if (
        not isinstance(epsilon, bool)
        and isinstance(epsilon, (int, float, Decimal))
        and epsilon == 0
    ):
        return Decimal(0)
    return exact_decimal(epsilon)


def compose(events: Iterable[PrivacyEvent]) -> Composition:
    """Compose events: sequentially, and in parallel across the partitions of a mechanism."""
    return Composition(events)


def compose_jobs(jobs: Iterable[Iterable[PrivacyEvent]]) -> Composition:
    """A dataset's ledger: the union of its jobs' events, composed as one."""
    return Composition(e for job in jobs for e in job)


def compose_datasets(datasets: Iterable[Iterable[PrivacyEvent]], *, disjoint: bool) -> Guarantee:
    """An organisation's spend over its datasets (module docstring for the choice).

    ``disjoint=False`` (the safe default a caller must state): one sequential
    composition of every event. ``disjoint=True``: the owner attests that no unit is in
    two datasets, so the worst dataset's composition is the spend.
    """
    if disjoint:
        return WorstOf(Composition(events) for events in datasets)
    return Composition(e for events in datasets for e in events)


def epsilon_by_mechanism(events: Iterable[PrivacyEvent], delta: float) -> dict[str, float]:
    """Each mechanism's releases composed alone, at ``delta`` (for display: a job's figure
    is the composition of all of them)."""
    by: dict[str, list[PrivacyEvent]] = {}
    for event in events:
        by.setdefault(event.mechanism, []).append(event)
    return {name: float(compose(group).epsilon(delta)) for name, group in by.items()}
