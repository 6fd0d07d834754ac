"""Load: 20 clients download a large release while 5 owners upload and a job runs, with
no error; the p50/p95 latencies and the server's peak memory are reported, and the
memory does not grow with the size of the download.

The machinery is :mod:`benchmarks.bench_load` (``make bench`` runs the same code on a
database of its own): a real uvicorn process on this session's Postgres database (its
RSS read from ``/proc``), a real Celery worker on Redis, httpx clients in threads.
The figures are recorded for the run's summary (``$KEYSEED_PROOF_REPORT``, see
``tests/conftest.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.db import Database
from benchmarks import bench_load
from tests.service import factories

pytestmark = [pytest.mark.slow, pytest.mark.proof]

# The server's peak RSS over its warm baseline, for a release 4× larger, may be at most
# GROWTH_RATIO times that for the small release plus GROWTH_SLACK_MB. Sound because:
# a server that buffered a body (or any part of it proportional to its size) per client
# would grow by about 20 × 3 × (small body) ≈ 500 MB more for the large release, far
# above the bound; a streaming server holds one page of rows per client whatever the
# size (measured: +163-192 MB for 20 clients of the small release, +204-219 MB for the
# large one, a ratio of 1.1-1.25), so both phases reach about the same peak up to
# allocator noise (arena fragmentation, how the threads interleave), which the ratio and
# the slack absorb. The large phase runs after the small one, so memory the allocator
# kept from the small phase counts against the large one: the order is the strict one.
GROWTH_RATIO = 1.5
GROWTH_SLACK_MB = 16.0


@pytest.mark.timeout(600)
def test_downloads_uploads_and_a_job_at_once(
    request: pytest.FixtureRequest,
    database_url: str,
    db: Database,
    client: TestClient,
    world: factories.World,
    tmp_path: Path,
) -> None:
    report = bench_load.run_load(database_url, db, client, world, tmp_path)
    request.node.user_properties.append(("figures", report))
    print(bench_load.markdown(report))

    # no error: every response 2xx, every body complete, the job succeeded
    assert report["errors"] == [], report["errors"]
    phases = report["phases"]
    mixed = phases["mixed"]
    assert mixed["job"].get("state") == "succeeded", mixed["job"]
    assert mixed["uploads"] >= bench_load.UPLOADERS
    for name in ("small", "large", "mixed"):
        latency = phases[name]["latency"]
        for fmt in ("jsonl", "csv"):
            assert latency[f"download_{fmt}"]["n"] == bench_load.DOWNLOADERS // 2, (name, fmt)

    # the body grows 4×, the server's memory does not
    releases = report["releases"]
    assert (
        releases["large"]["documents"] == bench_load.LARGE_FACTOR * releases["small"]["documents"]
    )
    assert releases["large"]["jsonl_mb"] > 3.5 * releases["small"]["jsonl_mb"]
    small_growth = max(phases["small"]["server_growth_mb"], 0.0)
    large_growth = max(phases["large"]["server_growth_mb"], 0.0)
    bound = GROWTH_RATIO * small_growth + GROWTH_SLACK_MB
    assert large_growth <= bound, (small_growth, large_growth, bound)
    # and far less than the bodies in flight: a server buffering each response would
    # hold 20 large bodies at once; a streaming one holds a page of rows per client
    # (about 6 MB for JSONL, 10 MB for CSV, whatever the release's size)
    in_flight = bench_load.DOWNLOADERS * releases["large"]["jsonl_mb"]
    assert large_growth < in_flight / 2, (large_growth, in_flight)
