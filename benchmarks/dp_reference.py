"""A classifier trained directly on the private texts under the same (ε, δ): issue 16's
reference for what the small corpora allow at all (a benchmark diagnostic, not the product).

The product releases synthetic keyphrase sequences, and a classifier trained on them is
post-processing of its releases. The same classifier family can instead be trained on the
private texts themselves by a DP learner: a softmax-linear model on the public model's
normalised sentence embeddings, fitted by full-batch DP gradient descent (each step's
per-document gradients clipped to L2 norm ``clip`` and summed, Gaussian noise of standard
deviation σ·clip on every coordinate, σ the noise multiplier of ``steps`` Gaussian releases
composing to (ε, δ): :func:`workers.privacy.calibration.gaussian_noise_multiplier`, the
product's accountant; the noise is OpenDP's, :func:`workers.privacy.noise.gaussian_noise`).
Adding or removing one document changes a step's summed gradient by at most ``clip``, so
the model is (ε, δ)-DP under add/remove adjacency whatever the other hyperparameters.

Full-batch steps (``batch`` 1, the default) keep the accounting the product's own: from a
zero start the first step's weights are each class's sum of embeddings less the mean share —
the nearest-centroid classifier the product's release carries — and later steps may fit
more, each noisier. With ``batch`` q < 1 it is DP-SGD instead (Abadi et al. 2016): each step
reads a Poisson sample of the rows (each row in it with probability q, independently), and
σ is the multiplier of ``steps`` Poisson-subsampled Gaussian releases composing to (ε, δ)
under add/remove adjacency — the amplification by subsampling, accounted by
``dp_accounting``'s PLD accountant (:func:`subsampled_noise_multiplier`), which the product's
accountant does not need; the samples come from numpy's generator, not a cryptographic one
(a diagnostic). The learning rate is divided by the expected number of rows a step reads,
q·n (a diagnostic too; a product would spend a little of the budget on a count, as DP-KPS
does). An optional start from the declared label names' embeddings (public) gives it the
product's prior. The hyperparameters are chosen on a tuning split (:func:`tune`), then
measured on the reported split with fresh noise (:func:`measure`). Records go to
``benchmarks/dp_reference.jsonl``.

    python -m benchmarks.dp_reference tune yelp-hospital-tune --seeds 0-4
    python -m benchmarks.dp_reference measure yelp-hospital --steps 16 --lr 2 --names 32 \
        --subspace true --runs 10
    python -m benchmarks.dp_reference measure yelp-small --steps 128 --lr 1 --names 16 \
        --subspace true --batch 0.25 --runs 10
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import dp_accounting
import numpy as np
from dp_accounting.pld import pld_privacy_accountant
from numpy.typing import NDArray

from benchmarks.bench_low_epsilon import DELTA, REPO, Bench
from benchmarks.paired import parse_seeds, seeded_noise
from workers.methods.dpkps.config import PUBLIC_VOCABULARY_SIZE, SUGGESTED_SUBSPACE
from workers.methods.dpkps.density.label_prior import name_directions
from workers.methods.dpkps.subspace import project_units, public_basis
from workers.privacy import noise as samplers
from workers.privacy.calibration import gaussian_noise_multiplier

OUT = REPO / "benchmarks" / "dp_reference.jsonl"
PUBLIC_PHRASES = PUBLIC_VOCABULARY_SIZE["centroid"]  # the product's Ṽ: its subspace's phrases

Noise = Callable[[NDArray[np.float64], float], NDArray[np.float64]]
# σ/Δ₂ for (ε, δ, steps): a PLD calibration, the same for every run of a setting
noise_multiplier = functools.lru_cache(maxsize=64)(gaussian_noise_multiplier)


def subsampled_event(sigma: float, rate: float, steps: int) -> dp_accounting.DpEvent:
    """``steps`` Gaussian releases of noise multiplier ``sigma``, each on a Poisson sample of
    the rows at ``rate``: the DP-SGD learner's event, for ``dp_accounting``'s accountants."""
    sampled = dp_accounting.PoissonSampledDpEvent(rate, dp_accounting.GaussianDpEvent(sigma))
    return dp_accounting.SelfComposedDpEvent(sampled, steps)


@functools.lru_cache(maxsize=256)
def subsampled_noise_multiplier(*, epsilon: float, delta: float, steps: int, rate: float) -> float:
    """σ/Δ₂ for ``steps`` Gaussian releases, each on a Poisson sample of the rows at
    ``rate``, composing to (ε, δ) under add/remove adjacency: ``dp_accounting``'s PLD
    accountant, bisected by its ``calibrate_dp_mechanism`` (within 1e-4 of the smallest).
    Its losses are discretised by 1e-3 rather than the default 1e-4: the bound stays
    pessimistic, σ moves by about 1e-4 of itself, and a calibration takes 1.5 s, not 16."""
    if not 0.0 < rate < 1.0:
        raise ValueError("rate must lie in (0, 1); a full batch takes noise_multiplier")

    def accountant() -> pld_privacy_accountant.PLDAccountant:
        return pld_privacy_accountant.PLDAccountant(
            dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE, value_discretization_interval=1e-3
        )

    sigma = dp_accounting.calibrate_dp_mechanism(
        accountant,
        lambda sigma: subsampled_event(sigma, rate, steps),
        epsilon,
        delta,
        dp_accounting.LowerEndpointAndGuess(0.1, 1.0),
        tol=1e-4,
    )
    return float(sigma)


def opendp_noise(values: NDArray[np.float64], scale: float) -> NDArray[np.float64]:
    """``values`` plus OpenDP's Gaussian noise of standard deviation ``scale`` (the shared
    sampler, looked up at each call: :func:`benchmarks.paired.seeded_noise` reaches it)."""
    return samplers.gaussian_noise(values.ravel(), scale=scale).reshape(values.shape)


@dataclass(frozen=True)
class Settings:
    """One DP learner: its steps, learning rate, clipping norm, names' start and space."""

    steps: int = 1
    lr: float = 1.0
    clip: float = 1.0
    names: float = 0.0  # the start: this multiple of the centred label names' embeddings
    subspace: bool = False  # the product's public subspace (top principal directions)
    batch: float = 1.0  # each step's Poisson sampling rate: 1 is full-batch, < 1 DP-SGD


def features(rows: NDArray[np.floating[Any]]) -> NDArray[np.float64]:
    """Each row with a constant bias coordinate, scaled so the whole has norm ≤ 1."""
    x = np.asarray(rows, dtype=np.float64)
    norms = np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1.0)
    with_bias = np.hstack([x / norms, np.ones((len(x), 1))])
    out: NDArray[np.float64] = with_bias / math.sqrt(2.0)
    return out


def clipped_gradient_sum(
    x: NDArray[np.float64], y: NDArray[np.int64], weights: NDArray[np.float64], clip: float
) -> NDArray[np.float64]:
    """Σ_i of each row's softmax cross-entropy gradient (C × d), each clipped to L2 norm
    ``clip``: the gradient of row i is (p_i − e_{y_i}) x_iᵀ, of norm ‖p_i − e_{y_i}‖·‖x_i‖."""
    logits = x @ weights.T
    logits -= logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(len(y)), y] -= 1.0
    norms = np.linalg.norm(p, axis=1) * np.linalg.norm(x, axis=1)
    scale = np.minimum(1.0, clip / np.maximum(norms, 1e-300))
    out: NDArray[np.float64] = (p * scale[:, None]).T @ x
    return out


def dp_gradient_descent(
    x: NDArray[np.float64],
    y: NDArray[np.int64],
    classes: int,
    *,
    epsilon: float,
    delta: float,
    settings: Settings,
    start: NDArray[np.float64] | None = None,
    noise: Noise = opendp_noise,
    sampling: np.random.Generator | None = None,
) -> NDArray[np.float64]:
    """Softmax weights (``classes`` × d) after ``settings.steps`` noisy steps, each on the
    whole of ``x`` or on a Poisson sample of it at ``settings.batch`` (drawn by
    ``sampling``, fresh entropy when None); (ε, δ)-DP in the rows of ``x`` (each of norm
    ≤ 1, :func:`features`). ``epsilon`` of ``math.inf`` takes no noise (the learner's own
    ceiling)."""
    if not settings.steps >= 1 or not settings.clip > 0:
        raise ValueError("steps must be ≥ 1 and clip > 0")
    if not 0.0 < settings.batch <= 1.0:
        raise ValueError("batch must lie in (0, 1]")
    if np.linalg.norm(x, axis=1).max(initial=0.0) > 1.0 + 1e-9:
        raise ValueError("rows must have L2 norm ≤ 1")
    full = settings.batch == 1.0
    if math.isinf(epsilon):
        sigma = 0.0
    elif full:
        sigma = noise_multiplier(epsilon=epsilon, delta=delta, steps=settings.steps)
    else:
        sigma = subsampled_noise_multiplier(
            epsilon=epsilon, delta=delta, steps=settings.steps, rate=settings.batch
        )
    # full batches draw nothing; a sampled run draws its rows from ``sampling`` or fresh entropy
    rng = None if full else sampling if sampling is not None else np.random.default_rng()
    weights = (
        np.zeros((classes, x.shape[1])) if start is None else np.array(start, dtype=np.float64)
    )
    for _ in range(settings.steps):
        rows = slice(None) if rng is None else rng.random(len(x)) < settings.batch
        total = clipped_gradient_sum(x[rows], y[rows], weights, settings.clip)
        if sigma:
            total = noise(total, sigma * settings.clip)
        weights = weights - settings.lr * total / max(settings.batch * len(x), 1.0)
    return weights


class Reference:
    """One split's embeddings (private and test), its label set and the public inputs."""

    def __init__(self, split: str) -> None:
        bench = Bench(split)
        self.split = split
        self.real = bench.real()
        self.label_set = list(bench.label_set)
        index = {label: n for n, label in enumerate(self.label_set)}
        self.y = np.array([index[label] for label in bench.labels], dtype=np.int64)
        self.test_y = np.array([index.get(label, -1) for label in bench.test_labels])
        embed = bench.embedder.encode
        private = np.asarray(embed(bench.texts), dtype=np.float64)
        test = np.asarray(embed(bench.test_texts), dtype=np.float64)
        names = name_directions(embed(self.label_set))
        vocabulary = bench.vocabulary
        phrases = bench.cache.lookup(
            phrases=vocabulary.phrases,
            fingerprint=vocabulary.fingerprint,
            indices=np.arange(min(PUBLIC_PHRASES, len(vocabulary)), dtype=np.int64),
            embedder=bench.embedder,  # type: ignore[arg-type]
        )
        basis = public_basis(np.asarray(phrases), SUGGESTED_SUBSPACE)
        # private rows, test rows and the centred names (the start's direction), in the
        # whole space and in the subspace: computed once, read by every run
        self.spaces = {
            False: self._space(private, test, names),
            True: self._space(
                project_units(private, basis),
                project_units(test, basis),
                name_directions(names @ basis),
            ),
        }

    @staticmethod
    def _space(
        private: NDArray[np.float64], test: NDArray[np.float64], names: NDArray[np.float64]
    ) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
        start = np.hstack([names - names.mean(axis=0), np.zeros((len(names), 1))])
        return features(private), features(test), start

    def inputs(
        self, settings: Settings
    ) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
        """Private rows, test rows and the centred names, in the settings' space."""
        return self.spaces[settings.subspace]

    def names_only(self, settings: Settings) -> float:
        """The start alone: each test row's class is the one whose centred label-name
        embedding scores it highest (public inputs only)."""
        _, test, start = self.inputs(settings)
        return float(((test @ start.T).argmax(axis=1) == self.test_y).mean())

    def accuracy(self, epsilon: float, settings: Settings, seed: int | None = None) -> float:
        """One run of the learner (OpenDP's noise, or a seeded block's) on the test rows;
        ``seed`` fixes its Poisson samples (a paired comparison), None draws them fresh."""
        private, test, start = self.inputs(settings)
        weights = dp_gradient_descent(
            private,
            self.y,
            len(self.label_set),
            epsilon=epsilon,
            delta=DELTA,
            settings=settings,
            start=settings.names * start,
            sampling=None if seed is None else np.random.default_rng(seed),
        )
        return float(((test @ weights.T).argmax(axis=1) == self.test_y).mean())


GRID = {
    "steps": (1, 2, 4, 8, 16),
    "lr": (0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0),
    "names": (0.0, 1.0, 2.0, 4.0, 8.0, 16.0),
    "subspace": (False, True),
    "batch": (1.0,),
}


def tune(
    split: str, epsilon: float, seeds: Sequence[int], grid: dict[str, Sequence[Any]] | None = None
) -> dict[str, Any]:
    """Every setting of ``grid`` (default :data:`GRID`) on ``split`` (a tuning split), the
    same seeded draws for each; the best by mean accuracy."""
    ref = Reference(split)
    grid = {**GRID, **(grid or {})}
    results = []
    for values in itertools.product(*(grid[k] for k in GRID)):
        settings = Settings(**dict(zip(GRID, values, strict=True)))
        scores = []
        for seed in seeds:  # the same draws for every setting: a paired comparison
            with seeded_noise(seed):
                scores.append(ref.accuracy(epsilon, settings, seed=seed))
        results.append({"settings": asdict(settings), "mean": float(np.mean(scores))})
    best = max(results, key=lambda r: r["mean"])
    return {"split": split, "real": ref.real, "epsilon": epsilon, "best": best, "grid": results}


def measure(split: str, epsilon: float, settings: Settings, runs: int) -> dict[str, Any]:
    """``runs`` fresh OpenDP runs of one setting on ``split``."""
    ref = Reference(split)
    scores = [ref.accuracy(epsilon, settings) for _ in range(runs)]
    return {
        "split": split,
        "epsilon": epsilon,
        "settings": asdict(settings),
        "real": ref.real,
        "scores": scores,
        "mean": float(np.mean(scores)),
        "fraction": float(np.mean(scores)) / ref.real,
        "noise_free": ref.accuracy(math.inf, settings),
        "names_only": ref.names_only(settings),
    }


def _parsed(field: str, text: str) -> Any:
    """A command-line value for a :class:`Settings` field, of the field's type."""
    kind = type(asdict(Settings())[field])
    return text == "true" if kind is bool else kind(text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("tune", "measure"))
    parser.add_argument("split")
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--seeds", default="0-4", help="tune: seeds of the paired draws")
    parser.add_argument("--runs", type=int, default=10, help="measure: fresh runs")
    parser.add_argument(
        "--grid", action="append", default=[], help="tune: a field's values, e.g. lr=1,2,4"
    )
    for field, default in asdict(Settings()).items():
        parser.add_argument(f"--{field}", type=functools.partial(_parsed, field), default=default)
    args = parser.parse_args(argv)
    started = time.time()
    if args.action == "tune":
        grid = {}
        for item in args.grid:
            field, _, values = item.partition("=")
            grid[field] = [_parsed(field, v) for v in values.split(",")]
        record = tune(args.split, args.epsilon, parse_seeds(args.seeds), grid)
        shown = {k: v for k, v in record.items() if k != "grid"}
    else:
        settings = Settings(**{f: getattr(args, f) for f in asdict(Settings())})
        record = measure(args.split, args.epsilon, settings, args.runs)
        shown = record
    record = {"action": args.action, **record, "seconds": round(time.time() - started, 1)}
    with OUT.open("a") as out:
        out.write(json.dumps(record) + "\n")
    print(json.dumps(shown, indent=1))


if __name__ == "__main__":
    main()
