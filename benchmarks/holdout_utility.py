"""The held-out accuracy figure on AG News (issue 66, item 2; docs/utility.md).

AG News (all 7,600 items, title + ". " + description) stands for the private corpus. A
keyed holdout (fraction 0.2) is taken out; DP-KPS (keyphrase sequences, no LLM, the
engine's defaults at a total ε = 1, 500 sequences a class) runs on the rest; the TF-IDF
classifier trained on the sequences labels one document of every slice unit. Beside the
exact accuracy on the slice (a non-private diagnostic: the service never releases it),
the figure the service publishes at ε_eval = 1: one draw, then ``DRAWS`` draws of the same
release to show the noise's error, the interval's width and its coverage of the exact
figure. Run: ``python -m benchmarks.holdout_utility`` (prints markdown).
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

from benchmarks.bench_utility import AG_NEWS, text_of
from workers.evaluation import holdout
from workers.methods.dpkps.config import GenerationConfig
from workers.methods.dpkps.pipeline import generate_sequences
from workers.settings import CoreSettings
from workers.text.embeddings import EmbeddingCache, SentenceEmbedder
from workers.text.vocabulary import load_vocabulary

KEY, FRACTION, EPSILON, DRAWS = "ag-news-holdout-2026-12-07", 0.2, 1.0, 1000


def run() -> dict[str, Any]:
    import csv

    with open(AG_NEWS, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    texts, labels = [text_of(r) for r in rows], [r["class"] for r in rows]
    label_set = sorted(set(labels))
    chosen = holdout.select(texts, labels, None, key=KEY, fraction=FRACTION, label_set=label_set)
    rest = list(chosen.rest)
    started = time.monotonic()
    result = generate_sequences(
        [texts[i] for i in rest],
        [labels[i] for i in rest],
        label_set=label_set,
        vocabulary=load_vocabulary("english"),
        config=GenerationConfig(epsilon=EPSILON, per_class=500, seed=0).validate(),
        embedder=SentenceEmbedder(),
        cache=EmbeddingCache(CoreSettings().embedding_cache_dir),
    )
    generation_seconds = time.monotonic() - started
    synthetic = [(s.label, " ".join(s.keyphrases)) for s in result.sequences]
    evaluated = list(chosen.evaluated)
    predicted = holdout.predict(
        [t for _, t in synthetic], [label for label, _ in synthetic], [texts[i] for i in evaluated]
    )
    truth = [labels[i] for i in evaluated]
    cells = holdout.cell_counts(truth, predicted, label_set)
    k = len(label_set)
    exact = float(cells[:k].sum() / cells.sum())
    exact_class = {c: float(cells[i] / (cells[i] + cells[k + i])) for i, c in enumerate(label_set)}
    split = holdout.split_name(KEY, FRACTION)
    figures = []
    for _ in range(DRAWS):
        noisy, _event = holdout.release(cells, epsilon=EPSILON, split=split)
        figures.append(holdout.figure(noisy, epsilon=EPSILON, label_set=label_set))
    first = figures[0]
    errors = [abs((f.accuracy or 0.0) - exact) for f in figures]
    return {
        "documents": len(texts),
        "rest": len(rest),
        "slice_units": len(evaluated),
        "generation_epsilon": float(result.report.epsilon),
        "generation_seconds": generation_seconds,
        "sequences": len(synthetic),
        "exact": exact,
        "exact_class": exact_class,
        "first": first.to_dict(),
        "mean_abs_error": statistics.fmean(errors),
        "max_abs_error": max(errors),
        "mean_half_width": statistics.fmean(f.half_width for f in figures),
        "coverage": statistics.fmean(f.low <= exact <= f.high for f in figures),
        "class_coverage": {
            c: statistics.fmean(
                f.per_class[c]["interval"][0] <= exact_class[c] <= f.per_class[c]["interval"][1]
                for f in figures
                if f.per_class[c]["interval"] is not None
            )
            for c in label_set
        },
        "expected_half_width": holdout.expected_half_width(
            slice_units=len(evaluated), epsilon=EPSILON, classes=k
        ),
        "load_average": os.getloadavg(),
    }


def markdown(r: dict[str, Any]) -> str:
    first = r["first"]
    lines = [
        f"AG News, {r['documents']} documents; slice (fraction {FRACTION}) "
        f"{r['slice_units']} units, generation on {r['rest']} at ε = {r['generation_epsilon']:g} "
        f"({r['sequences']} sequences, {r['generation_seconds']:.0f} s); ε_eval = {EPSILON:g}; "
        f"load average {', '.join(f'{x:.2f}' for x in r['load_average'])}.",
        "",
        "| figure | accuracy | interval (95 %) |",
        "|---|---|---|",
        f"| exact on the slice (not released) | {r['exact']:.4f} | – |",
        f"| DP figure, one draw | {first['accuracy']:.4f} | "
        f"[{first['interval'][0]:.4f}, {first['interval'][1]:.4f}] |",
        "",
        f"Over {DRAWS} draws of the release: mean |DP − exact| {r['mean_abs_error']:.4f} "
        f"(max {r['max_abs_error']:.4f}), mean half-width {r['mean_half_width']:.4f} "
        f"(the dry run's expected {r['expected_half_width']:.4f}), coverage of the exact "
        f"figure {r['coverage']:.3f}.",
        "",
        "| class | exact | DP (one draw) | interval | coverage |",
        "|---|---|---|---|---|",
    ]
    for c, exact in r["exact_class"].items():
        row = first["per_class"][c]
        shown = "–" if row["accuracy"] is None else f"{row['accuracy']:.4f}"
        interval = (
            "–"
            if row["interval"] is None
            else f"[{row['interval'][0]:.4f}, {row['interval'][1]:.4f}]"
        )
        lines.append(f"| {c} | {exact:.4f} | {shown} | {interval} | {r['class_coverage'][c]:.3f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown(run()))
