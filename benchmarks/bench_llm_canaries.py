"""What the audit's canaries cost an LLM method's release (issue 66, item 3).

Every LLM method (``--method aug_pe|pate_tutor|dp_eda``) runs as the worker runs it: its
registry entry's ``run`` with the job's arguments (:func:`app.jobs.stages._sequences`),
DP-EDA with the vocabulary its decoder reads and the embedding cache, and the job's
canaries drawn as :func:`app.jobs.stages._canaries` draws them (64 canaries whose six
suffix words come from the phrases of :attr:`~workers.methods.registry.Method.canary_phrases`:
the rare half of the first 50,000 English words for Aug-PE and PATE-tutor, of the whole
vocabulary DP-EDA's decoder reads), each in by a fair coin, joined to the private input
by :func:`app.jobs.stages.with_canaries`.

The "LLM" is a public pool of real news texts (AG News rows the private split does not
hold). Asked for a new text of a class (Aug-PE's and PATE-tutor's random prompt, DP-EDA's
initial population) it gives the next text of that class's stream of the pool; the
streams are disjoint and fixed. For Aug-PE the pool's labels are unread (class k's i-th
text is the pool's text k + 4·i): its selection votes per class, so the released labels
are the ones its selection chose. PATE-tutor's student scores how private a text looks,
not its class, and DP-EDA decodes its selections by asking the LLM for a text of the
class, so both rely on an LLM that answers a class's prompt with a text of that class:
for them class c's i-th text is the pool's i-th text of AG News class c (about 750 a
class; a longer stream starts again). Asked for an Aug-PE variation the LLM echoes the
text; asked for a DP-EDA reconstruction ("... using these phrases: p₁; …; p_m.", with a
draft or none) it gives the class's next pool text followed by the phrases it was given
("<text> p₁, …, p_m."): a text of the class that holds the vocabulary phrases nearest the
DP-selected embedding, as the decoder asks, of which the decoder keeps the candidate
nearest its target (the draft is not read). So what the method's private steps do is
all that varies, and every released text is a real text (or a real text and public
phrases).

Sizes. Aug-PE: one iteration (T = 1), every class's candidates its share of
``--population`` pool texts, the ``--released`` best by noisy votes released. PATE-tutor:
pools A, B, C of ``--negatives``, ``--queries`` and ``--candidates`` pool texts, M =
``--teachers``, ``--released`` of pool C kept. DP-EDA: ``--iterations``, ``--domain`` K,
``--parents`` k, ``--initial-population`` N_pb, ``--offspring`` N_cld, the decoder
``llm_reconstruction`` with ``--decode-candidates`` candidates and ``--rounds`` rounds,
reading the built-in ``english`` vocabulary or, with ``--vocabulary-words N``, its first N
phrases as an uploaded vocabulary (a file: its 300,194 phrases' embeddings take about 20
CPU minutes to cache); the method's defaults where not given.

For each seed, two runs side by side in one process: the private documents alone, and
with the canaries. Both runs of a seed draw the same noise (a diagnostic, :func:`seeded`:
OpenDP's Gaussian sampler replaced by a seeded numpy draw, and DP-EDA's Gumbel top-k by a
seeded numpy Gumbel top-k, its i-th call of a run drawing from stream i), PATE-tutor's
teacher key is one per seed (put in the checkpoints, where a resumed run finds it), and
both ask the pool in the same order (concurrency 1), so their difference is the canaries'.
The service's holdout classifier (TF-IDF, seed 0) trained on each release labels the test
texts; each line gives both accuracies, the texts the two releases share, and the audit's
figures on the run with canaries.

Run: ``KEYSEED_SHARED=/work/shared python -m benchmarks.bench_llm_canaries
[--method aug_pe] [--private 1200] [--epsilon 1] [--seeds 0 1 2] [sizes, above]``;
one JSON line per pair, then a summary.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import itertools
import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from app.jobs.stages import PrivateCorpus, with_canaries
from benchmarks.bench_low_epsilon import MemoEmbedder
from tests.fake_llm import FakeLLM, Turns, asked_class, echoed_text, last_message
from workers.evaluation.holdout import predict
from workers.methods.catalog import AUG_PE, DP_EDA, PATE_TUTOR
from workers.methods.checkpoints import MemoryCheckpoints
from workers.methods.dp_eda import limited_domain
from workers.methods.pate_tutor.runner import TEACHER_KEY
from workers.methods.registry import METHODS, Method
from workers.privacy import noise as samplers
from workers.privacy.audit import CanarySet, make_canaries, run_audit
from workers.settings import CoreSettings
from workers.text.embeddings import EmbeddingCache, SentenceEmbedder
from workers.text.vocabulary import Vocabulary, load_vocabulary

LABELS = ["Business", "Sci/Tech", "Sports", "World"]
POOL_FROM, TEST_FROM, TEST_ROWS = 3_800, 6_800, 800
DOCUMENT_TYPE = "news article"
METHOD_IDS = {"aug_pe": AUG_PE, "pate_tutor": PATE_TUTOR, "dp_eda": DP_EDA}


def _rows() -> list[tuple[str, str]]:
    shared = Path(os.environ.get("KEYSEED_SHARED", "../shared"))
    with (shared / "data" / "ag_news_test.csv").open(newline="", encoding="utf-8") as handle:
        return [(f"{r['title']}. {r['description']}", r["class"]) for r in csv.DictReader(handle)]


class PublicPool:
    """The test "LLM": class k's i-th new text is the pool's text k + 4·i, or with
    ``labels`` the i-th pool text of that class; a variation echoes its prompt's text; a
    DP-EDA reconstruction is the class's next text followed by the phrases its prompt gave."""

    def __init__(self, texts: list[str], labels: list[str] | None = None) -> None:
        self.texts = texts
        pairs = list(zip(texts, labels, strict=True)) if labels is not None else []
        self.streams = {label: [t for t, y in pairs if y == label] for label in LABELS}
        self.turns = Turns()

    def text(self, label: str, i: int) -> str:
        stream = self.streams[label]
        if stream:
            return stream[i % len(stream)]
        return self.texts[(LABELS.index(label) + len(LABELS) * i) % len(self.texts)]

    def __call__(self, body: Any) -> str:
        user = last_message(body)
        label = asked_class(user)
        if label is None:
            return echoed_text(user) or ""
        text = self.text(label, self.turns.next(label))
        phrases = re.search(r' using these phrases: (.*?)\.(?: Improve on this draft: "|$)', user)
        return text if phrases is None else f"{text} {', '.join(phrases.group(1).split('; '))}."


@contextmanager
def seeded(seed: int) -> Iterator[None]:
    """OpenDP's Gaussian sampler replaced by a seeded numpy draw, and DP-EDA's Gumbel
    top-k by a seeded numpy Gumbel top-k (the i-th call from stream i) (diagnostic only)."""
    rng = np.random.default_rng(10_000 + seed)
    calls = itertools.count()
    saved, saved_top_k = samplers._add, limited_domain.noisy_top_k

    def add(noise: str, data: Any, scale: float) -> list[float]:
        assert noise == "gaussian"
        values = np.asarray(data, dtype=np.float64)
        return list((values + rng.normal(0.0, scale, size=values.shape)).tolist())

    def top_k(scores: NDArray[Any], *, k: int, scale: float, **how: Any) -> NDArray[np.int64]:
        assert how["noise"] == "gumbel_top_k"  # the scale is the same, monotonic or not
        draw = np.random.default_rng([20_000 + seed, next(calls)])
        values = np.asarray(scores, dtype=np.float64)
        noisy = values + draw.gumbel(0.0, scale, size=values.shape)
        return np.argsort(-noisy, kind="stable")[:k].astype(np.int64)

    samplers._add, limited_domain.noisy_top_k = add, top_k
    try:
        yield
    finally:
        samplers._add, limited_domain.noisy_top_k = saved, saved_top_k


@dataclass
class Setup:
    """One method's run as the worker makes it: its entry, parameters, embedder, the
    inputs of a run that reads a vocabulary, and the phrases its canaries come from."""

    method: Method
    params: Any
    embedder: Any
    inputs: dict[str, Any]
    words: Vocabulary

    @classmethod
    def of(cls, method_id: str, params: Any) -> Setup:
        method = METHODS[method_id]
        inputs: dict[str, Any] = {}
        name = method.vocabulary(params)
        embedder: Any = SentenceEmbedder()
        if method_id != AUG_PE:  # the pair's runs embed the same public texts
            embedder = MemoEmbedder(embedder)
        if name is not None:
            inputs["vocabulary"] = load_vocabulary(name)
            inputs["cache"] = EmbeddingCache(CoreSettings().embedding_cache_dir)
        words = inputs.get("vocabulary") or load_vocabulary(method.canary_words_from)
        return cls(method, params, embedder, inputs, words)

    def canaries(self, count: int, seed: int) -> CanarySet:
        """The job's canaries (:func:`app.jobs.stages._canaries`), from a public seed."""
        assert self.method.canary_phrases is not None
        return make_canaries(
            phrases=self.words.phrases,
            labels=LABELS,
            count=count,
            seed=1_000_003 * (seed + 1),
            document_type=DOCUMENT_TYPE,
            stop=self.method.canary_phrases(self.params, len(self.words)),
        )

    def release(
        self, corpus: PrivateCorpus, pool: list[tuple[str, str]], seed: int
    ) -> list[tuple[str, str]]:
        checkpoints = MemoryCheckpoints()
        if self.method.id == PATE_TUTOR:  # the pair's teacher key: one per seed
            checkpoints.save(TEACHER_KEY, hashlib.sha256(f"teachers {seed}".encode()).digest())
        # Aug-PE's selection chooses its texts' labels; the others keep the prompt's
        labels = None if self.method.id == AUG_PE else [y for _, y in pool]
        llm = PublicPool([t for t, _ in pool], labels)
        with seeded(seed), FakeLLM(content_fn=llm) as fake:
            result = self.method.run(
                corpus.texts,
                corpus.labels,
                label_set=LABELS,
                units=corpus.units,
                params=self.params,
                embedder=self.embedder,
                llm=fake.endpoint(),
                checkpoints=checkpoints,
                **self.inputs,
            )
        return list(result.records)


def method_params(method_id: str, args: argparse.Namespace) -> Any:
    """The run's parameters: the sizes given, the method's defaults for the others."""
    given: dict[str, Any] = {
        "document_type": DOCUMENT_TYPE,
        "epsilon": args.epsilon,
        "delta": 1e-6,
        "concurrency": 1,
    }
    if method_id == AUG_PE:
        given |= {
            "iterations": 1,
            "population": args.population,
            "initial_variation_folds": 0,
            "num_released": args.released or 400,
            "max_tokens": 64,
        }
    sizes = {
        PATE_TUTOR: ("teachers", "negatives", "queries", "candidates", "released"),
        DP_EDA: (
            "iterations", "domain", "parents", "initial_population", "offspring",
            "decode_candidates", "rounds",
        ),
    }.get(method_id, ())  # fmt: skip
    renamed = {"released": "num_released", "decode_candidates": "candidates"}
    given |= {
        renamed.get(name, name): getattr(args, name)
        for name in sizes
        if getattr(args, name) is not None
    }
    if method_id == DP_EDA and args.vocabulary_words is not None:
        given["vocabulary"] = str(first_words(args.vocabulary_words))
    return METHODS[method_id].params(**given)


def first_words(count: int) -> Path:
    """A phrase-per-line file of the built-in ``english`` vocabulary's first ``count``
    phrases (as an uploaded vocabulary: the same file, so the same embedding cache)."""
    path = Path(tempfile.gettempdir()) / f"keyseed-english-{count}.txt"
    path.write_text("\n".join(load_vocabulary("english").phrases[:count]) + "\n", "utf-8")
    return path


def accuracy(released: list[tuple[str, str]], test: list[tuple[str, str]]) -> float:
    found = predict([t for _, t in released], [x for x, _ in released], [t for t, _ in test])
    return float(np.mean([p == y for p, (_, y) in zip(found, test, strict=True)]))


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--method", choices=sorted(METHOD_IDS), default="aug_pe")
    parser.add_argument("--private", type=int, default=1_200)
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--canaries", type=int, default=64)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--population", type=int, default=1_000, help="Aug-PE's candidates")
    parser.add_argument("--released", type=int, help="Aug-PE (400), PATE-tutor: released")
    for name in ("teachers", "negatives", "queries", "candidates"):
        parser.add_argument(f"--{name}", type=int, help="PATE-tutor")
    for name in ("iterations", "domain", "parents", "initial-population", "offspring"):
        parser.add_argument(f"--{name}", type=int, help="DP-EDA")
    parser.add_argument("--decode-candidates", type=int, help="DP-EDA: candidates a round")
    parser.add_argument("--rounds", type=int, help="DP-EDA: rounds a decode")
    parser.add_argument(
        "--vocabulary-words", type=int, help="DP-EDA: its decoder reads the first N English words"
    )
    return parser.parse_args()


def main() -> int:
    args = arguments()
    method_id = METHOD_IDS[args.method]
    rows = _rows()
    private = PrivateCorpus(
        [t for t, _ in rows[: args.private]], [y for _, y in rows[: args.private]], None
    )
    pool = rows[POOL_FROM:TEST_FROM]
    test = rows[TEST_FROM : TEST_FROM + TEST_ROWS]
    setup = Setup.of(method_id, method_params(method_id, args))
    found = []
    for seed in args.seeds:
        start = time.monotonic()
        canary_set = setup.canaries(args.canaries, seed)
        plain = setup.release(private, pool, seed)
        audited = setup.release(with_canaries(private, canary_set), pool, seed)
        audit = run_audit(canary_set, audited, claimed_epsilon=args.epsilon, delta=1e-6)
        line = {
            "method": method_id,
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
        "method": method_id,
        "parameters": setup.params.to_dict(),
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
