"""The LLM pass on the low-ε benchmark: DP keyphrase sequences written out as documents.

Issue 16's benchmark trains its classifier on the keyphrase sequences alone. The product's
next step prompts an LLM with each sequence (:mod:`workers.methods.dpkps.prompting`); this
diagnostic measures what that step adds on a split of ``bench_low_epsilon``. For each run
(``--seeds``), on the seeded releases of :mod:`benchmarks.paired` (so the sequences are
those the paired runs score for the same seed):

* the defaults' sequences at ``EPSILON``, scored as ``bench_low_epsilon`` scores them;
* a seeded sample of at most ``--per-class`` sequences of each label (all with ``0``),
  each prompted once (the document type named by ``--document-type``; no label, no private
  text, no count reaches the prompt: :func:`~workers.methods.dpkps.prompting.build_messages`)
  through the packaged SmolLM2-135M-Instruct on the batched local server, or through the
  product's configured endpoint where ``KEYSEED_LLM_BASE_URL`` is set (``KEYSEED_LLM_MODEL``,
  ``KEYSEED_LLM_API_KEY``: OpenAI, Azure, a vLLM server);
* the same classifier trained on the sample three ways: its sequences, the LLM's texts,
  and each text after its own sequence (``joined``). The three share the sample, so their
  differences are the LLM's alone.

Nothing printed is private: accuracies on the benchmark's test texts, the LLM's costs and
one synthetic example (post-processing of the DP releases). Records are appended to
``benchmarks/llm_pass.jsonl``. Run: ``python -m benchmarks.llm_pass SPLIT EPSILON --seeds
0-2 [--per-class 50] [--max-tokens 96] [--set key=value …]``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.bench_low_epsilon import SPLITS, Bench, parse_settings
from benchmarks.paired import parse_seeds, seeded_noise
from workers.llm.client import LLMCosts, LLMEndpoint
from workers.llm.local import LocalLLMServer
from workers.methods.dpkps.pipeline import SyntheticSequence
from workers.methods.dpkps.prompting import PromptSpec, run_prompts
from workers.settings import CoreSettings

OUT = Path(__file__).resolve().parent / "llm_pass.jsonl"
CONCURRENCY = 8  # the batched server's slots

# The public document type a job spec would declare for each split's corpus.
DOCUMENT_TYPES = {
    "ag": "news article",
    "yelp": "business review",
    "ohsumed": "medical abstract",
    "medical": "medical abstract",
    "newsgroups": "newsgroup post",
}


def document_type(split: str) -> str:
    """The document type of ``split``'s corpus.

    >>> document_type("newsgroups-larger-tune"), document_type("yelp-small")
    ('newsgroup post', 'business review')
    """
    return DOCUMENT_TYPES[split.split("-")[0]]


def sample(
    sequences: Sequence[SyntheticSequence], per_class: int, seed: int
) -> list[SyntheticSequence]:
    """At most ``per_class`` of each label's sequences (all of them for 0), seeded, in the
    input's order.

    >>> seqs = [SyntheticSequence("x", ("a",)), SyntheticSequence("x", ("b",)),
    ...         SyntheticSequence("y", ("c",))]
    >>> [s.label for s in sample(seqs, 1, 0)]
    ['x', 'y']
    """
    if per_class <= 0:
        return list(sequences)
    positions: dict[str, list[int]] = defaultdict(list)
    for i, s in enumerate(sequences):
        positions[s.label].append(i)
    rng = random.Random(seed)
    kept = {
        i for group in positions.values() for i in rng.sample(group, min(per_class, len(group)))
    }
    return [s for i, s in enumerate(sequences) if i in kept]


@contextmanager
def llm_endpoint(max_tokens: int) -> Iterator[LLMEndpoint]:
    """The product's configured endpoint (``KEYSEED_LLM_BASE_URL``), or else the packaged
    SmolLM2 on the batched local server for the length of the block; ``max_tokens`` a
    completion either way."""
    configured = LLMEndpoint.from_settings(CoreSettings())
    if configured is not None:
        yield replace(configured, max_tokens=max_tokens).validate()
        return
    with LocalLLMServer(max_tokens=max_tokens) as server:
        yield server.endpoint


def one_run(
    bench: Bench,
    endpoint: LLMEndpoint,
    epsilon: float,
    seed: int,
    settings: dict[str, Any],
    *,
    per_class: int,
    spec: PromptSpec,
) -> dict[str, Any]:
    """One seed: the sequences, the sample's LLM texts, and the classifier on each."""
    with seeded_noise(seed):
        sequences = bench.sequences(epsilon, seed, settings)
    accuracy = bench.score(
        [" ".join(s.keyphrases) for s in sequences], [s.label for s in sequences]
    )
    chosen = sample(sequences, per_class, seed)
    costs = LLMCosts()
    started = time.perf_counter()
    outcomes = run_prompts(
        [list(s.keyphrases) for s in chosen],
        endpoint=endpoint,
        spec=spec,
        concurrency=CONCURRENCY,
        costs=costs,
    )
    seconds = time.perf_counter() - started
    kept = [(s, o.text) for s, o in zip(chosen, outcomes, strict=True) if o.text]
    labels = [s.label for s, _ in kept]
    phrases = [" ".join(s.keyphrases) for s, _ in kept]
    texts = [text for _, text in kept]
    return {
        "sequences": len(sequences),
        "accuracy_all_sequences": accuracy,
        "sample": len(chosen),
        "texts": len(kept),
        "seconds": round(seconds, 1),
        "completion_tokens": costs.completion_tokens,
        "accuracy_sequences": bench.score(phrases, labels),
        "accuracy_texts": bench.score(texts, labels),
        "accuracy_joined": bench.score(
            [f"{p}. {t}" for p, t in zip(phrases, texts, strict=True)], labels
        ),
        "example": {"keyphrases": list(kept[0][0].keyphrases), "text": kept[0][1]}
        if kept
        else None,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("split", choices=sorted(SPLITS))
    parser.add_argument("epsilon", type=float)
    parser.add_argument("--seeds", default="0-2", help="FIRST-LAST or a comma list")
    parser.add_argument("--per-class", type=int, default=50, help="0: every sequence")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--document-type", default=None)
    parser.add_argument(
        "--template",
        default=None,
        help="the prompt's template (the job spec's; default its default)",
    )
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    try:
        seeds = parse_seeds(args.seeds)
    except ValueError as error:
        parser.error(str(error))
    if args.per_class < 0:
        parser.error("--per-class: must be ≥ 0")
    try:
        settings = parse_settings(args.set)
    except ValueError as error:
        parser.error(f"--set {error}")
    spec = PromptSpec(
        document_type=args.document_type or document_type(args.split),
        **({"template": args.template} if args.template else {}),
    ).validate()
    bench = Bench(args.split)
    real = bench.real()
    with (
        llm_endpoint(args.max_tokens) as endpoint,
        open(OUT, "a", encoding="utf-8") as out,
    ):
        for seed in seeds:
            record = {
                "split": args.split,
                "epsilon": args.epsilon,
                "seed": seed,
                "settings": settings,
                "per_class": args.per_class,
                "max_tokens": args.max_tokens,
                "document_type": spec.document_type,
                **({"template": spec.template} if args.template else {}),
                "llm": endpoint.model,
                "real": real,
                **one_run(
                    bench,
                    endpoint,
                    args.epsilon,
                    seed,
                    settings,
                    per_class=args.per_class,
                    spec=spec,
                ),
            }
            out.write(json.dumps(record) + "\n")
            out.flush()
            print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
