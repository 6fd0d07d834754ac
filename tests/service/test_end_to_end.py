"""The main job end to end: HTTP in, a REAL Celery worker process on Redis against the
test Postgres database, the packaged LLM, HTTP out.

The worker is ``celery -A app.worker worker`` in a subprocess; its broker keys carry a
prefix of their own (``KEYSEED_BROKER_KEY_PREFIX``), so concurrent test runs and other
workers on the same Redis never see its messages. It starts the packaged SmolLM2 for
the prompting stage (no ``KEYSEED_LOCAL_LLM_URL``). The corpus is a slice of the public
HPO sample; a handful of documents keep it to a minute or two on a busy machine.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Self

import pytest
import redis
from fastapi.testclient import TestClient

from app.main import create_app
from app.serve import worker_command
from tests.service import factories
from tests.service.conftest import DATA_KEY, make_settings
from workers.samples import build_hpo_sample

pytestmark = [pytest.mark.slow, pytest.mark.llm]

REPO = Path(__file__).resolve().parents[2]
REDIS_URL = os.environ.get("KEYSEED_TEST_REDIS", "redis://127.0.0.1:6379/0")
JOB_TIMEOUT = 900.0  # seconds; generous for two shared, busy cores
CAP = 10.0
SPEC: dict[str, Any] = {
    "vocabulary": "medical",
    "llm": "local",
    "document_type": "short clinical definition of a phenotype",
    "epsilon_vocab": 2.0,
    "epsilon_kde": 4.0,
    "per_class": 2,
    "vocabulary_size": 50,
    "max_matches_per_document": 2,
    "sequence_length": 4,
    "num_features": 256,
}


class Worker:
    """A Celery worker subprocess and its log. It runs in a session of its own, so
    :meth:`kill` SIGKILLs the main process and its pool child at once, as a crash of the
    machine or the container would."""

    def __init__(self, process: subprocess.Popen[bytes], log: Path) -> None:
        self.process = process
        self.log = log

    @classmethod
    def start(cls, env: dict[str, str], log: Path, name: str, *, timeout: float = 180.0) -> Self:
        """``worker_command(name)`` with the environment ``env`` and its output in ``log``,
        once it is ready (killed if it is not within ``timeout`` seconds)."""
        with open(log, "wb") as output:
            process = subprocess.Popen(
                worker_command(name),
                cwd=REPO,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=output,
                start_new_session=True,
            )
        worker = cls(process, log)

        def ready() -> bool:
            assert worker.alive, f"the worker exited:\n{worker.text()[-3000:]}"
            return "ready." in worker.text()

        try:
            factories.wait_for(ready, "the worker starts", timeout=timeout, interval=0.2)
        except BaseException:
            worker.kill()
            raise
        return worker

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL the worker and its pool children (its whole process group)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self, *, grace: float = 60.0) -> None:
        """A warm shutdown if it is still running (``grace`` seconds to finish), then
        nothing of it left."""
        if self.alive:
            self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=grace)
        self.kill()

    def text(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def events(self) -> list[dict[str, Any]]:
        found = []
        for line in self.text().splitlines():
            if line.startswith("{"):
                try:
                    found.append(json.loads(line))
                except ValueError:
                    continue
        return found


def base_env(cache_dir: Path, **extra: str) -> dict[str, str]:
    """The environment of a worker: this process's, without its ``KEYSEED_`` settings
    (so an embedded worker, with nothing more, uses SQLite and the SQLite broker)."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("KEYSEED_") and key not in ("DATABASE_URL", "REDIS_URL")
    }
    env.update(
        KEYSEED_CACHE_DIR=str(cache_dir),
        KEYSEED_LOG_JSON="true",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    env.update(extra)
    return env


def worker_env(database_url: str, prefix: str, cache_dir: Path, **extra: str) -> dict[str, str]:
    """The environment of a worker on Redis (keys under ``prefix``) and Postgres."""
    return base_env(
        cache_dir,
        KEYSEED_DATABASE_URL=database_url,
        KEYSEED_BROKER_URL=REDIS_URL,
        KEYSEED_BROKER_KEY_PREFIX=prefix,
        KEYSEED_DATA_KEY=DATA_KEY,
        **extra,
    )


def purge(prefix: str) -> None:
    """Delete every broker key of ``prefix``."""
    store = redis.Redis.from_url(REDIS_URL)
    try:
        for key in store.scan_iter(f"{prefix}*"):
            store.delete(key)
    finally:
        store.close()


def fresh_prefix(name: str) -> Iterator[str]:
    """A broker key prefix of its own (``keyseed_<name>_<random>:``), for a fixture to
    yield; every key under it is deleted afterwards."""
    value = f"keyseed_{name}_{uuid.uuid4().hex[:10]}:"
    yield value
    purge(value)


@contextlib.contextmanager
def redis_api(
    database_url: str, prefix: str, tmp_path: Path, **overrides: object
) -> Iterator[TestClient]:
    """The API on the test database (its keyring that of the workers started by
    :func:`worker_env` with ``KEYSEED_KEYRING_DIR`` ``tmp_path/keyring``), sending its
    tasks to Redis under ``prefix``; ``overrides`` to its other settings."""
    settings = make_settings(
        database_url,
        tmp_path / "api",
        broker_url=REDIS_URL,
        broker_key_prefix=prefix,
        keyring_dir=tmp_path / "keyring",
        **overrides,
    )
    app = create_app(settings)
    try:
        yield TestClient(app)
    finally:
        app.state.database.dispose()


@pytest.fixture
def prefix() -> Iterator[str]:
    yield from fresh_prefix("e2e")


@pytest.fixture
def worker(database_url: str, prefix: str, tmp_path: Path) -> Iterator[Worker]:
    env = worker_env(
        database_url,
        prefix,
        tmp_path / "cache",
        KEYSEED_KEYRING_DIR=str(tmp_path / "keyring"),  # the API's: the dataset keys
        KEYSEED_LLM_MAX_TOKENS="64",
        KEYSEED_PROGRESS_INTERVAL="0.5",
    )
    handle = Worker.start(env, tmp_path / "worker.log", prefix.rstrip(":"), timeout=300)
    try:
        yield handle
    finally:
        handle.stop(grace=90)


def test_a_job_runs_end_to_end_on_a_real_worker(
    database_url: str, prefix: str, worker: Worker, world: factories.World, tmp_path: Path
) -> None:
    started = time.monotonic()
    with redis_api(database_url, prefix, tmp_path) as client:
        _run(client, world, worker, tmp_path)
    print(f"end to end in {time.monotonic() - started:.1f} s")


def _run(client: TestClient, world: factories.World, worker: Worker, tmp_path: Path) -> None:
    private, _ = build_hpo_sample(tmp_path / "sample", max_per_class=40, num_classes=2)
    with open(private, encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle))
    labels = sorted({row["label"] for row in rows})
    owner = world.owner.headers

    # the hospital uploads its corpus and submits a job
    dataset_id = factories.dataset(
        client, world.owner, content=private.read_bytes(), labels=labels, cap=CAP
    )
    request_id = f"e2e-{uuid.uuid4().hex[:16]}"
    submitted = client.post(
        f"/v1/datasets/{dataset_id}/jobs", headers={**owner, "X-Request-ID": request_id}, json=SPEC
    )
    assert submitted.status_code == 202, submitted.text
    job_id = submitted.json()["id"]
    assert submitted.json()["epsilon"]["budget_state"] == "reserved"

    # the real worker runs it; progress is visible while it runs
    seen_stages: set[str] = set()

    def ended() -> dict[str, Any] | None:
        job = client.get(f"/v1/jobs/{job_id}", headers=owner).json()
        if job["stage"]:
            seen_stages.add(job["stage"])
        return None if job["state"] in ("queued", "running") else dict(job)

    job = factories.wait_for(ended, "the job ends", timeout=JOB_TIMEOUT, interval=0.5)
    assert job["state"] == "succeeded", (job, worker.text()[-4000:])
    assert "prompts" in seen_stages
    count = SPEC["per_class"] * len(labels)
    assert job["counts"]["sequences"] == job["counts"]["sequences_drawn"] == count  # exact KDE
    assert job["counts"]["texts_done"] == count and job["counts"]["texts_failed"] == 0
    assert job["counts"]["llm_calls"] >= count

    # released to the lab, downloaded by the lab
    release = factories.release(client, world, job_id)
    release_id = release["id"]
    download = client.get(
        f"/v1/releases/{release_id}/download",
        params={"format": "jsonl"},
        headers=world.client.headers,
    )
    assert download.status_code == 200
    records = [json.loads(line) for line in download.text.splitlines()]
    assert len(records) == count
    for record in records:
        assert record["label"] in labels
        assert isinstance(record["text"], str) and record["text"].strip()
        assert len(record["keyphrases"]) == SPEC["sequence_length"]
    assert sorted(r["label"] for r in records) == sorted(labels * SPEC["per_class"])

    # the ledger: one reservation, one commit, figures that follow from them
    epsilon = SPEC["epsilon_vocab"] + SPEC["epsilon_kde"]
    by_mechanism = {"vocabulary": SPEC["epsilon_vocab"], "kde": SPEC["epsilon_kde"]}
    ledger = client.get(f"/v1/datasets/{dataset_id}/ledger", headers=owner).json()
    entries = ledger["entries"]
    assert [e["kind"] for e in entries] == ["reserve", "commit"]
    assert all(e["job_id"] == job_id and e["epsilon"] == epsilon for e in entries)
    assert all(e["epsilon_by_mechanism"] == by_mechanism for e in entries)
    assert entries[1]["actor"] == "system:worker"
    budget = ledger["budget"]
    assert (budget["spent"], budget["reserved"]) == (epsilon, 0.0)
    assert budget["remaining"] == CAP - epsilon == budget["epsilon_cap"] - budget["spent"]

    # the manifest: method, parameters, ε by mechanism, models, time
    manifest = release["manifest"]
    assert manifest["method"].startswith("DP-KPS")
    assert manifest["job_id"] == job_id and manifest["documents"] == count
    for name, value in SPEC.items():
        if name in manifest["parameters"]:
            assert manifest["parameters"][name] == value, name
    privacy = manifest["privacy"]
    assert privacy["epsilon_charged"] == epsilon and privacy["delta"] == 0.0
    assert privacy["epsilon_by_mechanism"] == by_mechanism
    assert privacy["accountant"] == "exact-sum" and privacy["unit"] == "row"
    charged = {e["mechanism"] for e in privacy["events_charged"]}
    released = {e["mechanism"] for e in privacy["events_released"]}
    assert charged == released == set(by_mechanism)
    assert manifest["vocabulary"]["name"] == "medical"
    embedding, llm = manifest["models"]["embedding"], manifest["models"]["llm"]
    assert embedding["name"] == "all-MiniLM-L6-v2" and embedding["version"]
    assert re.fullmatch(r"[0-9a-f]{64}", embedding["sha256"])
    assert llm["endpoint"] == "local" and llm["model"] == "SmolLM2-135M-Instruct"
    assert llm["version"] and re.fullmatch(r"[0-9a-f]{64}", llm["sha256"])
    created = datetime.fromisoformat(manifest["created_at"])
    assert timedelta(0) <= datetime.now(UTC) - created < timedelta(hours=1)

    # the request id followed the job into both tasks; no private text reached the log
    events = worker.events()
    for name in ("job.sequences.started", "job.sequences.saved", "job.prompts.completed"):
        matching = [e for e in events if e.get("event") == name and e.get("job_id") == job_id]
        assert matching and all(e.get("request_id") == request_id for e in matching), name
    log = worker.text()
    for row in rows[:50]:
        assert row["text"] not in log
