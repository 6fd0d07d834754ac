"""What a PATE-tutor run releases, and the noise that makes it (ε, δ)-DP (pate-tutor.md §7).

Releases, under add/remove of one privacy unit (a document, or a patient with a unit
column), both fixed by the parameters before anything private is read (rule 1):

* **teacher votes**, Q queries: for each public text x of pool B the 2-vector
  S(x) = Σ_m P_m(·|x) of the M teachers' soft outputs, plus Gaussian noise σ on both
  coordinates (OpenDP). Units go to teachers by a keyed hash (rule 3), so one unit
  changes one teacher's model and each S(x) by at most ‖P − P′‖₂ ≤ √2; it can change it
  on every query, so the Q queries compose sequentially: one event with ``count`` = Q,
  Δ₂ = √2 (rule 11), μ_KD = √(2Q)/σ.
* **tutor counts** (with more than one class): the number of units of each declared
  class plus Gaussian noise σ_t (OpenDP), rounded to integers (post-processing); one
  unit moves one count by 1, Δ₂ = 1 (rule 5), on a vector of one coordinate per class.
  Never divided by the true N. Continuous rather than discrete Gaussian noise keeps the
  accountant analytic (every event here is a Gaussian, composed exactly as one GDP
  mechanism), where a discrete Gaussian's PLD at a small ε cost minutes and gigabytes.

Calibration. One noise multiplier z is found by bisection on the shared accountant's ε
(:func:`workers.privacy.calibration.calibrate_noise_multiplier`), so everything above
composes to at most (ε, δ) as the accountant certifies it — the data-independent bound
of rule 2; no data-dependent PATE ε is ever computed (rule 7). ``tutor_share`` of μ²
goes to the counts, the rest to the votes. With one class there are no counts and σ is
the analytic Gaussian σ for Δ₂ = √(2Q) (Balle & Wang 2018), up to OpenDP's lattice.
Both sensitivities are calibrated as OpenDP's map certifies them for the sampler (1 or
√2 plus the lattice rounding, about √n·2⁻⁴⁰), so the recorded events compose to at most
the target.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from workers.methods.class_counts import ClassCounts
from workers.methods.common import cached_plan
from workers.methods.pate_tutor.params import PateTutorParams
from workers.privacy.calibration import GaussianRelease, check_calibrated
from workers.privacy.events import PrivacyEvent
from workers.privacy.noise import release_event

VOTES = "pate-teacher-votes"
TUTOR = "pate-tutor-counts"
VOTE_SENSITIVITY = math.sqrt(2.0)  # ‖P − P′‖₂ of two probability 2-vectors
ACCOUNTANT_NOTE = (
    "data-independent: Q Gaussian vote queries (Δ₂ = √2 each) and the Gaussian tutor "
    "counts (Δ₂ = 1, rounded), composed exactly as Gaussians (dp-accounting)"
)
TUTOR_COUNTS = ClassCounts(TUTOR, "tutor-class-counts")
# The event of the tutor's class counts drawn with Gaussian noise ``sigma``.
tutor_release = TUTOR_COUNTS.event


@dataclass(frozen=True)
class NoisePlan:
    """σ of every release of a run and the events they make, before any private read."""

    vote_sigma: float
    tutor_sigma: float | None  # None with one class: nothing to count
    events: tuple[PrivacyEvent, ...]

    def tutor_event(self) -> PrivacyEvent | None:
        return next((e for e in self.events if e.mechanism == TUTOR), None)

    def vote_event(self) -> PrivacyEvent:
        return next(e for e in self.events if e.mechanism == VOTES)


def plan_pate_tutor(params: PateTutorParams, label_set: Sequence[str]) -> list[PrivacyEvent]:
    """Every event the run will record, computed from public inputs only."""
    return list(noise_plan(params, label_set).events)


@cached_plan
def noise_plan(params: PateTutorParams, labels: tuple[str, ...]) -> NoisePlan:
    """σ_KD and σ_t for the run (module docstring) and the events they make."""
    # The sensitivity OpenDP certifies for a vector includes its lattice rounding; the
    # scale does not matter for it.
    certified = vote_release(1.0, 1).sensitivity
    votes = GaussianRelease(
        mechanism=VOTES, sensitivity=certified, dimension=2, count=params.queries
    )
    # the Q queries together get 1 − tutor_share of μ²; the counts at the sensitivity
    # OpenDP certifies for them
    vote_sigma, tutor_sigma, events = TUTOR_COUNTS.calibrate_with(
        votes,
        len(labels),
        share=params.tutor_share,
        sensitivity=tutor_release(1.0, len(labels)).sensitivity,
        params=params,
    )
    events.append(vote_release(vote_sigma, params.queries))
    check_calibrated(events, epsilon=params.epsilon, delta=params.delta)
    return NoisePlan(vote_sigma=vote_sigma, tutor_sigma=tutor_sigma, events=tuple(events))


def vote_release(sigma: float, queries: int) -> PrivacyEvent:
    """The event of ``queries`` noisy 2-vector teacher votes, each of L2 sensitivity √2."""
    return release_event(
        mechanism=VOTES,
        noise="gaussian",
        scale=sigma,
        sensitivity=VOTE_SENSITIVITY,
        dimension=2,
        count=queries,
        name="teacher-votes",
    )
