"""Small factories: organisations and keys per role, uploads, job specs, finished jobs,
releases; the ``keyseed`` command as a subprocess; a wait on a condition.

A test gets a caller of a given role with ``world.owner.headers`` (and ``admin``,
``auditor``, ``other_owner``, ``client``, ``other_client``); each caller also knows its
organisation id. Jobs are driven through the worker-side functions of
``app.jobs.runner``, as a worker would (no mocks).
"""

from __future__ import annotations

import csv
import io
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeVar

import httpx
from celery import Celery
from fastapi import FastAPI
from fastapi.testclient import TestClient
from httpx import Response
from kombu.message import Message

from app.config import Settings
from app.db import Database
from app.identity import service as identity
from app.identity.policy import Actor
from app.jobs import runner
from app.jobs.stages import WorkerContext

REPO = Path(__file__).resolve().parents[2]
SYSTEM = Actor.system("tests")
# Owner organisations of the tests get room for many datasets (tests of the budget
# itself set their own).
OWNER_BUDGET, OWNER_DELTA = Decimal(100_000), Decimal("0.001")
LABELS = ("cardio", "ortho")
ROWS: tuple[tuple[str, str], ...] = (
    ("Chest pain and heart failure with shortness of breath", "cardio"),
    ("Atrial fibrillation treated with anticoagulation", "cardio"),
    ("Fracture of the femur after a fall", "ortho"),
    ("Knee arthritis with joint pain", "ortho"),
)
# a public vocabulary of the phrases of ROWS' texts (DP-KPS jobs upload it)
PHRASES = (
    "chest pain",
    "heart failure",
    "shortness of breath",
    "atrial fibrillation",
    "anticoagulation",
    "fracture",
    "femur",
    "fall",
    "knee",
    "arthritis",
    "joint pain",
    "treated",
)


@dataclass(frozen=True)
class Caller:
    role: str
    organisation_id: uuid.UUID
    key: str

    @property
    def headers(self) -> dict[str, str]:
        return auth(self.key)


@dataclass(frozen=True)
class World:
    admin: Caller
    auditor: Caller
    owner: Caller
    other_owner: Caller
    client: Caller
    other_client: Caller

    def callers(self) -> dict[str, Caller]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def organisation(
    db: Database,
    name: str,
    kind: str,
    *,
    epsilon_budget: Decimal = OWNER_BUDGET,
    delta_budget: Decimal = OWNER_DELTA,
) -> uuid.UUID:
    with db.transaction() as session:
        return identity.create_organisation(
            session,
            SYSTEM,
            name=name,
            kind=kind,
            epsilon_budget=epsilon_budget,
            delta_budget=delta_budget,
        ).id


def api_key(db: Database, role: str, organisation_id: uuid.UUID | None = None) -> Caller:
    with db.transaction() as session:
        key, plaintext = identity.create_key(
            session, SYSTEM, organisation_id=organisation_id, role=role
        )
        return Caller(role, key.organisation_id, plaintext)


def build_world(db: Database) -> World:
    hospital = organisation(db, "St Mary's Hospital", "owner")
    other_hospital = organisation(db, "General Hospital", "owner")
    lab = organisation(db, "Research Lab", "client")
    vendor = organisation(db, "Vendor Inc", "client")
    return World(
        admin=api_key(db, "admin"),
        auditor=api_key(db, "auditor"),
        owner=api_key(db, "owner", hospital),
        other_owner=api_key(db, "owner", other_hospital),
        client=api_key(db, "client", lab),
        other_client=api_key(db, "client", vendor),
    )


def csv_bytes(rows: Iterable[Sequence[str]], header: Sequence[str] = ("text", "label")) -> bytes:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buffer.getvalue().encode("utf-8")


def upload(
    client: TestClient,
    caller: Caller,
    content: bytes | None = None,
    *,
    filename: str = "notes.csv",
    labels: Sequence[str] = LABELS,
    cap: float | str = 5.0,
    text_columns: Sequence[str] = ("text",),
    label_column: str = "label",
    **form: str,
) -> Response:
    data: dict[str, Any] = {
        "name": "notes",
        "text_column": list(text_columns),
        "label_column": label_column,
        "labels": list(labels),
        "epsilon_cap": str(cap),
        **form,
    }
    body = csv_bytes(ROWS) if content is None else content
    return client.post(
        "/v1/datasets", headers=caller.headers, data=data, files={"file": (filename, body)}
    )


def dataset(client: TestClient, caller: Caller, **kwargs: Any) -> str:
    response = upload(client, caller, **kwargs)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def spec(**overrides: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "vocabulary": "medical",
        "llm": "none",
        "document_type": "clinical note",
        "epsilon_vocab": 0.5,
        "epsilon_kde": 0.5,
        "per_class": 2,
        "vocabulary_size": 50,
    }
    values.update(overrides)
    return values


def submit(
    client: TestClient, caller: Caller, dataset_id: str, *, dry_run: bool = False, **overrides: Any
) -> Response:
    """The answer to a job of :func:`spec` with ``overrides`` submitted on the dataset (or,
    with ``dry_run``, to its plan only)."""
    query = "?dry_run=true" if dry_run else ""
    return client.post(
        f"/v1/datasets/{dataset_id}/jobs{query}", headers=caller.headers, json=spec(**overrides)
    )


def job(client: TestClient, caller: Caller, dataset_id: str, **overrides: Any) -> str:
    response = submit(client, caller, dataset_id, **overrides)
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def dry_run(client: TestClient, caller: Caller, dataset_id: str, **overrides: Any) -> Any:
    """The plan of a job of :func:`spec` with ``overrides``: what it would cost and show."""
    response = submit(client, caller, dataset_id, dry_run=True, **overrides)
    assert response.status_code == 200, response.text
    return response.json()


def concurrent_submissions(app: FastAPI, caller: Caller, dataset_id: str, count: int) -> list[int]:
    """The statuses, sorted, of ``count`` jobs of :func:`spec` submitted at once on the
    dataset, each by a client of its own on a thread of its own."""
    statuses: list[int] = []
    barrier = threading.Barrier(count)

    def submit_one() -> None:
        local = TestClient(app)
        barrier.wait()
        statuses.append(submit(local, caller, dataset_id).status_code)

    threads = [threading.Thread(target=submit_one) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return sorted(statuses)


def release(
    client: TestClient, world: World, job_id: str, *, to: Caller | None = None, **body: Any
) -> dict[str, Any]:
    """The owner releases a succeeded job to the client's organisation (or ``to``'s),
    with ``body``'s other fields (a ``name``): the new release."""
    recipient = world.client if to is None else to
    response = client.post(
        f"/v1/jobs/{job_id}/release",
        headers=world.owner.headers,
        json={"client_organisations": [str(recipient.organisation_id)], **body},
    )
    assert response.status_code == 201, response.text
    return dict(response.json())


SEQUENCES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("cardio", ("heart failure", "chest pain")),
    ("ortho", ("fracture", '=HYPERLINK("http://x")')),
    ("cardio", ("atrial fibrillation",)),
)


def run_job(
    db: Database,
    job_id: str,
    *,
    sequences: Sequence[tuple[str, Sequence[str]]] = SEQUENCES,
    texts: Sequence[str | None] | None = None,
    failure: str | None = None,
) -> None:
    """Drive a queued job to success the way a worker does, with given DP outputs (or,
    with ``failure``, to failure with that message once the outputs are saved)."""
    job_uuid = uuid.UUID(job_id)
    with db.transaction() as session:
        assert runner.start_sequences(session, job_uuid) is not None
    with db.transaction() as session:
        runner.save_sequences(
            session,
            job_uuid,
            sequences,
            private_vocabulary=["heart failure", "fracture"],
            manifest={"privacy": {"epsilon_total": 1.0}, "embedding_model": "test-model"},
        )
    if texts is not None:
        with db.transaction() as session:
            for position, text in enumerate(texts):
                runner.save_outcome(
                    session,
                    job_uuid,
                    position,
                    text=text,
                    error=None if text is not None else "http_500",
                    attempts=1,
                )
    with db.transaction() as session:
        if failure is None:
            runner.finish(session, job_uuid)
        else:
            runner.fail(session, job_uuid, "llm_failed", failure)


def released(
    client: TestClient,
    world: World,
    db: Database,
    *,
    upload: dict[str, Any] | None = None,
    sequences: Sequence[tuple[str, Sequence[str]]] = SEQUENCES,
    texts: Sequence[str | None] | None = None,
    name: str | None = None,
    **overrides: Any,
) -> tuple[str, str]:
    """A job of :func:`spec` with ``overrides`` on a dataset of the owner's (uploaded with
    ``upload``), run to success with the given outputs (:func:`run_job`) and released to
    the client's organisation, named ``name`` if given: (the job id, the release id)."""
    dataset_id = dataset(client, world.owner, **(upload or {}))
    job_id = job(client, world.owner, dataset_id, **overrides)
    run_job(db, job_id, sequences=sequences, texts=texts)
    named: dict[str, Any] = {} if name is None else {"name": name}
    return job_id, str(release(client, world, job_id, **named)["id"])


def queued_message(app: FastAPI, queue_name: str, job_id: str) -> Message:
    """The message queued for ``job_id`` on the app's (in-memory) broker."""
    for message in taken_messages(app, queue_name, timeout=2):
        if message.decode()[0] == [job_id]:
            return message
    raise AssertionError(f"no message queued for job {job_id} on {queue_name!r}")


def taken_messages(app: FastAPI, queue_name: str, *, timeout: float) -> Iterator[Message]:
    """The messages on ``queue_name`` of the app's (in-memory) broker, each acknowledged
    as it is taken, as a worker takes them, until none comes within ``timeout`` seconds."""
    return taken_from(app.state.celery, queue_name, timeout=timeout)


def taken_from(celery: Celery, queue_name: str, *, timeout: float) -> Iterator[Message]:
    """:func:`taken_messages` from the broker of ``celery`` (a worker's, on Redis…)."""
    with celery.connection_for_read() as connection:
        queue = connection.SimpleQueue(queue_name)
        try:
            while True:
                try:
                    message = queue.get(timeout=timeout)
                except queue.Empty:
                    return
                message.ack()
                yield message
        finally:
            queue.close()


def embedded_settings(data_dir: Path) -> Settings:
    """Settings of the embedded mode: SQLite and the document key in ``data_dir``, the
    in-memory broker, the tests' upload limit (64 KiB)."""
    return Settings(
        data_dir=data_dir,
        database_url="",
        data_key="",
        broker_url="memory://",
        max_upload_bytes=65536,
    )


def worker_context(
    app: FastAPI, settings: Settings, cache_dir: Path, **update: Any
) -> WorkerContext:
    """A worker's context on the app's test database and broker: its cache in
    ``cache_dir``, progress written at every report (no throttling), ``update`` to its
    other settings."""
    worker_settings = settings.model_copy(
        update={"cache_dir": cache_dir, "progress_interval": 0.0, **update}
    )
    return WorkerContext(worker_settings, app.state.database, app.state.cipher)


def keyseed(
    *args: str, env: Mapping[str, str], cwd: Path = REPO, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``keyseed ARGS…`` (``python -m app.cli``) run in ``cwd`` with exactly the
    environment ``env``: its exit status and its output as text."""
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args],
        cwd=cwd,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


T = TypeVar("T")


def wait_for(
    condition: Callable[[], T | None],
    what: str | Callable[[], str],
    *,
    timeout: float,
    interval: float = 0.05,
) -> T:
    """Poll ``condition`` until it returns something true, and return that; fail naming
    ``what`` (or what ``what()`` says then, a log's tail) after ``timeout`` seconds. The
    condition may itself assert what must hold meanwhile (a process still running)."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() >= deadline:
            said = what if isinstance(what, str) else what()
            raise AssertionError(f"not within {timeout:g} s: {said}")
        time.sleep(interval)
    return value


def http_ok(url: str, *, timeout: float = 5) -> bool:
    """Whether ``url`` answers a GET with 200 (a refused or dropped connection: no)."""
    try:
        return httpx.get(url, timeout=timeout).status_code == 200
    except httpx.HTTPError:
        return False
