""" "Give ε, we compute the noise": noise scales from a target (ε, δ).

Tools answering with what the accountant (``accountant.py``) certifies:

* :func:`analytic_gaussian_sigma` — the analytic Gaussian mechanism (Balle & Wang,
  "Improving the Gaussian Mechanism for Differential Privacy", ICML 2018, Thm. 8 and
  Alg. 1): the smallest σ for which one Gaussian release of L2 sensitivity Δ₂ is
  (ε, δ)-DP, computed by ``dp_accounting.get_sigma_gaussian`` on the exact δ(ε) curve.
* :func:`calibrate_noise_multiplier` / :func:`gaussian_noise_multiplier` — the noise
  multiplier z (σ = z·Δ₂) that makes a whole set of Gaussian releases, composed with any
  fixed events, meet (ε, δ); :func:`calibrate_scales`, each release's σ from it. Found
  by bisection on the accountant's ε — no hand formula — so whatever the accountant
  composes (parallel classes, pure events beside) is respected. Private Evolution's
  published multipliers (Aug-PE README, T = 10, δ = 1/(N ln N): 13.26 for N = 75,316
  and 11.60 for N = 8,396 at ε = 1) come out of :func:`gaussian_noise_multiplier` to
  four digits.
* :func:`split_budget` — one total (ε, δ) shared among a job's mechanisms.
* :func:`gaussian_sigma_for_rho` — σ for a budget stated in zCDP's ρ.

The split rule (:func:`split_budget`). Each mechanism has a ``share`` (a positive
weight, 1 by default). With S the sum of all shares:

1. a pure-ε mechanism (Laplace, discrete Laplace, Gumbel top-k, exponential) gets
   ε·share/S, exactly (decimal arithmetic rounded down at 1e-12, so the pure parts
   never add up to more than their part of ε), spread evenly over its ``count``
   releases: scale = sensitivity·count / ε_share;
2. the Gaussian mechanisms divide what is left by their shares **of μ² (equivalently
   of ρ in zCDP)**, the quantity Gaussians add up exactly under composition: mechanism
   i gets σ_i = z·Δ_i·√(S_G/share_i) (S_G: the Gaussian shares' sum), and one common z
   is found by bisection so that the whole job — pure events included — composes to at
   most (ε, δ). Splitting μ² rather than ε keeps the shares meaningful whatever δ is
   (ε(δ) is not additive over Gaussians, μ² is), and because the accountant composes
   rather than adds, the Gaussian mechanisms receive at least their nominal part.

A mechanism may spend a δ outright (``delta``, e.g. a thresholded selection's chance
of releasing a phrase only one unit holds): its events carry it, and the accountant
takes it off the target δ before composing the rest, so the noise of every mechanism is
calibrated at what remains and the events alone compose to the target (ε, δ).

Pure parts are charged exactly as computed here; a mechanism that records OpenDP's own
map (rounded up by an ulp or so) must be planned with a hair of slack, which the
rounding down of step 1 provides.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from decimal import ROUND_FLOOR, Decimal, localcontext

import dp_accounting

from workers.errors import ConfigError
from workers.privacy.accountant import Composition, compose
from workers.privacy.events import (
    GAUSSIAN_NOISES,
    NOISES,
    PrivacyEvent,
    exact_decimal,
)

SHARE_QUANTUM = Decimal("1e-12")  # pure ε shares are rounded down to this
RELATIVE_TOLERANCE = 1e-6  # bisection stops when the bracket on z is this narrow
# Above it the Gaussian noise is tiny, nothing is gained over Laplace, and the privacy
# loss distributions the bisection builds grow large and slow (ε = 100: ~90 s, GBs):
# a request could hold a worker for minutes. Measured: ε = 10 plans in under 10 s.
GAUSSIAN_EPSILON_CEILING = 10.0


def _check_target(epsilon: float, delta: float) -> tuple[float, float]:
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)):
        raise ConfigError("must be a number", field="epsilon")
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ConfigError(f"must be finite and > 0 (got {epsilon})", field="epsilon")
    if isinstance(delta, bool) or not isinstance(delta, (int, float)):
        raise ConfigError("must be a number", field="delta")
    if not (0 <= delta < 1):
        raise ConfigError(f"must be in [0, 1) (got {delta})", field="delta")
    return float(epsilon), float(delta)


def analytic_gaussian_sigma(*, epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """σ of the analytic Gaussian mechanism (Balle & Wang 2018) for (ε, δ, Δ₂).

    >>> round(analytic_gaussian_sigma(epsilon=1.0, delta=1e-5), 4)
    3.7306
    """
    epsilon, delta = _check_target(epsilon, delta)
    if delta == 0:
        raise ConfigError("the Gaussian mechanism needs δ > 0", field="delta")
    if not (math.isfinite(sensitivity) and sensitivity > 0):
        raise ConfigError("must be finite and > 0", field="sensitivity")
    sigma = float(dp_accounting.get_sigma_gaussian(epsilon, delta))
    # brentq stops within 1e-12 of the root, possibly below it: step up until the exact
    # curve confirms the guarantee.
    while dp_accounting.get_epsilon_gaussian(sigma, delta) > epsilon:
        sigma = math.nextafter(sigma, math.inf) * (1 + 1e-12)
    return sigma * sensitivity


def gaussian_sigma_for_rho(*, rho: float, sensitivity: float = 1.0) -> float:
    """σ of the Gaussian mechanism that is ρ-zCDP: Δ₂/√(2ρ) (Bun & Steinke 2016, Prop. 1.6).

    For budgets stated as ρ (OpenDP's native measure for Gaussian noise). The event it
    yields is accounted like any Gaussian, by (ε, δ).

    >>> gaussian_sigma_for_rho(rho=0.125, sensitivity=1.0)
    2.0
    """
    if isinstance(rho, bool) or not isinstance(rho, (int, float)):
        raise ConfigError("must be a number", field="rho")
    if not (math.isfinite(rho) and rho > 0):
        raise ConfigError(f"must be finite and > 0 (got {rho})", field="rho")
    if not (math.isfinite(sensitivity) and sensitivity > 0):
        raise ConfigError("must be finite and > 0", field="sensitivity")
    sigma = sensitivity / math.sqrt(2 * rho)
    while sensitivity**2 / (2 * sigma**2) > rho:  # rounding: step up until it holds
        sigma = math.nextafter(sigma, math.inf)
    return sigma


@dataclass(frozen=True)
class GaussianRelease:
    """A Gaussian mechanism to calibrate: σ = z·sensitivity·√(total weight / weight)."""

    mechanism: str
    sensitivity: float  # L2, add/remove one unit
    dimension: int = 1
    count: int = 1
    partitions: tuple[str, ...] = ()  # disjoint classes, one release each; () = whole data
    weight: float = 1.0  # share of μ² among the releases calibrated together
    noise: str = "gaussian"  # or "discrete_gaussian"
    delta: float | None = None  # δ each release spends outright (the event's ``delta``)

    def __post_init__(self) -> None:
        if self.noise not in GAUSSIAN_NOISES:
            raise ConfigError(f"must be one of {', '.join(GAUSSIAN_NOISES)}", field="noise")
        if not (math.isfinite(self.weight) and self.weight > 0):
            raise ConfigError("must be finite and > 0", field="share")

    def scale(self, multiplier: float, total_weight: float) -> float:
        return multiplier * self.sensitivity * math.sqrt(total_weight / self.weight)

    def events(self, multiplier: float, total_weight: float) -> list[PrivacyEvent]:
        return _events_of(self, scale=self.scale(multiplier, total_weight), norm="l2")


def _events_of(
    m: GaussianRelease | PlannedMechanism,
    *,
    scale: float,
    norm: str,
    epsilon: Decimal | None = None,
) -> list[PrivacyEvent]:
    """The events of ``m`` drawn at ``scale``: one per partition (one for the whole data
    without partitions), each carrying the δ ``m`` spends outright."""
    delta = None if m.delta is None else exact_decimal(m.delta, field="delta")
    return [
        PrivacyEvent(
            mechanism=m.mechanism,
            noise=m.noise,
            scale=scale,
            sensitivity=m.sensitivity,
            norm=norm,
            dimension=m.dimension,
            partition=partition,
            count=m.count,
            epsilon=epsilon,
            delta=delta,
        )
        for partition in (m.partitions or (None,))
    ]


def _events_at(releases: Sequence[GaussianRelease], multiplier: float) -> list[PrivacyEvent]:
    total = math.fsum(r.weight for r in releases)
    return [e for r in releases for e in r.events(multiplier, total)]


def calibrate_noise_multiplier(
    *,
    epsilon: float,
    delta: float,
    releases: Sequence[GaussianRelease],
    fixed: Iterable[PrivacyEvent] = (),
) -> float:
    """The smallest z (to 1e-6 relative) at which ``releases`` plus ``fixed`` meet (ε, δ).

    Bisection on the accountant's ε, which decreases as z grows; the answer is the upper
    end of the final bracket, so the accountant certifies it.
    """
    epsilon, delta = _check_target(epsilon, delta)
    if epsilon > GAUSSIAN_EPSILON_CEILING:
        raise ConfigError(
            f"Gaussian noise is calibrated for ε up to {GAUSSIAN_EPSILON_CEILING:g} "
            "(use Laplace noise, δ = 0, above it)",
            field="epsilon",
        )
    if not releases:
        raise ConfigError("nothing to calibrate", field="mechanisms")
    if delta == 0:
        raise ConfigError("Gaussian noise needs δ > 0", field="delta")
    fixed = tuple(fixed)
    spent = float(compose(fixed).epsilon(delta)) if fixed else 0.0
    if spent >= epsilon:
        raise ConfigError(
            f"the fixed releases already spend ε = {spent:.6g} of {epsilon:g}", field="epsilon"
        )

    def meets(z: float) -> bool:
        return float(compose([*fixed, *_events_at(releases, z)]).epsilon(delta)) <= epsilon

    # Start from every release composed in sequence under the remaining budget.
    load = math.fsum(r.count * len(r.partitions or (None,)) for r in releases)
    guess = analytic_gaussian_sigma(epsilon=epsilon - spent, delta=delta) * math.sqrt(load)
    low, high = guess / 2, guess
    while not meets(high):
        low, high = high, high * 2
    while meets(low):
        low, high = low / 2, low
    while high / low - 1 > RELATIVE_TOLERANCE:
        middle = math.sqrt(low * high)
        if meets(middle):
            high = middle
        else:
            low = middle
    return high


def calibrate_scales(
    *, epsilon: float, delta: float, releases: Sequence[GaussianRelease]
) -> list[float]:
    """σ of each of ``releases``, calibrated together to (ε, δ): one noise multiplier z
    (:func:`calibrate_noise_multiplier`), each release's σ from its weight's share of μ²."""
    z = calibrate_noise_multiplier(epsilon=epsilon, delta=delta, releases=releases)
    total_weight = sum(r.weight for r in releases)
    return [r.scale(z, total_weight) for r in releases]


def calibrate_with_share(
    main: GaussianRelease, share: GaussianRelease | None, *, epsilon: float, delta: float
) -> tuple[float, float | None]:
    """σ of ``main`` and of ``share``, calibrated together to (ε, δ): ``share`` takes its
    weight of μ² and ``main``'s ``count`` releases the rest, equally; without ``share``
    (None: there is nothing to release beside ``main``), ``main`` takes the whole."""
    if share is None:
        (sigma,) = calibrate_scales(
            epsilon=epsilon, delta=delta, releases=[replace(main, weight=1.0)]
        )
        return sigma, None
    rest = replace(main, weight=(1.0 - share.weight) / main.count)
    sigma, shared = calibrate_scales(epsilon=epsilon, delta=delta, releases=[rest, share])
    return sigma, shared


def check_calibrated(events: Iterable[PrivacyEvent], *, epsilon: float, delta: float) -> None:
    """Refuse ``events`` that compose to more than ε at δ under the accountant (the
    bisection's answer is certified: a calibration bug, never data)."""
    spent = compose(events).epsilon(delta)
    if float(spent) > epsilon:
        raise ConfigError(f"calibration overshoots: ε = {spent}", field="epsilon")


def gaussian_noise_multiplier(*, epsilon: float, delta: float, steps: int) -> float:
    """σ/Δ₂ for ``steps`` Gaussian releases composing to (ε, δ) (Private Evolution's σ).

    Aug-PE's PubMed setting; the README prints the value rounded up to 13.26:

    >>> z = gaussian_noise_multiplier(epsilon=1.0, delta=1 / (75316 * math.log(75316)), steps=10)
    >>> math.ceil(z * 100) / 100
    13.26
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError("must be an integer ≥ 1", field="steps")
    release = GaussianRelease(mechanism="gaussian", sensitivity=1.0, count=steps)
    return calibrate_noise_multiplier(epsilon=epsilon, delta=delta, releases=[release])


# ------------------------------------------------------------------ budget split


@dataclass(frozen=True)
class PlannedMechanism:
    """A mechanism of a job, before its noise is known (see :func:`split_budget`).

    For ``gumbel_top_k``/``exponential``, ``sensitivity`` is the numerator of the ε that
    OpenDP's map reports for the selection (ε = sensitivity/scale: 2·k·Δ∞ for k
    selections on scores of L∞ sensitivity Δ∞, k·Δ∞ when the scores are monotone).
    """

    mechanism: str
    noise: str
    sensitivity: float
    norm: str
    dimension: int
    share: float = 1.0
    count: int = 1
    partitions: tuple[str, ...] = ()
    # δ one release spends outright (the event's ``delta``): the accountant takes it off
    # the target δ, so the rest of the budget is calibrated at what remains.
    delta: float | None = None

    def __post_init__(self) -> None:
        if self.noise not in NOISES:
            raise ConfigError(f"must be one of {', '.join(NOISES)}", field="noise")
        if isinstance(self.share, bool) or not (math.isfinite(self.share) and self.share > 0):
            raise ConfigError("must be finite and > 0", field="share")


@dataclass(frozen=True)
class BudgetSplit:
    """The planned events of a job and what they compose to."""

    events: tuple[PrivacyEvent, ...]
    composition: Composition
    epsilon: Decimal  # composed, at ``delta``
    delta: float

    def scale(self, mechanism: str) -> float:
        """The noise scale planned for ``mechanism``."""
        for event in self.events:
            if event.mechanism == mechanism:
                return event.scale
        raise ConfigError(f"no mechanism named {mechanism!r} in the plan", field="mechanism")


def _pure_events(m: PlannedMechanism, epsilon_share: Decimal) -> list[PrivacyEvent]:
    with localcontext() as ctx:
        ctx.prec = 60
        ctx.rounding = ROUND_FLOOR
        per_release = (epsilon_share / m.count).quantize(SHARE_QUANTUM, rounding=ROUND_FLOOR)
    if per_release <= 0:
        raise ConfigError("the share is too small to give ε > 1e-12", field="share")
    scale = m.sensitivity / float(per_release)
    scale = math.nextafter(scale, math.inf)  # Δ/scale ≤ per-release ε despite rounding
    return _events_of(m, scale=scale, norm=m.norm, epsilon=per_release)


def split_budget(
    *, epsilon: float, delta: float, mechanisms: Sequence[PlannedMechanism]
) -> BudgetSplit:
    """Noise for every mechanism of a job from one total (ε, δ) (module docstring rule)."""
    epsilon, delta = _check_target(epsilon, delta)
    if not mechanisms:
        raise ConfigError("a job needs at least one mechanism", field="mechanisms")
    names = [m.mechanism for m in mechanisms]
    if len(set(names)) != len(names):
        raise ConfigError("mechanism names must be unique within a job", field="mechanism")
    total_share = exact_decimal(math.fsum(m.share for m in mechanisms), field="share")
    target = exact_decimal(epsilon)
    pure: list[PrivacyEvent] = []
    gaussian: list[GaussianRelease] = []
    for m in mechanisms:
        if m.noise in GAUSSIAN_NOISES:
            gaussian.append(
                GaussianRelease(
                    mechanism=m.mechanism,
                    sensitivity=m.sensitivity,
                    dimension=m.dimension,
                    count=m.count,
                    partitions=m.partitions,
                    weight=m.share,
                    noise=m.noise,
                    delta=m.delta,
                )
            )
        else:
            with localcontext() as ctx:
                ctx.prec = 60
                ctx.rounding = ROUND_FLOOR
                share = target * exact_decimal(m.share, field="share") / total_share
            pure.extend(_pure_events(m, share.quantize(SHARE_QUANTUM, rounding=ROUND_FLOOR)))
    events = list(pure)
    if gaussian:
        if delta == 0:
            raise ConfigError("Gaussian mechanisms need δ > 0", field="delta")
        z = calibrate_noise_multiplier(epsilon=epsilon, delta=delta, releases=gaussian, fixed=pure)
        events.extend(_events_at(gaussian, z))
    composition = compose(events)
    achieved = composition.epsilon(delta)
    assert achieved <= target, (achieved, target)  # the accountant certifies the plan
    return BudgetSplit(events=tuple(events), composition=composition, epsilon=achieved, delta=delta)
