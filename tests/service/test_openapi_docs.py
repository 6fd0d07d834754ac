"""API docs that work offline (issue 67, item 2): Swagger UI and ReDoc served with their
assets by the app, every schema property described, an example for every request and
response body, and one stable problem ``type`` per kind of error, each a page of the app."""

from __future__ import annotations

import re
import uuid
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from fastapi.testclient import TestClient

from app import errors
from tests.service import factories

DOCS = Path(__file__).resolve().parents[2] / "docs" / "problems.md"


class _Assets(HTMLParser):
    """Every URL a page loads: script and link targets, and the bundle URLs its inline
    scripts name."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "script":
            self._in_script = True
            if found.get("src"):
                self.urls.append(str(found["src"]))
        elif tag == "link" and found.get("href"):
            self.urls.append(str(found["href"]))

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.urls += re.findall(r"https?://[^\s'\"]+", data)


@pytest.mark.parametrize(
    ("page", "needed"),
    [
        ("/docs", {"swagger-ui-bundle.js": "SwaggerUIBundle", "swagger-ui.css": ".swagger-ui"}),
        ("/redoc", {"redoc.standalone.js": "Redoc"}),
    ],
)
def test_docs_pages_load_every_asset_from_this_server(
    client: TestClient, page: str, needed: dict[str, str]
) -> None:
    response = client.get(page)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    parser = _Assets()
    parser.feed(response.text)
    assert parser.urls, "the page loads no asset"
    for url in parser.urls:
        parts = urlsplit(url)
        assert not parts.scheme and not parts.netloc, f"{page} loads {url} from another host"
    assert "fonts.googleapis" not in response.text and "cdn." not in response.text
    assert "/openapi.json" in response.text
    if page == "/docs":
        assert '"validatorUrl": null' in response.text  # no call to swagger.io's validator
    loaded = {url.rsplit("/", 1)[-1]: url for url in parser.urls}
    for name, marker in needed.items():
        asset = client.get(loaded[name])
        assert asset.status_code == 200, name
        assert len(asset.content) > 100_000, f"{name} is too small to be the real build"
        assert marker in asset.text, name
        kind = "css" if name.endswith(".css") else "javascript"
        assert kind in asset.headers["content-type"], (name, asset.headers["content-type"])
    favicon = client.get(loaded["favicon.png"])
    assert favicon.status_code == 200 and favicon.content.startswith(b"\x89PNG")


def test_the_swagger_oauth2_redirect_page_is_served(client: TestClient) -> None:
    response = client.get("/docs/oauth2-redirect")
    assert response.status_code == 200 and "oauth2" in response.text.lower()


# -- problem types ----------------------------------------------------------------------


def _problem_classes() -> list[type[errors.Problem]]:
    found: list[type[errors.Problem]] = []
    todo: list[type[errors.Problem]] = [errors.Problem]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo += cls.__subclasses__()
    return found


def test_every_error_class_has_its_own_type_of_its_status() -> None:
    classes = [c for c in _problem_classes() if c.__module__ == "app.errors"]
    assert len(classes) >= 11
    slugs = [c.type_slug for c in classes]
    assert len(set(slugs)) == len(slugs), "two error classes share a problem type"
    for cls in classes:
        kind = cls.problem_type()
        assert kind.status == cls.status, cls
        assert kind.uri == f"/problems/{cls.type_slug}"
    # Subclasses elsewhere (the dashboard's sign-in error) keep a registered type.
    for cls in _problem_classes():
        assert cls.type_slug in errors.PROBLEM_TYPES


def test_problem_types_are_unique_and_each_resolves(client: TestClient) -> None:
    uris = [t.uri for t in errors.PROBLEM_TYPES.values()]
    assert len(set(uris)) == len(uris)
    assert all(re.fullmatch(r"/problems/[a-z]+(-[a-z]+)*", uri) for uri in uris)
    for problem in errors.PROBLEM_TYPES.values():
        page = client.get(problem.uri)
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert problem.title in page.text and problem.uri in page.text
        as_json = client.get(problem.uri, headers={"Accept": "application/json"}).json()
        assert as_json["type"] == problem.uri and as_json["meaning"] == problem.meaning
    listing = client.get("/problems", headers={"Accept": "application/json"}).json()
    assert [t["type"] for t in listing] == uris
    unknown = client.get("/problems/no-such-type")
    assert unknown.status_code == 404 and unknown.json()["type"] == "/problems/not-found"


def test_every_problem_type_is_documented() -> None:
    text = DOCS.read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if "| `/" in line}
    for problem in errors.PROBLEM_TYPES.values():
        row = rows[f"`{problem.uri}`"]
        assert problem.title in row and problem.meaning in row, problem.uri
        assert f"| {problem.status or 'any other'} |" in row, problem.uri


def test_no_response_is_about_blank(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    assert "about:blank" not in str(schema)
    description = schema["info"]["description"]
    for problem in errors.PROBLEM_TYPES.values():
        assert problem.uri in description
    conflict = schema["paths"]["/v1/datasets/{dataset_id}/jobs"]["post"]["responses"]["409"]
    assert "/problems/budget-exceeded" in conflict["description"]


def _is_problem(response: Any, status: int, uri: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == errors.PROBLEM_JSON
    body: dict[str, Any] = response.json()
    assert body["type"] == uri and body["status"] == status
    assert body["title"] == errors.PROBLEM_TYPES[uri.rsplit("/", 1)[1]].title
    return body


def test_real_errors_carry_their_type(client: TestClient, world: factories.World) -> None:
    _is_problem(client.get("/v1/no-such-path"), 404, "/problems/not-found")
    _is_problem(client.get("/v1/datasets"), 401, "/problems/unauthorized")
    _is_problem(
        client.post("/v1/organisations", headers=world.client.headers, json={"name": "x"}),
        403,
        "/problems/forbidden",
    )
    missing = client.get(f"/v1/datasets/{uuid.uuid4()}", headers=world.owner.headers)
    _is_problem(missing, 404, "/problems/not-found")
    invalid = client.post(
        "/v1/organisations", headers=world.admin.headers, json={"name": "Clinic", "kind": 7}
    )
    assert _is_problem(invalid, 422, "/problems/validation-error")["field"] == "kind"
    _is_problem(client.delete("/healthz"), 405, "/problems/method-not-allowed")
    too_large = client.post(
        "/v1/organisations",
        headers={**world.admin.headers, "Content-Type": "application/json"},
        content=b" " * (client.app.state.settings.max_json_bytes + 1),  # type: ignore[attr-defined]
    )
    _is_problem(too_large, 413, "/problems/content-too-large")
    dataset_id = factories.dataset(client, world.owner, cap=1.0)
    refused = client.post(
        f"/v1/datasets/{dataset_id}/jobs",
        headers=world.owner.headers,
        json=factories.spec(epsilon_vocab=1.0, epsilon_kde=1.0),
    )
    _is_problem(refused, 409, "/problems/budget-exceeded")
    unknown_llm = client.post(
        f"/v1/datasets/{dataset_id}/jobs",
        headers=world.owner.headers,
        json=factories.spec(llm="no-such-endpoint"),
    )
    assert _is_problem(unknown_llm, 422, "/problems/unprocessable")["field"] == "llm"


# -- descriptions -----------------------------------------------------------------------


def test_every_property_of_every_schema_is_described(client: TestClient) -> None:
    """Every property of every component schema (the job specs of every method, their
    parameters, every request and response body) says what it is."""
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    missing = [
        f"{name}.{prop}"
        for name, schema in schemas.items()
        for prop, spec in (schema.get("properties") or {}).items()
        if not str(spec.get("description", "")).strip()
    ]
    assert not missing, missing
    specs = ("JobSpec", "AugPEJobSpec", "PateTutorJobSpec", "DPEDAJobSpec")
    assert all(len(schemas[name]["properties"]) >= 16 for name in specs)
    for field in ("epsilon", "delta"):
        assert "budget" in schemas["JobSpec"]["properties"][field]["description"] or (
            "δ" in schemas["JobSpec"]["properties"][field]["description"]
        )


# -- examples ---------------------------------------------------------------------------


def _resolve(document: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if ref is None:
        return schema
    found: Any = document
    for part in ref.removeprefix("#/").split("/"):
        found = found[part]
    return dict(found)


def _missing_examples(document: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    """Where ``schema`` (a body's) gives no example: itself, each branch of a union, or
    the items of an array all need one."""
    if schema.get("examples") or schema.get("example") is not None:
        return []
    branches = schema.get("oneOf") or schema.get("anyOf")
    if branches:
        return [m for branch in branches for m in _missing_examples(document, branch)]
    if "$ref" in schema:
        resolved = _resolve(document, schema)
        return [] if resolved.get("examples") else [schema["$ref"]]
    if schema.get("type") == "array" and "items" in schema:
        return _missing_examples(document, schema["items"])
    return [str(schema.get("title", schema))]


def test_every_json_body_and_response_has_an_example(client: TestClient) -> None:
    document = client.get("/openapi.json").json()
    missing: list[str] = []
    bodies = responses = 0
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            where = f"{method.upper()} {path}"
            body = operation.get("requestBody", {}).get("content", {}).get("application/json")
            if body is not None:
                bodies += 1
                if not (body.get("example") is not None or body.get("examples")):
                    missing += [
                        f"{where} request: {m}" for m in _missing_examples(document, body["schema"])
                    ]
            for status, response in operation["responses"].items():
                content = response.get("content", {}).get("application/json")
                if not status.startswith("2") or content is None:
                    continue
                responses += 1
                if not (content.get("example") is not None or content.get("examples")):
                    missing += [
                        f"{where} {status}: {m}"
                        for m in _missing_examples(document, content["schema"])
                    ]
    assert bodies >= 6 and responses >= 25
    assert not missing, missing


def test_every_example_is_valid_for_its_model() -> None:
    """An example is what the model accepts (requests: the same validation a client's body
    gets, so schemathesis's explicit phase sends valid ones) or emits (responses)."""
    from pydantic import BaseModel

    from app import errors as problem_module
    from app import health
    from app.datasets import schemas as datasets
    from app.identity import schemas as identity
    from app.jobs import schemas as jobs
    from app.ledger import schemas as ledger
    from app.releases import report
    from app.releases import schemas as releases
    from app.vocabularies import schemas as vocabularies

    checked = 0
    for module in (jobs, datasets, identity, ledger, releases, report, vocabularies, health):
        for model in vars(module).values():
            if not (isinstance(model, type) and issubclass(model, BaseModel)):
                continue
            extra = model.model_config.get("json_schema_extra")
            examples = extra.get("examples") if isinstance(extra, dict) else None
            for example in examples if isinstance(examples, list) else []:
                model.model_validate(example)
                checked += 1
    for example in problem_module.ProblemDetail.model_json_schema()["examples"]:
        problem_module.ProblemDetail.model_validate(example)
    spec = jobs.JobSpec.model_json_schema()["examples"][0]
    assert isinstance(jobs.JOB_SPEC.validate_python(spec), jobs.JobSpec)
    assert checked >= 20


def test_job_spec_examples_are_accepted_by_the_api(
    client: TestClient, world: factories.World
) -> None:
    """Every job spec example (one per method) passes the API's own checks: a dry run
    plans it."""
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    dataset_id = factories.dataset(client, world.owner, cap=10.0, delta_cap="1e-5")
    for name in ("JobSpec", "AugPEJobSpec", "PateTutorJobSpec", "DPEDAJobSpec"):
        for example in schemas[name]["examples"]:
            planned = client.post(
                f"/v1/datasets/{dataset_id}/jobs",
                params={"dry_run": "true"},
                headers=world.owner.headers,
                json=example,
            )
            assert planned.status_code == 200, (name, planned.text)
            assert planned.json()["dry_run"] is True
