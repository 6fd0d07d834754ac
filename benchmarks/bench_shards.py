"""Sharded jobs (issue 65): the private stages of one job in 1 worker process against 2.

One DP-KPS job of a shardable configuration (class centroids over a public Ṽ, Gaussian
noise) on a synthetic corpus of :data:`DOCUMENTS` documents (~30 words each, four labels,
words drawn from the public medical vocabulary's phrases), run as the service runs it
sharded (:mod:`app.jobs.shards`): each worker process, like a Celery pool process, loads
the embedding model once (torch threads 1), streams the corpus and keeps the rows of its
shard (:func:`workers.methods.dpkps.shards.shard_of`, the job's key), maps them; the
parent then reduces (the noise, once) and finishes (sampling the sequences).

``1 process``: one shard; ``2 processes``: two shards mapped at once; then 1 process
again, so that a drift of the machine's load between the runs shows. Documents/s is the
corpus over the wall time from the moment every process is ready (models loaded, Ṽ's
embeddings read from the cache the parent filled) to the end of the finish: the private
stages, without the start of the processes (a worker's models load once, not per job).
The ratio of the two is the figure (target ≥ 1.7× on an idle machine with 2 free cores);
the load average is read before and after each, as every figure here is a ratio on a
shared machine; the CPU seconds the map took in all processes say whether splitting adds
work (it should not: the ratio of wall times is then the machine's free cores). The
Celery and Postgres round trips of the real path (a few per shard)
are not in it.

``python -m benchmarks.bench_shards`` prints the Markdown table; ``run() -> dict`` and
``markdown(dict) -> str`` like the other ``bench_*`` modules.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DOCUMENTS = int(os.environ.get("KEYSEED_BENCH_SHARD_DOCUMENTS", "3000"))
WORDS = 30
LABELS = ("cardio", "ortho", "neuro", "derm")
KEY = bytes(range(32))
SPEC: dict[str, Any] = {
    "method": "dpkps",
    "vocabulary": "medical",
    "llm": "none",
    "document_type": "clinical note",
    "kde_method": "centroid",
    "noise": "gaussian",
    "epsilon": 1.0,
    "delta": 1e-6,
    "per_class": 5,
    "sequence_length": 4,
    "public_vocabulary_size": 2000,
    "audit_canaries": 0,
}


def corpus(count: int = DOCUMENTS) -> list[tuple[str, str, str | None]]:
    """Synthetic rows (text, label, no unit): the same for every process (seeded)."""
    from workers.text.vocabulary import load_vocabulary

    phrases = load_vocabulary("medical").phrases
    words = sorted({w for p in phrases[:5000] for w in p.split()})
    rng = random.Random(0)
    return [
        (" ".join(rng.choice(words) for _ in range(WORDS)), LABELS[i % len(LABELS)], None)
        for i in range(count)
    ]


def _run(cache: str) -> Any:
    """The job's sharded run, built as :func:`app.jobs.shards.build_run` builds it."""
    from app.jobs.schemas import JOB_SPEC
    from workers.methods.dpkps.run import plan_of
    from workers.methods.dpkps.shards import ShardedRun
    from workers.text.embeddings import EmbeddingCache, SentenceEmbedder
    from workers.text.vocabulary import load_vocabulary

    params: Any = JOB_SPEC.validate_python(SPEC).params()
    vocabulary = load_vocabulary("medical")
    return ShardedRun(
        config=params.generation_config("cpu"),
        label_set=LABELS,
        vocabulary=vocabulary,
        embedder=SentenceEmbedder(device="cpu"),
        cache=EmbeddingCache(cache),
        planned=plan_of(params, LABELS, len(vocabulary)),
        key=KEY,
        device="cpu",
    )


def _mapper(shard: int, shards: int, cache: str, ready: Any, go: Any, out: Any) -> None:
    """A worker process: models loaded, then (on ``go``) its shard's rows mapped."""
    import torch

    from workers.methods.dpkps.shards import shard_of

    torch.set_num_threads(1)
    run = _run(cache)
    run.basis()  # Ṽ's embeddings (from the cache) as a worker has them after its first job
    rows = corpus()
    ready.set()
    go.wait()
    cpu = time.process_time()
    mine = (r for i, r in enumerate(rows, 1) if shard_of(r[2], i, key=KEY, shards=shards) == shard)
    part = run.map(run.rounds[0], mine, None)
    out.put((shard, part, time.process_time() - cpu))


def measure(processes: int, cache: str) -> dict[str, Any]:
    """The private stages with ``processes`` worker processes (one shard each)."""
    import torch

    torch.set_num_threads(1)
    context = mp.get_context("spawn")
    go, out = context.Event(), context.Queue()
    readies = [context.Event() for _ in range(processes)]
    workers = [
        context.Process(target=_mapper, args=(i, processes, cache, readies[i], go, out))
        for i in range(processes)
    ]
    for worker in workers:
        worker.start()
    for ready in readies:
        ready.wait()
    run = _run(cache)
    run.embeddings()  # the parent's Ṽ, as the reducing worker has it
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    go.set()
    got = [out.get() for _ in workers]
    mapped = time.monotonic() - started
    parts = {shard: part for shard, part, _ in got}
    cpu = sum(seconds for _, _, seconds in got)
    state = run.reduce(run.rounds[0], [parts[i] for i in range(processes)], None)
    result = run.finish(state)
    total = time.monotonic() - started
    for worker in workers:
        worker.join()
    return {
        "processes": processes,
        "documents": DOCUMENTS,
        "map_seconds": round(mapped, 2),
        "map_cpu_seconds": round(cpu, 2),
        "total_seconds": round(total, 2),
        "documents_per_second": round(DOCUMENTS / total, 1),
        "sequences": len(result.sequences),
        "load_before": round(load_before, 2),
        "load_after": round(os.getloadavg()[0], 2),
    }


def run() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-shards-") as cache:
        _run(cache).basis()  # fill the cache once: no process pays for Ṽ in the timing
        # 1, 2, then 1 again: the drift of a shared machine's load shows in the two 1s
        runs = [measure(1, cache), measure(2, cache), measure(1, cache)]
    baseline = (runs[0]["documents_per_second"] + runs[2]["documents_per_second"]) / 2
    return {
        "cores": os.cpu_count(),
        "runs": runs,
        "ratio": round(runs[1]["documents_per_second"] / baseline, 2),
    }


def markdown(found: dict[str, Any]) -> str:
    lines = [
        "### Sharded jobs: the private stages of one job (class centroids, public Ṽ) mapped "
        "by 1 worker process (one shard) or 2 (two shards), each like a Celery pool process "
        "(torch threads 1), then one reduce and the finish; 1, 2, then 1 process again "
        "(`benchmarks/bench_shards.py`; issue 65's target ≥ 1.7× on 2 cores)",
        "",
        "| worker processes | documents | map s | map CPU s (all processes) | private stages s "
        "| documents/s | load 1 min (before → after) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in found["runs"]:
        lines.append(
            f"| {r['processes']} | {r['documents']} | {r['map_seconds']} | "
            f"{r['map_cpu_seconds']} | {r['total_seconds']} | {r['documents_per_second']} | "
            f"{r['load_before']} → {r['load_after']} |"
        )
    lines.append("")
    lines.append(
        f"2 processes / 1 process (the mean of the two 1-process runs): **{found['ratio']}×** "
        f"({found['cores']} cores); the map's CPU seconds summed over the processes say "
        f"whether splitting adds work."
    )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    print(markdown(run()))
