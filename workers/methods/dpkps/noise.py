"""DP-KPS's releases: a planned event's noise applied to an aggregate, the event recorded.

Every release of a run was planned before the private read (:mod:`workers.methods.dpkps.plan`);
here an aggregate gets the planned noise per unit of sensitivity times the sensitivity it
really has, from the shared OpenDP samplers (:mod:`workers.privacy.noise`), and the
realised :class:`~workers.privacy.events.PrivacyEvent` is returned beside it. For pure
mechanisms the ε recorded is OpenDP's own privacy map at that sensitivity and scale.

Noise is never seeded: a DP release must not be reproducible by whoever knows a seed.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import NDArray

from workers.errors import ConfigError
from workers.privacy import noise as samplers
from workers.privacy.events import PrivacyEvent

# The raw sums a float mechanism protects are computed in float64, and OpenDP rounds real
# vectors to the lattice 2^LATTICE_K, which adds up to √n·2^LATTICE_K to an L2
# sensitivity. This relative margin, added to the declared sensitivity, covers both for
# any sensitivity ≥ 1e-3 and n ≤ 10⁶, so the guarantee holds for the computed value.
FLOAT_SENSITIVITY_MARGIN = 1e-6


def noise_std(event: PrivacyEvent) -> float:
    """Standard deviation of the noise on one coordinate of a release."""
    if event.noise in ("laplace", "discrete_laplace"):
        return math.sqrt(2.0) * event.scale
    return event.scale


def _check_sensitivity(sensitivity: float) -> float:
    if not (math.isfinite(sensitivity) and sensitivity > 0):
        raise ConfigError("sensitivity must be finite and > 0", field="sensitivity")
    return float(sensitivity)


def _event(
    planned: PrivacyEvent, *, scale: float, sensitivity: float, partition: str | None, name: str
) -> PrivacyEvent:
    """What OpenDP's map certifies for the release just drawn (``release_event``), with
    the δ the planned release spends outright (a thresholded vocabulary's)."""
    return samplers.release_event(
        mechanism=planned.mechanism,
        noise=planned.noise,
        scale=scale,
        sensitivity=sensitivity,
        dimension=planned.dimension,
        partition=partition,
        name=name,
        delta=None if planned.delta is None else float(planned.delta),
    )


def release_counts(
    counts: NDArray[np.int64],
    planned: PrivacyEvent,
    *,
    sensitivity: float,
    name: str,
    partition: str | None = None,
) -> tuple[NDArray[np.int64], PrivacyEvent]:
    """Integer counts plus the planned integer noise (discrete Laplace or Gaussian).

    ``sensitivity``: L1 (an integer) for discrete Laplace, L2 (√ of the number of counts
    one unit moves by 1) for the discrete Gaussian.
    """
    if planned.noise not in ("discrete_laplace", "discrete_gaussian"):
        raise ConfigError(f"{planned.noise} is not integer noise", field="noise")
    sensitivity = _check_sensitivity(sensitivity)
    scale = sensitivity * (planned.scale / planned.sensitivity)
    values = np.asarray(counts, dtype=np.int64)
    if planned.noise == "discrete_laplace":
        noisy = samplers.discrete_laplace_noise(values, scale=scale)
    else:
        noisy = samplers.discrete_gaussian_noise(values, scale=scale)
    event = _event(planned, scale=scale, sensitivity=sensitivity, partition=partition, name=name)
    return noisy, event


def release_vector(
    values: NDArray[np.float64],
    planned: PrivacyEvent,
    *,
    sensitivity: float,
    name: str,
    partition: str | None = None,
) -> tuple[NDArray[np.float64], PrivacyEvent]:
    """A real vector plus the planned noise (Laplace or Gaussian) on every entry.

    Laplace: the scale covers OpenDP's lattice rounding (n·2^LATTICE_K in L1) so that the
    ε its map certifies is the planned one. Gaussian: the declared sensitivity carries the
    margin above, so the certified one is the declared one.
    """
    if planned.noise not in ("laplace", "gaussian"):
        raise ConfigError(f"{planned.noise} is not real-valued noise", field="noise")
    data = np.asarray(values, dtype=np.float64)
    declared = _check_sensitivity(sensitivity) * (1.0 + FLOAT_SENSITIVITY_MARGIN)
    ratio = planned.scale / planned.sensitivity
    if planned.noise == "laplace":
        scale = (declared + data.size * 2.0**samplers.LATTICE_K) * ratio
        noisy = samplers.laplace_noise(data, scale=scale)
    else:
        scale = declared * ratio
        noisy = samplers.gaussian_noise(data, scale=scale)
    event = _event(planned, scale=scale, sensitivity=declared, partition=partition, name=name)
    return noisy, event


def release(
    values: NDArray[Any],
    planned: PrivacyEvent,
    *,
    sensitivity: float,
    name: str,
    partition: str | None = None,
) -> tuple[NDArray[Any], PrivacyEvent]:
    """Counts or a vector plus the planned noise: integer noise keeps integer counts,
    real noise (Laplace, Gaussian) takes them as reals."""
    if planned.noise in ("discrete_laplace", "discrete_gaussian"):
        return release_counts(
            values, planned, sensitivity=sensitivity, name=name, partition=partition
        )
    return release_vector(
        np.asarray(values, dtype=np.float64),
        planned,
        sensitivity=sensitivity,
        name=name,
        partition=partition,
    )
