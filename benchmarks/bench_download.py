"""Downloads: 20 clients fetch a ~30 MB release at once, from the API and, side by side
in the same run, from a plain file server serving the same bytes.

The API runs as ``keyseed serve`` runs it (``python -m app.cli api``: uvicorn with the
settings' limits and :mod:`app.server`'s protocol) in a process of its own, on a
Postgres database of this run's own; the release is seeded as in
:mod:`benchmarks.bench_load` (a job driven to success, ~1 KB synthetic texts). Its
first download renders the JSONL file (timed apart); the bytes it sent are then put in
a folder that ``python -m http.server`` serves on the same loopback (the baseline).

Each round, :data:`CLIENTS` concurrent clients (one ``httpx.AsyncClient`` of as many
connections, in this process) download the whole file once from the API, then once
from the plain server; :data:`ROUNDS` rounds, the first a warm-up left out. Aggregate
MB/s (10^6 bytes) is all bytes received over the wall time of the round; every body's
length is checked, and the API's first body against its ETag (sha256). The API's
memory (VmRSS) is read before the rounds, sampled during them (its peak, with the
kernel's high-water mark reset where allowed) and read after; its CPU seconds per GB
sent are a figure a loaded machine disturbs less. ``run() -> dict`` and
``markdown(dict) -> str`` like the other ``bench_*`` modules.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from fastapi.testclient import TestClient

from app.db import Database
from app.serve import api_command, free_port
from benchmarks.bench_ingest import BASELINE_TREE, _commit, cpu_seconds
from benchmarks.bench_load import (
    RssSampler,
    _forget_prefix,
    child,
    http_ok,
    seed_release,
    service_env,
    wait_until,
)
from tests.service import factories

CLIENTS = 20
DOCUMENTS = int(os.environ.get("KEYSEED_BENCH_DOWNLOAD_DOCUMENTS", "27000"))  # ~30 MB JSONL
ROUNDS = int(os.environ.get("KEYSEED_BENCH_DOWNLOAD_ROUNDS", "6"))
TARGET = 0.5  # the API's aggregate over the plain server's (issue 65)


def _loadavg() -> list[str]:
    return Path("/proc/loadavg").read_text().split()[:3]


async def _fetch(client: httpx.AsyncClient, url: str, headers: dict[str, str]) -> int:
    received = 0
    async with client.stream("GET", url, headers=headers) as response:
        if response.status_code != 200:
            await response.aread()
            raise AssertionError(f"{url}: {response.status_code} {response.text[:300]}")
        async for chunk in response.aiter_raw():
            received += len(chunk)
    return received


async def _burst(url: str, headers: dict[str, str], size: int) -> dict[str, float]:
    limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=CLIENTS)
    async with httpx.AsyncClient(limits=limits, timeout=600) as client:
        began = time.perf_counter()
        sizes = await asyncio.gather(*(_fetch(client, url, headers) for _ in range(CLIENTS)))
        seconds = time.perf_counter() - began
    assert all(s == size for s in sizes), f"incomplete bodies from {url}: {sizes}"
    return {"seconds": round(seconds, 3), "mb_per_s": sum(sizes) / seconds / 1e6}


def _plain_argv(folder: Path, port: int) -> list[str]:
    """The baseline: Python's own file server (threaded) on the same loopback."""
    return [
        sys.executable,
        "-m",
        "http.server",
        "--bind",
        "127.0.0.1",
        "--directory",
        str(folder),
        str(port),
    ]


def _earlier_tree(
    tree: Path, env: dict[str, str], workdir: Path, release_id: str, headers: dict[str, str]
) -> dict[str, Any]:
    """One round of :data:`CLIENTS` downloads from another checkout's API (``tree``, the
    code before this change: each request rendered the corpus from the database), on
    the same database, with its RSS before and after."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    url = f"{base}/v1/releases/{release_id}/download"
    tree_env = env | {"PYTHONPATH": str(tree), "KEYSEED_DATA_DIR": str(workdir / "earlier")}
    argv = api_command("127.0.0.1", port)
    with child("earlier", argv, tree_env, workdir / "earlier.log", cwd=tree) as api:
        wait_until(lambda: http_ok(f"{base}/readyz"), api, f"the API of {tree}", 180)
        size = len(httpx.get(url, headers=headers, timeout=600).content)
        before_kb = RssSampler(api.pid).now_kb()
        figures = asyncio.run(_burst(url, headers, size))
        time.sleep(0.5)
        after_kb = RssSampler(api.pid).now_kb()
    return {
        "tree": str(tree),
        "commit": _commit(tree),
        "mb_per_s": round(figures["mb_per_s"], 1),
        "seconds": figures["seconds"],
        "rss_before_mb": round(before_kb / 1024, 1),
        "rss_after_mb": round(after_kb / 1024, 1),
    }


def run_download(
    database_url: str, db: Database, app_client: TestClient, workdir: Path
) -> dict[str, Any]:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise
    world = factories.build_world(db)
    prefix = f"keyseed_download_{uuid.uuid4().hex[:10]}:"
    env = service_env(database_url, prefix, workdir)
    seeded = seed_release(db, app_client, world, DOCUMENTS)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    headers = world.client.headers
    api_url = f"{base}/v1/releases/{seeded.release_id}/download"
    here = Path(__file__).resolve().parents[1]
    results: dict[str, Any] = {
        "clients": CLIENTS,
        "documents": DOCUMENTS,
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "commit": _commit(here),
        "loadavg_before": _loadavg(),
    }
    try:
        if BASELINE_TREE.is_dir() and BASELINE_TREE.resolve() != here:
            results["earlier"] = _earlier_tree(
                BASELINE_TREE, env, workdir, seeded.release_id, headers
            )
            print("earlier tree", results["earlier"], file=sys.stderr, flush=True)
        with child("api", api_command("127.0.0.1", port), env, workdir / "api.log") as api:
            wait_until(lambda: http_ok(f"{base}/readyz"), api, "the API", 180)
            results["api_rss_start_mb"] = round(RssSampler(api.pid).now_kb() / 1024, 1)
            began = time.perf_counter()
            first = httpx.get(api_url, headers=headers, timeout=600)
            results["first_download_s"] = round(time.perf_counter() - began, 2)
            assert first.status_code == 200, first.text[:300]
            body = first.content
            assert first.headers["etag"] == f'"{hashlib.sha256(body).hexdigest()}"'
            began = time.perf_counter()
            again = httpx.get(api_url, headers=headers, timeout=600)
            results["second_download_s"] = round(time.perf_counter() - began, 2)
            assert again.content == body
            size = len(body)
            results["release_mb"] = round(size / 1e6, 1)
            folder = workdir / "plain"
            folder.mkdir()
            (folder / "release.jsonl").write_bytes(body)
            del body, first, again
            plain_port = free_port()
            argv = _plain_argv(folder, plain_port)
            with child("plain", argv, dict(os.environ), workdir / "plain.log") as plain:
                plain_url = f"http://127.0.0.1:{plain_port}/release.jsonl"
                wait_until(lambda: http_ok(plain_url), plain, "the file server", 60)
                api_rounds: list[dict[str, float]] = []
                plain_rounds: list[dict[str, float]] = []
                with RssSampler(api.pid) as sampler:
                    time.sleep(0.5)
                    before_kb = sampler.now_kb()
                    since = time.monotonic()
                    reset = sampler.reset_hwm()
                    cpu = {"api": 0.0, "plain": 0.0}
                    for round_ in range(ROUNDS):
                        api_cpu, plain_cpu = cpu_seconds(api.pid), cpu_seconds(plain.pid)
                        api_figures = asyncio.run(_burst(api_url, headers, size))
                        plain_figures = asyncio.run(_burst(plain_url, {}, size))
                        print(
                            "round", round_, "api", api_figures, "plain", plain_figures,
                            "load", _loadavg(), file=sys.stderr, flush=True,
                        )  # fmt: skip
                        if round_ == 0:  # warm-up: connections, code paths, page cache
                            continue
                        cpu["api"] += cpu_seconds(api.pid) - api_cpu
                        cpu["plain"] += cpu_seconds(plain.pid) - plain_cpu
                        api_rounds.append(api_figures)
                        plain_rounds.append(plain_figures)
                    peak_kb = sampler.peak_kb(since, reset)
                    time.sleep(0.5)
                    after_kb = sampler.now_kb()
            assert api.alive(), f"the API died:\n{api.tail()}"
    finally:
        _forget_prefix(prefix)
    api_rates = [r["mb_per_s"] for r in api_rounds]
    plain_rates = [r["mb_per_s"] for r in plain_rounds]
    sent_gb = size * CLIENTS * len(api_rounds) / 1e9
    results.update(
        rounds=len(api_rounds),
        api_mb_per_s=[round(r, 1) for r in api_rates],
        plain_mb_per_s=[round(r, 1) for r in plain_rates],
        api_median_mb_per_s=round(statistics.median(api_rates), 1),
        plain_median_mb_per_s=round(statistics.median(plain_rates), 1),
        ratio=round(statistics.median(api_rates) / statistics.median(plain_rates), 3),
        ratios=[round(a / p, 3) for a, p in zip(api_rates, plain_rates, strict=True)],
        api_cpu_s_per_gb=round(cpu["api"] / sent_gb, 2),
        plain_cpu_s_per_gb=round(cpu["plain"] / sent_gb, 2),
        api_rss_before_mb=round(before_kb / 1024, 1),
        api_rss_peak_mb=round(peak_kb / 1024, 1),
        api_rss_after_mb=round(after_kb / 1024, 1),
        loadavg_after=_loadavg(),
        target=TARGET,
    )
    return results


def run() -> dict[str, Any]:
    """:func:`run_download` on a database of its own (created, migrated, dropped)."""
    from benchmarks.scratch import scratch_app

    with scratch_app() as (url, db, app_client, workdir):
        return run_download(url, db, app_client, workdir)


def markdown(results: dict[str, Any]) -> str:
    r = results
    verdict = "meets" if r["ratio"] >= r["target"] else "misses"
    rows = [
        "| server | tree | median MB/s | each round (MB/s) | server CPU s per GB |",
        "|---|---|---:|---|---:|",
        f"| API | {r['commit']} | {r['api_median_mb_per_s']} | "
        f"{', '.join(map(str, r['api_mb_per_s']))} | {r['api_cpu_s_per_gb']} |",
        f"| plain file server | | {r['plain_median_mb_per_s']} | "
        f"{', '.join(map(str, r['plain_mb_per_s']))} | {r['plain_cpu_s_per_gb']} |",
    ]
    earlier = r.get("earlier")
    if earlier:
        rows.append(
            f"| API before (rendered per request) | {earlier['commit']} | "
            f"{earlier['mb_per_s']} | one round | - |"
        )
    memory = (
        f"API memory: {r['api_rss_start_mb']} MB at start, {r['api_rss_before_mb']} MB "
        f"before the rounds, a peak of {r['api_rss_peak_mb']} MB during them and "
        f"{r['api_rss_after_mb']} MB after"
    )
    if earlier:
        memory += (
            f" (the API before: {earlier['rss_before_mb']} MB before its round, "
            f"{earlier['rss_after_mb']} MB after)"
        )
    return "\n".join(
        [
            "## Downloads: 20 clients at once against a plain file server",
            "",
            f"A release of {r['documents']:,} documents ({r['release_mb']} MB of JSONL), "
            f"{r['clients']} concurrent clients (httpx, one process), each round from the API "
            "(`keyseed api`; the file rendered once, sent with `os.sendfile`) and then from "
            "`python -m http.server` serving the same bytes on the same loopback; "
            f"{r['rounds']} rounds after a warm-up, {r['cpus']} CPUs, load average "
            f"{' '.join(r['loadavg_before'])} before and {' '.join(r['loadavg_after'])} after "
            "(`benchmarks/bench_download.py`).",
            "",
            *rows,
            "",
            f"The API gives {r['ratio']:.0%} of the plain server's aggregate ({verdict} the "
            f"target of {r['target']:.0%}; per round {', '.join(f'{x:.0%}' for x in r['ratios'])})"
            f". The first download (rendering the file) took {r['first_download_s']} s, the "
            f"second {r['second_download_s']} s. {memory}.",
            "",
        ]
    )


if __name__ == "__main__":
    import json

    figures = run()
    print(json.dumps(figures, indent=2))
    print(markdown(figures))
