"""How often a stochastic privacy test fails by chance (a tool for the test suite, not CI).

Every mechanism's test (``tests/core/privacy/test_neighbouring.py`` and its kin) estimates a
privacy loss from samples on neighbouring corpora and asserts it lies in a band around the
certified ε; a σ/2 control must read far above it. A correct mechanism still fails such a
band now and then, because the estimate is itself random. CI runs each test once per
submission, so a test failing one run in a few hundred blocks main often enough to matter.

This tool runs one test function many times in one process and reports how many runs
failed, with the range of each estimate the test computed (the loss first, then its
control). One run of a test draws tens of thousands of OpenDP samples one release at a
time, which costs seconds; thousands of runs would take hours. So, unless ``--opendp`` is
given, the noise primitives of ``workers.privacy.noise`` draw from numpy's generator
instead, with the same distributions (Laplace, Gaussian, discrete Laplace as a difference
of geometrics, discrete Gaussian from its normalised mass function). How often the
estimator misreads depends only on the noise's distribution, not on the generator; the
product never uses these stand-ins, and neither does any test.

Run: ``python -m benchmarks.flake_rates tests.core.methods.test_pate_tutor
test_tutor_counts_on_neighbouring_corpora_within_epsilon_delta --runs 2000`` (``--args``
takes a JSON object of the test's parameters, e.g. ``'{"unit_level": true}'``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

import tests.core.privacy.test_neighbouring as neighbouring
import workers.privacy.noise as noise

ESTIMATORS = ("estimate_epsilon_at_delta", "estimate_privacy_loss", "halved_scale_control")


def numpy_draw(rng: np.random.Generator, kind: str, n: int, scale: float) -> NDArray[Any]:
    """``n`` draws from ``rng`` of the noise ``noise._add`` adds (OpenDP's distributions)."""
    if kind == "laplace":
        return rng.laplace(0.0, scale, n)
    if kind == "gaussian":
        return rng.normal(0.0, scale, n)
    if kind == "discrete_laplace":  # P(k) ∝ exp(−|k| / scale)
        p = 1.0 - np.exp(-1.0 / scale)
        return rng.geometric(p, n) - rng.geometric(p, n)
    if kind == "discrete_gaussian":  # P(k) ∝ exp(−k² / 2σ²), mass beyond 30σ dropped
        k = np.arange(-int(30 * scale) - 5, int(30 * scale) + 6)
        mass = np.exp(-(k.astype(float) ** 2) / (2 * scale * scale))
        return rng.choice(k, size=n, p=mass / mass.sum())
    raise ValueError(f"unknown noise {kind!r}")


def numpy_noise(rng: np.random.Generator) -> Callable[[str, Any, float], list[Any]]:
    """A stand-in for ``noise._add`` drawing the same distributions from ``rng``."""

    def add(kind: str, data: Any, scale: float) -> list[Any]:
        n = int(data.size)
        return list(data + numpy_draw(rng, kind, n, scale)) if n else []

    return add


def flake_rate(module: str, test: str, runs: int, args: dict[str, Any]) -> dict[str, Any]:
    """Run ``module.test(**args)`` ``runs`` times; failures and each estimate's range."""
    target = importlib.import_module(module)
    estimates: list[float] = []
    for space in {target, neighbouring}:
        for name in ESTIMATORS:
            if hasattr(space, name):
                real = getattr(space, name)

                def recorded(*a: Any, _real: Any = real, **k: Any) -> float:
                    value = float(_real(*a, **k))
                    estimates.append(value)
                    return value

                setattr(space, name, recorded)
    failures, seen, start = 0, [], time.time()
    for _ in range(runs):
        estimates.clear()
        try:
            getattr(target, test)(**args)
        except AssertionError:
            failures += 1
        seen.append(list(estimates))
    # a failed run stops at its failing check: each estimate's range is over the runs that
    # reached it, so one early failure does not hide the controls of the others
    reached = [
        [run[k] for run in seen if len(run) > k] for k in range(max(map(len, seen), default=0))
    ]
    return {
        "test": f"{module}.{test}",
        "args": args,
        "runs": runs,
        "failures": failures,
        "seconds_per_run": round((time.time() - start) / runs, 3),
        "estimates": [{"min": round(min(v), 4), "max": round(max(v), 4)} for v in reached],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("module")
    parser.add_argument("test")
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--args", type=json.loads, default={})
    parser.add_argument("--opendp", action="store_true", help="keep OpenDP's noise (slow)")
    parser.add_argument("--seed", type=int, default=None)
    ns = parser.parse_args(argv)
    if not ns.opendp:
        noise._add = numpy_noise(np.random.default_rng(ns.seed))  # type: ignore[assignment]
    print(json.dumps(flake_rate(ns.module, ns.test, ns.runs, ns.args)))


if __name__ == "__main__":
    main()
