"""Property-based fuzzing of every operation of the OpenAPI schema with schemathesis,
each generated request sent as every kind of caller (admin, auditor, owner, client,
a revoked key, no key).

Checked on every response: no server error, the status code is one the operation
documents, the content type is the documented one, and the body matches the documented
schema (problem+json bodies included). Cases are the schema's coverage cases (bounds,
just-out-of-bounds, missing and wrong-typed values) plus Hypothesis-generated positive
and negative ones; generation is derandomized, so a run is repeatable.

Valid-looking ids and names are mapped onto real objects (a dataset, a job, a release,
a key, the medical vocabulary, a configured LLM) often enough that requests get past
the 404s and reach the services; every operation starts from a fresh database.

(The schema is loaded at collection and the tests are parametrized by schemathesis's
pytest plugin; its fixture-based lazy loader does not run under pytest 9.)
"""

from __future__ import annotations

import csv
import io
import tempfile
import time
import uuid
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import schemathesis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase
from schemathesis import Case, CheckContext, Response
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from app.db import Database
from app.main import create_app
from tests.proof.scene import Scene, revoked_caller
from tests.service import factories
from tests.service.conftest import make_settings

pytestmark = pytest.mark.proof

MAX_EXAMPLES = 25  # per operation, Hypothesis-generated, besides the coverage cases
MIN_CASES = 1000
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
ROLES = ("admin", "auditor", "owner", "client", "revoked", "anonymous")
SCHEMA_MISMATCH = "the request does not match the schema"  # app.errors, on validation


def schema_and_validation_agree(ctx: CheckContext, response: Response, case: Case) -> None:
    """A request the OpenAPI schema calls valid is not refused by the request validation
    (a bound or pattern the validator knows but the published schema does not)."""
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive or response.status_code != 422:
        return
    body = response.json()
    if body.get("detail") == SCHEMA_MISMATCH:
        raise AssertionError(f"the schema allows what validation refuses: {body.get('errors')}")


CHECKS.append(schema_and_validation_agree)


@dataclass
class Totals:
    """Cases and calls per operation over the session (read by the summary test)."""

    cases: Counter[str] = field(default_factory=Counter)
    calls: Counter[str] = field(default_factory=Counter)
    statuses: Counter[int] = field(default_factory=Counter)
    outcomes: Counter[tuple[str, int, str]] = field(default_factory=Counter)
    seconds: dict[str, float] = field(default_factory=dict)


@pytest.fixture(scope="session")
def totals() -> Totals:
    return Totals()


def _digest(value: Any) -> int:
    return zlib.crc32(repr(value).encode("utf-8", "surrogatepass"))


def _is_uuid(value: Any) -> bool:
    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return isinstance(value, str)


def _real_ids(scene: Scene, name: str, generated: Any) -> str | None:
    """A real object for a valid-looking generated id, chosen by the id (so a run is
    repeatable): mostly the owner's, sometimes the other organisation's."""
    if not _is_uuid(generated):
        return None
    scope = "other" if _digest(generated) % 5 == 0 else "own"
    pools = {
        "dataset_id": lambda: scene.dataset(scope),
        "job_id": lambda: (
            scene.succeeded_job(scope) if _digest(generated) % 2 else scene.job(scope)
        ),
        "release_id": lambda: scene.release(scope),
        "key_id": lambda: scene.spare_key(scope),
    }
    if name not in pools or _digest(generated) % 7 == 0:  # some stay unknown: 404
        return None
    return pools[name]()


def _csv_for(body: dict[str, Any]) -> bytes | None:
    """A corpus that fits the generated form (its columns and labels), if it names any."""
    columns = body.get("text_column")
    label_column = body.get("label_column")
    labels = body.get("labels")
    if not (
        isinstance(columns, list)
        and columns
        and all(isinstance(c, str) for c in columns)
        and isinstance(label_column, str)
        and isinstance(labels, list)
        and labels
        and all(isinstance(label, str) for label in labels)
    ):
        return None
    if len(columns) == 1 and "," in columns[0]:
        columns = columns[0].split(",")
    if len(labels) == 1 and "," in labels[0]:
        labels = labels[0].split(",")
    header = [c.strip() for c in columns] + [label_column.strip()]
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(header)
    for i in range(4):
        writer.writerow([f"note {i} {c}" for c in columns] + [labels[i % len(labels)].strip()])
    return buffer.getvalue().encode("utf-8", "surrogatepass")


def _aim(case: Case, scene: Scene) -> None:
    """Map valid-looking generated values onto real objects and usable settings."""
    for name, value in list(case.path_parameters.items()):
        real = _real_ids(scene, name, value)
        if real is not None:
            case.path_parameters[name] = real
    body = case.body
    if not isinstance(body, dict):
        return
    digest = _digest(sorted(body.items(), key=repr))
    if isinstance(body.get("client_organisations"), list) and digest % 3:
        body["client_organisations"] = [str(scene.world.client.organisation_id)]
    if _is_uuid(body.get("organisation_id")) and digest % 3:
        body["organisation_id"] = str(scene.world.owner.organisation_id)
    if isinstance(body.get("vocabulary"), str) and digest % 4:
        body["vocabulary"] = "medical"
    if isinstance(body.get("llm"), str) and digest % 4:
        body["llm"] = ("none", "local", "vllm")[digest % 3]
    if "file" in body and "text_column" in body and digest % 3:
        if digest % 3 == 2:  # the generated columns and labels are kept, if usable
            body |= {"text_column": ["text"], "label_column": "label", "labels": ["a", "b"]}
        corpus = _csv_for(body)
        if corpus is not None:
            body["file"] = corpus


def _schema() -> schemathesis.BaseSchema:
    """The schema, read at collection from an app like the test app (its database is
    never reached); every call goes to the test app of the session."""
    placeholder = make_settings(
        "postgresql+psycopg://postgres@127.0.0.1:5432/keyseed_schema_only",
        Path(tempfile.gettempdir()),
    )
    return schemathesis.openapi.from_asgi("/openapi.json", create_app(placeholder))


schema = _schema()


@pytest.fixture
def callers(db: Database, world: factories.World) -> dict[str, dict[str, str]]:
    headers = {role: getattr(world, role).headers for role in ROLES[:4]}
    headers["revoked"] = revoked_caller(db, "admin").headers
    headers["anonymous"] = {}
    return headers


@pytest.fixture
def scene(client: TestClient, db: Database, world: factories.World) -> Scene:
    """Objects the valid-looking ids are mapped onto, made before the first case."""
    made = Scene(client, db, world)
    for scope in ("own", "other"):
        made.release(scope)
        made.job(scope)
        made.spare_key(scope)
    return made


@schema.parametrize()
@hypothesis.settings(
    max_examples=MAX_EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
def test_every_operation_as_every_caller(
    case: Case,
    app: FastAPI,
    scene: Scene,
    callers: dict[str, dict[str, str]],
    totals: Totals,
) -> None:
    label = case.operation.label
    totals.cases[label] += 1
    started = time.monotonic()
    _aim(case, scene)
    case.headers.pop("Authorization", None)
    try:
        for role in ROLES:
            response = case.call(headers=callers[role], app=app)
            totals.calls[label] += 1
            totals.statuses[response.status_code] += 1
            if role == "owner":
                problem = response.json() if response.status_code >= 400 else {}
                totals.outcomes[label, response.status_code, str(problem.get("field"))] += 1
            case.validate_response(response, checks=CHECKS, headers=callers[role])
    finally:
        totals.seconds[label] = totals.seconds.get(label, 0.0) + time.monotonic() - started


def test_the_fuzzing_covered_every_operation_with_enough_cases(
    totals: Totals, request: pytest.FixtureRequest
) -> None:
    if not totals.cases:
        pytest.skip("the fuzzing test did not run in this session")
    labels = {result.ok().label for result in schema.get_all_operations()}
    assert labels == set(totals.cases), labels ^ set(totals.cases)
    assert sum(totals.cases.values()) >= MIN_CASES, totals.cases
    assert not [s for s in totals.statuses if s >= 500], totals.statuses
    figures = {
        "operations": len(labels),
        "cases": sum(totals.cases.values()),
        "calls": sum(totals.calls.values()),
        "fewest_cases": min(totals.cases.values()),
        "statuses": dict(sorted(totals.statuses.items())),
        "seconds": round(sum(totals.seconds.values()), 1),
        "slowest_operation": max(totals.seconds, key=totals.seconds.__getitem__),
    }
    request.node.user_properties.append(("figures", figures))
    print(f"\nfuzzing figures: {figures}")
    print({label: totals.cases[label] for label in sorted(totals.cases)})
    for (label, status, field_name), count in sorted(totals.outcomes.items()):
        print(f"{label:45} {status} {field_name:25} {count}")


def _schemas(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _schemas(value)
    elif isinstance(node, list):
        for value in node:
            yield from _schemas(value)


def test_the_schema_states_every_bound_in_json_schema_terms() -> None:
    """pydantic writes ``gt``/``le`` … into the schema when a bound follows a validator
    in ``Annotated``: clients and fuzzers would not see the bound."""
    document = schema.raw_schema
    leaked = [
        node
        for node in _schemas(document)
        if node.get("type") in ("number", "integer") and {"gt", "ge", "lt", "le"} & set(node)
    ]
    assert not leaked, leaked
