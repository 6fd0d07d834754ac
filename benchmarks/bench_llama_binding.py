"""The batched engine on two builds of llama.cpp, side by side (issue 67, item 1).

``workers.llm.serve`` (continuous batching, 8 slots, Q8_0 weights) runs on two server
processes at once, each from its own checkout and interpreter:

* **baseline**: a checkout whose engine calls llama-cpp-python (llama.cpp compiled from
  source at install, portable x86-64 set), e.g. main before this change;
* **candidate**: this checkout, whose engine calls the prebuilt llama.cpp of the
  ``llama-cpp-cffi`` wheel (:mod:`workers.llm.llamacpp`).

The prompts, ``max_tokens`` and measurement are :mod:`benchmarks.bench_prompting`'s (b):
the client of :mod:`workers.llm.client` at concurrency 1 and 8, the runs alternating
between the servers so a neighbour's load hits both alike, the median of ``--repeats``
shown with every run, and the load average before and after. It also sends each server
the same five prompts at temperature 0 and reports how many greedy completions agree
(llama.cpp's batched kernels are not bit-exact across versions, so a few may part after
some tokens) with the first ones side by side.

    python -m benchmarks.bench_llama_binding \\
        --baseline-src ../main --baseline-python ../main/.venv/bin/python
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_prompting import (
    LOCAL_MAX_TOKENS,
    SPEC,
    TOPICS,
    _table,
    interleaved_rows,
)
from workers.llm.local import LocalLLMServer
from workers.methods.dpkps.prompting import run_prompts

ROOT = Path(__file__).resolve().parents[1]


class CheckoutServer(LocalLLMServer):
    """:class:`LocalLLMServer`'s batched server run from ``src`` with ``python``."""

    def __init__(self, src: Path, python: Path, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.src = src
        self.python = python

    def command(self, port: int) -> list[str]:
        # an older checkout's server has no --exit-with-parent
        argv = [a for a in super().command(port) if a != "--exit-with-parent"]
        # run in src: ``python -m`` puts the working folder before PYTHONPATH
        return ["env", "-C", str(self.src), f"PYTHONPATH={self.src}", str(self.python), *argv[1:]]


def _greedy(server: LocalLLMServer) -> list[str]:
    import httpx

    texts = []
    for topic in TOPICS:
        body = {
            "model": server.model_name,
            "messages": [
                {"role": "user", "content": f"Write a news article about {', '.join(topic)}."}
            ],
            "max_tokens": LOCAL_MAX_TOKENS,
            "temperature": 0.0,
        }
        reply = httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=600)
        reply.raise_for_status()
        texts.append(str(reply.json()["choices"][0]["message"]["content"]))
    return texts


def _counters(server: LocalLLMServer) -> dict[str, int]:
    """The server's engine counters (``GET /slots``) after the runs."""
    import httpx

    reply = httpx.get(server.base_url.removesuffix("/v1") + "/slots", timeout=30)
    reply.raise_for_status()
    return dict(reply.json())


def run(args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    caches = {name: Path(tempfile.mkdtemp(prefix=f"keyseed-bench-{name}-")) for name in ("a", "b")}
    servers = {
        "baseline": CheckoutServer(
            args.baseline_src.resolve(),
            args.baseline_python,
            max_tokens=LOCAL_MAX_TOKENS,
            request_timeout=600.0,
            cache_dir=caches["a"],
        ),
        "candidate": CheckoutServer(
            ROOT,
            args.candidate_python,
            max_tokens=LOCAL_MAX_TOKENS,
            request_timeout=600.0,
            cache_dir=caches["b"],
        ),
    }
    load_before = os.getloadavg()
    try:
        startup = {}
        for name, server in servers.items():
            t0 = time.perf_counter()
            server.start()  # converts the weights to Q8_0 into its own empty cache
            startup[name] = time.perf_counter() - t0
            run_prompts([TOPICS[0]], endpoint=server.endpoint, spec=SPEC)  # warm-up
        greedy = {name: _greedy(server) for name, server in servers.items()}
        rows = interleaved_rows(servers, args.repeats)
        counters = {name: _counters(server) for name, server in servers.items()}
    finally:
        for server in servers.values():
            server.stop()
    return {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(terse=True),
        },
        "rows": rows,
        "startup_s": startup,
        "counters": counters,
        "greedy": greedy,
        "ratio_c8": rows["candidate"][-1]["calls_per_s"] / rows["baseline"][-1]["calls_per_s"],
        "ratio_c1": rows["candidate"][0]["calls_per_s"] / rows["baseline"][0]["calls_per_s"],
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "repeats": args.repeats,
        "total_s": time.perf_counter() - started,
    }


def markdown(results: dict[str, Any]) -> str:
    machine = results["machine"]
    greedy = results["greedy"]
    same = sum(a == b for a, b in zip(greedy["baseline"], greedy["candidate"], strict=True))
    load = ", ".join(f"{v:.2f}" for v in results["load_before"])
    load_after = ", ".join(f"{v:.2f}" for v in results["load_after"])
    lines = [
        "## The batched engine on llama-cpp-python against llama-cpp-cffi",
        "",
        f"{machine['cpus']} CPUs, Python {machine['python']}, {machine['platform']}; total "
        f"run {results['total_s']:.0f} s; load average (1, 5, 15 min) {load} before, "
        f"{load_after} after. max_tokens = {LOCAL_MAX_TOKENS}, bench_prompting's prompts; "
        f"runs alternate between the two servers ({results['repeats']} of each, median shown).",
        "",
        "*Baseline*: llama-cpp-python (llama.cpp compiled at install).",
        "",
        *_table(results["rows"]["baseline"], fake=False),
        "",
        "*Candidate*: llama-cpp-cffi's prebuilt CPU library.",
        "",
        *_table(results["rows"]["candidate"], fake=False),
        "",
        f"**Candidate / baseline calls/s: {results['ratio_c8']:.2f}× at concurrency 8, "
        f"{results['ratio_c1']:.2f}× at concurrency 1.** Start-up (weights converted to "
        f"Q8_0 into an empty cache, model loaded): baseline "
        f"{results['startup_s']['baseline']:.1f} s, candidate "
        f"{results['startup_s']['candidate']:.1f} s.",
        "",
        "Engine counters over the whole run (`GET /slots`): "
        + "; ".join(
            f"{name}: {c.get('decode_calls', 0)} decode calls, "
            f"{c.get('prompt_tokens', 0)} prompt tokens of which {c.get('reused_tokens', 0)} "
            f"found cached ({c.get('shared_tokens', 0)} in another sequence's cells), "
            f"{c.get('threads', 0)} thread(s) at the end, {c.get('thread_switches', 0)} switches"
            for name, c in results["counters"].items()
        )
        + ".",
        "",
        f"Greedy completions (temperature 0) of five prompts: {same} of {len(greedy['baseline'])} "
        "identical.",
        "",
        "| prompt | baseline | candidate |",
        "|---:|---|---|",
        *(
            f"| {i + 1} | {a[:90]!r} | {b[:90]!r} |"
            for i, (a, b) in enumerate(zip(greedy["baseline"], greedy["candidate"], strict=True))
        ),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline-src", type=Path, required=True)
    parser.add_argument("--baseline-python", type=Path, required=True)
    parser.add_argument("--candidate-python", type=Path, default=Path(sys.executable))
    parser.add_argument("--repeats", type=int, default=3)
    print(markdown(run(parser.parse_args(argv))))


if __name__ == "__main__":
    main()
