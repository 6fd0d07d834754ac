"""Budget races over real HTTP: 50 job submissions at once on one dataset, asking several
times its cap in total, against several uvicorn processes serving the production app
(``uvicorn --factory app.main:create_app``), on Postgres and on the embedded SQLite file,
with pure-ε jobs under an ε cap and with Gaussian (ε, δ) jobs under an (ε, δ) cap.

Proved: exactly as many jobs are accepted as the accountant's composition of their
releases at the cap's δ allows (⌊cap / ask⌋ for pure jobs, whose composition is the exact
sum; more for Gaussian ones, whose composition is tighter than the sum); every other one
is a 409 problem naming what was asked and what remains as (ε, δ); the jobs held
(committed or reserved), sampled from the database while the race runs, never compose
to more than the cap; the final figures are exact; and exactly one task message per
accepted job reached the broker (none for a refused one). No worker runs: the jobs stay
queued.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

import httpx
import pytest
import redis
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from app.config import Settings
from app.db import Database
from app.ledger import amounts
from tests.proof.conftest import PROBLEM_JSON
from tests.service import factories
from tests.service.conftest import DATA_KEY
from workers.privacy.accountant import compose
from workers.privacy.events import PrivacyEvent

REPO = Path(__file__).resolve().parents[2]
SUBMISSIONS = 50
SERVERS = 3


@dataclass(frozen=True)
class Case:
    """A dataset cap (ε, δ) and the job spec raced against it."""

    name: str
    cap: Decimal
    delta: Decimal
    spec: dict[str, object]

    def cost(self, jobs: int, events: list[PrivacyEvent]) -> Decimal:
        """The accountant's ε of ``jobs`` such jobs at the cap's δ (as the ledger rounds)."""
        if jobs == 0:
            return Decimal(0)
        return amounts.epsilon(compose(events * jobs).epsilon(self.delta), charge=True)

    def accepted(self, events: list[PrivacyEvent]) -> int:
        jobs = 0
        while self.cost(jobs + 1, events) <= self.cap:
            jobs += 1
        return jobs


_PURE = {"epsilon_vocab": 0.1, "epsilon_kde": 0.2}  # 0.1 + 0.2 != 0.3 in binary floating point
PURE = Case("pure", Decimal("3"), Decimal(0), factories.spec(**_PURE))  # ⌊3 / 0.3⌋ = 10 jobs
_TOTAL = {"epsilon": 0.5, "delta": 1e-7, "noise": "gaussian"}
GAUSSIAN = Case(
    "gaussian",
    Decimal("1.5"),
    Decimal("1e-6"),
    {k: v for k, v in factories.spec().items() if not k.startswith("epsilon_")} | _TOTAL,
)
CASES = [PURE, GAUSSIAN]
REDIS_URL = "redis://127.0.0.1:6379/0"
# the race is the ledger's: the organisation's limits on jobs at once and jobs sent to
# the broker (tests/service/test_fair_limits.py) are lifted so all fifty reach it
UNLIMITED = {"KEYSEED_ORG_MAX_ACTIVE_JOBS": "10000", "KEYSEED_ORG_DISPATCHED_JOBS": "10000"}
_SCRUBBED = ("DATABASE_URL", "REDIS_URL", "KEYSEED_DATABASE_URL", "KEYSEED_BROKER_URL")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def serving(env: dict[str, str], log_dir: Path, count: int = SERVERS) -> Iterator[list[str]]:
    """``count`` uvicorn processes of the production app factory; their base URLs."""
    environ = {k: v for k, v in os.environ.items() if k not in _SCRUBBED}
    environ |= {"KEYSEED_LOG_LEVEL": "WARNING", "PYTHONUNBUFFERED": "1"} | UNLIMITED | env
    processes: list[tuple[subprocess.Popen[bytes], str]] = []
    with ExitStack() as stack:
        try:
            for index in range(count):
                port = _free_port()
                log = stack.enter_context((log_dir / f"server-{index}.log").open("wb"))
                command = [sys.executable, "-m", "uvicorn", "--factory", "app.main:create_app"]
                command += ["--host", "127.0.0.1", "--port", str(port), "--no-access-log"]
                process = subprocess.Popen(
                    command, cwd=REPO, env=environ, stdout=log, stderr=subprocess.STDOUT
                )
                processes.append((process, f"http://127.0.0.1:{port}"))
            for process, url in processes:
                _wait_until_up(process, url, log_dir)
            yield [url for _, url in processes]
        finally:
            for process, _ in processes:
                process.terminate()
            for process, _ in processes:
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=30)


def _wait_until_up(process: subprocess.Popen[bytes], url: str, log_dir: Path) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if process.poll() is not None:
            logs = "\n".join(p.read_text(errors="replace")[-3000:] for p in log_dir.glob("*.log"))
            raise AssertionError(f"the server at {url} exited: {logs}")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    raise AssertionError(f"the server at {url} did not start")


@dataclass
class Sampler:
    """Reads how many jobs hold budget (committed or reserved) from the ledger table,
    again and again, while the race runs (its own connection, each read a fresh
    snapshot). The jobs are alike, so what they compose to follows from their number."""

    read: Callable[[], int]
    samples: list[tuple[float, int]] = field(default_factory=list)  # (read begun, jobs)
    _stop: threading.Event = field(default_factory=threading.Event)
    _sampled: threading.Condition = field(default_factory=threading.Condition)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Sampler:
        def loop() -> None:
            while not self._stop.is_set():
                sample = (time.monotonic(), self.read())
                with self._sampled:
                    self.samples.append(sample)
                    self._sampled.notify_all()
                time.sleep(0.002)

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(timeout=30)

    def wait_for_a_read_after(self, moment: float) -> None:
        """Until a read begun after ``moment`` (``time.monotonic()``) is sampled."""
        with self._sampled:
            read = self._sampled.wait_for(
                lambda: bool(self.samples) and self.samples[-1][0] > moment, timeout=30
            )
        assert read, "the sampler did not read the ledger after the race"

    def peak(self) -> int:
        return max(value for _, value in self.samples)


def held_jobs(kinds: list[str]) -> int:
    """Reservations not released: the jobs whose ε is spent or reserved."""
    return kinds.count("reserve") - kinds.count("release")


@dataclass
class Outcome:
    statuses: list[int]
    bodies: list[dict[str, object]]
    content_types: list[str]
    started: float
    ended: float
    slowest: float


def race(urls: list[str], key: str, dataset_id: str, spec: dict[str, object]) -> Outcome:
    """``SUBMISSIONS`` threads, each with a connection of its own to one of the servers,
    released together by a barrier."""
    barrier = threading.Barrier(SUBMISSIONS)
    results: list[tuple[int, dict[str, object], str, float] | None] = [None] * SUBMISSIONS
    headers = factories.auth(key)
    for url in urls:  # what each process loads once (the built-in vocabularies) is loaded
        assert httpx.get(f"{url}/v1/vocabularies", headers=headers, timeout=120).is_success

    def submit(index: int) -> None:
        with httpx.Client(base_url=urls[index % len(urls)], timeout=120) as http:
            http.get("/healthz")  # the connection is open before the barrier
            barrier.wait(timeout=60)
            began = time.monotonic()
            response = http.post(f"/v1/datasets/{dataset_id}/jobs", headers=headers, json=spec)
            seconds = time.monotonic() - began
            results[index] = (
                response.status_code,
                response.json(),
                response.headers["content-type"],
                seconds,
            )

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(SUBMISSIONS)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    ended = time.monotonic()
    done = [r for r in results if r is not None]
    assert len(done) == SUBMISSIONS, "a submission did not finish"
    return Outcome(
        statuses=[r[0] for r in done],
        bodies=[r[1] for r in done],
        content_types=[r[2] for r in done],
        started=started,
        ended=ended,
        slowest=max(r[3] for r in done),
    )


def check_outcome(
    outcome: Outcome, sampler: Sampler, case: Case, events: list[PrivacyEvent]
) -> list[str]:
    """The accepted job ids, after checking every figure of the race. ``events`` are the
    releases of one job, as its reservation lists them."""
    accepted_count = case.accepted(events)
    assert accepted_count >= 2
    if case is PURE:
        assert accepted_count == int(case.cap // Decimal("0.3")) == 10
    else:  # composing is tighter than adding the jobs' ε up
        assert accepted_count > int(case.cap // case.cost(1, events))
    assert sorted(outcome.statuses) == [202] * accepted_count + [409] * (
        SUBMISSIONS - accepted_count
    )
    accepted = [b for s, b in zip(outcome.statuses, outcome.bodies, strict=True) if s == 202]
    asked, held = case.cost(1, events), case.cost(accepted_count, events)
    delta = float(case.delta)
    for status, body, content_type in zip(
        outcome.statuses, outcome.bodies, outcome.content_types, strict=True
    ):
        if status != 409:
            continue
        assert content_type == PROBLEM_JSON
        assert body["title"] == "Privacy budget exceeded"
        assert body["requested"] == {"epsilon": float(asked), "delta": delta}
        assert body["remaining"] == {"epsilon": float(case.cap - held), "delta": delta}
        assert body["cap"] == {"epsilon": float(case.cap), "delta": delta}
        assert body["reserved"] == float(held)
        assert body["accountant"] == ("exact-sum" if case is PURE else compose(events).name)
        assert f"asks for ε = {float(asked):g} at δ = {delta:g}" in str(body["detail"])
    for body in accepted:
        assert body["state"] == "queued"
        assert body["epsilon"]["budget_state"] == "reserved"  # type: ignore[index]
        charged = {"epsilon": float(asked), "delta": delta, "accountant": compose(events).name}
        assert body["epsilon"]["charged"] == charged  # type: ignore[index]
        if case is PURE:
            assert body["epsilon"] == {
                "requested": 0.3,
                "by_mechanism": {"vocabulary": 0.1, "kde": 0.2},
                "budget_state": "reserved",
                "charged": {"epsilon": 0.3, "delta": 0.0, "accountant": "exact-sum"},
            }
    during = [v for t, v in sampler.samples if outcome.started <= t <= outcome.ended]
    assert len(during) >= 5, "the sampler did not overlap the race"
    assert case.cost(sampler.peak(), events) <= case.cap
    assert sampler.samples[-1][1] == accepted_count
    return [str(body["id"]) for body in accepted]


def race_and_check(
    urls: list[str], key: str, dataset_id: str, case: Case, read: Callable[[], int], *, api: str
) -> tuple[Outcome, Sampler, list[str]]:
    """The race, the jobs held sampled with ``read`` while it runs and once after it;
    then its outcome and the final figures checked through the server at ``api``.
    Returns the race, its samples and the accepted job ids."""
    with Sampler(read) as sampler:
        outcome = race(urls, key, dataset_id, case.spec)
        sampler.wait_for_a_read_after(outcome.ended)
    with httpx.Client(base_url=api, timeout=60) as http:
        events = job_events(http, key, dataset_id)
        accepted = check_outcome(outcome, sampler, case, events)
        check_final_figures(http, key, dataset_id, accepted, case)
    return outcome, sampler, accepted


def job_events(http: httpx.Client, key: str, dataset_id: str) -> list[PrivacyEvent]:
    """The releases of one job of the race, as its reservation lists them (all alike)."""
    ledger = http.get(f"/v1/datasets/{dataset_id}/ledger", headers=factories.auth(key)).json()
    kinds = {json.dumps(e["events"], sort_keys=True) for e in ledger["entries"]}
    assert len(kinds) == 1, "the jobs of the race plan different releases"
    return [PrivacyEvent.from_dict(e) for e in ledger["entries"][0]["events"]]


def check_final_figures(
    http: httpx.Client, key: str, dataset_id: str, accepted: list[str], case: Case
) -> None:
    headers = factories.auth(key)
    ledger = http.get(f"/v1/datasets/{dataset_id}/ledger", headers=headers).json()
    held = case.cost(len(accepted), job_events(http, key, dataset_id))
    assert ledger["budget"] == {
        **ledger["budget"],
        "epsilon_cap": float(case.cap),
        "delta_cap": float(case.delta),
        "spent": 0.0,
        "reserved": float(held),
        "remaining": float(case.cap - held),
    }
    assert sorted(e["job_id"] for e in ledger["entries"]) == sorted(accepted)
    assert {e["kind"] for e in ledger["entries"]} == {"reserve"}
    jobs = http.get(f"/v1/datasets/{dataset_id}/jobs", headers=headers).json()
    assert sorted(j["id"] for j in jobs) == sorted(accepted)
    assert {j["state"] for j in jobs} == {"queued"}  # no worker ran them


def _job_ids_of_messages(payloads: list[bytes]) -> list[str]:
    """The job id argument of each Celery message (kombu's JSON envelope)."""
    ids = []
    for payload in payloads:
        envelope = json.loads(payload)
        assert envelope["headers"]["task"] == "keyseed.jobs.run_sequences"
        body = json.loads(base64.b64decode(envelope["body"]))
        ids.append(body[0][0])
    return ids


def _figures(
    request: pytest.FixtureRequest, mode: str, case: Case, outcome: Outcome, sampler: Sampler
) -> None:
    figures = {
        "mode": mode,
        "budget": case.name,
        "cap": {"epsilon": str(case.cap), "delta": str(case.delta)},
        "servers": SERVERS,
        "submissions": SUBMISSIONS,
        "accepted": outcome.statuses.count(202),
        "refused_409": outcome.statuses.count(409),
        "race_seconds": round(outcome.ended - outcome.started, 2),
        "slowest_request_seconds": round(outcome.slowest, 2),
        "ledger_samples": len(sampler.samples),
        "peak_jobs_held": sampler.peak(),
    }
    request.node.user_properties.append(("figures", figures))
    print(f"\nbudget race figures: {json.dumps(figures)}")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_fifty_concurrent_submissions_on_postgres(
    request: pytest.FixtureRequest,
    client: TestClient,
    world: factories.World,
    database_url: str,
    tmp_path: Path,
    case: Case,
) -> None:
    dataset_id = factories.dataset(
        client, world.owner, cap=str(case.cap), delta_cap=str(case.delta)
    )
    prefix = f"keyseed_proof_{uuid.uuid4().hex[:12]}:"
    store = redis.Redis.from_url(REDIS_URL)
    try:
        store.ping()
        broker = {"KEYSEED_BROKER_URL": REDIS_URL, "KEYSEED_BROKER_KEY_PREFIX": prefix}
    except redis.RedisError:
        broker = {"KEYSEED_BROKER_URL": "memory://"}  # no Redis here: count nothing
    env = {"KEYSEED_DATABASE_URL": database_url, "KEYSEED_DATA_KEY": DATA_KEY, **broker}
    engine = create_engine(database_url, pool_size=1)
    query = text("SELECT kind FROM ledger_entries WHERE dataset_id = :d")

    def read() -> int:
        with engine.connect() as connection:
            return held_jobs(
                list(connection.execute(query, {"d": uuid.UUID(dataset_id)}).scalars())
            )

    try:
        with serving(env, tmp_path) as urls:
            outcome, sampler, accepted = race_and_check(
                urls, world.owner.key, dataset_id, case, read, api=urls[0]
            )
        if "KEYSEED_BROKER_KEY_PREFIX" in broker:
            payloads = store.lrange(f"{prefix}cpu", 0, -1)
            assert sorted(_job_ids_of_messages(payloads)) == sorted(accepted)
    finally:
        engine.dispose()
        for stale in store.scan_iter(f"{prefix}*"):
            store.delete(stale)
    _figures(request, "postgres", case, outcome, sampler)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_fifty_concurrent_submissions_on_embedded_sqlite(
    request: pytest.FixtureRequest, tmp_path: Path, case: Case
) -> None:
    data_dir = tmp_path / "data"
    env = {"KEYSEED_DATA_DIR": str(data_dir), "KEYSEED_DATA_KEY": ""}
    settings = Settings(data_dir=data_dir, database_url="", data_key="", broker_url="")
    assert settings.embedded and settings.celery_broker_url.startswith("sqla+sqlite:///")
    environ = {k: v for k, v in os.environ.items() if k not in _SCRUBBED} | env
    migrate = subprocess.run(
        [sys.executable, "-m", "app.cli", "admin", "migrate"],
        cwd=REPO,
        env=environ,
        capture_output=True,
        timeout=300,
    )
    assert migrate.returncode == 0, migrate.stderr.decode()
    settings.document_key()  # made once here, not by three servers starting at once
    database = Database.from_url(settings.sqlalchemy_url)
    try:
        world = factories.build_world(database)
    finally:
        database.dispose()
    path = settings.sqlalchemy_url.removeprefix("sqlite:///")

    def read() -> int:
        connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
        try:
            rows = connection.execute(
                "SELECT kind FROM ledger_entries WHERE dataset_id = ?",
                (uuid.UUID(dataset_id).hex,),
            ).fetchall()
        finally:
            connection.close()
        return held_jobs([r[0] for r in rows])

    with serving(env, tmp_path) as urls:
        with httpx.Client(base_url=urls[0], timeout=60) as http:
            uploaded = http.post(
                "/v1/datasets",
                headers=world.owner.headers,
                data={
                    "name": "notes",
                    "text_column": "text",
                    "label_column": "label",
                    "labels": "cardio,ortho",
                    "epsilon_cap": str(case.cap),
                    "delta_cap": str(case.delta),
                },
                files={"file": ("notes.csv", factories.csv_bytes(factories.ROWS))},
            )
            assert uploaded.status_code == 201, uploaded.text
            dataset_id = str(uploaded.json()["id"])
        outcome, sampler, accepted = race_and_check(
            urls, world.owner.key, dataset_id, case, read, api=urls[1]
        )
    broker = sqlite3.connect(str(data_dir / "broker.sqlite3"))
    try:
        payloads = broker.execute(
            "SELECT m.payload FROM kombu_message m JOIN kombu_queue q ON q.id = m.queue_id "
            "WHERE q.name = 'cpu'"
        ).fetchall()
    finally:
        broker.close()
    assert sorted(_job_ids_of_messages([p[0] for p in payloads])) == sorted(accepted)
    _figures(request, "sqlite", case, outcome, sampler)
