"""Small factories: organisations and keys per role, uploads, job specs, finished jobs.

A test gets a caller of a given role with ``world.owner.headers`` (and ``admin``,
``auditor``, ``other_owner``, ``client``, ``other_client``); each caller also knows its
organisation id. Jobs are driven through the worker-side functions of
``app.jobs.runner``, as a worker would (no mocks).
"""

from __future__ import annotations

import csv
import io
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

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


def job(client: TestClient, caller: Caller, dataset_id: str, **overrides: Any) -> str:
    response = client.post(
        f"/v1/datasets/{dataset_id}/jobs", headers=caller.headers, json=spec(**overrides)
    )
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


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


def queued_message(app: FastAPI, queue_name: str, job_id: str) -> Message:
    """The message queued for ``job_id`` on the app's (in-memory) broker."""
    for message in taken_messages(app, queue_name, timeout=2):
        if message.decode()[0] == [job_id]:
            return message
    raise AssertionError(f"no message queued for job {job_id} on {queue_name!r}")


def taken_messages(app: FastAPI, queue_name: str, *, timeout: float) -> Iterator[Message]:
    """The messages on ``queue_name`` of the app's (in-memory) broker, each acknowledged
    as it is taken, as a worker takes them, until none comes within ``timeout`` seconds."""
    with app.state.celery.connection_for_read() as connection:
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
