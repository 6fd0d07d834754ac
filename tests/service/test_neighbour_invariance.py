"""Neighbouring uploads look alike to everyone but their owner (docs/privacy.md).

For each edge case, the full flow runs twice, on two uploads that differ by one row of
the file: upload, job (the real engine, in-process as a worker runs it), prompting (a
real HTTP server standing in for the LLM, ``tests/fake_llm.py``), release to a client
organisation, download. Everything the platform roles (admin, auditor) and the client
organisation can observe is recorded: what the API answers them at every progress write
of the job and at the end (job, dataset, ledger, release, listings, download), the audit
events, and what ``/metrics`` gained. Apart from the DP outputs themselves (sequences,
texts, and the figures the engine derives from the private vocabulary), the two records
must be identical: a function of DP releases and public inputs only.

The release's canary audit (issue 66, item 3) is compared too: its canaries, guesses,
confidence, claimed ε and words must match; its outcome (right guesses, the bound) is
left out like the other DP outputs.

That covers the job's progress as others see it at every write: the running stage, its
"k of n", its fraction where the stage's work is public, and whether a time estimate is
shown. The estimate's value is the wall-clock rate of public work (like the time stamps,
it is left out of the comparison); the time stamps that would time the private stages
(a stage's start, the job's last change and its end) must not be shown to others at all.
Nor may any time stamp written while the job ran (its start, which follows the jobs
before it on the worker, a worker's ledger entries and report): no time others see,
through the API or on the admin dashboard's pages, falls between the worker's first
step and its last.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from app.config import LLMEndpointSettings, Settings
from app.jobs import stages
from app.jobs.stages import WorkerContext
from app.models import Job, utcnow
from tests.dashboard.factories import person, sign_in
from tests.fake_llm import FakeLLM
from tests.service import factories
from tests.service.test_sharded_jobs import SHARDABLE, drive, prefix, sharded
from tests.service.test_worker import vocabulary

__all__ = ["prefix", "sharded"]  # the sharded worker's fixtures

LABELS = ("cardio", "ortho")
SPEC: dict[str, Any] = {
    "llm": "vllm",
    "document_type": "clinical note",
    "epsilon_vocab": 0.5,
    "epsilon_kde": 0.5,
    "vocabulary_size": 8,
    "sequence_length": 3,
    "per_class": 2,
}
NO_PHRASE = ("Routine visit, nothing to report", "ortho")  # none of the vocabulary's
LARGE_CLASS = [(f"Heart failure follow-up visit number {i}", "cardio") for i in range(30)]
Rows = Sequence[tuple[str, str]]
# name: (rows of one upload, rows of its neighbour, declared labels)
CASES: dict[str, tuple[Rows, Rows, tuple[str, ...]]] = {
    # the first of (text, cardio), (text, ortho) removed: no relabelling of the second
    "a duplicate text with another label": (
        [("Chest pain at rest", "cardio"), ("Chest pain at rest", "ortho"), *factories.ROWS],
        [("Chest pain at rest", "ortho"), *factories.ROWS],
        LABELS,
    ),
    "a row matching no vocabulary phrase": (
        factories.ROWS,
        [*factories.ROWS, NO_PHRASE],
        LABELS,
    ),
    # whether any document holds a phrase of the vocabulary must not decide the outcome
    "the only row matching the vocabulary": (
        [("Knee arthritis", "ortho"), NO_PHRASE, ("Nothing to report today", "cardio")],
        [NO_PHRASE, ("Nothing to report today", "cardio")],
        LABELS,
    ),
    # the declared labels are fixed: a class empty in one upload gets a row in the other
    "a row with a new label": (
        factories.ROWS,
        [*factories.ROWS, ("Migraine with aura and a fall", "neuro")],
        (*LABELS, "neuro"),
    ),
    "one added row in a large class": (
        [*factories.ROWS, *LARGE_CLASS],
        [*factories.ROWS, *LARGE_CLASS, ("Heart failure with chest pain", "cardio")],
        LABELS,
    ),
}
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
TIMES = frozenset({"created_at", "started_at", "finished_at", "updated_at", "deleted_at"})
# Time stamps of a job that would time its private stages: the owner's only.
OWNERS_TIMES = ("started_at", "finished_at", "updated_at")
# A time stamp as the API (ISO 8601) or the dashboard (its <time> elements, its chart's
# markers: "2026-12-07 05:31:59 UTC") writes it.
STAMP = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:\d{2}| UTC)?")
DASHBOARD_ROLES = ("admin", "auditor")
# Metric samples that are wall-clock times (sums and buckets of durations, creation times),
# and those of the test process itself, which here runs the worker's stages too (a worker
# is a process of its own in every deployment, and its process metrics are not exported).
TIMED = re.compile(r"(_sum|_bucket|_created)$|^(process|python)_")
PRIVATE_STAGES = ("extract", "private_vocabulary", "embed", "dp_kde", "sequences")
# The canary audit's outcome (release manifest and report): from the released corpus and
# the run's own random canaries and coins
AUDIT_OUTCOMES = (
    "correct",
    "included",
    "epsilon_lower_bound",
    "exceeds_claim",
    "in_words",
    "finding_in_words",
    "canary_set",
)


@pytest.fixture
def fake_llm() -> Iterator[FakeLLM]:
    with FakeLLM() as fake:
        yield fake


@pytest.fixture
def worker(app: FastAPI, settings: Settings, fake_llm: FakeLLM, tmp_path: Path) -> WorkerContext:
    """A worker on the test database; the endpoint jobs name ("vllm") is the fake LLM.
    Progress is written at every report the engine makes (no throttling)."""
    endpoint = LLMEndpointSettings(base_url=fake_llm.base_url, model=fake_llm.model)
    return factories.worker_context(
        app, settings, tmp_path / "cache", llm_endpoints={"vllm": endpoint}
    )


def _normalised(value: Any, ids: dict[str, str]) -> Any:
    """``value`` with ids numbered by first appearance, and wall-clock times and serial
    row numbers (a ledger entry's) left out."""
    if isinstance(value, dict):
        return {
            _normalised(k, ids): (
                # a time estimate: whether there is one (its value is a wall-clock rate)
                v is not None if k == "seconds_left" else _normalised(v, ids)
            )
            for k, v in value.items()
            if k not in TIMES and not (k == "id" and isinstance(v, int))
        }
    if isinstance(value, (list, tuple)):
        return [_normalised(v, ids) for v in value]
    if isinstance(value, str):
        return UUID.sub(lambda m: ids.setdefault(m[0], f"<id {len(ids)}>"), value)
    return value


def _metrics(client: TestClient, world: factories.World) -> dict[tuple[str, Any], float]:
    response = client.get("/metrics", headers=world.admin.headers)
    assert response.status_code == 200
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def _audit_after(client: TestClient, world: factories.World, mark: int) -> list[dict[str, Any]]:
    events = client.get(
        "/v1/audit/events", headers=world.auditor.headers, params={"limit": 500}
    ).json()["events"]
    return [
        {k: v for k, v in e.items() if k not in ("id", "request_id")}
        for e in reversed(events)
        if e["id"] > mark
    ]


def _last_event(client: TestClient, world: factories.World) -> int:
    events = client.get("/v1/audit/events", headers=world.auditor.headers).json()["events"]
    return int(events[0]["id"]) if events else 0


def _others(world: factories.World) -> dict[str, factories.Caller]:
    return {"admin": world.admin, "auditor": world.auditor, "client": world.client}


def _views(
    client: TestClient, world: factories.World, paths: Sequence[str], own: Sequence[str] = ()
) -> dict[str, Any]:
    """What each non-owner gets at ``paths``: status and body (of a listing, the items
    of this flow, ``own``: the other flow's objects are listed too)."""
    seen: dict[str, Any] = {}
    for role, caller in _others(world).items():
        for path in paths:
            response = client.get(path, headers=caller.headers)
            body = response.json() if "json" in response.headers["content-type"] else None
            if isinstance(body, list):
                body = [item for item in body if item["id"] in own]
            seen[f"{role} GET {path}"] = (response.status_code, body)
    return seen


def _times_shown(views: Any, path: str = "") -> list[str]:
    """Where a job in ``views`` (what others see) shows a time stamp of its own: a
    stage's start, its last change or its end."""
    found: list[str] = []
    if isinstance(views, dict):
        if "current_stage" in views:  # a job
            stage = views["current_stage"] or {}
            found += [f"{path}.{k}" for k in OWNERS_TIMES if views.get(k) is not None]
            if stage.get("started_at") is not None:
                found.append(f"{path}.current_stage.started_at")
        for k, v in views.items():
            found += _times_shown(v, f"{path}.{k}")
    elif isinstance(views, list | tuple):
        for i, v in enumerate(views):
            found += _times_shown(v, f"{path}[{i}]")
    return found


def _stamps(value: Any, path: str = "") -> Iterator[tuple[datetime, datetime, str]]:
    """Every time stamp written in ``value`` (strings anywhere in it), as the earliest and
    the latest time it may stand for (a time shown to the second, as the dashboard's
    text shows them, stands for any time within that second), in UTC, with where it is
    (the path to its string, and the text around it)."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _stamps(item, f"{path}.{key}")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from _stamps(item, f"{path}[{i}]")
    elif isinstance(value, str):
        for found in STAMP.finditer(value):
            text = found[0].replace(" UTC", "+00:00").replace("Z", "+00:00")
            at = datetime.fromisoformat(text.replace(" ", "T", 1))
            at = at if at.tzinfo is not None else at.replace(tzinfo=UTC)
            within = timedelta(0) if "." in found[0] else timedelta(seconds=1)
            around = value[max(0, found.start() - 80) : found.end() + 20]
            yield at, at + within, f"{path}: {around}"


def _stamped_while_running(views: Any, start: datetime, end: datetime) -> list[str]:
    """Where ``views`` show a time stamp taken while the worker ran the job: each would
    time what the worker did (and what ran before it)."""
    return sorted({where for early, late, where in _stamps(views) if start <= early <= late <= end})


def _dashboard(
    dashboards: dict[str, TestClient], dataset_id: str, organisation_id: uuid.UUID
) -> dict[str, Any]:
    """The dashboard pages that show the job's dataset and organisation, as each platform
    person reads them (HTML)."""
    pages: dict[str, Any] = {}
    for role, browser in dashboards.items():
        for path in (f"/admin/datasets/{dataset_id}", f"/admin/organisations/{organisation_id}"):
            response = browser.get(path)
            assert response.status_code == 200, (role, path, response.text[:500])
            pages[f"{role} GET {path}"] = response.text
    return pages


def _without_dp_outputs(views: dict[str, Any]) -> None:
    """Leave out what the engine derived from the private vocabulary Ṽ (a DP output): a
    realised release (it has a ``name``; the planned ones, which the ledger reserves,
    do not) of the exact kernel has its sensitivity from Ṽ (the largest column sum or
    norm), and its noise scale follows from it. The LLM's tokens and time are those of
    prompts built from the released sequences (post-processing of DP outputs); the
    number of calls stays compared. Everything else must match."""

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            if isinstance(value.get("utility"), dict):  # the held-out figure: DP outputs
                value["utility"] = _utility_shape(value["utility"])
            realised = value.get("name") and "sensitivity" in value and "noise" in value
            if realised:
                for name in ("sensitivity", "scale"):
                    value.pop(name, None)
            if "prompt_tokens" in value:  # LLM costs: of prompts built from DP outputs
                for name in ("prompt_tokens", "completion_tokens", "wall_seconds"):
                    value.pop(name, None)
            if "guesses" in value and "claimed_epsilon" in value:  # the canary audit's
                # result: the right guesses and what follows from them are a function of
                # the released corpus (DP output), the coins and canaries of fresh public
                # randomness; m, k, the confidence, the claim and the texts stay compared
                for name in AUDIT_OUTCOMES:
                    value.pop(name, None)
            report = isinstance(value.get("events"), list)  # a ledger report, a manifest
            if (realised or report) and isinstance(value.get("epsilon"), float | str):
                value["epsilon"] = round(float(value["epsilon"]), 9)
            for item in value.values():
                walk(item)
        elif isinstance(value, list | tuple):
            for item in value:
                walk(item)

    walk(views)


def _utility_shape(found: dict[str, Any]) -> dict[str, Any]:
    """The held-out accuracy figure with its DP outputs (the noisy cells and what is
    computed from them) blanked and its public inputs kept: ε, fraction, key, split,
    confidence and the noise bound q (a function of ε and the declared labels)."""
    public = {"epsilon", "fraction", "key", "split", "confidence", "noise_bound", "classifier"}
    return {k: (v if k in public else "<DP output>") for k, v in found.items()}


def _flow(
    client: TestClient,
    world: factories.World,
    worker: WorkerContext,
    rows: Rows,
    labels: tuple[str, ...],
    vocabulary_id: str,
    dashboards: dict[str, TestClient],
    spec: dict[str, Any] = SPEC,
    *,
    run: Callable[[WorkerContext, uuid.UUID], str] = stages.run_sequences,
    upload: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Upload ``rows`` (with the form fields ``upload``), run a job on them to a release
    (its private stages by ``run``), and record what others see."""
    metrics_before = _metrics(client, world)
    mark = _last_event(client, world)
    record: dict[str, Any] = {}

    dataset_id = factories.dataset(
        client, world.owner, content=factories.csv_bytes(rows), labels=labels, **(upload or {})
    )
    job_id = factories.job(client, world.owner, dataset_id, vocabulary=vocabulary_id, **spec)
    job_path = f"/v1/jobs/{job_id}"
    record["submitted"] = _views(client, world, [job_path])
    progress: list[dict[str, Any]] = []
    worker.stage_hooks.append(lambda *_: progress.append(_views(client, world, [job_path])))
    started = utcnow()
    record["sequences stage"] = run(worker, uuid.UUID(job_id))
    worker.stage_hooks.clear()
    record["at every progress write"] = progress
    record["after the sequences stage"] = _views(client, world, [job_path])
    during: list[Any] = [*progress, record["after the sequences stage"]]
    record["prompts stage"] = stages.run_prompts(worker, uuid.UUID(job_id))
    ended = utcnow()

    released = client.post(
        f"/v1/jobs/{job_id}/release",
        headers=world.owner.headers,
        json={"client_organisations": [str(world.client.organisation_id)]},
    )
    record["release"] = released.status_code
    paths = [
        job_path,
        f"/v1/datasets/{dataset_id}",
        f"/v1/datasets/{dataset_id}/ledger",
        f"/v1/datasets/{dataset_id}/jobs",
        "/v1/datasets",
    ]
    record["the end"] = _views(client, world, paths, own=[dataset_id, job_id])
    _without_dp_outputs(record["the end"])
    if released.status_code == 201:
        release_id = released.json()["id"]
        views = _views(
            client, world, [f"/v1/releases/{release_id}", "/v1/releases"], own=[release_id]
        )
        _without_dp_outputs(views)
        record["released"] = views
        record["download"] = _download_seen(client, world, release_id)
        record["prompt log"] = _prompt_log_views(client, world, release_id)
    record["audit events"] = _audit_after(client, world, mark)
    record["time stamps shown to others"] = _times_shown([*during, record["the end"]])
    seen_by_others = [
        *during,
        record["the end"],
        record.get("released"),
        record["audit events"],
        _dashboard(dashboards, dataset_id, world.owner.organisation_id),
    ]
    record["stamped while the job ran"] = _stamped_while_running(seen_by_others, started, ended)

    after = _metrics(client, world)
    gained = {  # rounded: a counter's difference depends on what earlier tests added
        key: round(value - metrics_before.get(key, 0.0), 9)
        for key, value in after.items()
        if not TIMED.search(key[0]) and value != metrics_before.get(key, 0.0)
    }
    record["metrics gained"] = sorted(gained.items())
    record["private stages timed"] = sorted(
        {dict(labels).get("stage") for _, labels in gained} & set(PRIVATE_STAGES)
    )
    normalised: dict[str, Any] = _normalised(record, {})
    return normalised


DP_LOG_FIELDS = ("prev", "hash", "prompt_sha256")  # digests of prompts built from DP outputs


def _prompt_log_views(
    client: TestClient, world: factories.World, release_id: str
) -> dict[str, Any]:
    """The release's prompt log as each non-owner reads it (issue 66, item 4). Its
    records are built from the released sequences (DP outputs): their hashes, digests and
    content are left out; how many there are, their keys, kinds, the names of their
    inputs and their public refs stay compared."""
    seen: dict[str, Any] = {}
    for role, caller in _others(world).items():
        response = client.get(f"/v1/releases/{release_id}/prompts", headers=caller.headers)
        records = [json.loads(line) for line in response.text.splitlines()]
        for record in records:
            for name in DP_LOG_FIELDS:
                record[name] = "<DP output>" if record.get(name) else record.get(name)
            record["inputs"] = sorted(record["inputs"])
            if "content" in record:
                record["content"] = sorted(record["content"])
        seen[role] = (response.status_code, response.headers["content-type"], records)
    return seen


def _download_seen(client: TestClient, world: factories.World, release_id: str) -> dict[str, Any]:
    """A grantee's download as others could compare it: its status and size in lines
    (DP outputs), which headers it carries, and that its ETag, length and time are
    functions of the released bytes and of the release alone (the ETag their sha256,
    Last-Modified the release's time, not when the file was rendered); revalidation and
    a range answer alike."""
    path = f"/v1/releases/{release_id}/download"
    headers = world.client.headers
    download = client.get(path, headers=headers)
    etag = download.headers["etag"]
    created = datetime.fromisoformat(
        client.get(f"/v1/releases/{release_id}", headers=headers).json()["created_at"]
    )
    modified = parsedate_to_datetime(download.headers["last-modified"])
    return {
        "status": download.status_code,
        "lines": len(download.text.splitlines()),
        "headers": sorted(set(download.headers) - {"x-request-id"}),
        "etag is the sha256": etag == f'"{hashlib.sha256(download.content).hexdigest()}"',
        "length is the body's": download.headers["content-length"] == str(len(download.content)),
        "time is the release's": abs(
            (modified - created.replace(tzinfo=created.tzinfo or UTC)).total_seconds()
        )
        < 1,
        "revalidated": client.get(path, headers={**headers, "If-None-Match": etag}).status_code,
        "a range": client.get(path, headers={**headers, "Range": "bytes=0-0"}).status_code,
    }


def _stages_seen(record: dict[str, Any]) -> list[tuple[Any, ...]]:
    """(stage, k, n, fraction) of the job as the auditor saw it at each progress write."""
    seen = []
    for views in record["at every progress write"]:
        stage = views["auditor GET /v1/jobs/<id 0>"][1]["current_stage"]
        seen.append((stage["name"], stage["number"], stage["count"], stage["fraction"]))
    return seen


def _first_differences(one: Any, other: Any, keys: list[str]) -> list[str]:
    """Where two records first differ, as paths (for a readable failure)."""
    found: list[str] = []

    def walk(a: Any, b: Any, path: str) -> None:
        if len(found) >= 10 or a == b:
            return
        if isinstance(a, dict) and isinstance(b, dict):
            for k in sorted(set(a) | set(b), key=str):
                walk(a.get(k), b.get(k), f"{path}.{k}")
        elif isinstance(a, list | tuple) and isinstance(b, list | tuple) and len(a) == len(b):
            for i, (x, y) in enumerate(zip(a, b, strict=True)):
                walk(x, y, f"{path}[{i}]")
        else:
            found.append(f"{path}: {a!r} != {b!r}")

    for key in keys:
        walk(one[key], other.get(key), key)
    return found


def dashboard_browsers(app: Any, db: Any) -> dict[str, TestClient]:
    """A signed-in dashboard session of a platform admin and of an auditor."""
    browsers = {}
    for role in DASHBOARD_ROLES:
        person(db, f"{role}-person", role)
        browser = TestClient(app)
        response = sign_in(browser, f"{role}-person")
        assert response.status_code == 303, response.text[:500]
        browsers[role] = browser
    return browsers


@pytest.mark.parametrize("case", list(CASES))
def test_neighbouring_uploads_look_alike_to_everyone_but_their_owner(
    case: str, client: TestClient, world: factories.World, worker: WorkerContext, db: Any
) -> None:
    rows, neighbour, labels = CASES[case]
    assert abs(len(rows) - len(neighbour)) == 1
    assert client.get("/metrics").status_code == 401  # no anonymous scrape
    vocabulary_id = vocabulary(client, world.owner)
    dashboards = dashboard_browsers(client.app, db)

    one = _flow(client, world, worker, rows, labels, vocabulary_id, dashboards)
    other = _flow(client, world, worker, neighbour, labels, vocabulary_id, dashboards)

    assert one["prompts stage"] == "succeeded", one
    assert one["private stages timed"] == [], "the private stages' durations are exported"
    assert one["time stamps shown to others"] == [], "others see when private stages ran"
    assert one["stamped while the job ran"] == [], "others see times the worker wrote"
    assert _stages_seen(one) == [
        ("extract", 1, 6, None),
        ("extract", 1, 6, None),  # its end
        ("private_vocabulary", 2, 6, None),
        ("private_vocabulary", 2, 6, None),
        ("embed", 3, 6, 0.0),
        ("embed", 3, 6, 1.0),
        ("dp_kde", 4, 6, None),
        ("dp_kde", 4, 6, None),
        ("sequences", 5, 6, 0.0),
        *[("sequences", 5, 6, (n + 1) / len(labels)) for n in range(len(labels))],
    ], "the running stage, k of n and the fractions of public work, as others see them"
    differing = [key for key in one if one[key] != other.get(key)]
    assert differing == [], _first_differences(one, other, differing)


# -- the release report (issue 66, item 1) ----------------------------------------------


def _report_views(
    client: TestClient,
    world: factories.World,
    worker: WorkerContext,
    rows: Rows,
    labels: tuple[str, ...],
    vocabulary_id: str,
    spec: dict[str, Any] = SPEC,
) -> dict[str, Any]:
    """Upload ``rows``, run a job on them to a release, and record the release report as
    each non-owner reads it (JSON, and whether the HTML and the PDF are served). Sample
    documents are DP outputs (texts written from the released sequences): their classes
    stay compared, their words are left out."""
    dataset_id = factories.dataset(
        client, world.owner, content=factories.csv_bytes(rows), labels=labels
    )
    job_id = factories.job(client, world.owner, dataset_id, vocabulary=vocabulary_id, **spec)
    budget_path = f"/v1/organisations/{world.owner.organisation_id}/budget"
    budget_before = client.get(budget_path, headers=world.admin.headers).json()
    stages.run_sequences(worker, uuid.UUID(job_id))
    assert stages.run_prompts(worker, uuid.UUID(job_id)) == "succeeded"
    released = client.post(
        f"/v1/jobs/{job_id}/release",
        headers=world.owner.headers,
        json={"client_organisations": [str(world.client.organisation_id)]},
    )
    assert released.status_code == 201, released.text
    path = f"/v1/releases/{released.json()['id']}/report"
    seen: dict[str, Any] = {}
    for role, caller in _others(world).items():
        body = client.get(path, headers=caller.headers).json()
        body["released"].pop("released_at")
        if body["spend"]["organisation_budget"] is not None:  # the flow's change to it: the
            # organisation's figures also hold the datasets of the flows before this one
            body["spend"]["organisation_budget"] = _change(
                budget_before, body["spend"]["organisation_budget"]
            )
        for sample in body.get("samples") or []:
            sample["text"] = sample["keyphrases"] = "<DP output>"
        attested = body["prompt_log"]  # its head hashes prompts built from DP outputs
        head = attested["head"]
        assert attested["recorded"] and head in attested["verify"] and head in attested["in_words"]
        for name in ("head", "verify", "in_words"):
            attested[name] = attested[name].replace(head, "<DP output>")
        seen[role] = body
        for fmt in ("html", "pdf"):
            response = client.get(path, params={"format": fmt}, headers=caller.headers)
            seen[f"{role} {fmt}"] = (response.status_code, response.headers["content-type"])
    _without_dp_outputs(seen)
    normalised: dict[str, Any] = _normalised(seen, {})
    return normalised


def _change(before: Any, after: Any) -> Any:
    """``after`` with each number replaced by how much it grew since ``before``."""
    if isinstance(after, dict):
        return {k: _change(before.get(k), v) for k, v in after.items()}
    if isinstance(after, int | float) and isinstance(before, int | float):
        return round(after - before, 9)
    return after


@pytest.mark.parametrize("case", ["a row with a new label", "a duplicate text with another label"])
def test_the_release_report_looks_alike_to_everyone_but_the_owner(
    case: str, client: TestClient, world: factories.World, worker: WorkerContext
) -> None:
    rows, neighbour, labels = CASES[case]
    vocabulary_id = vocabulary(client, world.owner)
    one = _report_views(client, world, worker, rows, labels, vocabulary_id)
    other = _report_views(client, world, worker, neighbour, labels, vocabulary_id)
    assert one["admin"]["view"] == "platform" and one["client"]["view"] == "grantee"
    assert one["admin"]["released"]["dataset_raw_counts"] is None
    assert one["admin"]["samples"] is None and one["client"]["samples"]
    # the canary audit is in every view, its public part compared below
    assert all(one[role]["empirical_audit"]["guesses"] == 32 for role in _others(world))
    differing = [key for key in one if one[key] != other.get(key)]
    assert differing == [], _first_differences(one, other, differing)


# -- a held-out slice (issue 66, item 2) ------------------------------------------------

HOLDOUT = {**SPEC, "holdout": {"fraction": 0.5, "key": "neighbour-test-key"}}


@pytest.mark.parametrize("case", ["one added row in a large class", "a row with a new label"])
def test_a_job_with_a_holdout_looks_alike_to_everyone_but_its_owner(
    case: str, client: TestClient, world: factories.World, worker: WorkerContext, db: Any
) -> None:
    """The holdout's events (split and side), its figure's public fields and the shape of
    the rest are the same on neighbouring uploads; the figure's values are DP outputs."""
    rows, neighbour, labels = CASES[case]
    vocabulary_id = vocabulary(client, world.owner)
    dashboards = dashboard_browsers(client.app, db)
    one = _flow(client, world, worker, rows, labels, vocabulary_id, dashboards, HOLDOUT)
    other = _flow(client, world, worker, neighbour, labels, vocabulary_id, dashboards, HOLDOUT)
    assert one["prompts stage"] == "succeeded", one
    end = one["the end"]["admin GET /v1/jobs/<id 0>"][1]
    assert "holdout_accuracy" in end["epsilon"]["by_mechanism"]
    differing = [key for key in one if one[key] != other.get(key)]
    assert differing == [], _first_differences(one, other, differing)

    reports = [
        _report_views(client, world, worker, r, labels, vocabulary_id, HOLDOUT)
        for r in (rows, neighbour)
    ]
    shown = reports[0]["client"]["utility"]
    assert shown["epsilon"] == 0.5 + 0.5 and shown["fraction"] == 0.5
    differing = [key for key in reports[0] if reports[0][key] != reports[1].get(key)]
    assert differing == [], _first_differences(reports[0], reports[1], differing)


# -- a sharded job (issue 65) -------------------------------------------------------------

SHARDED = {
    **SPEC,
    **SHARDABLE,
    # without it the number of sequences kept is a DP output (the filter's share)
    "consistency_filter": False,
}


def _sharded_run(ctx: WorkerContext, job_id: uuid.UUID) -> str:
    """The sequences task of a sharded job, then its chords as a worker runs them."""
    first = stages.run_sequences(ctx, job_id)
    drive(ctx)
    with ctx.database.session() as session:
        job = session.get(Job, job_id)
        assert job is not None
        return f"{first}, then {job.state} at {job.stage}"


@pytest.mark.parametrize("case", ["one added row in a large class", "a row with a new label"])
def test_a_sharded_job_looks_alike_to_everyone_but_its_owner(
    case: str,
    client: TestClient,
    world: factories.World,
    sharded: WorkerContext,
    db: Any,
) -> None:
    """A job split in 3 shards (its canaries among them): what others see, its shards
    included (nothing), is the same on neighbouring uploads; the owner sees each shard."""
    rows, neighbour, labels = CASES[case]
    vocabulary_id = vocabulary(client, world.owner)
    dashboards = dashboard_browsers(client.app, db)
    flows = [
        _flow(
            client,
            world,
            sharded,
            r,
            labels,
            vocabulary_id,
            dashboards,
            SHARDED,
            run=_sharded_run,
            upload={"delta_cap": "1e-5"},
        )
        for r in (rows, neighbour)
    ]
    one, other = flows
    assert one["sequences stage"] == "mapping, then running at prompts", one
    assert one["prompts stage"] == "succeeded", one
    end = one["the end"]["admin GET /v1/jobs/<id 0>"][1]
    assert end["shards"] is None
    differing = [key for key in one if one[key] != other.get(key)]
    assert differing == [], _first_differences(one, other, differing)
