"""Prometheus metrics. Labels are routes, states, stages, endpoint names and outcome
codes: never an id of a private row, never text. No metric is computed from private
data: the private stages of a job (extraction to sequences) are not timed, since their
durations depend on the data; only the prompting stage, over the DP sequences, is
(docs/privacy.md). ``/metrics`` needs the metrics token or an admin or auditor key.

Counters the workers increment (``STAGE_DURATION``, ``LLM_CALLS``, ``EPSILON_COMMITTED``,
``JOBS_ENDED``) are defined here so API and workers share names; with
``PROMETHEUS_MULTIPROC_DIR`` set, every process writes its samples there and
``/metrics`` adds them up. Jobs by state and ε spent are read from
the database at scrape time, so every API replica reports the same figures.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from app.db import Database
from app.jobs import repository as jobs_repo
from app.ledger import service as ledger
from app.models import JOB_STATES

HTTP_REQUESTS = Counter(
    "keyseed_http_requests", "HTTP requests answered", ["method", "route", "status"]
)
HTTP_DURATION = Histogram(
    "keyseed_http_request_duration_seconds", "Time to answer HTTP requests", ["method", "route"]
)
PUBLIC_STAGES = ("prompts",)  # stages whose duration depends on DP outputs only
STAGE_DURATION = Histogram(
    "keyseed_job_stage_duration_seconds",
    "Wall time of the job stages that run on DP outputs only (prompting)",
    ["stage"],
    buckets=(1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 12 * 3600, float("inf")),
)
LLM_CALLS = Counter("keyseed_llm_calls", "HTTP calls to LLM endpoints", ["endpoint", "outcome"])
EPSILON_COMMITTED = Counter(
    "keyseed_worker_epsilon_committed",
    "ε committed by workers as they start reading private data, by mechanism",
    ["mechanism"],
)
JOBS_ENDED = Counter("keyseed_worker_jobs_ended", "Jobs ended by workers", ["state"])


def observe_stage(stage: str, seconds: float) -> None:
    """Time a stage that runs on DP outputs only; a private stage is refused."""
    if stage not in PUBLIC_STAGES:
        raise ValueError(f"the {stage} stage reads private data: its duration is not exported")
    STAGE_DURATION.labels(stage).observe(seconds)


def observe_request(method: str, route: str, status: int, seconds: float) -> None:
    HTTP_REQUESTS.labels(method, route, str(status)).inc()
    HTTP_DURATION.labels(method, route).observe(seconds)


class DatabaseCollector(Collector):
    """Jobs by state and ε spent, from the database, at each scrape."""

    def __init__(self, database: Database) -> None:
        self.database = database

    def collect(self) -> Iterator[Metric]:
        with self.database.session() as session:
            counts = jobs_repo.counts_by_state(session)
            spent = ledger.epsilon_spent_total(session)
        jobs = GaugeMetricFamily("keyseed_jobs", "Jobs by state", labels=["state"])
        for state in JOB_STATES:
            jobs.add_metric([state], counts.get(state, 0))
        yield jobs
        yield CounterMetricFamily(
            "keyseed_epsilon_spent",
            "ε committed over every dataset (basic composition)",
            value=spent,
        )


def render(database: Database) -> bytes:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        process_registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(process_registry)  # type: ignore[no-untyped-call]
    else:
        process_registry = REGISTRY
    database_registry = CollectorRegistry(auto_describe=False)
    database_registry.register(DatabaseCollector(database))
    return generate_latest(process_registry) + generate_latest(database_registry)
