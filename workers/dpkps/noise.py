"""Laplace noise from OpenDP, and the ε each release costs.

All privacy-protecting noise in keyseed comes from here, and here from OpenDP: the
discrete Laplace mechanism for integer counts (exact, floating-point safe) and OpenDP's
Laplace mechanism for real vectors. The ε recorded for a release is what OpenDP's own
privacy map returns for the sensitivity the caller declares, so the accounting is
computed by the mechanism that drew the noise, not by a formula next to it.

Noise is never seeded: a DP release must not be reproducible by whoever knows a seed.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import opendp.prelude as dp
from numpy.typing import NDArray

from workers.dpkps.accounting import MechanismSpend
from workers.dpkps.config import check_epsilon
from workers.dpkps.errors import ConfigError

dp.enable_features("contrib")

# The raw sums a float mechanism protects are computed in float64. Their rounding error
# is far below this relative margin, which is added to the declared sensitivity so the
# guarantee holds for the computed value and not only for the exact one.
FLOAT_SENSITIVITY_MARGIN = 1e-9


def _calibrated(make: Any, d_in: float | int, epsilon: float) -> tuple[Any, float]:
    """A measurement with the smallest scale ≥ d_in/ε whose OpenDP map is ≤ ε."""
    scale = float(d_in) / epsilon
    for attempt in range(48):
        meas = make(scale)
        if float(meas.map(d_in)) <= epsilon:
            return meas, scale
        scale *= 1.0 + 1e-15 * 2.0**attempt  # OpenDP rounds its map up; nudge the scale
    raise ConfigError("could not calibrate the noise scale", field="epsilon")


def discrete_laplace_counts(
    counts: NDArray[np.int64],
    *,
    sensitivity: int,
    epsilon: float,
    mechanism: str,
    name: str,
    partition: str | None = None,
) -> tuple[NDArray[np.int64], MechanismSpend]:
    """Integer counts plus discrete Laplace noise of scale ``sensitivity / ε``.

    ``sensitivity`` is the L1 distance between the count vectors of two corpora that
    differ by one document; it is the caller's contribution bound.
    """
    epsilon = check_epsilon(epsilon, field="epsilon")
    if sensitivity < 1:
        raise ConfigError("sensitivity must be a positive integer", field="sensitivity")
    space = dp.vector_domain(dp.atom_domain(T=int)), dp.l1_distance(T=int)

    def make(scale: float) -> Any:
        return dp.m.make_laplace(*space, scale=scale)

    meas, scale = _calibrated(make, int(sensitivity), epsilon)
    values = [int(v) for v in np.asarray(counts, dtype=np.int64)]
    noisy = np.asarray(meas(values), dtype=np.int64)
    spend = MechanismSpend(
        mechanism=mechanism,
        name=name,
        epsilon=float(meas.map(int(sensitivity))),
        sensitivity=float(sensitivity),
        scale=scale,
        noise="discrete_laplace",
        partition=partition,
        dimension=len(values),
    )
    return noisy, spend


def laplace_vector(
    values: NDArray[np.float64],
    *,
    sensitivity: float,
    epsilon: float,
    mechanism: str,
    name: str,
    partition: str | None = None,
) -> tuple[NDArray[np.float64], MechanismSpend]:
    """A real vector plus Laplace noise of scale ``sensitivity / ε`` on every entry."""
    epsilon = check_epsilon(epsilon, field="epsilon")
    if not (math.isfinite(sensitivity) and sensitivity > 0):
        raise ConfigError("sensitivity must be finite and > 0", field="sensitivity")
    data = np.asarray(values, dtype=np.float64)
    if not np.all(np.isfinite(data)):
        raise ConfigError("the aggregate to privatise holds a non-finite value", field="values")
    d_in = float(sensitivity) * (1.0 + FLOAT_SENSITIVITY_MARGIN)
    space = dp.vector_domain(dp.atom_domain(T=float, nan=False)), dp.l1_distance(T=float)

    def make(scale: float) -> Any:
        return dp.m.make_laplace(*space, scale=scale)

    meas, scale = _calibrated(make, d_in, epsilon)
    noisy = np.asarray(meas(data.tolist()), dtype=np.float64)
    spend = MechanismSpend(
        mechanism=mechanism,
        name=name,
        epsilon=float(meas.map(d_in)),
        sensitivity=float(sensitivity),
        scale=scale,
        noise="laplace",
        partition=partition,
        dimension=int(data.size),
    )
    return noisy, spend
