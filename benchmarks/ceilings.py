"""What keyphrase sequences carry of a low-ε split without a release (a non-private diagnostic).

Issue 16 asks, where a target is missed, for what limits it. The low-ε benchmark's paired
diagnostics remove the DP noise (``benchmarks/paired.py``'s ``sums-noise=0``); this one goes
one step further back and asks what the *representation* allows: the same classifier
trained on stand-ins that read the private split directly, with no release at all:

* ``own first L``: each private document's own first L distinct phrases of the run's
  public Ṽ (the first ``public_size`` phrases of the vocabulary), labelled with its class:
  a sequence of L phrases that is each document's own, coherent and exactly labelled;
* ``own frequent L``: its L most frequent phrases instead (long documents' openings are
  often quotes and greetings);
* ``independent L``: sequences of L distinct phrases drawn independently from each class's
  exact frequencies of those bags (τ = 1, as ``bench_utility``'s diagnostic): the method's
  independence without its noise, the split's class counts as the engine's ``total`` would
  split them exactly.

None of these is DP and nothing like them is released. They are reference points for
what sequences of L phrases from that Ṽ carry, not a proven bound: a rule that picks a
document's most telling phrases could beat its first or most frequent ones. Run: ``python -m
benchmarks.ceilings SPLIT [--lengths 8 16]``; the accuracies (and the real texts') are
printed and appended to ``benchmarks/ceilings.jsonl`` (no private text).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.bench_low_epsilon import SEED, SPLITS, Bench
from benchmarks.bench_utility import independent_draws, own_phrases
from workers.methods.proportions import allocate
from workers.text.extraction import KeyphraseExtractor
from workers.text.vocabulary import Vocabulary

OUT = Path(__file__).resolve().parent / "ceilings.jsonl"


def wanted_counts(labels: Sequence[str], total: int) -> dict[str, int]:
    """``total`` sequences split among the classes by their exact counts (largest
    remainders), as the engine splits a ``total`` by released counts, here without noise.

    >>> wanted_counts(["a", "a", "a", "b"], 8)
    {'a': 6, 'b': 2}
    """
    counts = Counter(labels)
    return allocate(total, {c: float(counts[c]) for c in sorted(counts)})


def ceilings(bench: Bench, lengths: Sequence[int], total: int | None = None) -> dict[str, Any]:
    """The split's stand-ins for each L of ``lengths`` (see the module's docstring), with
    the run's public Ṽ and number of sequences (``total``, or the benchmark's own)."""
    config = bench.config(1.0, SEED, {})
    size = config.public_size
    phrases = list(bench.vocabulary.phrases)[:size]
    matches = KeyphraseExtractor(Vocabulary.from_phrases("public", phrases)).extract_many(
        bench.texts
    )
    total = total or config.total or (config.per_class or 0) * len(bench.label_set)
    wanted = wanted_counts(bench.labels, total)

    def joined(bags: Sequence[Sequence[int]]) -> list[str]:
        return [" ".join(phrases[i] for i in bag) for bag in bags]

    rows: dict[str, float] = {}
    for length in lengths:
        first = own_phrases(matches, length)
        frequent = own_phrases(matches, length, frequent=True)
        rows[f"own first {length}"] = bench.score(joined(first), bench.labels)
        rows[f"own frequent {length}"] = bench.score(joined(frequent), bench.labels)
        rng = np.random.default_rng(SEED)
        draws, labels = independent_draws(first, bench.labels, wanted, size, length, rng)
        rows[f"independent {length}"] = bench.score(joined(draws), labels)
    return {"public_size": size, "total": total, "accuracy": rows}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("split", choices=sorted(SPLITS))
    parser.add_argument("--lengths", type=int, nargs="+", default=[8, 16])
    args = parser.parse_args(argv)
    if any(length < 1 for length in args.lengths):
        parser.error("--lengths: each L must be ≥ 1")
    started = time.perf_counter()
    bench = Bench(args.split)
    record = {"split": args.split, "real": bench.real(), **ceilings(bench, args.lengths)}
    record["seconds"] = time.perf_counter() - started
    with open(OUT, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")
    print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
