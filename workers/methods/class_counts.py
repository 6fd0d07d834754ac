"""The noisy class counts an LLM method releases beside its main mechanism (Aug-PE's
class counts, PATE-tutor's tutor counts): the number of units of each declared class
plus Gaussian noise (OpenDP), calibrated together with the main release to the run's
(ε, δ), the counts taking their share of μ²
(:func:`~workers.privacy.calibration.calibrate_with_share`). One unit moves one count by
1: L2 sensitivity 1. With one class there is nothing to count.
"""

from __future__ import annotations

from dataclasses import dataclass

from workers.methods.common import MethodParams
from workers.privacy.calibration import GaussianRelease, calibrate_with_share
from workers.privacy.events import PrivacyEvent
from workers.privacy.noise import release_event


@dataclass(frozen=True)
class ClassCounts:
    """A method's class counts: the events' mechanism and name."""

    mechanism: str
    name: str

    def event(self, sigma: float, classes: int) -> PrivacyEvent:
        """The event of the counts of ``classes`` classes drawn with Gaussian noise ``sigma``."""
        return release_event(
            mechanism=self.mechanism,
            noise="gaussian",
            scale=sigma,
            sensitivity=1.0,
            dimension=classes,
            name=self.name,
        )

    def calibrate_with(
        self,
        main: GaussianRelease,
        classes: int,
        *,
        share: float,
        sensitivity: float,
        params: MethodParams,
    ) -> tuple[float, float | None, list[PrivacyEvent]]:
        """σ of ``main`` and σ of the counts (None with one class), calibrated together to
        the run's (ε, δ), the counts taking ``share`` of μ² at L2 ``sensitivity``; and
        the counts' event (none with one class)."""
        counts = GaussianRelease(
            mechanism=self.mechanism,
            sensitivity=sensitivity,
            dimension=classes,
            noise="gaussian",
            weight=share,
        )
        sigma, count_sigma = calibrate_with_share(
            main, counts if classes > 1 else None, epsilon=params.epsilon, delta=params.delta
        )
        events = [] if count_sigma is None else [self.event(count_sigma, classes)]
        return sigma, count_sigma, events
