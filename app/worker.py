"""The Celery application: task names, their queues (in one place), and its settings.

Tasks take ids, never rows or text; messages are JSON only. Job state lives in the
database, not in Celery results: no task stores a result; on Redis the result backend
only counts the finished map tasks of a sharded job's chord (:mod:`app.jobs.shards`).
``acks_late`` with ``reject_on_worker_lost`` puts a task back on its queue when a pool
process dies, and the soft time limit lets a task mark its job failed before the hard
limit kills it. A job whose whole worker died is sent again by the next worker
(``app.jobs.recovery``).

Queues: ``cpu`` and ``gpu`` for the stages that read private data (extraction, private
vocabulary, embedding, DP-KDE, sampling; ``KEYSEED_SEQUENCES_QUEUE`` picks which),
``llm`` for prompting, which reads DP outputs only.

The tasks themselves are in :mod:`app.jobs.tasks`, which a worker imports at start
(``include``); the API only sends them by name. Run a worker with
``celery -A app.worker worker -Q cpu,gpu,llm`` (``keyseed serve`` starts one).
"""

from __future__ import annotations

import json
import time
from typing import Any

from celery import Celery, signals
from kombu.utils.url import url_to_parts

from app.config import Settings, get_settings
from app.logging import bind_task_context, configure_logging

TASK_MODULES = ("app.jobs.tasks",)

QUEUES = ("cpu", "gpu", "llm")

# Task names are part of the wire format between API and workers: never rename one.
RUN_SEQUENCES = "keyseed.jobs.run_sequences"  # (job_id: str) stages 1-6, persists sequences
RUN_PROMPTS = "keyseed.jobs.run_prompts"  # (job_id: str) step 7, resumable
MAP_SHARD = "keyseed.jobs.map_shard"  # (job_id: str, round: str, shard: int) one shard's rows
REDUCE_ROUND = "keyseed.jobs.reduce_round"  # (job_id: str, round: str) noise added once
TASKS = (RUN_SEQUENCES, RUN_PROMPTS, MAP_SHARD, REDUCE_ROUND)


def task_routes(settings: Settings) -> dict[str, dict[str, str]]:
    return {
        RUN_SEQUENCES: {"queue": settings.sequences_queue},
        RUN_PROMPTS: {"queue": "llm"},
        MAP_SHARD: {"queue": settings.sequences_queue},
        REDUCE_ROUND: {"queue": settings.sequences_queue},
    }


def chords_available(settings: Settings) -> bool:
    """Whether the broker can run a chord (:mod:`app.jobs.shards`): Redis, where the
    chord's counter lives beside the broker's keys (the result backend of the same URL
    and key prefix). A chord's results are its map tasks' short status words (ids and
    states only: an aggregate is stored in the database, never returned)."""
    scheme = url_to_parts(settings.celery_broker_url).scheme or ""
    return scheme in ("redis", "rediss")


def result_backend(settings: Settings) -> dict[str, Any]:
    """The result backend's settings: none (no task stores a result), except on Redis,
    where the chords of sharded jobs count their finished map tasks."""
    if not chords_available(settings):
        return {"result_backend": None}
    options: dict[str, Any] = {}
    if settings.broker_key_prefix:
        options["global_keyprefix"] = settings.broker_key_prefix
    return {
        "result_backend": settings.celery_broker_url,
        "result_backend_transport_options": options,
        "result_expires": settings.job_time_limit + 600,
    }


def transport_options(settings: Settings) -> dict[str, Any]:
    """Redis: a key prefix per deployment, and a visibility timeout longer than a task
    may live, so that a running task is never handed to a second worker. The embedded
    SQLite broker (kombu's SQLAlchemy transport passes its options to ``create_engine``):
    wait up to 30 s for the file's write lock, as several API processes and the worker
    write to it at once, rather than SQLite's default 5 s."""
    scheme = url_to_parts(settings.celery_broker_url).scheme or ""
    if scheme == "sqla+sqlite":
        return {"connect_args": {"timeout": 30}}
    if scheme not in ("redis", "rediss"):
        return {}
    options: dict[str, Any] = {"visibility_timeout": settings.job_time_limit + 600}
    if settings.broker_key_prefix:
        options["global_keyprefix"] = settings.broker_key_prefix
    return options


def create_celery(settings: Settings) -> Celery:
    app = Celery(
        "keyseed",
        broker=settings.celery_broker_url,
        include=list(TASK_MODULES),
        set_as_current=False,
    )
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_soft_time_limit=settings.job_soft_time_limit,
        task_time_limit=settings.job_time_limit,
        task_default_queue="cpu",
        task_routes=task_routes(settings),
        broker_connection_retry_on_startup=True,
        broker_connection_timeout=5,
        # a message that cannot be stored is sent again (connection errors, a locked
        # SQLite broker) for about 10 s before the job is reported as not enqueued
        task_publish_retry=True,
        task_publish_retry_policy={
            "max_retries": 12,
            "interval_start": 0,
            "interval_step": 0.25,
            "interval_max": 1.0,
        },
        broker_transport_options=transport_options(settings),
        worker_hijack_root_logger=False,
        enable_utc=True,
        **result_backend(settings),
    )
    return app


def declare_queues(app: Celery, *, attempts: int = 20) -> None:
    """Create the broker's queues now, before any message is sent or consumed.

    For the embedded SQLite broker: kombu's SQLAlchemy transport creates a queue's row on
    first use, so API processes and the worker starting at once race to insert it and the
    loser fails to store its message (an IntegrityError, which is not retried). Each
    attempt uses a fresh connection, since a failed one keeps a broken session.
    """
    for attempt in range(1, attempts + 1):
        try:
            with app.connection_for_write() as connection:
                channel = connection.default_channel
                for name in QUEUES:
                    channel.queue_declare(queue=name)
            return
        except Exception:  # the other process won the race, or the file is locked
            if attempt == attempts:
                raise
            time.sleep(0.05 * attempt)


def declares_queues(settings: Settings) -> bool:
    """Whether this broker needs :func:`declare_queues` at start (the SQL transports)."""
    scheme = url_to_parts(settings.celery_broker_url).scheme or ""
    return scheme.startswith("sqla+")


def redelivers(settings: Settings) -> bool:
    """Whether the broker gives a task whose worker died to another worker: Redis does,
    once the visibility timeout has passed; kombu's SQL transports forget a message as
    soon as a worker takes it (``app.jobs.recovery`` makes up for it)."""
    return not declares_queues(settings)


def waiting_task_ids(app: Celery) -> set[str] | None:
    """Ids of the task messages that wait in the broker for a worker to take them, where
    the broker can list them (kombu's SQL transports keep a message as a row, marked
    invisible once taken); None where it cannot."""
    if not (url_to_parts(app.conf.broker_url).scheme or "").startswith("sqla+"):
        return None
    with app.connection_for_read() as connection:
        channel: Any = connection.default_channel
        session = channel.session
        try:
            message = channel.message_cls
            rows = session.query(message.payload).filter(message.visible.is_(True)).all()
        finally:
            session.rollback()  # end the read
    return {str(json.loads(payload)["headers"]["id"]) for (payload,) in rows}


def _declare_at_worker_start(sender: Any = None, **_: Any) -> None:
    if declares_queues(get_settings()) and sender is not None:
        declare_queues(sender.app)


def _bind_request_id(task_id: str | None = None, task: Any = None, **_: Any) -> None:
    """The request id travels as a message header (``app.logging.task_headers``)."""
    request = getattr(task, "request", None)
    request_id = getattr(request, "request_id", None)
    headers = getattr(request, "headers", None)
    if request_id is None and isinstance(headers, dict):
        request_id = headers.get("request_id")
    bind_task_context(task_id, request_id)


def _configure_worker_logging(**_: Any) -> None:
    """A worker logs like the API: structlog, JSON by default (replaces Celery's setup)."""
    settings = get_settings()
    configure_logging(level=settings.log_level, json=settings.log_json)


signals.task_prerun.connect(_bind_request_id, weak=False)
signals.worker_init.connect(_declare_at_worker_start, weak=False)
signals.setup_logging.connect(_configure_worker_logging, weak=False)


celery_app = create_celery(get_settings())
