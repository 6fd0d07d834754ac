"""Head-to-head: DP-KPS, Aug-PE, PATE-tutor and DP-EDA at equal (ε, δ), same LLM, same
classifier (issues 17, 18, 19).

For each data set and each ε (1 and 4, δ = 1/(N ln N) with N the private documents):

* **DP-KPS** (``workers.methods.dpkps``): ``total`` = the released documents, split by
  noisy class counts, Gaussian noise at the run's (ε, δ); each sequence prompted once
  through the LLM. Scored on its texts and on its keyphrase sequences.
* **Aug-PE** (``workers.methods.aug_pe``): the library's example settings (rank
  selection, keep_selected, fill-in-the-blanks, k = 1, L2) with the population, the
  folds and T scaled down as stated in the report; ``num_released`` = the released
  documents.
* **PATE-tutor** (``workers.methods.pate_tutor``): the paper's M = 15 teachers and the
  keyseed defaults for the pools (Q = 100 votes, 200 negatives, 300 candidates), scaled
  down as stated; ``num_released`` = the released documents.
* **DP-EDA** (``workers.methods.dp_eda``): the paper's K = 300, N_pb = 1000, N_cld = 3000
  and T = 7, scaled down as stated; k = released ÷ classes parents per class (DP-EDA
  releases at most k per class); the default decoder (LLM reconstruction from the
  ``english`` vocabulary's nearest phrases).

All use one server of the packaged SmolLM2-135M (``workers.llm.local``, the batched
engine, same ``max_tokens`` and concurrency), the same sentence embedder, and the
classifier of the utility benchmark (``workers.evaluation.classifier``,
``DEFAULT_CLASSIFIER``) scored on the same held-out real documents. Reported per method:
accuracy, LLM calls, prompt and completion tokens, wall time (the whole method, LLM
included), and calls per 1,000 released documents.

Data (``../shared/data/``, see its README): AG News (``ag_news_test.csv``: a seeded
shuffle split into private and test) and Yelp business categories (``yelp_dev.csv`` as
the private corpus, ``yelp_test.csv`` as the test set, ``label1``). A missing file skips
that data set with a message.

Sizes are parameters (:class:`Sizes`). ``FULL`` is the issue's setting (Aug-PE at its
published example: population 2,000, T = 10, f = 3); it does not fit on 2 CPU cores in
a working session. ``QUICK`` (``--quick``) is what ``make bench`` records by default:

    python -m benchmarks.run --only bench_methods            # QUICK (default)
    python -m benchmarks.bench_methods --full                # FULL, hours to days
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import random
import sys
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks.bench_low_epsilon import accuracy
from workers.evaluation.classifier import DEFAULT_CLASSIFIER
from workers.llm.client import LLMCosts, LLMEndpoint
from workers.methods.aug_pe import AugPEParams
from workers.methods.checkpoints import MemoryCheckpoints
from workers.methods.dp_eda import DPEDAParams
from workers.methods.dpkps.config import GenerationConfig
from workers.methods.dpkps.pipeline import generate_sequences
from workers.methods.dpkps.prompting import PromptSpec, run_prompts
from workers.methods.pate_tutor import PateTutorParams
from workers.methods.registry import LLM_METHODS
from workers.settings import CoreSettings
from workers.text.embeddings import EmbeddingCache, SentenceEmbedder
from workers.text.vocabulary import load_vocabulary

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("KEYSEED_SHARED", REPO.parent / "shared")) / "data"
EPSILONS = (1.0, 4.0)
METHODS = ("dpkps", "aug-pe", "pate-tutor", "dp-eda")
SEED = 0


@dataclass(frozen=True)
class Sizes:
    private: int  # private documents (N)
    test: int  # held-out real documents the classifier is scored on
    released: int  # documents each method releases
    population: int  # Aug-PE N_t
    iterations: int  # Aug-PE T
    initial_folds: int  # Aug-PE f_0
    folds: int  # Aug-PE f
    max_tokens: int  # per completion, every method
    concurrency: int  # client concurrency, every method
    teachers: int = 15  # PATE-tutor M
    queries: int = 100  # PATE-tutor Q (pool B)
    negatives: int = 200  # PATE-tutor pool A
    candidates: int = 300  # PATE-tutor pool C (≥ released)
    eda_iterations: int = 7  # DP-EDA T
    eda_domain: int = 300  # DP-EDA K
    eda_initial: int = 1000  # DP-EDA N_pb per class (≥ K + 1)
    eda_offspring: int = 3000  # DP-EDA N_cld per class (≥ K + 1)


FULL = Sizes(
    private=5000,
    test=1600,
    released=2000,
    population=2000,
    iterations=10,
    initial_folds=3,
    folds=3,
    max_tokens=128,
    concurrency=8,
)
QUICK = Sizes(
    private=300,
    test=400,
    released=40,
    population=20,
    iterations=2,
    initial_folds=1,
    folds=1,
    max_tokens=48,
    concurrency=8,
    teachers=5,
    queries=40,
    negatives=40,
    candidates=80,
    eda_iterations=2,
    eda_domain=10,
    eda_initial=16,
    eda_offspring=16,
)


@dataclass(frozen=True)
class Dataset:
    name: str
    document_type: str
    private_texts: list[str]
    private_labels: list[str]
    test_texts: list[str]
    test_labels: list[str]

    @property
    def labels(self) -> list[str]:
        return sorted(set(self.private_labels) | set(self.test_labels))


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def _sample(rows: list[dict[str, str]], n: int, rng: random.Random) -> list[dict[str, str]]:
    rows = list(rows)
    rng.shuffle(rows)
    return rows[:n]


def ag_news(sizes: Sizes) -> Dataset | None:
    path = DATA / "ag_news_test.csv"
    if not path.exists():
        print(f"[bench_methods] {path} missing: AG News skipped", file=sys.stderr)
        return None
    rows = _sample(_rows(path), sizes.test + sizes.private, random.Random(SEED))

    def text(row: dict[str, str]) -> str:
        parts = (" ".join(row[c].split()) for c in ("title", "description"))
        return ". ".join(p for p in parts if p)

    test, private = rows[: sizes.test], rows[sizes.test :]
    return Dataset(
        "AG News",
        "news article",
        [text(r) for r in private],
        [r["class"] for r in private],
        [text(r) for r in test],
        [r["class"] for r in test],
    )


def yelp(sizes: Sizes) -> Dataset | None:
    dev, test_path = DATA / "yelp_dev.csv", DATA / "yelp_test.csv"
    if not (dev.exists() and test_path.exists()):
        print(f"[bench_methods] {dev} or {test_path} missing: Yelp skipped", file=sys.stderr)
        return None
    rng = random.Random(SEED)
    private = _sample(_rows(dev), sizes.private, rng)
    test = _sample(_rows(test_path), sizes.test, rng)

    def label(row: dict[str, str]) -> str:
        return row["label1"].removeprefix("Business Category: ").strip()

    return Dataset(
        "Yelp business category",
        "business review",
        [" ".join(r["text"].split()) for r in private],
        [label(r) for r in private],
        [" ".join(r["text"].split()) for r in test],
        [label(r) for r in test],
    )


def delta_for(n: int) -> float:
    """The paper's δ = 1/(N ln N)."""
    return 1.0 / (n * math.log(n))


class Harness:
    def __init__(self, sizes: Sizes, endpoint: LLMEndpoint) -> None:
        self.sizes = sizes
        self.endpoint = replace(endpoint, max_tokens=sizes.max_tokens)
        self.embedder = SentenceEmbedder()
        self.cache = EmbeddingCache(CoreSettings().embedding_cache_dir)
        self.vocabulary = load_vocabulary("english")

    def score(self, data: Dataset, texts: list[str], labels: list[str]) -> float:
        return accuracy(texts, labels, data.test_texts, data.test_labels, embedder=self.embedder)

    def dpkps(self, data: Dataset, epsilon: float, delta: float) -> dict[str, Any]:
        started = time.perf_counter()
        config = GenerationConfig(
            epsilon=epsilon,
            delta=delta,
            noise="gaussian",
            per_class=None,
            total=self.sizes.released,
        ).validate()
        result = generate_sequences(
            data.private_texts,
            data.private_labels,
            label_set=data.labels,
            vocabulary=self.vocabulary,
            config=config,
            embedder=self.embedder,
            cache=self.cache,
        )
        costs = LLMCosts()
        outcomes = run_prompts(
            [list(s.keyphrases) for s in result.sequences],
            endpoint=self.endpoint,
            spec=PromptSpec(document_type=data.document_type).validate(),
            concurrency=self.sizes.concurrency,
            costs=costs,
        )
        wall = time.perf_counter() - started
        kept = [
            (s.label, o.text) for s, o in zip(result.sequences, outcomes, strict=True) if o.text
        ]
        return {
            "method": "dpkps",
            "epsilon_spent": float(result.report.epsilon),
            "released": len(kept),
            "accuracy": self.score(data, [t for _, t in kept], [x for x, _ in kept]),
            "accuracy_sequences": self.score(
                data,
                [" ".join(s.keyphrases) for s in result.sequences],
                [s.label for s in result.sequences],
            ),
            "wall_seconds": wall,
            **_costs(costs),
        }

    def _llm_params(self, data: Dataset, epsilon: float, delta: float) -> dict[str, Any]:
        """The parameters every LLM method takes alike: the corpus's document type, the
        budget, the sampling settings and the seed."""
        return {
            "document_type": data.document_type,
            "epsilon": epsilon,
            "delta": delta,
            "max_tokens": self.sizes.max_tokens,
            "concurrency": self.sizes.concurrency,
            "seed": SEED,
        }

    def aug_pe(self, data: Dataset, epsilon: float, delta: float) -> dict[str, Any]:
        s = self.sizes
        params = AugPEParams(
            **self._llm_params(data, epsilon, delta),
            iterations=s.iterations,
            population=s.population,
            num_released=s.released,
            initial_variation_folds=s.initial_folds,
            variation_folds=s.folds,
        )
        row = self._llm_method("aug-pe", data, params)
        row["histogram_sigma"] = row["noise"]["histogram_sigma"]
        return row

    def _llm_method(self, method: str, data: Dataset, params: Any, **extra: Any) -> dict[str, Any]:
        entry = LLM_METHODS[method]
        started = time.perf_counter()
        result = entry.run(
            data.private_texts,
            data.private_labels,
            label_set=data.labels,
            units=None,
            params=params,
            llm=self.endpoint,
            embedder=self.embedder,
            checkpoints=MemoryCheckpoints(),
            **extra,
        )
        wall = time.perf_counter() - started
        texts = [t for _, t in result.records]
        return {
            "method": method,
            "epsilon_spent": float(result.manifest["privacy"]["epsilon"]),
            "released": len(result.records),
            "accuracy": (
                self.score(data, texts, [x for x, _ in result.records])
                if len({x for x, _ in result.records}) > 1
                else 1.0 / len(data.labels)  # fewer than two classes released: chance
            ),
            "wall_seconds": wall,
            "noise": result.manifest.get("noise", {}),
            **_costs(result.llm_costs),
        }

    def pate_tutor(self, data: Dataset, epsilon: float, delta: float) -> dict[str, Any]:
        s = self.sizes
        params = PateTutorParams(
            **self._llm_params(data, epsilon, delta),
            teachers=s.teachers,
            queries=s.queries,
            negatives=s.negatives,
            candidates=s.candidates,
            num_released=s.released,
        )
        return self._llm_method("pate-tutor", data, params)

    def dp_eda(self, data: Dataset, epsilon: float, delta: float) -> dict[str, Any]:
        s = self.sizes
        parents = max(2, s.released // len(data.labels))  # at most k released per class
        params = DPEDAParams(
            **self._llm_params(data, epsilon, delta),
            iterations=s.eda_iterations,
            domain=max(s.eda_domain, parents),
            parents=parents,
            initial_population=s.eda_initial,
            offspring=s.eda_offspring,
        )
        return self._llm_method(
            "dp-eda", data, params, vocabulary=self.vocabulary, cache=self.cache
        )


def _costs(costs: LLMCosts) -> dict[str, Any]:
    return {
        "calls": costs.calls,
        "prompt_tokens": costs.prompt_tokens,
        "completion_tokens": costs.completion_tokens,
    }


def run(
    *, quick: bool = True, sizes: Sizes | None = None, methods: tuple[str, ...] = METHODS
) -> dict[str, Any]:
    from workers.llm.local import LocalLLMServer

    sizes = sizes or (QUICK if quick else FULL)
    datasets = [d for d in (ag_news(sizes), yelp(sizes)) if d is not None]
    out: dict[str, Any] = {
        "preset": "quick" if sizes == QUICK else "full" if sizes == FULL else "custom",
        "sizes": asdict(sizes),
        "classifier": DEFAULT_CLASSIFIER,
        "rows": [],
        "real": {},
    }
    with LocalLLMServer(max_tokens=sizes.max_tokens, request_timeout=900.0) as server:
        h = Harness(sizes, server.endpoint)
        out["llm"] = {"model": server.model_name, "engine": server.engine, "slots": server.slots}
        for data in datasets:
            n = len(data.private_texts)
            out["real"][data.name] = h.score(data, data.private_texts, data.private_labels)
            for epsilon in EPSILONS:
                delta = delta_for(n)
                for method in (getattr(h, name.replace("-", "_")) for name in methods):
                    print(
                        f"[bench_methods] {data.name} ε={epsilon:g} {method.__name__}",
                        file=sys.stderr,
                    )
                    row = method(data, epsilon, delta)
                    row.update(
                        dataset=data.name,
                        private=n,
                        classes=len(data.labels),
                        epsilon=epsilon,
                        delta=delta,
                    )
                    out["rows"].append(row)
                    print(f"[bench_methods] {json.dumps(row)}", file=sys.stderr, flush=True)
    return out


def markdown(r: dict[str, Any]) -> str:
    s = r["sizes"]
    lines = [
        "## Head-to-head: DP-KPS, Aug-PE, PATE-tutor, DP-EDA (`benchmarks/bench_methods.py`)",
        "",
        f"Preset **{r['preset']}**"
        + (
            " (scaled down to fit the session on 2 busy CPU cores; NOT the issue's full size)"
            if r["preset"] != "full"
            else ""
        )
        + (
            f"; rows of {', '.join(r['partial_rerun'])} re-run after the others (same "
            "sizes, same data)"
            if r.get("partial_rerun")
            else ""
        )
        + f": {s['private']} private documents, {s['test']} held-out test documents, "
        f"{s['released']} released documents per method; Aug-PE population {s['population']}, "
        f"T = {s['iterations']}, f₀ = {s['initial_folds']}, f = {s['folds']} (the published "
        "example: population 2,000, T = 10, f₀ = f = 3; other settings as published: rank "
        "selection, keep_selected, fill-in-the-blanks, k = 1, L2); PATE-tutor "
        f"M = {s.get('teachers', 15)} teachers, Q = {s.get('queries', 100)} votes, "
        f"{s.get('negatives', 200)} negatives, {s.get('candidates', 300)} candidates (keyseed "
        "defaults: M = 15, Q = 100, 200, 300); DP-EDA T = "
        f"{s.get('eda_iterations', 7)}, K = {s.get('eda_domain', 300)}, N_pb = "
        f"{s.get('eda_initial', 1000)}, N_cld = {s.get('eda_offspring', 3000)} (the paper: "
        "T = 7, K = 300, N_pb = 1000, N_cld = 3000), released ÷ classes parents per class, "
        "LLM-reconstruction decoder. Same LLM for all: "
        f"{r['llm']['model']} on the {r['llm']['engine']} engine ({r['llm']['slots']} slots), "
        f"max_tokens {s['max_tokens']}, client concurrency {s['concurrency']}; same embedder; "
        f"classifier `{r['classifier']}`; δ = 1/(N ln N). One run each: at these sizes the "
        "accuracies carry several points of run-to-run noise.",
        "",
        "| data | ε | method | accuracy | (sequences) | released | LLM calls | "
        "calls / 1,000 docs | prompt tokens | completion tokens | wall (s) |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in r["rows"]:
        seq = f"{row['accuracy_sequences']:.3f}" if "accuracy_sequences" in row else "–"
        per_k = f"{1000 * row['calls'] / row['released']:,.0f}" if row["released"] else "–"
        accuracy = f"**{row['accuracy']:.3f}**"
        if row["released"] == 0:
            accuracy = f"{row['accuracy']:.3f} (chance: nothing released)"
        lines.append(
            f"| {row['dataset']} | {row['epsilon']:g} | {row['method']} | "
            f"{accuracy} | {seq} | {row['released']} | {row['calls']:,} | "
            f"{per_k} | {row['prompt_tokens']:,} | {row['completion_tokens']:,} | "
            f"{row['wall_seconds']:.0f} |"
        )
    lines += ["", "Trained on the real private documents (same classifier): "]
    lines[-1] += "; ".join(f"{name} {acc:.3f}" for name, acc in r["real"].items()) + "."
    by: dict[tuple[str, float], dict[str, Any]] = defaultdict(dict)
    for row in r["rows"]:
        by[(row["dataset"], row["epsilon"])][row["method"]] = row
    verdicts = []
    for (name, epsilon), pair in by.items():
        if {"dpkps", "aug-pe"} <= pair.keys():
            d, a = pair["dpkps"], pair["aug-pe"]
            ratio = a["calls"] / d["calls"] if d["calls"] else float("inf")
            met = d["accuracy"] >= a["accuracy"] and ratio >= 30
            verdicts.append(
                f"{name} ε = {epsilon:g}: accuracy {d['accuracy']:.3f} vs {a['accuracy']:.3f}, "
                f"Aug-PE made {ratio:.1f}× DP-KPS's calls ({'met' if met else 'NOT met'})"
            )
    lines += _dp_eda_thresholds(r)
    lines += [
        "",
        "Target (issue 17): DP-KPS at least as accurate as Aug-PE with at most 1/30 of its "
        "LLM calls. " + "; ".join(verdicts) + ".",
        "",
        "PATE-tutor keeps the best-scored candidates of each class in the tutor's noisy "
        "proportions, at most the candidates that class has (pool C split evenly over the "
        "classes), so with many classes it can release fewer documents than asked.",
        "",
        "At the quick preset Aug-PE's call count is far below its published setting "
        "(each released document costs N_t(1+f₀) + (T−1)·N_t·f calls over N_T documents); at "
        "the full setting it makes about 34 calls per released document against DP-KPS's 1.",
        "",
        "Full run (hours on a GPU or a hosted LLM; days on 2 CPU cores): "
        "`python -m benchmarks.bench_methods --full` (or `make bench` after changing the "
        "preset).",
        "",
    ]
    return "\n".join(lines)


def _dp_eda_thresholds(r: dict[str, Any]) -> list[str]:
    """Why a DP-EDA row may release little or nothing: its LimitedDomain threshold gap
    (public parameters only) beside the documents a class has to vote with."""
    from workers.methods.dp_eda.accounting import noise_plan

    s = r["sizes"]
    rows = [row for row in r["rows"] if row["method"] == "dp-eda"]
    if not rows:
        return []
    lines = [
        "",
        "DP-EDA's LimitedDomain keeps a parent only if its vote count clears a noisy "
        "threshold, k·T Gumbel peels sharing ε. At these sizes (computed from the public "
        "parameters; a class's documents are the even share):",
        "",
        "| data | ε | parents k per class | ε per peel | Gumbel scale | threshold gap "
        "(votes) | documents per class | released |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        classes = row.get("classes") or _CLASSES.get(row["dataset"], 2)
        parents = max(2, s["released"] // classes)
        params = DPEDAParams(
            document_type="x",
            epsilon=row["epsilon"],
            delta=row["delta"],
            iterations=s.get("eda_iterations", 7),
            domain=max(s.get("eda_domain", 300), parents),
            parents=parents,
            initial_population=s.get("eda_initial", 1000),
            offspring=s.get("eda_offspring", 3000),
        )
        cal = noise_plan(params, [str(c) for c in range(classes)]).calibration
        lines.append(
            f"| {row['dataset']} | {row['epsilon']:g} | {parents} | {cal.epsilon:.3g} | "
            f"{cal.scale:.3g} | {cal.gap(params.offspring):.1f} | "
            f"{row['private'] // classes} | {row['released']} |"
        )
    lines += [
        "",
        "A class whose best candidate gets fewer votes than the gap releases nothing "
        "(the run stops there, a function of DP outputs); DP-EDA needs far more documents "
        "per class, or fewer parents, at a privacy officer's ε.",
    ]
    return lines


_CLASSES = {"AG News": 4, "Yelp business category": 10}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--full", action="store_true", help="the issue's sizes (FULL)")
    parser.add_argument("--quick", action="store_true", help="the QUICK preset (default)")
    parser.add_argument(
        "--methods",
        nargs="+",
        choices=METHODS,
        default=list(METHODS),
        help="run these methods only; with --update, the other rows stay as stored",
    )
    parser.add_argument(
        "--update",
        type=Path,
        default=None,
        help="BENCHMARKS.json: replace its bench_methods rows of --methods, keep the others",
    )
    args = parser.parse_args(argv)
    results = run(quick=not args.full, methods=tuple(args.methods))
    if args.update is not None:
        stored = json.loads(args.update.read_text())
        earlier = stored.get("bench_methods")
        if earlier and earlier["sizes"] == results["sizes"]:
            kept = [row for row in earlier["rows"] if row["method"] not in args.methods]
            results["rows"] = sorted(
                kept + results["rows"],
                key=lambda row: (row["dataset"], row["epsilon"], METHODS.index(row["method"])),
            )
            results["partial_rerun"] = list(args.methods)
        stored["bench_methods"] = results
        args.update.write_text(json.dumps(stored, indent=1, default=str))
    print(json.dumps(results, indent=1), file=sys.stderr)
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
