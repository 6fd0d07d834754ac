"""Meta-talk in the small LLM's documents, and what the prompt and the cleanup remove.

Issue 67 (item 5): the packaged SmolLM2-135M-Instruct often opens a document with talk
about the request ("Sure! Here is a rewritten …", "Using the keyphrases …") or ends it
with a note, instead of writing the document. This diagnostic measures, on DP keyphrase
sequences of a ``bench_low_epsilon`` split (AG News by default):

* the share of texts that begin with meta-talk (:func:`workers.text.cleanup.opens_with_meta`,
  the one detector the tests also use), before and after
  :func:`~workers.text.cleanup.clean_completion`;
* the downstream accuracy of the benchmark's classifier trained on the texts, before and
  after the cleanup (same texts, same classifier seed);

for each prompt template named with ``--template NAME=TEMPLATE`` (``default``: the
product's :data:`~workers.methods.dpkps.prompting.DEFAULT_TEMPLATE`, measured as ``short``
in the note; ``before``: the template of the releases the issue measured). The sequences
are those of :meth:`benchmarks.bench_low_epsilon.Bench.sequences` under
:func:`benchmarks.paired.seeded_noise`
(seeded releases), sampled as :mod:`benchmarks.llm_pass` samples them, each prompted
once through the packaged model on the batched local server.

The completions are kept in ``--outputs`` (JSON; a variant already there is not
generated again), so the scoring can be rerun on the same texts. They are synthetic
(post-processing of DP releases of the public AG News test split); nothing private is
printed or saved. Run::

    python -m benchmarks.text_cleanup ag-tune 1 --seed 0 --per-class 50 \\
        --outputs /tmp/cleanup.json --template before --template default
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from benchmarks.bench_low_epsilon import SPLITS, Bench
from benchmarks.llm_pass import document_type, llm_endpoint, sample
from benchmarks.paired import seeded_noise
from workers.methods.dpkps.prompting import DEFAULT_TEMPLATE, PromptSpec, run_prompts
from workers.text.cleanup import clean_completion, opens_with_meta

CONCURRENCY = 8
# The template the releases of issue 67 were written with (before this change).
BEFORE = (
    "{examples}Write one {document_type} that naturally uses all of these keyphrases: {keyphrases}."
)
NAMED = {"before": BEFORE, "default": DEFAULT_TEMPLATE}


def share_meta(texts: list[str]) -> float:
    return sum(opens_with_meta(t) for t in texts) / len(texts) if texts else 0.0


def generate(args: argparse.Namespace, variants: dict[str, str], store: dict[str, Any]) -> None:
    missing = {n: t for n, t in variants.items() if n not in store["variants"]}
    if not missing:
        return
    bench = Bench(args.split)
    with seeded_noise(args.seed):
        sequences = bench.sequences(args.epsilon, args.seed, {})
    chosen = sample(sequences, args.per_class, args.seed)
    store["sequences"] = [{"label": s.label, "keyphrases": list(s.keyphrases)} for s in chosen]
    with llm_endpoint(args.max_tokens) as endpoint:
        store["llm"] = endpoint.model
        for name, template in missing.items():
            spec = PromptSpec(document_type=document_type(args.split), template=template)
            outcomes = run_prompts(
                [list(s.keyphrases) for s in chosen],
                endpoint=endpoint,
                spec=spec.validate(),
                concurrency=CONCURRENCY,
                clean=False,  # the raw completions: the cleanup is applied when scoring
            )
            store["variants"][name] = {
                "template": template,
                "texts": [o.text if o.text else None for o in outcomes],
            }
            args.outputs.write_text(json.dumps(store, indent=1), encoding="utf-8")
            print(f"generated {name}: {len(outcomes)} completions", flush=True)


def score(
    args: argparse.Namespace, store: dict[str, Any], names: list[str]
) -> list[dict[str, Any]]:
    bench = Bench(args.split)
    labels_all = [s["label"] for s in store["sequences"]]
    rows = []
    for name in names:
        texts_all = store["variants"][name]["texts"]
        kept = [(t, lab) for t, lab in zip(texts_all, labels_all, strict=True) if t]
        raw = [t for t, _ in kept]
        labels = [lab for _, lab in kept]
        cleaned = [clean_completion(t) for t in raw]
        rows.append(
            {
                "variant": name,
                "texts": len(raw),
                "meta_raw": round(share_meta(raw), 3),
                "meta_cleaned": round(share_meta(cleaned), 3),
                "changed": sum(a != b for a, b in zip(raw, cleaned, strict=True)),
                "empty_after": sum(not c.strip() for c in cleaned),
                "accuracy_raw": round(bench.score(raw, labels), 4),
                "accuracy_cleaned": round(bench.score(cleaned, labels), 4),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("split", choices=sorted(SPLITS))
    parser.add_argument("epsilon", type=float)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--per-class", type=int, default=50)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--outputs", type=Path, required=True)
    parser.add_argument("--template", action="append", default=[], metavar="NAME[=TEMPLATE]")
    parser.add_argument("--generate-only", action="store_true")
    args = parser.parse_args(argv)
    variants: dict[str, str] = {}
    for item in args.template or ["before", "default"]:
        name, _, template = item.partition("=")
        variants[name] = template or NAMED[name]
    store: dict[str, Any] = {"split": args.split, "epsilon": args.epsilon, "seed": args.seed}
    store["variants"] = {}
    if args.outputs.exists():
        store = json.loads(args.outputs.read_text(encoding="utf-8"))
    generate(args, variants, store)
    if not args.generate_only:
        score(args, store, list(variants))


if __name__ == "__main__":
    main(sys.argv[1:])
