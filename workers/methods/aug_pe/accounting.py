"""What an Aug-PE run releases, and the noise that makes it (ε, δ)-DP (aug-pe.md §3).

Releases, under add/remove of one privacy unit (a document, or a patient with a unit
column):

* **class counts** (only with more than one class): the number of units of each declared
  class plus Gaussian noise σ_c (OpenDP). One unit moves one count by 1:
  L2 sensitivity 1. They set how many seeds each class gets (caveat A1).
* **one vote histogram per iteration and class**, T iterations: every unit of the class
  votes for its k nearest candidates with a vote vector of L2 norm ≤ 1, and every bin gets
  Gaussian noise σ (OpenDP). A unit lies in one class, so the classes of one iteration
  compose in parallel (``partition`` = the class); the T iterations compose sequentially.
  Each class's histogram spans the whole population of the iteration (other classes'
  candidates get no vote from it and are noised all the same): its dimension, like every
  other field of every event, is then fixed by the parameters before anything private is
  read, and the ledger can reserve the run's exact events (caveat A9).

Noise calibration. One noise multiplier z is found by bisection on the shared
accountant's ε (:func:`workers.privacy.calibration.calibrate_noise_multiplier`), so the
composition of every event above is at most (ε, δ) as the accountant certifies it
(exact GDP composition of the Gaussians, counts included: continuous Gaussian noise on
the counts keeps the accountant analytic, where a discrete Gaussian's PLD at a small ε
cost minutes and gigabytes).
``count_share`` of μ² (the quantity Gaussian mechanisms add up in) goes to the counts,
the rest is spread evenly over the T histograms: σ = z·√(T/(1 − count_share)) and
σ_c = z/√count_share. With one class there are no counts and σ is Private Evolution's
noise multiplier for T steps (13.25 at ε = 1, T = 10, δ = 1/(N ln N), N = 75,316; the
Aug-PE README rounds it up to 13.26).

The sensitivity recorded for a histogram is what OpenDP's privacy map certifies for its
sampler (1 plus the lattice rounding, about √n·2⁻⁴⁰), and σ is calibrated for the largest
of them, so the recorded events compose to at most the target.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from workers.errors import ConfigError
from workers.methods.aug_pe.params import AugPEParams
from workers.methods.class_counts import ClassCounts
from workers.methods.common import cached_plan
from workers.privacy.calibration import GaussianRelease, check_calibrated
from workers.privacy.events import PrivacyEvent
from workers.privacy.noise import release_event

COUNTS = "aug-pe-class-counts"
HISTOGRAM = "aug-pe-histogram"
ACCOUNTANT_NOTE = "exact GDP composition of the Gaussian histograms (dp-accounting PLD)"
CLASS_COUNTS = ClassCounts(COUNTS, "class-counts")
# The event of the class counts drawn with Gaussian noise ``sigma``.
count_release = CLASS_COUNTS.event


@dataclass(frozen=True)
class NoisePlan:
    """σ of every release of a run and the events they make, before any private read."""

    histogram_sigma: float
    count_sigma: float | None  # None with one class: nothing to count
    events: tuple[PrivacyEvent, ...]

    def count_event(self) -> PrivacyEvent | None:
        return next((e for e in self.events if e.mechanism == COUNTS), None)

    def histogram_event(self, iteration: int, label: str) -> PrivacyEvent:
        name = histogram_name(iteration)
        for event in self.events:
            if event.mechanism == HISTOGRAM and event.name == name and event.partition == label:
                return event
        raise ConfigError(f"no histogram planned for iteration {iteration}", field="iterations")


def histogram_name(iteration: int) -> str:
    return f"vote-histogram[t={iteration}]"


def plan_aug_pe(params: AugPEParams, label_set: Sequence[str]) -> list[PrivacyEvent]:
    """Every event the run will record, computed from public inputs only."""
    return list(noise_plan(params, label_set).events)


@cached_plan
def noise_plan(params: AugPEParams, labels: tuple[str, ...]) -> NoisePlan:
    """σ and σ_c for the run (module docstring) and the events they make."""
    iterations = params.iterations
    dimensions = [params.candidates(t) for t in range(1, iterations + 1)]
    # The sensitivity OpenDP certifies grows with the dimension (lattice rounding); the
    # scale does not matter for it.
    certified = max(
        release_event(
            mechanism=HISTOGRAM, noise="gaussian", scale=1.0, sensitivity=1.0, dimension=n
        ).sensitivity
        for n in set(dimensions)
    )
    histogram = GaussianRelease(
        mechanism=HISTOGRAM, sensitivity=certified, count=iterations, partitions=labels
    )
    sigma, count_sigma, events = CLASS_COUNTS.calibrate_with(
        histogram, len(labels), share=params.count_share, sensitivity=1.0, params=params
    )
    for t, dimension in enumerate(dimensions, start=1):
        events.extend(histogram_release(sigma, dimension, t, label) for label in labels)
    check_calibrated(events, epsilon=params.epsilon, delta=params.delta)
    return NoisePlan(histogram_sigma=sigma, count_sigma=count_sigma, events=tuple(events))


def histogram_release(sigma: float, dimension: int, iteration: int, label: str) -> PrivacyEvent:
    """The event of one class's vote histogram over ``dimension`` candidates."""
    return release_event(
        mechanism=HISTOGRAM,
        noise="gaussian",
        scale=sigma,
        sensitivity=1.0,
        dimension=dimension,
        partition=label,
        name=histogram_name(iteration),
    )
