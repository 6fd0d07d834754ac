"""The ε and δ every method accepts, checked once with errors that name the field.

The floor on ε refuses the probes a tiny ε invites (many jobs at ε = 1e-9 each, spending
nothing on the ledger, asking one yes/no question each); the ceiling refuses a release
that is private in name only. δ is a probability of failure: it stays far below 1/n.

This module imports no numerical library, so an API process can validate job specs.
"""

from __future__ import annotations

import math

from workers.errors import ConfigError

EPSILON_FLOOR = 1e-3  # per mechanism: below it a release is all noise, and a probe of one fact
EPSILON_CEILING = 100.0  # above it the noise is negligible: no privacy worth a ledger entry
DELTA_CEILING = 1e-3  # δ is a probability of failure: keep it far below 1/n


def check_delta(value: float, *, gaussian: bool, field: str = "delta") -> float:
    """δ in [0, 1e-3]; > 0 for Gaussian noise, 0 for pure ε."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError("must be a number", field=field)
    if not math.isfinite(value) or not 0 <= value <= DELTA_CEILING:
        raise ConfigError(f"must be between 0 and {DELTA_CEILING:g} (got {value})", field=field)
    if gaussian and value == 0:
        raise ConfigError("Gaussian noise needs δ > 0 (e.g. 1e-6)", field=field)
    if not gaussian and value != 0:
        raise ConfigError("Laplace noise is pure ε-DP: δ must be 0", field=field)
    return float(value)


def check_epsilon(value: float, *, field: str) -> float:
    """ε must be a number in [EPSILON_FLOOR, EPSILON_CEILING] (per mechanism; module
    docstring for why)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError("must be a number", field=field)
    if not math.isfinite(value) or not EPSILON_FLOOR <= value <= EPSILON_CEILING:
        raise ConfigError(
            f"must be between {EPSILON_FLOOR:g} and {EPSILON_CEILING:g} (got {value})",
            field=field,
        )
    return float(value)
