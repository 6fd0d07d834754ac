"""The privacy tests' estimators drawn directly, many times (a tool for the test suite, not CI).

``benchmarks/flake_rates.py`` runs a whole test; this draws only the statistic its
estimator reads, from the distribution the test's mechanism gives it, so that the chance of
a rare failure can be counted over 10⁵ draws in minutes. Three shapes cover the suite:

* ``gaussian``: the helper ``check_gaussian`` of ``tests/core/test_neighbouring.py`` (eleven
  tests use it) projects every release on the shift between the two raw aggregates, which
  leaves N(0, σ₁²) against N(1, σ₁²), σ₁ the analytic σ of (ε, δ) = (1, 1e-2) for Δ₂ = 1;
  6,000 draws a side, :func:`estimate_epsilon_at_delta`; control at σ₁/2 with 40,000.
* ``laplace``: Laplace noise of scale b = shift/ε on two points ``shift`` apart, 6,000 a
  side, :func:`estimate_privacy_loss` (the KDE structure's test); control at b/2.
* ``discrete-laplace``: the same on the integers (the vocabulary histogram: ε = 1, shift 4;
  the class counts: ε = 0.7, shift 1).

Each estimate is printed in units of ε, with its mean, SD, range and how many draws fall
outside the given band, and the control's lowest reading.

Run: ``python -m benchmarks.estimator_tails discrete-laplace --epsilon 0.7 --shift 1
--runs 100000 --band 0.75 1.3``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

import numpy as np

from tests.privacy_audit import estimate_epsilon_at_delta, estimate_privacy_loss
from workers.privacy.calibration import analytic_gaussian_sigma

SIDE = 6000  # RUNS of tests/core/test_neighbouring.py
GAUSSIAN_CONTROL_SIDE = 40_000  # check_gaussian's control
GAUSSIAN_DELTA = 1e-2


def estimator(
    kind: str, epsilon: float, shift: float, rng: np.random.Generator
) -> tuple[Callable[[], float], Callable[[], float]]:
    """``(estimate, control)``: each call draws both samples afresh and returns ε̂ / ε."""
    if kind == "gaussian":
        sigma = analytic_gaussian_sigma(epsilon=epsilon, delta=GAUSSIAN_DELTA) * shift

        def gauss(scale: float, side: int) -> float:
            x, y = rng.normal(0.0, scale, side), rng.normal(shift, scale, side)
            return estimate_epsilon_at_delta(x, y, delta=GAUSSIAN_DELTA) / epsilon

        return (lambda: gauss(sigma, SIDE)), (lambda: gauss(sigma / 2, GAUSSIAN_CONTROL_SIDE))

    def draw(scale: float) -> np.ndarray:
        if kind == "laplace":
            return rng.laplace(0.0, scale, SIDE)
        if kind == "discrete-laplace":  # P(k) ∝ exp(−|k| / scale)
            p = 1.0 - np.exp(-1.0 / scale)
            return (rng.geometric(p, SIDE) - rng.geometric(p, SIDE)).astype(float)
        raise ValueError(f"unknown kind {kind!r}")

    def pure(scale: float) -> float:
        return estimate_privacy_loss(draw(scale), shift + draw(scale)) / epsilon

    scale = shift / epsilon
    return (lambda: pure(scale)), (lambda: pure(scale / 2))


def tails(
    kind: str, *, epsilon: float, shift: float, runs: int, band: tuple[float, float], seed: int
) -> dict[str, object]:
    estimate, control = estimator(kind, epsilon, shift, np.random.default_rng(seed))
    values = np.array([estimate() for _ in range(runs)])
    controls = np.array([control() for _ in range(runs)])
    low, high = band
    return {
        "kind": kind,
        "epsilon": epsilon,
        "shift": shift,
        "runs": runs,
        "seed": seed,
        "mean": round(float(values.mean()), 4),
        "sd": round(float(values.std()), 4),
        "min": round(float(values.min()), 4),
        "max": round(float(values.max()), 4),
        "band": [low, high],
        "at_or_below_band": int((values <= low).sum()),
        "above_band": int((values > high).sum()),
        "control_min": round(float(controls.min()), 4),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=("gaussian", "laplace", "discrete-laplace"))
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--shift", type=float, default=1.0)
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--band", type=float, nargs=2, default=(0.7, 1.3), metavar=("LOW", "HIGH"))
    parser.add_argument("--seed", type=int, default=0)
    ns = parser.parse_args(argv)
    print(json.dumps(tails(ns.kind, epsilon=ns.epsilon, shift=ns.shift, runs=ns.runs,
                           band=tuple(ns.band), seed=ns.seed)))  # fmt: skip


if __name__ == "__main__":
    main()
