"""A real Celery worker is SIGKILLed during each stage of a job, and another is started.

What must hold (the issue): the job finishes or fails cleanly, its ε is charged exactly
once, the keyphrase sequences persisted before the crash are not redrawn, and the
release holds one document per sequence, none twice and none missing.

The worker is ``celery -A app.worker worker`` in a subprocess (``tests/proof/realworker.py``),
killed with its pool child by a SIGKILL of its process group. The task it was running
is redelivered (``acks_late``): Redis holds it as unacked until the visibility timeout
has passed, which the test plays by backdating it (:func:`realworker.expire_visibility`);
the next worker restores it when it starts.

Where the worker dies is not left to timing. Every progress write of the sequences task
updates the job's row, so a turnstile on that row's updates (:class:`JobGate`) stops the
worker at its next stage boundary and lets it through one write at a time; a SHARE lock
on the sequences table (:class:`SaveGate`) stops it at the INSERT that saves them. The
worker is killed after it has recorded stage X and done the work that follows it (a DP
histogram drawn, embeddings computed, a class's DP-KDE built, a class sampled, every
sequence drawn but none saved), while it waits to record what comes next. For the
prompting stage the fake LLM answers a few calls and holds the others, so the kill comes
with some texts saved and two calls in flight. The last test kills the worker between
the commit of the sequences and the sending of the prompting task (its broker traffic is
held by a relay, :class:`realworker.BrokerProxy`).
"""

from __future__ import annotations

import csv
import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient
from sqlalchemy import select, text
from sqlalchemy.engine import Connection, RootTransaction

from app.config import LLMEndpointSettings
from app.db import Database
from app.main import create_app
from app.models import KeyphraseSequence
from tests.fake_llm import Behaviour, FakeLLM, RecordedRequest
from tests.proof.realworker import (
    REDIS_URL,
    BrokerProxy,
    RealWorker,
    expire_visibility,
    purge,
    worker_env,
)
from tests.service import factories
from tests.service.conftest import make_settings
from workers.samples import build_hpo_sample

pytestmark = [pytest.mark.slow, pytest.mark.proof]

CAP = 20.0
SPEC: dict[str, Any] = {
    "vocabulary": "medical",
    "llm": "fake",
    "document_type": "short clinical definition of a phenotype",
    "epsilon_vocab": 2.0,
    "epsilon_kde": 4.0,
    "per_class": 4,
    "vocabulary_size": 30,
    "max_matches_per_document": 2,
    "sequence_length": 3,
    "num_features": 128,
}
EPSILON = SPEC["epsilon_vocab"] + SPEC["epsilon_kde"]
SEQUENCES = 2 * SPEC["per_class"]  # two classes
# The job's stage after each write of the sequences task that changes the job's row, for
# two classes (start, then one write per change of stage or of its shown progress, which
# is 0 or 1 only: a private stage shows its start and its end, never a fraction). The
# tracker's first report (extract at 0, once the models are loaded) changes nothing that
# the start did not write already, so it updates no row and is not a step of the gate.
TRACE = (  # each stage is written when it starts (issue 67, item 3) and when it ends
    "extract",  # the task started: running, ε committed
    "extract",  # the documents are read and their phrases extracted
    "private_vocabulary",  # the DP vocabulary is about to be drawn
    "private_vocabulary",  # the DP vocabulary is drawn
    "embed",  # Ṽ's embeddings are about to be computed
    "embed",  # Ṽ's embeddings are computed (public work: its one chunk done)
    "dp_kde",  # the DP-KDE of the classes is about to be built
    "dp_kde",  # the DP-KDE of every class is built
    "sequences",  # sampling starts
)
# stage -> how many writes the worker makes before it is killed, waiting for the next
# (so that the job reads that stage, running, when it dies)
KILL_AFTER = {
    "extract": 1,  # killed while the documents are read and their phrases extracted
    "private_vocabulary": 3,  # killed while the DP vocabulary is drawn
    "embed": 5,  # killed while Ṽ's embeddings are computed
    "dp_kde": 7,  # killed while the classes' DP-KDEs are built
    "sequences": 7,  # every class sampled, the sequences about to be saved (SaveGate)
}
JOB_TIMEOUT = 180.0  # seconds
FREE_CALLS = 3  # LLM calls answered before the fake holds the others (prompting crash)
LLM_CONCURRENCY = 2


# ------------------------------------------------------------------ helpers


def wait_for(condition: Callable[[], bool], what: str, *, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.05)


class Gate:
    """A lock the test holds, on its own connection, and the worker waits for."""

    def __init__(self, db: Database) -> None:
        self.connection: Connection = db.engine.connect()
        self.pid = self.connection.execute(text("SELECT pg_backend_pid()")).scalar_one()
        self.connection.commit()
        self.monitor = db.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        self.transaction: RootTransaction | None = None

    def close(self) -> str | None:
        """Take the lock (a :class:`JobGate` says the job's stage)."""
        raise NotImplementedError

    def open(self) -> None:
        if self.transaction is not None:
            self.transaction.commit()
            self.transaction = None

    def waiters(self) -> int:
        """How many other database sessions wait for the gate (the worker's, or none)."""
        query = text(
            "SELECT count(*) FROM pg_stat_activity WHERE :pid = ANY(pg_blocking_pids(pid))"
        )
        return int(self.monitor.execute(query, {"pid": self.pid}).scalar_one())

    def wait_for_worker(self, worker: RealWorker) -> None:
        def waiting() -> bool:
            assert worker.alive, f"the worker died:\n{worker.text()[-3000:]}"
            return self.waiters() > 0

        wait_for(waiting, "the worker waits at the gate", timeout=JOB_TIMEOUT)

    def dispose(self) -> None:
        self.open()
        self.connection.close()
        self.monitor.close()


class JobGate(Gate):
    """A turnstile on the job's row: every transaction of the worker that updates it
    waits, in the update, for the next of a run of numbered tickets the gate holds.

    The test database gets, for this gate only, a trigger on the job's row that takes
    a ticket (a sequence number) once per updating transaction and waits for the
    advisory lock of that number, which the gate's session holds for every ticket from
    the start. While closed, the worker stops at its next write. :meth:`step` lets
    exactly one write through: it frees that write's ticket and waits until the worker
    waits for the next one (so the write has committed), then returns the job's stage.
    A row lock could not do this: once a write commits, the worker's next transaction
    and the gate's re-lock race for the row, and PostgreSQL's tuple locks keep no queue
    for a newcomer, so under load two writes could go through one step.
    """

    TICKETS = 64  # more than any test lets through
    LOCK_BASE = 7_340_000  # advisory lock keys of the tickets: LOCK_BASE + n

    def __init__(self, db: Database, job_id: str) -> None:
        super().__init__(db)
        self.job_id = uuid.UUID(job_id)
        self.name = f"crash_gate_{self.job_id.hex}"
        self.ticket = 1  # the next write's ticket
        self.installed = False

    def close(self) -> str | None:
        """Hold every ticket and install the turnstile (once; the job is queued)."""
        assert not self.installed, "a JobGate closes once"
        for n in range(1, self.TICKETS + 1):
            self.connection.execute(text("SELECT pg_advisory_lock(:k)"), {"k": self.key(n)})
        name, gate = self.name, f"{self.name}_ticket"
        for statement in (
            f"CREATE SEQUENCE {name}",
            f"""CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
              IF coalesce(current_setting('{gate}.taken', true), '') = '' THEN
                PERFORM set_config('{gate}.taken', 'yes', true);
                PERFORM pg_advisory_xact_lock({self.LOCK_BASE} + nextval('{name}'));
              END IF;
              RETURN NEW;
            END $$""",
            f"CREATE TRIGGER {name} BEFORE UPDATE ON jobs FOR EACH ROW "
            f"WHEN (OLD.id = '{self.job_id}') EXECUTE FUNCTION {name}()",
        ):
            self.connection.execute(text(statement))
        self.connection.commit()
        self.installed = True
        return self.stage()

    def key(self, ticket: int) -> int:
        return self.LOCK_BASE + ticket

    def stage(self) -> str | None:
        query = text("SELECT stage FROM jobs WHERE id = :id")
        stage = self.monitor.execute(query, {"id": self.job_id}).scalar_one()
        return str(stage) if stage is not None else None

    def waits_for(self, ticket: int) -> bool:
        """Whether a session waits for ``ticket``'s lock (advisory keys below 2³²
        have classid 0 and objid the key)."""
        query = text(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            " AND classid = 0 AND objid = :k AND objsubid = 1"
        )
        return bool(self.monitor.execute(query, {"k": self.key(ticket)}).scalar_one())

    def step(self, worker: RealWorker) -> str | None:
        def waiting(ticket: int) -> Callable[[], bool]:
            def check() -> bool:
                assert worker.alive, f"the worker died:\n{worker.text()[-3000:]}"
                return self.waits_for(ticket)

            return check

        wait_for(waiting(self.ticket), "the worker waits at the gate", timeout=JOB_TIMEOUT)
        self.connection.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": self.key(self.ticket)})
        self.connection.commit()
        self.ticket += 1
        assert self.ticket <= self.TICKETS, "more writes than the gate has tickets"
        wait_for(waiting(self.ticket), "the worker's write commits", timeout=JOB_TIMEOUT)
        return self.stage()

    def wait_for_worker(self, worker: RealWorker) -> None:
        def waiting() -> bool:
            assert worker.alive, f"the worker died:\n{worker.text()[-3000:]}"
            return self.waits_for(self.ticket)

        wait_for(waiting, "the worker waits at the gate", timeout=JOB_TIMEOUT)

    def dispose(self) -> None:
        """Free every ticket and remove the turnstile (the worker is dead or past it)."""
        if self.installed:
            self.connection.execute(text("SELECT pg_advisory_unlock_all()"))
            self.connection.commit()
            for statement in (
                f"DROP TRIGGER IF EXISTS {self.name} ON jobs",
                f"DROP FUNCTION IF EXISTS {self.name}()",
                f"DROP SEQUENCE IF EXISTS {self.name}",
            ):
                self.monitor.execute(text(statement))
            self.installed = False
        super().dispose()


class SaveGate(Gate):
    """A SHARE lock on the sequences table: the worker stops at the INSERT of the job's
    sequences, in the transaction that saves them, once every sequence is drawn."""

    def close(self) -> None:
        self.transaction = self.connection.begin()
        self.connection.execute(text("LOCK TABLE sequences IN SHARE MODE"))


class Tap:
    """The fake LLM's responder: the first ``free`` calls are answered, the next ones
    hang (no answer) until :attr:`flowing` is set."""

    def __init__(self, free: int | None = None) -> None:
        self.free = free
        self.calls = 0
        self.flowing = threading.Event()
        if free is None:
            self.flowing.set()
        self._lock = threading.Lock()

    def __call__(self, request: RecordedRequest) -> Behaviour | None:
        with self._lock:
            self.calls += 1
            number = self.calls
        if self.flowing.is_set() or (self.free is not None and number <= self.free):
            return None  # the default: 200 with "[fake] " + the prompt
        return Behaviour("timeout", hang=300.0)


def prompt_of(text: str) -> str:
    """The prompt a text was made from (the fake LLM echoes it after ``[fake] ``)."""
    assert text.startswith("[fake] "), text[:80]
    return text.removeprefix("[fake] ")


@dataclass
class Scene:
    """One test's world: the API on Redis, a fake LLM, a corpus, the workers it starts."""

    client: TestClient
    world: factories.World
    db: Database
    llm: FakeLLM
    tap: Tap
    prefix: str
    env: dict[str, str]
    logs: Path
    corpus: Corpus
    workers: list[RealWorker] = field(default_factory=list)

    def __enter__(self) -> Scene:
        return self

    def __exit__(self, *_: object) -> None:
        for worker in self.workers:
            worker.stop()

    def start_worker(self, **env: str) -> RealWorker:
        number = len(self.workers) + 1
        worker = RealWorker.start(
            {**self.env, **env},
            self.logs / f"worker{number}.log",
            f"{self.prefix.rstrip(':')}_{number}",
        )
        self.workers.append(worker)
        return worker

    def submit(self) -> tuple[str, str]:
        dataset_id = factories.dataset(
            self.client,
            self.world.owner,
            content=self.corpus.content,
            labels=self.corpus.labels,
            cap=CAP,
        )
        response = self.client.post(
            f"/v1/datasets/{dataset_id}/jobs", headers=self.world.owner.headers, json=SPEC
        )
        assert response.status_code == 202, response.text
        return dataset_id, str(response.json()["id"])

    def job(self, job_id: str) -> dict[str, Any]:
        response = self.client.get(f"/v1/jobs/{job_id}", headers=self.world.owner.headers)
        assert response.status_code == 200, response.text
        return dict(response.json())

    def wait_until_ended(self, job_id: str, worker: RealWorker) -> dict[str, Any]:
        deadline = time.monotonic() + JOB_TIMEOUT
        while True:
            job = self.job(job_id)
            if job["state"] not in ("queued", "running"):
                return job
            assert worker.alive, f"the worker died:\n{worker.text()[-3000:]}"
            assert time.monotonic() < deadline, (job, worker.text()[-3000:])
            time.sleep(0.2)

    def sequences(self, job_id: str) -> list[dict[str, Any]]:
        with self.db.session() as session:
            rows = session.scalars(
                select(KeyphraseSequence)
                .where(KeyphraseSequence.job_id == uuid.UUID(job_id))
                .order_by(KeyphraseSequence.position)
            ).all()
            return [
                {
                    "id": s.id,
                    "position": s.position,
                    "label": s.label,
                    "keyphrases": list(s.keyphrases),
                    "text": s.text,
                }
                for s in rows
            ]

    def unacked(self) -> int:
        with redis.Redis.from_url(REDIS_URL) as store:
            return int(store.hlen(f"{self.prefix}unacked"))

    def queued(self, queue: str) -> int:
        with redis.Redis.from_url(REDIS_URL) as store:
            return int(store.llen(f"{self.prefix}{queue}"))

    def crash(self, worker: RealWorker) -> None:
        """SIGKILL the worker; its task stays unacked, then its visibility times out."""
        worker.kill()
        assert self.unacked() == 1, "the killed worker's task is not held for redelivery"
        assert expire_visibility(self.prefix) == 1

    def wait_for_texts(
        self, job_id: str, worker: RealWorker, *, hanging: int | None = None
    ) -> None:
        """Until the fake LLM has answered its ``FREE_CALLS`` and the job saved their
        texts (and, with ``hanging``, that many calls hang), ``worker`` alive meanwhile."""

        def held() -> bool:
            assert worker.alive, worker.text()[-3000:]
            saved = self.job(job_id)["counts"]["texts_done"] == FREE_CALLS
            return saved and (hanging is None or self.llm.in_flight == hanging)

        hung = "" if hanging is None else f" and {hanging} calls hang"
        wait_for(held, f"{FREE_CALLS} texts are saved{hung}", timeout=JOB_TIMEOUT)

    # -------------------------------------------------------------- what must hold

    def check_ledger(self, dataset_id: str, job_id: str) -> None:
        """One reservation, one commit of the job's ε; the budget spent is that ε."""
        response = self.client.get(
            f"/v1/datasets/{dataset_id}/ledger", headers=self.world.owner.headers
        )
        assert response.status_code == 200, response.text
        ledger = response.json()
        assert [(e["kind"], e["job_id"]) for e in ledger["entries"]] == [
            ("reserve", job_id),
            ("commit", job_id),
        ]
        assert all(e["epsilon"] == EPSILON for e in ledger["entries"])
        budget = ledger["budget"]
        assert (budget["spent"], budget["reserved"]) == (EPSILON, 0.0)
        assert budget["remaining"] == CAP - EPSILON

    def check_release(self, job_id: str) -> list[dict[str, Any]]:
        """Released to the lab and downloaded by it: one document per saved sequence."""
        release = self.client.post(
            f"/v1/jobs/{job_id}/release",
            headers=self.world.owner.headers,
            json={"client_organisations": [str(self.world.client.organisation_id)]},
        )
        assert release.status_code == 201, release.text
        assert release.json()["manifest"]["documents"] == SEQUENCES
        download = self.client.get(
            f"/v1/releases/{release.json()['id']}/download",
            params={"format": "jsonl"},
            headers=self.world.client.headers,
        )
        assert download.status_code == 200, download.text
        records = [json.loads(line) for line in download.text.splitlines()]
        saved = self.sequences(job_id)
        assert len(saved) == SEQUENCES and all(s["text"] for s in saved)

        def key(item: dict[str, Any]) -> tuple[str, tuple[str, ...], str]:
            return item["label"], tuple(item["keyphrases"]), item["text"]

        assert Counter(map(key, records)) == Counter(map(key, saved))
        return saved

    def check_resumed_prompting(
        self, job_id: str, before: list[dict[str, Any]], calls_before: int
    ) -> None:
        """After a kill while prompting: the persisted sequences were not redrawn, the
        texts saved before the kill stay, and the LLM calls made since ``calls_before``
        prompted each sequence that had no text once, and no other."""
        done = {s["position"] for s in before if s["text"] is not None}
        after = self.sequences(job_id)
        assert drawn(after) == drawn(before)
        assert [s["text"] for s in after if s["position"] in done] == [
            s["text"] for s in before if s["position"] in done
        ]
        resumed = [r.user_text for r in self.llm.chat_requests[calls_before:]]
        assert Counter(resumed) == Counter(
            prompt_of(s["text"]) for s in after if s["position"] not in done
        )

    def check_clean_end(self, job: dict[str, Any], worker: RealWorker) -> None:
        assert job["state"] == "succeeded", (job, worker.text()[-3000:])
        assert job["error"] is None and job["epsilon"]["budget_state"] == "committed"
        assert job["counts"]["sequences"] == SEQUENCES
        assert job["counts"]["texts_done"] == SEQUENCES and job["counts"]["texts_failed"] == 0
        # no stage stopped on an unexpected error, and no document reached a log
        for each in self.workers:
            assert not [e for e in each.events() if str(e.get("event")).endswith(".crashed")]
            log = each.text()
            assert not [text for text in self.corpus.texts if text in log]


def drawn(sequences: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the DP run drew of each sequence (its text aside)."""
    keep = ("id", "position", "label", "keyphrases")
    return [{k: s[k] for k in keep} for s in sequences]


def events(worker: RealWorker, name: str, job_id: str) -> list[dict[str, Any]]:
    return [e for e in worker.events() if e.get("event") == name and e.get("job_id") == job_id]


# ------------------------------------------------------------------ fixtures


@dataclass(frozen=True)
class Corpus:
    content: bytes  # the CSV uploaded
    labels: list[str]
    texts: list[str]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    """A slice of the public HPO sample: two classes of 12 documents at most."""
    private, _ = build_hpo_sample(
        tmp_path_factory.mktemp("sample"), max_per_class=12, num_classes=2
    )
    with open(private, encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle))
    labels = sorted({row["label"] for row in rows})
    assert len(labels) == 2
    return Corpus(private.read_bytes(), labels, [row["text"] for row in rows])


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Embeddings of public phrases, shared by the tests' workers."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture
def tap(request: pytest.FixtureRequest) -> Tap:
    """The fake LLM answers every call, or (parametrised) the first ``n`` only."""
    return Tap(getattr(request, "param", None))


@pytest.fixture
def scene(
    database_url: str,
    db: Database,
    world: factories.World,
    tap: Tap,
    corpus: Corpus,
    cache_dir: Path,
    tmp_path: Path,
) -> Iterator[Scene]:
    prefix = f"keyseed_crash_{uuid.uuid4().hex[:10]}:"
    with FakeLLM(latency=0.05, responder=tap) as llm:
        endpoint = LLMEndpointSettings(base_url=llm.base_url, model=llm.model)
        settings = make_settings(
            database_url,
            tmp_path / "api",
            broker_url=REDIS_URL,
            broker_key_prefix=prefix,
            llm_endpoints={"fake": endpoint},
        )
        app = create_app(settings)
        env = worker_env(
            database_url,
            prefix,
            cache_dir,
            KEYSEED_LLM_ENDPOINTS=json.dumps({"fake": endpoint.model_dump(mode="json")}),
            KEYSEED_LLM_CONCURRENCY=str(LLM_CONCURRENCY),
            KEYSEED_LLM_MAX_RETRIES="0",
            KEYSEED_PROGRESS_INTERVAL="3600",  # a write per stage change, none between
            KEYSEED_KEYRING_DIR=str(settings.keyring_path),  # the API's: the dataset keys
        )
        try:
            with Scene(TestClient(app), world, db, llm, tap, prefix, env, tmp_path, corpus) as here:
                yield here  # its workers stopped on the way out
        finally:
            app.state.database.dispose()
            purge(prefix)


# ------------------------------------------------------------------ the tests


def run_until_stopped_in(scene: Scene, job_id: str, stage: str) -> tuple[RealWorker, Gate]:
    """Start a worker on the queued job and stop it, waiting, once the job has been at
    ``stage`` and the work that follows it is done. The caller disposes of the gate."""
    gate: Gate = SaveGate(scene.db) if stage == "sequences" else JobGate(scene.db, job_id)
    try:
        if isinstance(gate, JobGate):
            assert gate.close() is None  # queued: the worker will stop at its first write
            worker = scene.start_worker()
            trace = [gate.step(worker) for _ in range(KILL_AFTER[stage])]
            assert tuple(trace) == TRACE[: len(trace)], "more than a write went through"
        else:
            gate.close()
            worker = scene.start_worker()
        gate.wait_for_worker(worker)
    except BaseException:
        gate.dispose()
        raise
    return worker, gate


@pytest.mark.parametrize("stage", list(KILL_AFTER))
def test_a_kill_during_a_stage_of_the_dp_run_reruns_it_and_charges_once(
    scene: Scene, stage: str
) -> None:
    dataset_id, job_id = scene.submit()
    first, gate = run_until_stopped_in(scene, job_id, stage)
    try:
        scene.crash(first)
    finally:
        gate.dispose()

    # what the crash left: the job running at that stage, its ε committed, nothing saved
    job = scene.job(job_id)
    assert (job["state"], job["stage"]) == ("running", stage)
    assert job["epsilon"]["budget_state"] == "committed"
    assert job["counts"]["sequences"] == 0 and scene.sequences(job_id) == []
    assert scene.llm.chat_requests == []

    second = scene.start_worker()
    job = scene.wait_until_ended(job_id, second)
    scene.check_clean_end(job, second)
    (started,) = events(second, "job.sequences.started", job_id)
    assert started["restarted"] is True  # the redelivered task ran the engine again
    scene.check_ledger(dataset_id, job_id)
    saved = scene.check_release(job_id)
    prompts = Counter(prompt_of(s["text"]) for s in saved)
    assert Counter(scene.llm.prompts()) == prompts  # one LLM call per sequence


@pytest.mark.parametrize("tap", [FREE_CALLS], indirect=True)
def test_a_kill_while_prompting_resumes_without_redrawing_or_reprompting(
    scene: Scene, tap: Tap
) -> None:
    dataset_id, job_id = scene.submit()
    first = scene.start_worker()
    scene.wait_for_texts(job_id, first, hanging=2)
    scene.crash(first)
    job = scene.job(job_id)
    assert (job["state"], job["stage"]) == ("running", "prompts")
    assert job["counts"]["texts_done"] == FREE_CALLS
    before = scene.sequences(job_id)
    assert len(before) == SEQUENCES
    done = {s["position"] for s in before if s["text"] is not None}
    assert len(done) == FREE_CALLS
    calls_before = len(scene.llm.chat_requests)
    assert calls_before == FREE_CALLS + LLM_CONCURRENCY

    tap.flowing.set()
    second = scene.start_worker()
    job = scene.wait_until_ended(job_id, second)
    scene.check_clean_end(job, second)
    assert events(second, "job.sequences.started", job_id) == []  # no private read again
    assert events(second, "job.prompts.completed", job_id)
    scene.check_ledger(dataset_id, job_id)

    scene.check_resumed_prompting(job_id, before, calls_before)
    assert job["counts"]["llm_calls"] == SEQUENCES  # the calls cut by the crash saved nothing
    scene.check_release(job_id)


def test_a_kill_between_saving_the_sequences_and_queueing_the_prompts(scene: Scene) -> None:
    """The prompting task is sent after the sequences commit: a worker that dies in
    between leaves the job running with no task queued. The redelivered sequences task
    must not run the DP mechanisms again, and must queue the prompting."""
    dataset_id, job_id = scene.submit()
    proxy = BrokerProxy()
    gate = SaveGate(scene.db)
    try:
        gate.close()
        first = scene.start_worker(KEYSEED_BROKER_URL=proxy.url)
        gate.wait_for_worker(first)  # every sequence drawn, about to be saved
        proxy.hold()  # what the worker sends to the broker from now on goes nowhere
        gate.open()

        def saved() -> bool:
            assert first.alive, first.text()[-3000:]
            return bool(scene.job(job_id)["counts"]["sequences"])

        wait_for(saved, "the sequences are saved", timeout=JOB_TIMEOUT)
        wait_for(lambda: proxy.held > 0, "the worker sends the prompting task")
        first.kill()
        proxy.cut()
    finally:
        gate.dispose()
        proxy.close()
    assert scene.queued("llm") == 0, "the prompting task reached the broker"
    assert scene.unacked() == 1 and expire_visibility(scene.prefix) == 1
    before = scene.sequences(job_id)
    assert len(before) == SEQUENCES and not any(s["text"] for s in before)
    job = scene.job(job_id)
    assert (job["state"], job["stage"]) == ("running", "prompts")

    second = scene.start_worker()
    job = scene.wait_until_ended(job_id, second)
    scene.check_clean_end(job, second)
    assert events(second, "job.sequences.skipped", job_id)  # the redelivery
    assert events(second, "job.sequences.started", job_id) == []  # nothing drawn again
    scene.check_ledger(dataset_id, job_id)
    after = scene.sequences(job_id)
    assert drawn(after) == drawn(before)
    scene.check_release(job_id)
    assert Counter(scene.llm.prompts()) == Counter(prompt_of(s["text"]) for s in after)
