"""Prompting throughput: calls/s and per-call latency at client concurrency 1, 8 and 32.

Two targets:

(a) the fake OpenAI-compatible server of ``tests/fake_llm.py`` with a fixed 200 ms
    latency per call: it answers calls in parallel, so this shows what the client itself
    sustains (ideal: concurrency / 0.2 s calls per second);
(b) the packaged SmolLM2-135M (Q4_1) behind llama-cpp-python's server, small
    ``max_tokens``: that server runs one completion at a time (a lock around the model),
    so throughput stays flat as concurrency grows and the extra calls only wait in its
    queue, which shows up as latency.

Latency is ``PromptOutcome.elapsed`` as the client sees it (no retry happens here, so it
is one HTTP call, server queueing included). Runs in about a minute or two on 2 cores.

    python benchmarks/bench_prompting.py            # prints a section for BENCHMARKS.md
"""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `tests.fake_llm` from a checkout

from tests.fake_llm import FakeLLM
from workers.llm.client import LLMEndpoint
from workers.llm.local import LocalLLMServer
from workers.methods.dpkps.prompting import PromptSpec, run_prompts

LEVELS = (1, 8, 32)
FAKE_LATENCY = 0.2
FAKE_CALLS = {1: 10, 8: 80, 32: 320}  # ≈ 2 s of wall time per level when ideal
LOCAL_CALLS = {1: 6, 8: 16, 32: 32}
LOCAL_MAX_TOKENS = 32
SPEC = PromptSpec(document_type="news article")
TOPICS = [
    ["stock market", "oil prices", "federal reserve"],
    ["football", "championship", "coach"],
    ["vaccine", "clinical trial", "hospital"],
    ["election", "parliament", "coalition"],
    ["smartphone", "battery", "launch"],
]


def _percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100])."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def _measure(endpoint: LLMEndpoint, *, calls: int, concurrency: int) -> dict[str, Any]:
    sequences = [TOPICS[i % len(TOPICS)] for i in range(calls)]
    started = time.perf_counter()
    outcomes = run_prompts(
        sequences, endpoint=endpoint, spec=SPEC, concurrency=concurrency, max_retries=0
    )
    wall = time.perf_counter() - started
    latencies = [o.elapsed for o in outcomes if o.error is None]
    return {
        "concurrency": concurrency,
        "calls": calls,
        "errors": sum(o.error is not None for o in outcomes),
        "wall_s": wall,
        "calls_per_s": calls / wall,
        "p50_ms": 1000 * _percentile(latencies, 50),
        "p95_ms": 1000 * _percentile(latencies, 95),
    }


def bench_fake() -> list[dict[str, Any]]:
    rows = []
    with FakeLLM(latency=FAKE_LATENCY) as llm:
        endpoint = llm.endpoint(timeout=30.0)
        run_prompts([TOPICS[0]], endpoint=endpoint, spec=SPEC)  # warm-up (imports), not measured
        llm.reset()
        for level in LEVELS:
            rows.append(_measure(endpoint, calls=FAKE_CALLS[level], concurrency=level))
            rows[-1]["ideal_calls_per_s"] = level / FAKE_LATENCY
            rows[-1]["server_max_in_flight"] = llm.max_in_flight
            llm.reset()
    return rows


def bench_local() -> dict[str, Any]:
    with LocalLLMServer(max_tokens=LOCAL_MAX_TOKENS, request_timeout=600.0) as server:
        endpoint = server.endpoint
        run_prompts([TOPICS[0]], endpoint=endpoint, spec=SPEC)  # warm-up, not measured
        rows = [_measure(endpoint, calls=LOCAL_CALLS[level], concurrency=level) for level in LEVELS]
        return {"model": server.model_name, "threads": server.threads, "rows": rows}


def run() -> dict[str, Any]:
    started = time.perf_counter()
    fake = bench_fake()
    local = bench_local()
    return {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(terse=True),
        },
        "fake": {"latency_s": FAKE_LATENCY, "rows": fake},
        "local": {**local, "max_tokens": LOCAL_MAX_TOKENS},
        "total_s": time.perf_counter() - started,
    }


def _table(rows: list[dict[str, Any]], *, ideal: bool) -> list[str]:
    head = "| concurrency | calls | errors | wall (s) | calls/s | p50 (ms) | p95 (ms) |"
    rule = "|---:|---:|---:|---:|---:|---:|---:|"
    if ideal:
        head += " ideal calls/s | max in flight at server |"
        rule += "---:|---:|"
    lines = [head, rule]
    for r in rows:
        line = (
            f"| {r['concurrency']} | {r['calls']} | {r['errors']} | {r['wall_s']:.2f} | "
            f"{r['calls_per_s']:.1f} | {r['p50_ms']:.0f} | {r['p95_ms']:.0f} |"
        )
        if ideal:
            line += f" {r['ideal_calls_per_s']:.0f} | {r['server_max_in_flight']} |"
        lines.append(line)
    return lines


def markdown(results: dict[str, Any]) -> str:
    machine = results["machine"]
    local = results["local"]
    fake_ms = results["fake"]["latency_s"] * 1000
    lines = [
        "## Prompting throughput (`benchmarks/bench_prompting.py`)",
        "",
        f"{machine['cpus']} CPUs, Python {machine['python']}, {machine['platform']}; "
        f"total run {results['total_s']:.0f} s. Latency is per call as the client sees it "
        "(server queueing included); no retries happened.",
        "",
        f"**(a) Fake OpenAI-compatible server, fixed {fake_ms:.0f} ms per call** "
        "(answers in parallel: this measures the client).",
        "",
        *_table(results["fake"]["rows"], ideal=True),
        "",
        f"**(b) Packaged {local['model']} (Q4_1 gguf) on llama-cpp-python's server**, "
        f"{local['threads']} thread(s), max_tokens = {local['max_tokens']}.",
        "",
        *_table(local["rows"], ideal=False),
        "",
        "llama-cpp-python's server runs one completion at a time, so calls/s does not grow "
        "with concurrency and the p50/p95 latency grows with the queue. Client concurrency "
        "pays off only against endpoints that serve calls in parallel (OpenAI, Azure, "
        "vLLM), as (a) shows; for the local model a concurrency of 1-2 is enough.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(run()))
