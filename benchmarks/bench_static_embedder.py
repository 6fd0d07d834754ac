"""A cheaper document representation (issue 65): the static embedder distilled from the
packaged MiniLM (:mod:`benchmarks.static_embedder`) against MiniLM, in one process.

``speed``: documents embedded per CPU second (``time.process_time``, all threads) and per
wall second by MiniLM and by the static embedder, on the same documents (AG News rows,
``title. description``), with the load average before and after.

``utility SPLIT EPS …``: the DP-KPS default (total ε, δ = 1e-6; class centroids) on a
split of :mod:`benchmarks.bench_low_epsilon`, its sequences scored by that module's
classifier (MiniLM sentence embeddings + a small network, unchanged), for each variant
of the document embedder, each run's variants one after another with the same seed:

* ``minilm``: the default, MiniLM for documents and phrases alike;
* ``static``: variant (a), the static embedder for everything the engine embeds (the
  private documents, Ṽ's phrases, the label names, the consistency filter's sequences);
* ``mapped``: variant (b), the private documents by the static embedder mapped into
  MiniLM's space by a linear map fitted by least squares on PUBLIC data only (phrases of
  the public vocabulary embedded by both models), everything else by MiniLM. The engine
  has one embedder argument; the bench routes only the documents' embedding
  (``stages.embed_units``) to the mapped embedder.

Records (accuracies and settings, no text) are appended to
``benchmarks/static_embedder.jsonl``. Run: ``python -m benchmarks.bench_static_embedder
utility ag-tune 1 --runs 3`` or ``python -m benchmarks.bench_static_embedder speed``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from benchmarks.bench_low_epsilon import DELTA, Bench, ag_split
from benchmarks.static_embedder import StaticEmbedder, load_static
from workers.methods.dpkps import stages
from workers.methods.dpkps.density import centroid
from workers.settings import CoreSettings
from workers.text.embeddings import Embedder, SentenceEmbedder

OUT = Path(__file__).resolve().parent / "static_embedder.jsonl"
VARIANTS = ("minilm", "static", "mapped")
MAP_PHRASES = 20_000  # public phrases the linear map is fitted on
MAP_RIDGE = 1e-3


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def fit_map(
    static: Embedder, minilm: NDArray[np.float32], phrases: Sequence[str]
) -> tuple[NDArray[np.float64], float]:
    """USES ONLY PUBLIC INPUTS: ``[s, 1] @ W ≈ m`` by ridge least squares over ``phrases``
    (``s`` their static embeddings, ``m`` their MiniLM ones, ``minilm``); the map and its R²
    on a held-out fifth."""
    s = np.asarray(static.encode(phrases), dtype=np.float64)
    m = np.asarray(minilm, dtype=np.float64)
    x = np.hstack([s, np.ones((len(s), 1))])
    cut = len(x) * 4 // 5
    w = np.linalg.solve(x[:cut].T @ x[:cut] + MAP_RIDGE * np.eye(x.shape[1]), x[:cut].T @ m[:cut])
    residual = m[cut:] - x[cut:] @ w
    r2 = 1.0 - float((residual**2).sum() / ((m[cut:] - m[cut:].mean(0)) ** 2).sum())
    w = np.linalg.solve(x.T @ x + MAP_RIDGE * np.eye(x.shape[1]), x.T @ m)
    return w, r2


class MappedEmbedder:
    """The static embedder's rows mapped by ``[s, 1] @ W`` and L2-normalised."""

    def __init__(self, static: StaticEmbedder, w: NDArray[np.float64]) -> None:
        self.static, self.w = static, w

    @property
    def name(self) -> str:
        return f"{self.static.name}-mapped"

    @property
    def dim(self) -> int:
        return int(self.w.shape[1])

    def encode(self, texts: Sequence[str], *, batch_size: int = 256) -> NDArray[np.float32]:
        s = np.asarray(self.static.encode(texts), dtype=np.float64)
        y = np.hstack([s, np.ones((len(s), 1))]) @ self.w
        y /= np.maximum(np.linalg.norm(y, axis=1, keepdims=True), 1e-12)
        return y.astype(np.float32)


class DocumentsApart:
    """``inner`` for everything the engine embeds, ``documents`` for the private documents
    (routed by :func:`_route_documents`)."""

    def __init__(self, inner: Embedder, documents: Embedder) -> None:
        self.inner, self.documents = inner, documents

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def dim(self) -> int:
        return self.inner.dim

    def encode(self, texts: Sequence[str], *, batch_size: int = 256) -> NDArray[np.float32]:
        return self.inner.encode(texts, batch_size=batch_size)


def _route_documents() -> None:
    """``stages.embed_units`` (the documents' embedding) given ``DocumentsApart`` uses its
    document embedder; any other embedder as before."""
    original: Callable[..., Any] = centroid.embed_units

    def embed_units(embedder: Any, documents: Any, units: Any, **kw: Any) -> Any:
        return original(getattr(embedder, "documents", embedder), documents, units, **kw)

    stages.embed_units = embed_units  # type: ignore[assignment]


def speed(n_minilm: int, n_static: int) -> dict[str, Any]:
    """Documents per CPU second and per wall second, MiniLM then static, same documents."""
    texts = ag_split(0, 7600)[0] + ag_split(0, 7600)[2]
    random.Random(1).shuffle(texts)
    record: dict[str, Any] = {"kind": "speed", "load_before": load()}
    static = load_static(CoreSettings().cache_dir)
    minilm = SentenceEmbedder()
    minilm.encode(texts[:8])
    static.encode(texts[:8])
    for name, embedder, n in (("minilm", minilm, n_minilm), ("static", static, n_static)):
        batch = texts[:n]
        wall, cpu = time.perf_counter(), time.process_time()
        embedder.encode(batch)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        record[name] = {"documents": n, "per_cpu_s": n / cpu, "per_wall_s": n / wall}
    record["ratio_per_cpu_s"] = record["static"]["per_cpu_s"] / record["minilm"]["per_cpu_s"]
    record["load_after"] = load()
    return record


def mapped_embedder(bench: Bench, static: StaticEmbedder) -> tuple[MappedEmbedder, float]:
    """The static embedder mapped into MiniLM's space (:func:`fit_map`) on a seeded sample
    of ``MAP_PHRASES`` phrases of the public vocabulary, their MiniLM rows from the shared
    cache; and the map's held-out R²."""
    vocabulary = bench.vocabulary
    picked = np.array(
        sorted(random.Random(0).sample(range(len(vocabulary)), MAP_PHRASES)), dtype=np.int64
    )
    rows = bench.cache.lookup(
        phrases=vocabulary.phrases,
        fingerprint=vocabulary.fingerprint,
        indices=picked,
        embedder=bench.embedder.inner,
    )
    w, r2 = fit_map(static, rows, [vocabulary.phrases[i] for i in picked])
    return MappedEmbedder(static, w), r2


def separation(split: str, epsilon: float) -> dict[str, Any]:
    """A diagnostic that READS THE PRIVATE SPLIT (nothing like it is released): how far
    apart each document representation puts the classes, before any noise. Per variant:
    the leave-one-out nearest class-mean accuracy of the private documents, their median
    margin (:func:`benchmarks.bench_low_epsilon.score_margins`) and the median margin
    against the noise of the default's release at ``epsilon`` (margin · n_c / (σ√2))."""
    from benchmarks.bench_low_epsilon import class_sum_noise, score_margins

    bench = Bench(split)
    static = load_static(CoreSettings().cache_dir)
    mapped, r2 = mapped_embedder(bench, static)
    sigma = class_sum_noise(bench.config(epsilon, 0, {}), bench.label_set, len(bench.vocabulary))
    names = sorted(set(bench.labels))
    y = np.array([names.index(label) for label in bench.labels])
    record: dict[str, Any] = {"kind": "separation", "split": split, "epsilon": epsilon}
    for name, embedder in (("minilm", bench.embedder), ("static", static), ("mapped", mapped)):
        x = np.asarray(embedder.encode(bench.texts), dtype=np.float64)
        margin, size = score_margins(x, bench.labels)
        sums = np.stack([x[y == c].sum(axis=0) for c in range(len(names))])
        sizes = np.bincount(y, minlength=len(names)).astype(np.float64)
        scores = x @ sums.T
        scores[np.arange(len(x)), y] -= (x * x).sum(axis=1)  # leave the document out
        scores /= np.maximum(sizes - (np.arange(len(names))[None, :] == y[:, None]), 1)
        record[name] = {
            "loo_nearest_mean": float((scores.argmax(axis=1) == y).mean()),
            "median_margin": float(np.median(margin)),
            "median_ratio": float(np.median(margin * size / (sigma * np.sqrt(2)))),
        }
    record["map_r2_heldout"] = r2
    record["load"] = load()
    return record


def utility(split: str, epsilons: Sequence[float], runs: int, variants: Sequence[str]) -> None:
    bench = Bench(split)
    minilm = bench.embedder  # MiniLM, memoised: the classifier's and the default's
    static = load_static(CoreSettings().cache_dir)
    embedders: dict[str, Any] = {"minilm": minilm, "static": static}
    info: dict[str, Any] = {}
    if "mapped" in variants:
        mapped, info["map_r2_heldout"] = mapped_embedder(bench, static)
        embedders["mapped"] = DocumentsApart(minilm, mapped)
        _route_documents()
    for epsilon in epsilons:
        accs: dict[str, list[float]] = {v: [] for v in variants}
        seconds: dict[str, float] = dict.fromkeys(variants, 0.0)
        for seed in range(runs):
            for variant in variants:
                started = time.perf_counter()
                accs[variant].append(bench.run(epsilon, seed, {}, embedder=embedders[variant]))
                seconds[variant] += time.perf_counter() - started
                print(f"{split} eps={epsilon} seed={seed} {variant}: {accs[variant][-1]:.4f}",
                      flush=True)  # fmt: skip
        record = {
            "kind": "utility",
            "split": split,
            "epsilon": epsilon,
            "delta": DELTA,
            "runs": accs,
            "mean": {v: statistics.mean(a) for v, a in accs.items()},
            "seconds": seconds,
            "load": load(),
            **info,
        }
        write(record)


def write(record: dict[str, Any]) -> None:
    with open(OUT, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")
    print(json.dumps(record), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sp = sub.add_parser("speed")
    sp.add_argument("--minilm", type=int, default=300, help="documents MiniLM embeds")
    sp.add_argument("--static", type=int, default=10_000, help="documents static embeds")
    ut = sub.add_parser("utility")
    ut.add_argument("split")
    ut.add_argument("epsilons", type=float, nargs="+")
    ut.add_argument("--runs", type=int, default=3)
    ut.add_argument("--variants", default=",".join(VARIANTS))
    se = sub.add_parser("separation")
    se.add_argument("split")
    se.add_argument("--epsilon", type=float, default=1.0)
    args = parser.parse_args(argv)
    if args.command == "speed":
        write(speed(args.minilm, args.static))
    elif args.command == "separation":
        write(separation(args.split, args.epsilon))
    else:
        utility(args.split, args.epsilons, args.runs, args.variants.split(","))


if __name__ == "__main__":
    main(sys.argv[1:])
