"""Prompting throughput: calls/s and per-call latency at client concurrency 1, 8 and 32.

Two targets:

(a) the fake OpenAI-compatible server of ``tests/fake_llm.py`` with a fixed 200 ms
    latency per call: it answers calls in parallel, so this shows what the client itself
    sustains (ideal: concurrency / 0.2 s calls per second);
(b) the packaged SmolLM2-135M on the two local engines of :mod:`workers.llm.local`, same
    ``max_tokens``: llama-cpp-python's server, which runs one completion at a time (a
    lock around the model, so throughput stays flat as concurrency grows and the extra
    calls only wait in its queue), and the default ``batched`` engine (continuous
    batching over 8 slots, :mod:`workers.llm.engine`). Target (issue 17): the batched
    engine ≥ 3× llama-cpp-python's calls/s at concurrency 8.

Latency is ``PromptOutcome.elapsed`` as the client sees it (no retry happens here, so it
is one HTTP call, server queueing included). Runs in a few minutes on 2 cores.

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
from workers.llm.engine import DEFAULT_SLOTS
from workers.llm.local import LocalLLMServer
from workers.methods.dpkps.prompting import PromptSpec, run_prompts

LEVELS = (1, 8, 32)
FAKE_LATENCY = 0.2
FAKE_CALLS = {1: 10, 8: 80, 32: 320}  # ≈ 2 s of wall time per level when ideal
LOCAL_CALLS = {1: 6, 8: 16, 32: 32}
ENGINES = ("llama-cpp-python", "batched")  # the reference first, then the default
TARGET_SPEEDUP = 3.0
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


def bench_local(engine: str) -> dict[str, Any]:
    slots = 1 if engine == "llama-cpp-python" else DEFAULT_SLOTS
    with LocalLLMServer(
        engine=engine, slots=slots, max_tokens=LOCAL_MAX_TOKENS, request_timeout=600.0
    ) as server:
        endpoint = server.endpoint
        run_prompts([TOPICS[0]], endpoint=endpoint, spec=SPEC)  # warm-up, not measured
        rows = [_measure(endpoint, calls=LOCAL_CALLS[level], concurrency=level) for level in LEVELS]
        return {
            "engine": engine,
            "slots": server.slots,
            "model": server.model_name,
            "threads": server.threads,
            "rows": rows,
        }


def _calls_per_s(local: dict[str, Any], concurrency: int) -> float:
    return float(next(r["calls_per_s"] for r in local["rows"] if r["concurrency"] == concurrency))


def run() -> dict[str, Any]:
    started = time.perf_counter()
    fake = bench_fake()
    local = [bench_local(engine) for engine in ENGINES]
    return {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(terse=True),
        },
        "fake": {"latency_s": FAKE_LATENCY, "rows": fake},
        "local": [{**x, "max_tokens": LOCAL_MAX_TOKENS} for x in local],
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
    ]
    local = results["local"]
    if isinstance(local, dict):  # figures of a run before the batched engine existed
        local = [{"engine": "llama-cpp-python", "slots": 1, **local}]
    names = {
        "llama-cpp-python": "llama-cpp-python's server (one completion at a time)",
        "batched": "the batched engine (`workers/llm/serve.py`, the default for `llm: local`)",
    }
    for part, x in zip("bcdef", local, strict=False):
        lines += [
            f"**({part}) Packaged {x['model']} on {names.get(x['engine'], x['engine'])}**, "
            f"{x['slots']} slot(s), {x['threads']} thread(s), max_tokens = {x['max_tokens']}.",
            "",
            *_table(x["rows"], ideal=False),
            "",
        ]
    by_engine = {x["engine"]: x for x in local}
    if {"llama-cpp-python", "batched"} <= by_engine.keys():
        ratio = _calls_per_s(by_engine["batched"], 8) / _calls_per_s(
            by_engine["llama-cpp-python"], 8
        )
        verdict = "met" if ratio >= TARGET_SPEEDUP else "NOT met"
        lines += [
            f"At concurrency 8 the batched engine serves **{ratio:.1f}×** the calls/s of "
            f"llama-cpp-python's single slot, same model and max_tokens (target ≥ "
            f"{TARGET_SPEEDUP:g}×: **{verdict}**). llama-cpp-python's server runs one "
            "completion at a time, so its calls/s does not grow with concurrency and the "
            "latency grows with the queue; the batched engine decodes up to its slot count "
            "together.",
        ]
    else:
        lines += [
            "llama-cpp-python's server runs one completion at a time, so calls/s does not "
            "grow with concurrency and the p50/p95 latency grows with the queue.",
        ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(run()))
