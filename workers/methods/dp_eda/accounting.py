"""What a DP-EDA run releases and what it costs (dp-eda.md §5, §9 Q1–Q3).

Releases: per class and iteration t = 1 … T, one LimitedDomain selection of up to k
parents (OpenDP Gumbel top-k on K + 1 scores). A unit votes in one class only, so the
classes compose in parallel (``partition`` = the class); the T iterations compose
sequentially. All T·(classes) events are planned from the public parameters before
any private read; a run that stops early still records (commits) every one of them.

Each event is one call: ``gumbel_top_k`` with the ε OpenDP's map certifies for its k
peels (k·ε_s) and ``delta`` = δ_LD, the δ the restriction to the top K spends outright
(Durfee & Rogers 2019, Thm. 4/5: a call is (k·ε_s, δ_LD)-DP). The accountant takes the
δ's off the target before composing the pure part (``accountant.py``: the classes in
parallel, so T·δ_LD per class), which is dp-eda.md §9 Q1 (c): T (ε₀, δ_LD) mechanisms
are at most the pure composition at δ − T·δ_LD, plus T·δ_LD.

Calibration. δ is split: ``ld_delta_share``·δ pays the T domain restrictions
(δ_LD = share·δ/T per call); the rest, δ − T·δ_LD, is what the accountant is left to
compose the pure Gumbel events at. ε_s (per peel) is the largest value, found by
bisection, for which the accountant's ε of the planned events at the job's δ is at most
ε: the events the ledger reserves and composes (at the cap's δ) are the ones calibrated,
δ_LD included, so the job costs (ε, δ) there as here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from workers.errors import ConfigError
from workers.methods.common import cached_plan
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
    delta: float  # the job's δ, which the events compose at (δ_LD included)
    domain_delta: float  # T·δ_LD: the δ the events spend outright (per class)
    events: tuple[PrivacyEvent, ...]

    def event(self, iteration: int, label: str) -> PrivacyEvent:
        name = selection_name(iteration)
        for event in self.events:
            if event.name == name and event.partition == label:
                return event
        raise ConfigError(f"no selection planned for iteration {iteration}", field="iterations")

    @property
    def accountant_delta(self) -> float:
        """δ − T·δ_LD: the δ left to compose the pure Gumbel peels at."""
        return self.delta - self.domain_delta


def selection_event(calibration: Calibration, iteration: int, label: str) -> PrivacyEvent:
    """The event of one LimitedDomain call: the ε OpenDP's map certifies, δ_LD spent."""
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
        delta=calibration.delta,
    )


def plan_dp_eda(params: DPEDAParams, label_set: Sequence[str]) -> list[PrivacyEvent]:
    """Every event the run records, computed from public inputs only."""
    return list(noise_plan(params, label_set).events)


def _events(params: DPEDAParams, labels: tuple[str, ...], cal: Calibration) -> list[PrivacyEvent]:
    return [
        selection_event(cal, t, label) for t in range(1, params.iterations + 1) for label in labels
    ]


@cached_plan
def noise_plan(params: DPEDAParams, labels: tuple[str, ...]) -> Plan:
    """ε_s, δ_LD and the events of the run (module docstring)."""
    per_call = params.delta * params.ld_delta_share / params.iterations

    def calibration(epsilon_s: float) -> Calibration:
        return Calibration(
            epsilon=epsilon_s,
            delta=per_call,
            adjacency=params.adjacency,
            domain=params.domain,
            parents=params.parents,
        )

    def spent(epsilon_s: float) -> float:
        return float(compose(_events(params, labels, calibration(epsilon_s))).epsilon(params.delta))

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
    composition = compose(events)
    if float(composition.epsilon(params.delta)) > params.epsilon:
        raise ConfigError("calibration overshoots the target ε", field="epsilon")
    assert cal.scale == FACTOR[params.adjacency] / low
    return Plan(
        calibration=cal,
        delta=params.delta,
        domain_delta=float(composition.spends_delta),
        events=tuple(events),
    )
