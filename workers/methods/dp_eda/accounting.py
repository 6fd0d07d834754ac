"""What a DP-EDA run releases and what it costs (dp-eda.md §5, §9 Q1–Q3).

Releases: per class and iteration t = 1 … T, one LimitedDomain selection of up to k
parents (OpenDP Gumbel top-k on K + 1 scores). A unit votes in one class only, so the
classes compose in parallel (``partition`` = the class); the T iterations compose
sequentially. All T·(classes) events are planned from the public parameters before
any private read; a run that stops early still records (commits) every one of them.

Calibration. δ is split: ``ld_delta_share``·δ pays the T domain restrictions
(δ_LD = share·δ/T per call), the rest, δ_acc = (1 − share)·δ, is the δ at which the
shared accountant (:func:`workers.privacy.accountant.compose`, dp-accounting) composes
the pure Gumbel events. ε_s (per peel) is the largest value, found by bisection on the
accountant's answer, with ε_acc(δ_acc) ≤ ε. The run is then (ε, δ)-DP: the Gumbel peels
are pure, so the composition of T generic (ε₀, δ_LD) mechanisms is at most the pure
composition at δ_acc plus T·δ_LD (dp-eda.md §9 Q1 (c)).

Caveat: a :class:`~workers.privacy.events.PrivacyEvent` has no δ field, so the ledger
sees the pure part only; ``domain_delta`` in :class:`Plan` (and the manifest) carries
T·δ_LD, to be added to whatever δ the ledger composes at.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from workers.errors import ConfigError
from workers.methods.common import check_label_set
from workers.methods.dp_eda.limited_domain import FACTOR, Calibration
from workers.methods.dp_eda.params import DPEDAParams
from workers.privacy.accountant import compose
from workers.privacy.events import PrivacyEvent
from workers.privacy.noise import release_event

MECHANISM = "dp-eda-limited-domain"
_BISECTIONS = 60


def selection_name(iteration: int) -> str:
    return f"limited-domain[t={iteration}]"


@dataclass(frozen=True)
class Plan:
    """The calibration of every call and the events of the run, from public inputs."""

    calibration: Calibration
    accountant_delta: float  # δ_acc, where the pure events are composed
    domain_delta: float  # T·δ_LD, added on top
    events: tuple[PrivacyEvent, ...]

    def event(self, iteration: int, label: str) -> PrivacyEvent:
        name = selection_name(iteration)
        for event in self.events:
            if event.name == name and event.partition == label:
                return event
        raise ConfigError(f"no selection planned for iteration {iteration}", field="iterations")

    @property
    def total_delta(self) -> float:
        return self.accountant_delta + self.domain_delta


def selection_event(calibration: Calibration, iteration: int, label: str) -> PrivacyEvent:
    """The event of one LimitedDomain call, with the ε OpenDP's map certifies."""
    return release_event(
        mechanism=MECHANISM,
        noise="gumbel_top_k",
        scale=calibration.scale,
        sensitivity=1.0,
        dimension=calibration.domain + 1,
        partition=label,
        name=selection_name(iteration),
        k=calibration.parents,
        monotonic=calibration.monotonic,
    )


def plan_dp_eda(params: DPEDAParams, label_set: Sequence[str]) -> list[PrivacyEvent]:
    """Every event the run records, computed from public inputs only."""
    return list(noise_plan(params, label_set).events)


def noise_plan(params: DPEDAParams, label_set: Sequence[str]) -> Plan:
    return _noise_plan(params, check_label_set(label_set))


def _events(params: DPEDAParams, labels: tuple[str, ...], cal: Calibration) -> list[PrivacyEvent]:
    return [
        selection_event(cal, t, label) for t in range(1, params.iterations + 1) for label in labels
    ]


@lru_cache(maxsize=32)
def _noise_plan(params: DPEDAParams, labels: tuple[str, ...]) -> Plan:
    domain_delta = params.delta * params.ld_delta_share
    accountant_delta = params.delta - domain_delta
    per_call = domain_delta / params.iterations

    def calibration(epsilon_s: float) -> Calibration:
        return Calibration(
            epsilon=epsilon_s,
            delta=per_call,
            adjacency=params.adjacency,
            domain=params.domain,
            parents=params.parents,
        )

    def spent(epsilon_s: float) -> float:
        return float(
            compose(_events(params, labels, calibration(epsilon_s))).epsilon(accountant_delta)
        )

    # ε_s·T·k ≤ ε always fits (basic composition); the accountant may allow more
    low = params.epsilon / (params.iterations * params.parents) * (1 - 1e-9)
    high = params.epsilon
    if spent(low) > params.epsilon:
        low /= 1.001  # OpenDP's rounding of ε up by an ulp or two
    for _ in range(_BISECTIONS):
        middle = math.sqrt(low * high)
        if spent(middle) <= params.epsilon:
            low = middle
        else:
            high = middle
    cal = calibration(low)
    events = _events(params, labels, cal)
    if float(compose(events).epsilon(accountant_delta)) > params.epsilon:
        raise ConfigError("calibration overshoots the target ε", field="epsilon")
    assert cal.scale == FACTOR[params.adjacency] / low
    return Plan(
        calibration=cal,
        accountant_delta=accountant_delta,
        domain_delta=domain_delta,
        events=tuple(events),
    )
