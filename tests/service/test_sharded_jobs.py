"""Sharded DP-KPS jobs (issue 65, app/jobs/shards.py).

In-process: the worker's functions on the test database, the chords sent to the test
Redis under a key prefix of the test's own, and run by :func:`drive` as a worker runs
them: each message taken from the broker, its task called with the message's arguments,
and, once a chord's maps are done, its body (the reduce) called as the chord's counter
would. The real engine (the packaged embedding model, an uploaded vocabulary) runs.

With real workers (slow): ``celery -A app.worker worker`` subprocesses on Redis, as the
end-to-end test starts them; a shard's pool process killed; a cancel during the map.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.db import Database
from app.jobs import recovery, shards, stages, tasks
from app.jobs.stages import WorkerContext
from app.models import Job, JobShard, JobShardPlan, JobShardRound
from app.worker import MAP_SHARD, REDUCE_ROUND, RUN_SEQUENCES, celery_app, create_celery
from tests.service import factories
from tests.service.test_end_to_end import (
    REDIS_URL,
    Worker,
    fresh_prefix,
    redis_api,
    worker_env,
)
from tests.service.test_worker import cache_dir, job_of, ledger, vocabulary, worker

__all__ = ["cache_dir", "worker"]

SHARDS = 3
LABELS = ("cardio", "ortho")
CARDIO = ("chest pain", "heart failure", "shortness of breath", "atrial fibrillation")
ORTHO = ("fracture", "femur", "knee", "arthritis", "joint pain")
# what makes a job shardable: class centroids of the document embeddings, Gaussian noise
SHARDABLE: dict[str, Any] = {
    "kde_method": "centroid",
    "noise": "gaussian",
    "epsilon": 1.0,
    "delta": 1e-6,
    "epsilon_vocab": None,
    "epsilon_kde": None,
}
# a shardable job on a public Ṽ
SPEC: dict[str, Any] = {
    **SHARDABLE,
    "vocabulary_size": 8,
    "sequence_length": 3,
    "per_class": 2,
    "audit_canaries": 0,
    "embed_sample": 0,  # every unit embedded: one round, the sums (the mechanics' tests)
}
# the default: a sample of about 4,000 units a class, so a counts round comes first
DEFAULT_SPEC = {name: value for name, value in SPEC.items() if name != "embed_sample"}


def rows(count: int, *, units: bool = False) -> list[tuple[str, ...]]:
    """``count`` notes of the two classes (with a patient column: two notes a patient)."""
    out: list[tuple[str, ...]] = []
    for i in range(count):
        label = LABELS[i % 2]
        words = CARDIO if label == "cardio" else ORTHO
        text = f"Visit {i}: {words[i % len(words)]} and {words[(i + 1) % len(words)]}"
        out.append((text, label, f"patient-{i // 2}") if units else (text, label))
    return out


def upload(client: TestClient, world: factories.World, count: int, *, units: bool = False) -> str:
    header = ("text", "label", "patient") if units else ("text", "label")
    form = {"unit_column": "patient"} if units else {}
    return factories.dataset(
        client,
        world.owner,
        content=factories.csv_bytes(rows(count, units=units), header),
        cap=5,
        delta_cap="1e-5",
        **form,
    )


@pytest.fixture
def prefix() -> Iterator[str]:
    yield from fresh_prefix("shards")


@pytest.fixture
def sharded(worker: WorkerContext, prefix: str) -> Iterator[WorkerContext]:
    """A worker's context whose broker is Redis (so jobs run sharded, in 3 shards)."""
    settings = worker.settings.model_copy(
        update={"broker_url": REDIS_URL, "broker_key_prefix": prefix, "job_shards": SHARDS}
    )
    url = worker.database.engine.url.render_as_string(hide_password=False)
    database = Database.from_url(url, celery=create_celery(settings))
    yield WorkerContext(settings, database, worker.cipher)
    database.dispose()


def run_task(ctx: WorkerContext, name: str, args: list[Any]) -> str:
    """What the task ``name`` does with ``args`` in a worker process of context ``ctx``."""
    job, *rest = args
    if name == MAP_SHARD:
        round_name, shard = rest
        return shards.map_shard(ctx, uuid.UUID(job), round_name, shard)
    assert name == REDUCE_ROUND
    (round_name,) = rest
    return shards.reduce_round(ctx, uuid.UUID(job), round_name)


def drive(
    ctx: WorkerContext, *, queue: str = "cpu", lose: tuple[Any, ...] | None = None
) -> list[tuple[str, list[Any]]]:
    """Run every message the broker holds, and what they send, until none is left, as
    a worker would: each map with its message's arguments, then each chord's body once
    its maps ran. A message whose arguments are ``lose`` is taken and not run (its
    worker died). Returns (task, arguments) of every message taken."""
    celery = ctx.database.sessions.kw["info"]["keyseed.celery"]
    taken: list[tuple[str, list[Any]]] = []
    while True:
        bodies: dict[str, dict[str, Any]] = {}
        messages = list(factories.taken_from(celery, queue, timeout=0.5))
        if not messages:
            return taken
        for message in messages:
            args, kwargs, embed = message.decode()
            name = message.headers["task"]
            taken.append((name, list(args)))
            assert kwargs == {}
            if lose is not None and tuple(args) == lose:
                continue
            run_task(ctx, name, args)
            if embed.get("chord"):
                bodies[message.headers["group"]] = embed["chord"]
        for body in bodies.values():
            taken.append((body["task"], list(body["args"])))
            run_task(ctx, body["task"], body["args"])


def mapping(
    client: TestClient,
    world: factories.World,
    ctx: WorkerContext,
    count: int,
    *,
    units: bool = False,
) -> tuple[str, str]:
    """A dataset of ``count`` rows and a job of :data:`SPEC` on it, started by ``ctx``:
    its spend committed and its shards sent (``mapping``). Returns their ids."""
    vocabulary_id = vocabulary(client, world.owner)
    dataset_id = upload(client, world, count, units=units)
    job_id = factories.job(client, world.owner, dataset_id, vocabulary=vocabulary_id, **SPEC)
    assert stages.run_sequences(ctx, uuid.UUID(job_id)) == "mapping"
    return dataset_id, job_id


def row(db: Database, job_id: str) -> Job:
    with db.session() as session:
        job = session.get(Job, uuid.UUID(job_id))
        assert job is not None
        return job


def shard_rows(db: Database, job_id: str) -> list[JobShard]:
    with db.session() as session:
        return list(
            session.query(JobShard)
            .filter(JobShard.job_id == uuid.UUID(job_id))
            .order_by(JobShard.round, JobShard.shard)
        )


def events(job: Job) -> list[dict[str, Any]]:
    return list((job.manifest or {})["privacy"]["events"])


@pytest.mark.parametrize(
    ("spec", "rounds"),
    [(SPEC, ("sums",)), (DEFAULT_SPEC, ("counts", "sums"))],
    ids=["every-unit", "default-sample"],
)
def test_a_sharded_job_makes_the_releases_of_a_whole_one_without_loading_the_corpus(
    spec: dict[str, Any],
    rounds: tuple[str, ...],
    client: TestClient,
    world: factories.World,
    worker: WorkerContext,
    sharded: WorkerContext,
    db: Database,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    vocabulary_id = vocabulary(client, world.owner)
    dataset_id = upload(client, world, 40)
    whole = factories.job(client, world.owner, dataset_id, vocabulary=vocabulary_id, **spec)
    split = factories.job(client, world.owner, dataset_id, vocabulary=vocabulary_id, **spec)
    # the whole path (a broker without chords) loads the corpus
    assert stages.run_sequences(worker, uuid.UUID(whole)) == "succeeded"

    def no_corpus(*_: Any) -> Any:
        raise AssertionError("the sharded path loaded the whole corpus")

    monkeypatch.setattr(stages, "load_corpus", no_corpus)
    assert stages.run_sequences(sharded, uuid.UUID(split)) == "mapping"
    job = row(db, split)
    first = "private_vocabulary" if rounds[0] == "counts" else "dp_kde"  # the round's stage
    assert (job.state, job.worker_id, job.stage) == ("running", None, first)
    assert job_of(client, world, split)["shards"]["rounds"][0]["done"] == 0
    taken = drive(sharded)

    # the messages: ids only (the job's, the round's name, the shard's number)
    assert sorted(taken) == sorted(
        [(MAP_SHARD, [split, name, shard]) for name in rounds for shard in range(SHARDS)]
        + [(REDUCE_ROUND, [split, name]) for name in rounds]
    )
    done, other = row(db, split), row(db, whole)
    assert done.state == "succeeded", (done.error_code, done.error_message)
    # the draws are planned (public); the consistency filter keeps a DP-dependent share
    assert done.manifest["sequences_drawn"] == other.manifest["sequences_drawn"] > 0
    assert done.sequences_total > 0
    assert events(done) == events(other)
    assert done.manifest["privacy"] == other.manifest["privacy"]  # events, ε, δ, accountant
    assert done.epsilon_by_mechanism == other.epsilon_by_mechanism
    assert done.manifest["shards"] == SHARDS
    # the raw parts were deleted once the round was released; its state stays sealed
    parts = shard_rows(db, split)
    assert [(p.round, p.shard, p.state, p.attempts, p.sealed) for p in parts] == [
        (name, shard, "done", 1, None) for name in rounds for shard in range(SHARDS)
    ]
    with db.session() as session:
        plan = session.get(JobShardPlan, uuid.UUID(split))
        reduced = session.get(JobShardRound, (uuid.UUID(split), "sums"))
        assert plan is not None and reduced is not None and len(plan.sealed_key) == 12 + 32 + 16
    # one commit per job, as for any job
    book = ledger(client, world, dataset_id)
    assert [e["kind"] for e in book["entries"]] == ["reserve", "reserve", "commit", "commit"]
    view = job_of(client, world, split)["shards"]
    assert view["count"] == SHARDS
    assert [(r["name"], r["reduced"], r["done"]) for r in view["rounds"]] == [
        (name, True, 3) for name in rounds
    ]
    others = client.get(f"/v1/jobs/{split}", headers=world.auditor.headers).json()
    assert others["shards"] is None


def test_the_shard_tasks_are_routed_with_the_private_stages_and_acknowledged_late() -> None:
    router = celery_app.amqp.router
    for name, function in ((MAP_SHARD, tasks.map_shard), (REDUCE_ROUND, tasks.reduce_round)):
        assert router.route({}, name)["queue"].name == router.route({}, RUN_SEQUENCES)["queue"].name
        task = celery_app.tasks[name]
        assert task.run is function
        assert task.acks_late is True and task.reject_on_worker_lost is True
        assert task.ignore_result is True
    assert tasks.map_shard("not-a-job", "sums", 0) == "bad_argument"
    assert tasks.map_shard(str(uuid.uuid4()), "sums", "0") == "bad_argument"  # type: ignore[arg-type]


def test_one_shard_the_default_runs_the_same_map_and_reduce(
    client: TestClient, world: factories.World, sharded: WorkerContext, db: Database
) -> None:
    settings = sharded.settings.model_copy(update={"job_shards": 1})
    ctx = WorkerContext(settings, sharded.database, sharded.cipher)
    _, job_id = mapping(client, world, ctx, 12)
    assert drive(ctx) == [(MAP_SHARD, [job_id, "sums", 0]), (REDUCE_ROUND, [job_id, "sums"])]
    done = row(db, job_id)
    assert done.state == "succeeded" and done.manifest["shards"] == 1


def test_a_redelivered_shard_or_reduce_does_nothing_and_a_restart_charges_once(
    client: TestClient,
    world: factories.World,
    sharded: WorkerContext,
    db: Database,
) -> None:
    dataset_id, job_id = mapping(client, world, sharded, 24, units=True)
    job = uuid.UUID(job_id)
    assert shards.map_shard(sharded, job, "sums", 0) == "stored"
    assert shards.map_shard(sharded, job, "sums", 0) == "done"  # redelivered: nothing
    # the chord's body before the other shards: it waits (and releases the job)
    assert shards.reduce_round(sharded, job, "sums") == "waiting"
    # the first chord: shard 0 stored again by nobody, shard 1's message taken by a
    # worker that died holding it, shard 2 stored; its reduce waits
    drive(sharded, lose=(job_id, "sums", 1))
    with sharded.database.transaction() as session:
        dead = session.get(JobShard, (job, "sums", 1))
        assert dead is not None
        dead.state, dead.worker_id, dead.attempts = "running", "worker-x.example:1:1", 1
    assert {p.shard: p.state for p in shard_rows(db, job_id)} == {
        0: "done",
        1: "running",
        2: "done",
    }
    assert row(db, job_id).state == "running"
    # the sweeper takes the job for an orphan: its shard's process died
    with sharded.database.session() as session:
        current = session.get(Job, job)
        assert current is not None and recovery.is_orphan(session, current, unheld=False)
    assert stages.run_sequences(sharded, job) == "mapping"  # restarted: the round again
    drive(sharded)
    done = row(db, job_id)
    assert done.state == "succeeded", (done.error_code, done.error_message)
    assert {p.shard: p.attempts for p in shard_rows(db, job_id)} == {0: 1, 1: 2, 2: 1}
    assert shards.reduce_round(sharded, job, "sums") == "skipped"  # a late reduce
    assert shards.map_shard(sharded, job, "sums", 2) == "succeeded"  # a late map
    book = ledger(client, world, dataset_id)
    assert [e["kind"] for e in book["entries"]] == ["reserve", "commit"]


def test_a_cancel_stops_the_shards_and_a_cancelled_jobs_shards_do_nothing(
    client: TestClient,
    world: factories.World,
    sharded: WorkerContext,
    db: Database,
) -> None:
    dataset_id, job_id = mapping(client, world, sharded, 40)
    job = uuid.UUID(job_id)
    # the maps do not hold the job: a cancel ends it at once
    cancelled = client.post(f"/v1/jobs/{job_id}/cancel", headers=world.owner.headers)
    assert cancelled.status_code in (200, 202), cancelled.text
    assert row(db, job_id).state == "cancelled"
    assert shards.map_shard(sharded, job, "sums", 0) == "cancelled"
    assert shards.reduce_round(sharded, job, "sums") == "skipped"
    assert [p.state for p in shard_rows(db, job_id)] == ["pending"] * SHARDS
    book = ledger(client, world, dataset_id)
    assert [e["kind"] for e in book["entries"]] == ["reserve", "commit"]


def test_a_map_stops_at_its_next_check_once_the_job_is_cancelled(
    client: TestClient,
    world: factories.World,
    sharded: WorkerContext,
    db: Database,
) -> None:
    _, job_id = mapping(client, world, sharded, 40)
    job = uuid.UUID(job_id)
    ticker = shards._Ticker(sharded, job, "sums", 0)
    with sharded.database.transaction() as session:  # claimed by this process
        part = session.get(JobShard, (job, "sums", 0))
        assert part is not None
        part.state, part.worker_id = "running", recovery.this_process()
    ticker.check()  # the job may go on
    client.post(f"/v1/jobs/{job_id}/cancel", headers=world.owner.headers)
    with pytest.raises(shards.ShardStopped):
        ticker.check()


# ------------------------------------------------------------------ real workers


@pytest.fixture
def api(database_url: str, prefix: str, tmp_path: Path) -> Iterator[TestClient]:
    """The API on the test database, sending its tasks to Redis under ``prefix``."""
    with redis_api(database_url, prefix, tmp_path, max_upload_bytes=4_000_000) as client:
        yield client


def start_worker(database_url: str, prefix: str, tmp_path: Path, name: str) -> Worker:
    """A real worker (one pool process), its jobs split in 3 shards."""
    env = worker_env(
        database_url,
        prefix,
        tmp_path / "cache",
        KEYSEED_KEYRING_DIR=str(tmp_path / "keyring"),
        KEYSEED_JOB_SHARDS=str(SHARDS),
        KEYSEED_PROGRESS_INTERVAL="0.5",
    )
    return Worker.start(env, tmp_path / f"{name}.log", f"{prefix.rstrip(':')}-{name}", timeout=300)


def pids_holding(db: Database, job_id: str) -> list[int]:
    """Process ids of the processes that claim a shard of the job now."""
    return [
        int(p.worker_id.split(":")[1])
        for p in shard_rows(db, job_id)
        if p.state == "running" and p.worker_id
    ]


def finished(client: TestClient, world: factories.World, job_id: str) -> dict[str, Any] | None:
    job = job_of(client, world, job_id)
    return job if job["state"] in ("succeeded", "failed", "cancelled") else None


@pytest.mark.slow
def test_a_sharded_job_on_a_real_worker_survives_a_killed_shard_and_is_charged_once(
    api: TestClient,
    database_url: str,
    prefix: str,
    world: factories.World,
    db: Database,
    tmp_path: Path,
) -> None:
    vocabulary_id = vocabulary(api, world.owner)
    dataset_id = upload(api, world, 60, units=True)
    job_id = factories.job(api, world.owner, dataset_id, vocabulary=vocabulary_id, **SPEC)
    worker = start_worker(database_url, prefix, tmp_path, "w1")
    try:
        # the first shard claimed (its process loads the models): its pool process dies
        pid = factories.wait_for(
            lambda: next(iter(pids_holding(db, job_id)), None),
            "a shard is claimed",
            timeout=300,
            interval=0.05,
        )
        os.kill(pid, signal.SIGKILL)
        job = factories.wait_for(
            lambda: finished(api, world, job_id), "the job ends", timeout=600, interval=0.5
        )
    finally:
        worker.stop()
    assert job["state"] == "succeeded", job["error"]
    attempts = sorted(p.attempts for p in shard_rows(db, job_id))
    assert attempts == [1, 1, 2], worker.text()[-3000:]  # the killed one ran again
    book = ledger(api, world, dataset_id)
    assert [e["kind"] for e in book["entries"]] == ["reserve", "commit"]
    assert book["entries"][0]["epsilon"] == book["entries"][1]["epsilon"]
    assert row(db, job_id).manifest["shards"] == SHARDS
    logged = worker.text()
    assert "job.shard.stored" in logged and "Visit " not in logged  # no private text


@pytest.mark.slow
def test_a_cancel_during_the_map_stops_a_real_workers_shard_within_5_seconds(
    api: TestClient,
    database_url: str,
    prefix: str,
    world: factories.World,
    db: Database,
    tmp_path: Path,
) -> None:
    vocabulary_id = vocabulary(api, world.owner)
    dataset_id = upload(api, world, 6000)
    job_id = factories.job(api, world.owner, dataset_id, vocabulary=vocabulary_id, **SPEC)
    worker = start_worker(database_url, prefix, tmp_path, "w2")
    try:
        # once a shard is stored (the models are loaded), the next one runs: cancel it
        factories.wait_for(
            lambda: any(p.state == "done" for p in shard_rows(db, job_id)) or None,
            "a shard is stored",
            timeout=600,
            interval=0.1,
        )
        factories.wait_for(
            lambda: pids_holding(db, job_id) or None, "the next shard runs", timeout=60
        )
        cancelled_at = time.monotonic()
        answer = api.post(f"/v1/jobs/{job_id}/cancel", headers=world.owner.headers)
        assert answer.status_code in (200, 202), answer.text
        assert job_of(api, world, job_id)["state"] == "cancelled"
        factories.wait_for(
            lambda: not pids_holding(db, job_id), "the shard stops", timeout=10, interval=0.05
        )
        stopped_after = time.monotonic() - cancelled_at
        time.sleep(2)  # the shards left do nothing
    finally:
        worker.stop()
    print(f"the running shard stopped {stopped_after:.2f} s after the cancel")
    assert stopped_after < 5.0, stopped_after
    states = sorted(p.state for p in shard_rows(db, job_id))
    assert "running" not in states and states.count("done") < SHARDS
    assert '"reason": "cancelled"' in worker.text()
    book = ledger(api, world, dataset_id)
    assert [e["kind"] for e in book["entries"]] == ["reserve", "commit"]
