"""Paired runs of the low-ε benchmark: several rules on the same DP releases (a diagnostic).

The engine draws its noise from OpenDP, unseeded, so no two runs share a release, and a
difference of a few thousandths between two settings is lost in the spread between runs
(Yelp small at ε = 1: about 0.008 from run to run). To compare post-processing rules, this
diagnostic replaces OpenDP's two Gaussian samplers (``workers.privacy.noise.gaussian_noise``
and ``discrete_gaussian_noise``), *inside a ``with`` block only*, by numpy draws seeded per run
(:func:`seeded_noise`; the discrete one a rounded normal): every variant of a run then makes
exactly the same releases, and the difference between two variants is the rules' alone. It is
never used by the engine or the service, whose noise stays OpenDP's; nothing it prints is
private (accuracies on the benchmark's test texts, as ``bench_low_epsilon`` prints).

Variants (the first is the reference every other is compared with):

* ``defaults``: the engine's defaults;
* ``set:key=value[,key=value…]``: engine settings, as ``bench_low_epsilon --set`` (an item
  may be an experiment's name, benchmarks/experiments.py);
* ``exact-counts``: **not DP** — ``total`` split by the private class counts instead of the
  released ones (the release is still made, so the other draws stay paired): what no
  post-processing of the released counts is likely to beat;
* ``sums-noise=F``: the continuous Gaussian releases' noise (the class sums and the cells'
  sums) multiplied by F; the engine still sizes what reads σ (the names' prior) for the
  planned σ. F = 0.5 is about what twice the ε would give those releases.

``--codes`` declares every label as a code (``class 0``, ``class 1``, …; :func:`with_codes`):
the same classes under names that tell nothing, for the names' prior.

Run: ``python -m benchmarks.paired SPLIT EPSILON --seeds 0-9 VARIANT [VARIANT …]``; each
run and each variant's summary (mean, difference to the reference with its standard
error, runs that rose) are printed and appended to ``benchmarks/paired.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

import workers.methods.dpkps.stages as dpkps_stages
import workers.privacy.noise as samplers
from benchmarks.bench_low_epsilon import SPLITS, Bench, parse_settings
from workers.methods.proportions import allocate

OUT = Path(__file__).resolve().parent / "paired.jsonl"
SEED_OFFSET = 1000  # run s draws its noise from numpy's generator seeded 1000 + s
SPLIT = "split_by_counts"  # the name under which DP-KPS's class-counts stage splits `total`


def check_factor(factor: float) -> float:
    """``sums-noise``'s factor: finite and ≥ 0."""
    if not (math.isfinite(factor) and factor >= 0):
        raise ValueError("sums-noise: the factor must be finite and ≥ 0")
    return factor


@contextmanager
def seeded_noise(seed: int, *, sums_factor: float = 1.0) -> Iterator[None]:
    """Within the block, OpenDP's Gaussian samplers are replaced by seeded numpy draws (a
    diagnostic: the same seed gives the same releases); restored on leaving. The continuous
    sampler's noise is multiplied by ``sums_factor``, its draws made all the same, so the
    draws after it do not shift."""
    check_factor(sums_factor)
    rng = np.random.default_rng(SEED_OFFSET + seed)

    def gaussian(values: NDArray[Any], *, scale: float) -> NDArray[np.float64]:
        v = np.asarray(values, dtype=np.float64)
        noise = rng.normal(0.0, scale, size=v.shape)
        out: NDArray[np.float64] = v + sums_factor * noise
        return out

    def discrete_gaussian(values: NDArray[Any], *, scale: float) -> NDArray[np.int64]:
        v = np.asarray(values, dtype=np.int64)
        out: NDArray[np.int64] = v + np.rint(rng.normal(0.0, scale, size=v.shape)).astype(np.int64)
        return out

    saved = samplers.gaussian_noise, samplers.discrete_gaussian_noise
    samplers.gaussian_noise = gaussian
    samplers.discrete_gaussian_noise = discrete_gaussian
    try:
        yield
    finally:
        samplers.gaussian_noise, samplers.discrete_gaussian_noise = saved


@contextmanager
def exact_counts(labels: Sequence[str]) -> Iterator[None]:
    """Within the block, DP-KPS splits ``total`` by the exact counts of ``labels`` (not DP;
    a ceiling for the count release's post-processing); restored on leaving."""
    counts = Counter(labels)
    saved = getattr(dpkps_stages, SPLIT)

    def split(total: int, noisy: Mapping[str, float], noise_std: float) -> dict[str, int]:
        return allocate(total, {label: float(counts.get(label, 0)) for label in noisy})

    setattr(dpkps_stages, SPLIT, split)
    try:
        yield
    finally:
        setattr(dpkps_stages, SPLIT, saved)


@dataclass(frozen=True)
class Variant:
    name: str
    settings: dict[str, Any] = field(default_factory=dict)
    exact_counts: bool = False
    sums_factor: float = 1.0


def parse_variant(text: str) -> Variant:
    """``defaults``, ``set:k=v[,k=v…]``, ``exact-counts`` or ``sums-noise=F``.

    >>> parse_variant("set:consistency_filter=false,subspace=0").settings
    {'consistency_filter': False, 'subspace': 0}
    >>> parse_variant("sums-noise=0.5").sums_factor
    0.5
    """
    if text == "defaults":
        return Variant(text)
    if text == "exact-counts":
        return Variant(text, exact_counts=True)
    if text.startswith("sums-noise="):
        try:
            factor = check_factor(float(text.split("=", 1)[1]))
        except ValueError:
            raise ValueError(f"variant {text!r}: F must be a finite number ≥ 0") from None
        return Variant(text, sums_factor=factor)
    if text.startswith("set:"):
        try:
            settings = parse_settings(item for item in text[4:].split(",") if item)
        except ValueError:
            settings = {}
        if not settings:
            raise ValueError(f"variant {text!r}: set: needs key=value pairs")
        return Variant(text, settings=settings)
    raise ValueError(
        f"variant {text!r}: expected defaults, set:key=value, exact-counts or sums-noise=F"
    )


def parse_seeds(text: str) -> list[int]:
    """``0-9`` or ``0,2,5``.

    >>> parse_seeds("0-3"), parse_seeds("1,4")
    ([0, 1, 2, 3], [1, 4])
    """
    try:
        if "-" in text:
            first, last = (int(x) for x in text.split("-", 1))
            seeds = list(range(first, last + 1))
        else:
            seeds = [int(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"--seeds {text!r}: expected FIRST-LAST or a comma list") from None
    if not seeds or min(seeds) < 0:
        raise ValueError(f"--seeds {text!r}: expected at least one seed, none negative")
    return seeds


def with_codes(bench: Bench) -> Bench:
    """``bench`` with every declared label renamed ``class 0``, ``class 1``, … (in the
    label set's order), the private and the test labels alike: the classes are the same,
    but their names tell nothing (what the names' prior must survive).

    >>> bench = Bench.__new__(Bench)
    >>> bench.label_set, bench.labels, bench.test_labels = ["b", "a"], ["a", "b"], ["b"]
    >>> renamed = with_codes(bench)
    >>> renamed.label_set, renamed.labels, renamed.test_labels
    (['class 0', 'class 1'], ['class 1', 'class 0'], ['class 0'])
    """
    code = {label: f"class {i}" for i, label in enumerate(bench.label_set)}
    bench.label_set = [code[label] for label in bench.label_set]
    bench.labels = [code[label] for label in bench.labels]
    bench.test_labels = [code[label] for label in bench.test_labels]
    return bench


def run_variant(bench: Bench, epsilon: float, seed: int, variant: Variant) -> float:
    """One run of ``bench`` with ``variant``, on run ``seed``'s releases."""
    counts = exact_counts(bench.labels) if variant.exact_counts else nullcontext()
    with seeded_noise(seed, sums_factor=variant.sums_factor), counts:
        return bench.run(epsilon, seed, variant.settings)


def summary(reference: Sequence[float], runs: Sequence[float]) -> dict[str, float | int]:
    """Mean of ``runs``, and their paired difference to ``reference``: mean, standard error
    (0 for one run) and how many runs rose.

    >>> summary([0.30, 0.31, 0.32], [0.31, 0.31, 0.34])
    {'mean': 0.32, 'difference': 0.01, 'standard_error': 0.005774, 'up': 2}
    """
    a, b = np.asarray(reference, dtype=np.float64), np.asarray(runs, dtype=np.float64)
    if a.shape != b.shape or a.size == 0:
        raise ValueError("paired runs: the same non-empty seeds for every variant")
    d = b - a
    se = float(d.std(ddof=1) / math.sqrt(d.size)) if d.size > 1 else 0.0
    return {
        "mean": round(float(b.mean()), 6),
        "difference": round(float(d.mean()), 6),
        "standard_error": round(se, 6),
        "up": int((d > 0).sum()),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("split", choices=sorted(SPLITS))
    parser.add_argument("epsilon", type=float)
    parser.add_argument("variants", nargs="+", help="the first is the reference")
    parser.add_argument("--seeds", default="0-4", help="FIRST-LAST or a comma list")
    parser.add_argument("--vocabulary", default="english", help="the public vocabulary")
    parser.add_argument(
        "--codes", action="store_true", help="declare the labels as codes (class 0, class 1, …)"
    )
    args = parser.parse_args(argv)
    try:
        seeds = parse_seeds(args.seeds)
        variants = [parse_variant(v) for v in args.variants]
    except ValueError as error:
        parser.error(str(error))
    bench = Bench(args.split, args.vocabulary)
    if args.codes:
        bench = with_codes(bench)
    extra = {"names": "codes"} if args.codes else {}
    runs: dict[str, list[float]] = {v.name: [] for v in variants}
    with open(OUT, "a", encoding="utf-8") as out:
        for seed in seeds:
            for variant in variants:
                accuracy = run_variant(bench, args.epsilon, seed, variant)
                runs[variant.name].append(accuracy)
                record = {
                    "split": args.split,
                    "epsilon": args.epsilon,
                    **({} if args.vocabulary == "english" else {"vocabulary": args.vocabulary}),
                    **extra,
                    "seed": seed,
                    "variant": variant.name,
                    "accuracy": accuracy,
                }
                out.write(json.dumps(record) + "\n")
                print(json.dumps(record), flush=True)
        reference = runs[variants[0].name]
        for variant in variants:
            record = {
                "split": args.split,
                "epsilon": args.epsilon,
                **({} if args.vocabulary == "english" else {"vocabulary": args.vocabulary}),
                **extra,
                "seeds": seeds,
                "variant": variant.name,
                "reference": variants[0].name,
                **summary(reference, runs[variant.name]),
            }
            out.write(json.dumps(record) + "\n")
            print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
