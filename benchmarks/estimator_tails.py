"""The privacy tests' estimators drawn directly, many times (a tool for the test suite, not CI).

``benchmarks/flake_rates.py`` runs a whole test; this draws only the statistic its
estimator reads, from the distribution the test's mechanism gives it, so that the chance of
a rare failure can be counted over 10⁵ draws in minutes. Three shapes cover the suite:

* ``gaussian``: the helper ``check_gaussian`` of ``tests/core/privacy/test_neighbouring.py`` (eleven
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

import numpy as np

from benchmarks.flake_rates import numpy_draw
from tests.core.privacy.test_neighbouring import CONTROL_RUNS, DELTA, RUNS
from tests.privacy_audit import estimate_epsilon_at_delta, estimate_privacy_loss
from workers.privacy.calibration import analytic_gaussian_sigma

NOISE = {"gaussian": "gaussian", "laplace": "laplace", "discrete-laplace": "discrete_laplace"}


def tails(
    kind: str, *, epsilon: float, shift: float, runs: int, band: tuple[float, float], seed: int
) -> dict[str, object]:
    """``runs`` readings of the estimator and of its σ/2 (b/2) control, in units of ε."""
    rng = np.random.default_rng(seed)
    noise = NOISE[kind]
    gaussian = kind == "gaussian"
    unit = analytic_gaussian_sigma(epsilon=epsilon, delta=DELTA) if gaussian else 1 / epsilon
    scale = unit * shift

    def reading(b: float, side: int) -> float:
        x = numpy_draw(rng, noise, side, b)
        y = shift + numpy_draw(rng, noise, side, b)
        loss = (
            estimate_epsilon_at_delta(x, y, delta=DELTA)
            if gaussian
            else estimate_privacy_loss(x, y)
        )
        return loss / epsilon

    values = np.array([reading(scale, RUNS) for _ in range(runs)])
    controls = np.array(
        [reading(scale / 2, CONTROL_RUNS if gaussian else RUNS) for _ in range(runs)]
    )
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
    parser.add_argument("kind", choices=tuple(NOISE))
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
