"""Load: 20 clients download a large release while 5 owners upload and a job runs.

The service runs as it does in production: ``keyseed api`` (uvicorn, :mod:`app.server`) in
a process of its own (so its memory can be read from ``/proc/<pid>/status``), a real
Celery worker on Redis, the given Postgres database. The releases are seeded cheaply:
a job of the in-process app (``llm: "none"``) is driven to success through
:mod:`app.jobs.runner`, its sequences inserted in bulk with ~1 KB synthetic texts.

Four phases, all over HTTP:

``warmup``
    20 concurrent downloads of a tiny release: the server's thread pool, connection
    pool and code paths exist afterwards, so the baseline RSS is a warm server's;
``small`` and ``large``
    20 concurrent downloads (half JSONL, half CSV) of a release of N, then 4N documents,
    nothing else running: the server's peak RSS over the baseline must not grow with
    the size of the body;
``mixed``
    20 concurrent downloads of the large release while 5 owners upload multi-MB CSV
    datasets in a loop and a job (submitted over HTTP, run by the real worker) goes
    from queued to succeeded.

Every request must be 2xx, every body complete (its line count and its last record
checked). Latencies are per request: time to the last byte of a download, time to
the response of an upload, a job submission or a job poll. :func:`run_load` returns
the figures (a JSON-ready dict); :func:`run` makes its own database for ``make bench``.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from fastapi.testclient import TestClient

from app.db import Database
from app.jobs import repository as jobs_repo
from app.jobs import runner
from app.models import Job
from app.serve import free_port, worker_command
from tests.service import factories

REPO = Path(__file__).resolve().parents[1]
REDIS_URL = os.environ.get("KEYSEED_TEST_REDIS", "redis://127.0.0.1:6379/0")
DOWNLOADERS = 20
UPLOADERS = 5
SMALL = 8_000  # documents of the small release; the large one has LARGE_FACTOR times more
LARGE_FACTOR = 4
TINY = 200  # the warm-up release
TEXT_CHARS = 1_000  # about 1 KB of text per synthetic document
UPLOAD_ROWS = 3_000  # about 3 MB of CSV per upload
UPLOADS_PER_UPLOADER = 8  # at most; each uploader keeps going while the downloads run
UPLOAD_LIMIT = 8 * 2**20
SAMPLE_EVERY = 0.02  # seconds between two reads of the server's VmRSS
INSERT_BATCH = 2_000
_FOREIGN = ("DATABASE_URL", "REDIS_URL", "PROMETHEUS_MULTIPROC_DIR")
_NOTE = (
    "patient presented with chest pain radiating to the left arm, troponin negative, "
    "echocardiogram showed reduced ejection fraction; started on beta blocker and "
    "diuretic. knee arthritis with joint pain, femur fracture after a fall, treated "
    "with fixation and physiotherapy; atrial fibrillation on anticoagulation, follow up "
    "in clinic in six weeks with repeat imaging and bloods"
)
_WORDS = _NOTE.split(" ")


def _text_pool() -> str:
    rng = random.Random(20240917)
    return " ".join(rng.choice(_WORDS) for _ in range(40_000))


_POOL = _text_pool()


def synthetic_text(index: int, chars: int = TEXT_CHARS) -> str:
    """A distinct ~``chars``-character clinical-sounding text, one line, no quotes."""
    start = (index * 7919) % (len(_POOL) - chars)
    return f"note {index}: {_POOL[start : start + chars]}"


# -- seeding ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Seeded:
    release_id: str
    documents: int


def seed_release(
    db: Database, app_client: TestClient, world: factories.World, documents: int
) -> Seeded:
    """A release of ``documents`` synthetic documents granted to ``world.client``: a
    ``llm: "none"`` job of the in-process app, driven to success as a worker would, its
    sequences inserted in bulk (the insert :func:`app.jobs.runner.save_sequences` uses)."""
    dataset_id = factories.dataset(app_client, world.owner)
    job_id = uuid.UUID(factories.job(app_client, world.owner, dataset_id))
    with db.transaction() as session:
        assert runner.start_sequences(session, job_id) is not None
    for start in range(0, documents, INSERT_BATCH):
        rows = [
            {
                "job_id": job_id,
                "position": i,
                "label": factories.LABELS[i % 2],
                "keyphrases": [factories.PHRASES[i % 12], factories.PHRASES[(i * 5 + 1) % 12]],
                "text": synthetic_text(i),
                "attempts": 1,
            }
            for i in range(start, min(start + INSERT_BATCH, documents))
        ]
        with db.transaction() as session:
            jobs_repo.insert_sequences(session, rows)
    with db.transaction() as session:
        job = session.get(Job, job_id, with_for_update=True)
        assert job is not None
        job.sequences_total = job.texts_done = documents
        job.private_vocabulary = ["heart failure", "fracture"]
        job.manifest = {"privacy": {"epsilon_total": 1.0}, "embedding_model": "test-model"}
        job.stage, job.progress = "prompts", 0.0
    with db.transaction() as session:
        runner.finish(session, job_id)
    response = app_client.post(
        f"/v1/jobs/{job_id}/release",
        headers=world.owner.headers,
        json={"client_organisations": [str(world.client.organisation_id)]},
    )
    assert response.status_code == 201, response.text
    assert response.json()["documents"] == documents
    return Seeded(str(response.json()["id"]), documents)


def seed_job_inputs(app_client: TestClient, world: factories.World) -> tuple[str, str]:
    """A small dataset and a small uploaded vocabulary for the job of the mixed phase."""
    dataset_id = factories.dataset(app_client, world.owner)
    response = app_client.post(
        "/v1/vocabularies",
        headers=world.owner.headers,
        data={"name": "load-phrases"},
        files={"file": ("phrases.txt", "\n".join(factories.PHRASES).encode())},
    )
    assert response.status_code == 201, response.text
    return dataset_id, str(response.json()["id"])


def upload_body(uploader: int, round_: int) -> bytes:
    base = (uploader + 1) * 10_000_000 + round_ * 100_000
    rows = ((synthetic_text(base + i), factories.LABELS[i % 2]) for i in range(UPLOAD_ROWS))
    return factories.csv_bytes(rows)


# -- processes ----------------------------------------------------------------------------


def service_env(database_url: str, prefix: str, workdir: Path) -> dict[str, str]:
    """The environment of the API and the worker: the given database, Redis with a key
    prefix of this run's own, the test document key, a roomy upload limit."""
    from tests.service.conftest import DATA_KEY

    env = {k: v for k, v in os.environ.items() if not k.startswith("KEYSEED_")}
    for name in _FOREIGN:
        env.pop(name, None)
    env.update(
        KEYSEED_DATABASE_URL=database_url,
        KEYSEED_BROKER_URL=REDIS_URL,
        KEYSEED_BROKER_KEY_PREFIX=prefix,
        KEYSEED_DATA_KEY=DATA_KEY,
        KEYSEED_DATA_DIR=str(workdir / "data"),
        KEYSEED_CACHE_DIR=str(workdir / "cache"),
        KEYSEED_MAX_UPLOAD_BYTES=str(UPLOAD_LIMIT),
        KEYSEED_PROGRESS_INTERVAL="0.5",
        KEYSEED_LOG_LEVEL="WARNING",
        KEYSEED_LOG_JSON="true",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        PYTHONUNBUFFERED="1",
    )
    return env


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def text(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def tail(self, chars: int = 3000) -> str:
        return self.text()[-chars:]

    def alive(self) -> bool:
        return self.process.poll() is None


@contextlib.contextmanager
def child(
    name: str, argv: list[str], env: dict[str, str], log: Path, cwd: Path = REPO
) -> Iterator[Child]:
    """A subprocess in a process group of its own, stopped (group and all) on exit."""
    with open(log, "wb") as output:
        process = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    handle = Child(name, process, log)
    try:
        yield handle
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=60)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=30)


def api_argv(port: int) -> list[str]:
    """The API as production runs it (``keyseed api``: uvicorn with the settings' limits
    and the ``pathsend`` extension, so a release file goes out by ``sendfile``)."""
    return [
        sys.executable,
        "-m",
        "app.cli",
        "api",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]


def wait_until(ready: Callable[[], bool], process: Child, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert process.alive(), f"{what} exited:\n{process.tail()}"
        assert time.monotonic() < deadline, (
            f"{what} not ready in {timeout:.0f} s:\n{process.tail()}"
        )
        time.sleep(0.25)


def http_ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


# -- memory -------------------------------------------------------------------------------


def _status_kb(pid: int, name: str) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(name + ":"):
                return int(line.split()[1])
    raise KeyError(name)


class RssSampler:
    """Reads a process's VmRSS every :data:`SAMPLE_EVERY` seconds in a thread. Where the
    kernel lets us (``/proc/<pid>/clear_refs``), the peak of a window also takes the
    kernel's own high-water mark (VmHWM), reset at the window's start, so a spike
    shorter than the sampling period is not missed."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.samples: list[tuple[float, int]] = []  # (monotonic time, kB)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rss", daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError, KeyError, ValueError):
                self.samples.append((time.monotonic(), _status_kb(self.pid, "VmRSS")))
            self._stop.wait(SAMPLE_EVERY)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def now_kb(self) -> int:
        return _status_kb(self.pid, "VmRSS")

    def reset_hwm(self) -> bool:
        try:
            with open(f"/proc/{self.pid}/clear_refs", "w", encoding="ascii") as refs:
                refs.write("5")
        except OSError:
            return False
        return True

    def peak_kb(self, since: float, hwm_reset: bool) -> int:
        sampled = max((kb for t, kb in self.samples if t >= since), default=0)
        return max(sampled, _status_kb(self.pid, "VmHWM")) if hwm_reset else sampled


# -- load ---------------------------------------------------------------------------------


@dataclass
class Tally:
    """What the clients of one phase saw, filled from many threads."""

    latencies: dict[str, list[float]] = field(default_factory=dict)
    bytes_in: int = 0
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, kind: str, seconds: float, size: int = 0) -> None:
        with self.lock:
            self.latencies.setdefault(kind, []).append(seconds)
            self.bytes_in += size

    def error(self, message: str) -> None:
        with self.lock:
            self.errors.append(message)


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    low = math.floor(k)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (k - low)


def summary(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50_s": round(percentile(values, 0.50), 4),
        "p95_s": round(percentile(values, 0.95), 4),
        "max_s": round(max(values), 4),
    }


def _check_tail(fmt: str, tail: bytes, documents: int) -> str | None:
    """None if the body's last record is the release's last document."""
    last = tail.rstrip(b"\r\n").rsplit(b"\n", 1)[-1].decode("utf-8")
    if fmt == "jsonl":
        record = json.loads(last)
    else:
        label, text, keyphrases = next(csv.reader(io.StringIO(last)))
        record = {"label": label, "text": text, "keyphrases": keyphrases}
    text = record["text"]
    expected = synthetic_text(documents - 1)
    return None if text == expected else f"{fmt}: last record is not document {documents - 1}"


def download(base: str, headers: dict[str, str], release: Seeded, fmt: str, tally: Tally) -> int:
    """One client streams the whole release; returns the body's size."""
    url = f"{base}/v1/releases/{release.release_id}/download"
    lines, size, tail = 0, 0, b""
    with httpx.Client(timeout=httpx.Timeout(180, connect=15)) as http:
        started = time.perf_counter()
        with http.stream("GET", url, params={"format": fmt}, headers=headers) as response:
            if response.status_code != 200:
                response.read()
                tally.error(f"download {fmt}: {response.status_code} {response.text[:300]}")
                return 0
            for chunk in response.iter_bytes():
                lines += chunk.count(b"\n")
                size += len(chunk)
                tail = (tail + chunk)[-16384:]
        elapsed = time.perf_counter() - started
    expected = release.documents + (1 if fmt == "csv" else 0)  # CSV has a header row
    if lines != expected:
        tally.error(f"download {fmt}: {lines} lines, expected {expected}")
    elif (problem := _check_tail(fmt, tail, release.documents)) is not None:
        tally.error(problem)
    tally.record(f"download_{fmt}", elapsed, size)
    return size


def upload(base: str, headers: dict[str, str], body: bytes, tally: Tally) -> None:
    data = {
        "name": "load",
        "text_column": ["text"],
        "label_column": "label",
        "labels": list(factories.LABELS),
        "epsilon_cap": "5",
    }
    with httpx.Client(timeout=180) as http:
        started = time.perf_counter()
        response = http.post(
            f"{base}/v1/datasets",
            headers=headers,
            data=data,
            files={"file": ("load.csv", body, "text/csv")},
        )
        elapsed = time.perf_counter() - started
    if response.status_code != 201:
        tally.error(f"upload: {response.status_code} {response.text[:300]}")
    elif response.json()["documents"] != UPLOAD_ROWS:
        tally.error(f"upload: {response.json()['documents']} documents stored")
    tally.record("upload", elapsed)


def run_job(
    base: str, headers: dict[str, str], dataset_id: str, vocabulary_id: str, tally: Tally
) -> dict[str, Any]:
    """Submit a small ``llm: "none"`` job over HTTP and poll it until it ends."""
    spec = factories.spec(
        vocabulary=vocabulary_id,
        per_class=2,
        vocabulary_size=8,
        sequence_length=3,
        num_features=64,
    )
    with httpx.Client(base_url=base, headers=headers, timeout=60) as http:
        started = time.perf_counter()
        response = http.post(f"/v1/datasets/{dataset_id}/jobs", json=spec)
        tally.record("job_submit", time.perf_counter() - started)
        if response.status_code != 202:
            tally.error(f"job submit: {response.status_code} {response.text[:300]}")
            return {}
        job = response.json()
        deadline = time.monotonic() + 180
        while job["state"] in ("queued", "running") and time.monotonic() < deadline:
            time.sleep(0.5)
            polled = time.perf_counter()
            response = http.get(f"/v1/jobs/{job['id']}")
            tally.record("job_poll", time.perf_counter() - polled)
            if response.status_code != 200:
                tally.error(f"job poll: {response.status_code} {response.text[:300]}")
                return job
            job = response.json()
        duration = time.perf_counter() - started
    if job["state"] != "succeeded":
        tally.error(f"job ended {job['state']}: {job.get('error')}")
    return {"id": job["id"], "state": job["state"], "seconds": round(duration, 2)}


def _threads(targets: list[Callable[[], object]], tally: Tally) -> list[threading.Thread]:
    barrier = threading.Barrier(len(targets))

    def wrap(target: Callable[[], object]) -> Callable[[], None]:
        def body() -> None:
            try:
                barrier.wait(timeout=60)
                target()
            except Exception as exc:  # a failure of the client is an error of the phase
                tally.error(f"{type(exc).__name__}: {exc}")

        return body

    threads = [threading.Thread(target=wrap(t), daemon=True) for t in targets]
    for thread in threads:
        thread.start()
    return threads


@dataclass
class Phase:
    name: str
    seconds: float
    tally: Tally
    peak_kb: int
    extra: dict[str, Any] = field(default_factory=dict)

    def figures(self, baseline_kb: int) -> dict[str, Any]:
        mb = self.tally.bytes_in / 2**20
        return {
            "seconds": round(self.seconds, 2),
            "downloaded_mb": round(mb, 1),
            "throughput_mb_s": round(mb / self.seconds, 1),
            "latency": {k: summary(v) for k, v in sorted(self.tally.latencies.items())},
            "server_peak_rss_mb": round(self.peak_kb / 1024, 1),
            "server_growth_mb": round((self.peak_kb - baseline_kb) / 1024, 1),
            "errors": list(self.tally.errors),
            **self.extra,
        }


def phase(
    name: str,
    sampler: RssSampler,
    base: str,
    client_headers: dict[str, str],
    release: Seeded,
    *,
    side: Callable[[Tally, threading.Event], list[Callable[[], object]]] | None = None,
) -> Phase:
    """:data:`DOWNLOADERS` concurrent downloads of ``release``, half JSONL, half CSV (and
    the ``side`` load, given the tally and an event set once the downloads are done)."""
    tally = Tally()
    done = threading.Event()
    downloads: list[Callable[[], object]] = [
        (lambda fmt=fmt: download(base, client_headers, release, fmt, tally))
        for fmt in ("jsonl", "csv") * (DOWNLOADERS // 2)
    ]
    others = side(tally, done) if side is not None else []
    before_kb = sampler.now_kb()
    hwm = sampler.reset_hwm()
    since = time.monotonic()
    started = time.perf_counter()
    threads = _threads(downloads + others, tally)
    for thread in threads[: len(downloads)]:
        thread.join(timeout=600)
    done.set()
    for thread in threads[len(downloads) :]:
        thread.join(timeout=600)
    seconds = time.perf_counter() - started
    if any(t.is_alive() for t in threads):
        tally.error(f"{name}: a client did not finish in 10 minutes")
    extra = {"server_rss_before_mb": round(before_kb / 1024, 1), "hwm_reset": hwm}
    return Phase(name, seconds, tally, sampler.peak_kb(since, hwm), extra)


def release_sizes(base: str, headers: dict[str, str], release: Seeded) -> dict[str, Any]:
    sizes: dict[str, Any] = {"documents": release.documents}
    with httpx.Client(timeout=180) as http:
        for fmt in ("jsonl", "csv"):
            size = 0
            url = f"{base}/v1/releases/{release.release_id}/download"
            with http.stream("GET", url, params={"format": fmt}, headers=headers) as response:
                assert response.status_code == 200, response.status_code
                for chunk in response.iter_bytes():
                    size += len(chunk)
            sizes[f"{fmt}_mb"] = round(size / 2**20, 2)
    return sizes


def run_load(
    database_url: str,
    db: Database,
    app_client: TestClient,
    world: factories.World,
    workdir: Path,
    *,
    small: int = SMALL,
) -> dict[str, Any]:
    """Seed, start the API and a worker, run the four phases; the figures."""
    began = time.perf_counter()
    prefix = f"keyseed_load_{uuid.uuid4().hex[:10]}:"
    env = service_env(database_url, prefix, workdir)
    # the worker reads the datasets app_client uploads: their keys are in its keyring
    env["KEYSEED_KEYRING_DIR"] = str(app_client.app.state.cipher.keyring)  # type: ignore[attr-defined]
    worker_env = env | {"KEYSEED_LOG_LEVEL": "INFO"}  # its "ready." line is at INFO
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    large = small * LARGE_FACTOR
    worker_argv = worker_command(prefix.rstrip(":"))
    try:
        with (
            child("worker", worker_argv, worker_env, workdir / "worker.log") as worker,
            child("api", api_argv(port), env, workdir / "api.log") as api,
        ):
            seeding = time.perf_counter()
            tiny_release = seed_release(db, app_client, world, TINY)
            small_release = seed_release(db, app_client, world, small)
            large_release = seed_release(db, app_client, world, large)
            job_dataset, vocabulary = seed_job_inputs(app_client, world)
            seeded_in = time.perf_counter() - seeding
            wait_until(lambda: http_ok(f"{base}/readyz"), api, "the API", 180)
            client_headers = world.client.headers
            with RssSampler(api.pid) as sampler:
                started_kb = sampler.now_kb()
                warmup = phase("warmup", sampler, base, client_headers, tiny_release)
                time.sleep(1.0)
                baseline_kb = sampler.now_kb()
                phases = [warmup]
                phases.append(phase("small", sampler, base, client_headers, small_release))
                phases.append(phase("large", sampler, base, client_headers, large_release))
                wait_until(lambda: "ready." in worker.text(), worker, "the worker", 300)
                job_result: dict[str, Any] = {}

                def side(tally: Tally, done: threading.Event) -> list[Callable[[], object]]:
                    def uploader(index: int) -> None:
                        round_ = 0
                        while round_ < UPLOADS_PER_UPLOADER and (round_ == 0 or not done.is_set()):
                            upload(base, world.owner.headers, upload_body(index, round_), tally)
                            round_ += 1

                    def job() -> None:
                        job_result.update(
                            run_job(base, world.owner.headers, job_dataset, vocabulary, tally)
                        )

                    return [*(lambda i=i: uploader(i) for i in range(UPLOADERS)), job]

                mixed = phase("mixed", sampler, base, client_headers, large_release, side=side)
                mixed.extra["job"] = job_result
                mixed.extra["uploads"] = len(mixed.tally.latencies.get("upload", []))
                mixed.extra["upload_mb_each"] = round(len(upload_body(0, 0)) / 2**20, 2)
                phases.append(mixed)
                hwm_kb = _status_kb(api.pid, "VmHWM")
            sizes = {
                "tiny": release_sizes(base, client_headers, tiny_release),
                "small": release_sizes(base, client_headers, small_release),
                "large": release_sizes(base, client_headers, large_release),
            }
            assert api.alive(), f"the API died:\n{api.tail()}"
    finally:
        _forget_prefix(prefix)
    return {
        "machine": f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}",
        "downloaders": DOWNLOADERS,
        "uploaders": UPLOADERS,
        "releases": sizes,
        "seeding_seconds": round(seeded_in, 1),
        "rss_sampled_every_s": SAMPLE_EVERY,
        "server_rss_mb": {
            "at_start": round(started_kb / 1024, 1),
            "baseline": round(baseline_kb / 1024, 1),
            "peak_overall": round(max(hwm_kb, *(p.peak_kb for p in phases)) / 1024, 1),
        },
        "phases": {p.name: p.figures(baseline_kb) for p in phases},
        "errors": [e for p in phases for e in p.tally.errors],
        "seconds": round(time.perf_counter() - began, 1),
    }


def _forget_prefix(prefix: str) -> None:
    import redis

    with contextlib.suppress(redis.RedisError):
        store = redis.Redis.from_url(REDIS_URL)
        for key in store.scan_iter(f"{prefix}*"):
            store.delete(key)
        store.close()


# -- make bench ---------------------------------------------------------------------------


def run() -> dict[str, Any]:
    """:func:`run_load` on a database of its own (created, migrated, dropped)."""
    from benchmarks.scratch import scratch_app

    with scratch_app() as (url, db, app_client, workdir):
        return run_load(url, db, app_client, factories.build_world(db), workdir)


def markdown(results: dict[str, Any]) -> str:
    releases = results["releases"]
    rss = results["server_rss_mb"]
    lines = [
        "## Load: downloads, uploads and a job at once",
        "",
        f"One uvicorn process on Postgres, a Celery worker on Redis; "
        f"{results['downloaders']} concurrent downloaders (half JSONL, half CSV), "
        f"{results['uploaders']} concurrent uploaders in the mixed phase.",
        "",
        "| release | documents | JSONL MB | CSV MB |",
        "|---|---:|---:|---:|",
    ]
    for name in ("small", "large"):
        r = releases[name]
        lines.append(f"| {name} | {r['documents']:,} | {r['jsonl_mb']} | {r['csv_mb']} |")
    lines += [
        "",
        f"Server RSS: {rss['at_start']} MB at start, {rss['baseline']} MB warm (baseline), "
        f"{rss['peak_overall']} MB at most.",
        "",
        "| phase | kind | n | p50 s | p95 s | max s | phase MB/s | server peak MB | growth MB |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, figures in results["phases"].items():
        for kind, s in figures["latency"].items():
            lines.append(
                f"| {name} | {kind} | {s['n']} | {s['p50_s']} | {s['p95_s']} | {s['max_s']} "
                f"| {figures['throughput_mb_s']} | {figures['server_peak_rss_mb']} "
                f"| {figures['server_growth_mb']} |"
            )
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(json.dumps(run(), indent=1))
