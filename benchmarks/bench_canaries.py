"""What the audit's canaries cost a release's utility (issue 66, item 3).

On a split of :mod:`benchmarks.bench_low_epsilon` (AG News rows 0–3,799 by default), the
service's default DP-KPS run without LLM (class centroids over a public Ṽ, Gaussian noise,
δ = 1e-6) at ε, each seed twice, side by side in the same process: once on the private
documents alone, once with the job's canaries added as the worker adds them
(:func:`app.jobs.stages.with_canaries`: ``m`` canaries, each in by a fair coin). The two
runs of a seed draw the same noise (:func:`benchmarks.paired.seeded_noise`, a diagnostic:
seeded Gaussian releases) and the same public randomness, so their difference is the
canaries' alone. Both runs' keyphrase sequences train the benchmark's classifier; each
line gives both accuracies, their difference, and the audit's figures on the run with
canaries (seeded noise: the audit of a diagnostic run, not of a release).

Run: ``python -m benchmarks.bench_canaries [--split ag-tune] [--epsilon 1]
[--canaries 64] [--seeds 0 1 2]``; one JSON line per pair on stdout, then a summary.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

from benchmarks.bench_low_epsilon import Bench
from benchmarks.paired import seeded_noise
from workers.methods.dpkps.pipeline import generate_sequences
from workers.privacy.audit import make_canaries, run_audit


def pair(bench: Bench, *, epsilon: float, seed: int, canaries: int) -> dict[str, Any]:
    """One seed: accuracy without and with canaries, and the audit of the second run."""
    config = bench.config(epsilon, seed, {}).for_classes(len(bench.label_set))
    with seeded_noise(seed):
        plain = bench.run(epsilon, seed, {})
    stop = config.candidate_count if config.vocabulary_selection == "public" else None
    canary_set = make_canaries(
        phrases=bench.vocabulary.phrases,
        labels=bench.label_set,
        count=canaries,
        seed=1_000_003 * (seed + 1),
        document_type="news article",
        stop=stop,
    )
    added = canary_set.included_canaries
    with seeded_noise(seed):  # the same noise as the run without: a paired difference
        result = generate_sequences(
            [*bench.texts, *(c.text for c in added)],
            [*bench.labels, *(c.label for c in added)],
            label_set=bench.label_set,
            vocabulary=bench.vocabulary,
            config=config,
            embedder=bench.embedder,
            cache=bench.cache,
        )
    texts = [" ".join(s.keyphrases) for s in result.sequences]
    labels = [s.label for s in result.sequences]
    with_canaries = bench.score(texts, labels)
    audit = run_audit(
        canary_set,
        list(zip(labels, texts, strict=True)),
        claimed_epsilon=float(result.report.epsilon),
        delta=float(result.report.delta),
    )
    return {
        "split": bench.split,
        "epsilon": epsilon,
        "seed": seed,
        "canaries": canaries,
        "included": len(added),
        "private_documents": len(bench.texts),
        "accuracy_without": plain,
        "accuracy_with": with_canaries,
        "difference": with_canaries - plain,
        "audit": {k: v for k, v in audit.to_dict().items() if k != "in_words"},
        "load_average": os.getloadavg()[0],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--split", default="ag-tune")
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--canaries", type=int, default=64)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args(argv)
    bench = Bench(args.split)
    started = time.monotonic()
    rows = []
    for seed in args.seeds:
        row = pair(bench, epsilon=args.epsilon, seed=seed, canaries=args.canaries)
        rows.append(row)
        print(json.dumps(row), flush=True)
    differences = [r["difference"] for r in rows]
    summary = {
        "pairs": len(rows),
        "mean_without": statistics.fmean(r["accuracy_without"] for r in rows),
        "mean_with": statistics.fmean(r["accuracy_with"] for r in rows),
        "mean_difference": statistics.fmean(differences),
        "sd_difference": statistics.stdev(differences) if len(rows) > 1 else None,
        "bounds": [r["audit"]["epsilon_lower_bound"] for r in rows],
        "seconds": round(time.monotonic() - started, 1),
        "load_average": os.getloadavg(),
    }
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
