"""What the audit's canaries cost an LLM method's release (issue 66, item 3): Aug-PE.

Aug-PE releases LLM texts selected by its private documents' noisy nearest-neighbour
votes; canaries join those votes. Here the "LLM" is a public pool of real news texts
(AG News rows the private split does not hold, their labels unread): asked for a new text
of a class it gives the next text of that class's stream of the pool (the classes' streams
are disjoint and fixed), so what the selection does is all that varies, and the released
(label, text) pairs are real texts whose label the selection chose. One iteration (T = 1):
every class's candidates are its share of ``--population`` pool texts, and the
``--released`` best by noisy votes are released.

For each seed, two runs side by side in one process: the private documents alone, and
with the job's canaries added as the worker adds them (:func:`app.jobs.stages.with_canaries`:
64 canaries from the rare half of the first 50,000 English words, each in by a fair coin).
Both runs of a seed draw the same Gaussian noise (OpenDP's sampler replaced by a seeded
numpy draw: a diagnostic) and ask the pool in the same order (concurrency 1), so their
difference is the canaries'. The service's holdout classifier (TF-IDF, seed 0) trained on
each release labels the test texts; each line gives both accuracies, the texts the two
releases share, and the audit's figures on the run with canaries.

Run: ``KEYSEED_SHARED=/work/shared python -m benchmarks.bench_llm_canaries
[--private 1200] [--population 1000] [--released 400] [--epsilon 1] [--seeds 0 1 2]``;
one JSON line per pair, then a summary.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from app.jobs.stages import PrivateCorpus, with_canaries
from tests.fake_llm import FakeLLM, Turns, asked_class, echoed_text, last_message
from workers.evaluation.holdout import predict
from workers.methods.aug_pe import run_aug_pe
from workers.methods.aug_pe.params import AugPEParams
from workers.methods.checkpoints import MemoryCheckpoints
from workers.methods.registry import LLM_CANARY_WORDS
from workers.privacy import noise as samplers
from workers.privacy.audit import make_canaries, run_audit
from workers.text.embeddings import SentenceEmbedder
from workers.text.vocabulary import load_vocabulary

LABELS = ["Business", "Sci/Tech", "Sports", "World"]
POOL_FROM, TEST_FROM, TEST_ROWS = 3_800, 6_800, 800


def _rows() -> list[tuple[str, str]]:
    shared = Path(os.environ.get("KEYSEED_SHARED", "../shared"))
    with (shared / "data" / "ag_news_test.csv").open(newline="", encoding="utf-8") as handle:
        return [(f"{r['title']}. {r['description']}", r["class"]) for r in csv.DictReader(handle)]


class PublicPool:
    """The test "LLM": class k's i-th new text is the pool's text k + 4·i; a variation
    echoes its prompt's text."""

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts
        self.turns = Turns()

    def __call__(self, body: Any) -> str:
        user = last_message(body)
        label = asked_class(user)
        if label is None:
            return echoed_text(user) or ""
        i = self.turns.next(label)
        return self.texts[(LABELS.index(label) + len(LABELS) * i) % len(self.texts)]


@contextmanager
def seeded(seed: int) -> Iterator[None]:
    """OpenDP's Gaussian sampler replaced by a seeded numpy draw (diagnostic only)."""
    rng = np.random.default_rng(10_000 + seed)
    saved = samplers._add

    def add(noise: str, data: Any, scale: float) -> list[float]:
        assert noise == "gaussian"
        values = np.asarray(data, dtype=np.float64)
        return list((values + rng.normal(0.0, scale, size=values.shape)).tolist())

    samplers._add = add
    try:
        yield
    finally:
        samplers._add = saved


def release(
    corpus: PrivateCorpus, pool: list[str], params: AugPEParams, seed: int, embedder: Any
) -> list[tuple[str, str]]:
    with seeded(seed), FakeLLM(content_fn=PublicPool(pool)) as fake:
        result = run_aug_pe(
            corpus.texts,
            corpus.labels,
            params=params,
            label_set=LABELS,
            units=None,
            llm=fake.endpoint(),
            embedder=embedder,
            checkpoints=MemoryCheckpoints(),
        )
    return list(result.records)


def accuracy(released: list[tuple[str, str]], test: list[tuple[str, str]]) -> float:
    found = predict([t for _, t in released], [x for x, _ in released], [t for t, _ in test])
    return float(np.mean([p == y for p, (_, y) in zip(found, test, strict=True)]))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--private", type=int, default=1_200)
    parser.add_argument("--population", type=int, default=1_000)
    parser.add_argument("--released", type=int, default=400)
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--canaries", type=int, default=64)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    rows = _rows()
    private = PrivateCorpus(
        [t for t, _ in rows[: args.private]], [y for _, y in rows[: args.private]], None
    )
    pool = [t for t, _ in rows[POOL_FROM:TEST_FROM]]
    test = rows[TEST_FROM : TEST_FROM + TEST_ROWS]
    english = load_vocabulary("english").phrases
    embedder = SentenceEmbedder()
    params = AugPEParams(
        document_type="news article",
        epsilon=args.epsilon,
        delta=1e-6,
        iterations=1,
        population=args.population,
        initial_variation_folds=0,
        num_released=args.released,
        concurrency=1,
        max_tokens=64,
    )
    found = []
    for seed in args.seeds:
        start = time.monotonic()
        canary_set = make_canaries(
            phrases=english,
            labels=LABELS,
            count=args.canaries,
            seed=1_000_003 * (seed + 1),
            document_type="news article",
            stop=LLM_CANARY_WORDS,
        )
        plain = release(private, pool, params, seed, embedder)
        audited = release(with_canaries(private, canary_set), pool, params, seed, embedder)
        audit = run_audit(canary_set, audited, claimed_epsilon=args.epsilon, delta=1e-6)
        line = {
            "seed": seed,
            "canaries_in": sum(canary_set.included),
            "accuracy_without": accuracy(plain, test),
            "accuracy_with": accuracy(audited, test),
            "released": [len(plain), len(audited)],
            "shared_texts": len(set(plain) & set(audited)),
            "audit_correct": audit.correct,
            "audit_guesses": audit.guesses,
            "audit_bound": audit.epsilon_lower_bound,
            "seconds": round(time.monotonic() - start, 1),
        }
        line["difference"] = line["accuracy_with"] - line["accuracy_without"]
        found.append(line)
        print(json.dumps(line), flush=True)
    differences = [line["difference"] for line in found]
    summary = {
        "mean_without": statistics.mean(line["accuracy_without"] for line in found),
        "mean_with": statistics.mean(line["accuracy_with"] for line in found),
        "mean_difference": statistics.mean(differences),
        "sd_difference": statistics.stdev(differences) if len(differences) > 1 else 0.0,
        "load": os.getloadavg(),
    }
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
