"""The access boundary as a table: every route × every role × the caller's own
organisation's object and another organisation's, with the status each must get.

The table is written from service.md, not from ``app/identity/policy.py``:

* platform admin: creates organisations and keys, sets a dataset's cap, reads every
  ledger and audit event; never reads private text, and never downloads a released
  corpus (that is for the owner and the grantees);
* privacy auditor: reads what the admin reads, changes nothing;
* data owner: uploads corpora, submits and cancels jobs, releases them to named client
  organisations, within its own organisation only;
* client: lists and downloads the releases granted to it, nothing else (it may list
  its own organisation's key metadata);
* anonymous callers and revoked keys: 401 on every ``/v1`` route.

Where service.md is silent the table follows the service's stated operational choices
(the admin may also cancel jobs, delete datasets and upload public vocabularies).
Another organisation's object is a 404, so it cannot be told apart from a missing one.

The route list comes from the app itself: a route added without a row here fails
:func:`test_every_route_has_exactly_one_row`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute, iter_route_contexts
from fastapi.testclient import TestClient
from starlette.routing import BaseRoute, Mount

from app.db import Database
from app.identity.policy import RULES, Action
from tests.proof.conftest import PROBLEM_JSON
from tests.proof.scene import Call, Scene
from tests.service import factories
from tests.service.factories import Caller, World

ACCOUNT_ROLES = ("admin", "auditor", "owner", "client")
ROLES = (*ACCOUNT_ROLES, "anonymous", "revoked")
SCOPES = ("own", "other")
API = "/v1/"


def _dataset(scene: Scene, scope: str) -> Call:
    return Call({"dataset_id": scene.dataset(scope)})


def _job(scene: Scene, scope: str) -> Call:
    return Call({"job_id": scene.job(scope)})


def _release(scene: Scene, scope: str) -> Call:
    return Call({"release_id": scene.release(scope)})


def _none(scene: Scene, scope: str) -> Call:
    return Call()


def _upload_form(scene: Scene, scope: str) -> Call:
    form = {"name": "notes", "text_column": "text", "label_column": "label"}
    form |= {"labels": "cardio,ortho", "epsilon_cap": "5"}
    files = {"file": ("n.csv", factories.csv_bytes(factories.ROWS))}
    return Call(form={"data": form, "files": files})


_CSV = {"format": "csv"}


def _open_upload(scene: Scene, scope: str) -> str:
    form = {"name": "notes", "text_column": "text", "label_column": "label", "format": "csv"}
    form |= {"labels": "cardio,ortho", "epsilon_cap": "5"}
    response = scene.client.post(
        "/v1/datasets/uploads", headers=scene.owner(scope).headers, data=form
    )
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def _chunk(scene: Scene, scope: str) -> Call:
    content = factories.csv_bytes(factories.ROWS)
    return Call(
        {"dataset_id": _open_upload(scene, scope)},
        form={"content": content, "params": {"offset": 0}},
    )


def _to_seal(scene: Scene, scope: str) -> Call:
    dataset_id = _open_upload(scene, scope)
    chunk = factories.csv_bytes(factories.ROWS)
    response = scene.client.put(
        f"/v1/datasets/{dataset_id}/upload",
        headers=scene.owner(scope).headers,
        params={"offset": 0},
        content=chunk,
    )
    assert response.status_code == 200, response.text
    return Call({"dataset_id": dataset_id})


def _vocabulary_form(scene: Scene, scope: str) -> Call:
    phrases = f"phrase {uuid.uuid4().hex}\nheart failure\n".encode()
    return Call(form={"data": {"name": "public terms"}, "files": {"file": ("v.txt", phrases)}})


def _upload_session(scene: Scene, scope: str) -> Call:
    return Call(form={"data": _upload_form(scene, scope).form["data"] | _CSV})  # type: ignore[index]


def _docs_asset(scene: Scene, scope: str) -> Call:
    return Call({"path": "swagger-ui-bundle.js"})


def _problem_page(scene: Scene, scope: str) -> Call:
    return Call({"slug": "budget-exceeded"})


def _dashboard_asset(scene: Scene, scope: str) -> Call:
    return Call({"path": "admin.css"})


def _org(scene: Scene, scope: str) -> Call:
    return Call({"organisation_id": str(scene.owner(scope).organisation_id)})


def _new_organisation(scene: Scene, scope: str) -> Call:
    return Call(json={"name": f"Clinic {uuid.uuid4().hex}", "kind": "owner"})


def _budget(scene: Scene, scope: str) -> Call:
    change = {"epsilon": float(factories.OWNER_BUDGET), "delta": 0, "reason": "matrix"}
    return Call(_org(scene, scope).ids, json=change)


def _new_key(scene: Scene, scope: str) -> Call:
    organisation = _org(scene, scope).ids["organisation_id"]
    return Call(json={"role": "owner", "organisation_id": organisation})


def _spare_key(scene: Scene, scope: str) -> Call:
    return Call({"key_id": scene.spare_key(scope)})


def _fresh_dataset(scene: Scene, scope: str) -> Call:
    return Call({"dataset_id": scene.dataset(scope, fresh=True)})


def _cap_change(scene: Scene, scope: str) -> Call:
    return Call(_dataset(scene, scope).ids, json={"epsilon_cap": 999, "reason": "matrix"})


def _job_spec(scene: Scene, scope: str) -> Call:
    return Call(_dataset(scene, scope).ids, json=factories.spec())


def _fresh_job(scene: Scene, scope: str) -> Call:
    return Call({"job_id": scene.job(scope, fresh=True)})


def _failed_job(scene: Scene, scope: str) -> Call:
    return Call({"job_id": scene.failed_job(scope)})


def _grant(scene: Scene, scope: str) -> Call:
    job_id = scene.succeeded_job(scope, fresh=True)
    grantee = str(scene.grantee(scope).organisation_id)
    return Call({"job_id": job_id}, json={"client_organisations": [grantee]})


def _csv_download(scene: Scene, scope: str) -> Call:
    return Call(_release(scene, scope).ids, params={"format": "csv"})


# Statuses for admin, auditor, owner, client, anonymous, revoked key. "a/b": for the
# own organisation's object / another organisation's; one figure: either way.
Row = tuple[str, str, str, Callable[[Scene, str], Call]]
MATRIX: tuple[Row, ...] = (
    ("GET", "/healthz", "200 200 200 200 200 200", _none),
    ("GET", "/readyz", "200 200 200 200 200 200", _none),
    ("GET", "/metrics", "200 200 403 403 401 401", _none),
    ("GET", "/openapi.json", "200 200 200 200 200 200", _none),
    ("GET", "/docs", "200 200 200 200 200 200", _none),
    ("GET", "/docs/oauth2-redirect", "200 200 200 200 200 200", _none),
    ("GET", "/redoc", "200 200 200 200 200 200", _none),
    # The docs' own assets and the problem types' pages: public, the same for everyone.
    ("*", "/docs/static/{path}", "200 200 200 200 200 200", _docs_asset),
    ("GET", "/problems", "200 200 200 200 200 200", _none),
    ("GET", "/problems/{slug}", "200 200 200 200 200 200", _problem_page),
    ("POST", "/v1/organisations", "201 403 403 403 401 401", _new_organisation),
    ("GET", "/v1/organisations", "200 200 403 403 401 401", _none),
    ("GET", "/v1/organisations/{organisation_id}/budget", "200 200 200/404 403 401 401", _org),
    ("PATCH", "/v1/organisations/{organisation_id}/budget", "200 403 403 403 401 401", _budget),
    ("POST", "/v1/keys", "201 403 403 403 401 401", _new_key),
    ("GET", "/v1/keys", "200 200 200 200 401 401", _none),
    ("POST", "/v1/keys/{key_id}/revoke", "200 403 403 403 401 401", _spare_key),
    ("GET", "/v1/datasets", "200 200 200 403 401 401", _none),
    ("POST", "/v1/datasets", "403 403 201 403 401 401", _upload_form),
    ("POST", "/v1/datasets/uploads", "403 403 201 403 401 401", _upload_session),
    ("GET", "/v1/datasets/{dataset_id}/upload", "403 403 200/404 403 401 401", _dataset),
    ("PUT", "/v1/datasets/{dataset_id}/upload", "403 403 200/404 403 401 401", _chunk),
    ("POST", "/v1/datasets/{dataset_id}/seal", "403 403 200/404 403 401 401", _to_seal),
    ("GET", "/v1/datasets/{dataset_id}", "200 200 200/404 403 401 401", _dataset),
    ("DELETE", "/v1/datasets/{dataset_id}", "200 403 200/404 403 401 401", _fresh_dataset),
    ("PATCH", "/v1/datasets/{dataset_id}", "200 403 403 403 401 401", _cap_change),
    ("GET", "/v1/datasets/{dataset_id}/ledger", "200 200 200/404 403 401 401", _dataset),
    ("GET", "/v1/vocabularies", "200 200 200 403 401 401", _none),
    ("POST", "/v1/vocabularies", "201 403 201 403 401 401", _vocabulary_form),
    ("POST", "/v1/datasets/{dataset_id}/jobs", "403 403 202/404 403 401 401", _job_spec),
    ("GET", "/v1/datasets/{dataset_id}/jobs", "200 200 200/404 403 401 401", _dataset),
    ("GET", "/v1/jobs/{job_id}", "200 200 200/404 403 401 401", _job),
    ("POST", "/v1/jobs/{job_id}/cancel", "200 403 200/404 403 401 401", _fresh_job),
    ("POST", "/v1/jobs/{job_id}/release", "403 403 201/404 403 401 401", _grant),
    ("GET", "/v1/releases", "200 200 200 200 401 401", _none),
    ("GET", "/v1/releases/{release_id}", "200 200 200/404 200/404 401 401", _release),
    ("GET", "/v1/releases/{release_id}/report", "200 200 200/404 200/404 401 401", _release),
    ("GET", "/v1/releases/{release_id}/prompts", "200 200 200/404 200/404 401 401", _release),
    ("GET", "/v1/releases/{release_id}/download", "403 403 200/404 200/404 401 401", _csv_download),
    ("POST", "/v1/jobs/{job_id}/retry", "202 403 202/404 403 401 401", _failed_job),
    ("GET", "/v1/audit/events", "200 200 403 403 401 401", _none),
    # The dashboard is for people with a session cookie: any API key is refused (403,
    # 401 for a revoked one); without credentials a page redirects to the sign-in page,
    # a form posted without a session is 401 (the sign-in form itself: 415 without a form).
    ("*", "/admin/static/{path}", "200 200 200 200 200 200", _dashboard_asset),
    ("GET", "/admin", "403 403 403 403 303 401", _none),
    ("GET", "/admin/sign-in", "403 403 403 403 200 401", _none),
    ("POST", "/admin/sign-in", "403 403 403 403 415 401", _none),
    ("POST", "/admin/sign-out", "403 403 403 403 401 401", _none),
    ("GET", "/admin/audit", "403 403 403 403 303 401", _none),
    ("GET", "/admin/audit.csv", "403 403 403 403 303 401", _none),
    ("GET", "/admin/keys", "403 403 403 403 303 401", _none),
    ("GET", "/admin/organisations", "403 403 403 403 303 401", _none),
    ("GET", "/admin/organisations/{organisation_id}", "403 403 403 403 303 401", _org),
    ("POST", "/admin/keys/{key_id}/revoke", "403 403 403 403 401 401", _spare_key),
    ("GET", "/admin/datasets/{dataset_id}", "403 403 403 403 303 401", _dataset),
    ("GET", "/admin/releases/{release_id}/report", "403 403 403 403 303 401", _release),
    ("GET", "/admin/datasets/{dataset_id}/cap", "403 403 403 403 303 401", _dataset),
    ("POST", "/admin/datasets/{dataset_id}/cap", "403 403 403 403 401 401", _dataset),
)


def expected(statuses: str) -> dict[str, tuple[int, int]]:
    """``role -> (status for the own object, status for the other's)``."""
    figures = statuses.split()
    assert len(figures) == len(ROLES), statuses
    table = {}
    for role, figure in zip(ROLES, figures, strict=True):
        own, _, other = figure.partition("/")
        table[role] = (int(own), int(other or own))
    return table


def app_routes(routes: Sequence[BaseRoute], prefix: str = "") -> Iterator[tuple[str, str]]:
    """``(method, path)`` of every route the app serves, through included routers and
    mounts (``*`` for a mounted app whose routes cannot be listed)."""
    for context in iter_route_contexts(routes):
        route = context.original_route
        path = prefix + str(context.path_format or context.path)
        if isinstance(route, Mount):
            if route.routes:
                yield from app_routes(route.routes, path)
            else:
                yield "*", path
        elif context.methods:
            for method in sorted(set(context.methods) - {"HEAD"}):
                yield method, path
        else:
            yield "*", path


def api_routes(app: FastAPI) -> Iterator[tuple[str, APIRoute]]:
    """``(path, route)`` of every ``/v1`` endpoint."""
    for context in iter_route_contexts(app.routes):
        route = context.original_route
        path = str(context.path_format)
        if isinstance(route, APIRoute) and path.startswith(API):
            yield path, route


def test_every_route_has_exactly_one_row(app: FastAPI) -> None:
    served = set(app_routes(list(app.routes)))
    rows = [(method, path) for method, path, _, _ in MATRIX]
    assert len(rows) == len(set(rows)), "a route has two rows"
    missing = sorted(served - set(rows))
    assert not missing, f"routes without an expected status per role in MATRIX: {missing}"
    assert not sorted(set(rows) - served), "rows for routes the app does not serve"


def _allowed_actions(route: APIRoute) -> list[Action]:
    """The ``allowed(Action.X)`` checks among the route's dependencies."""
    found: list[Action] = []
    pending = [route.dependant]
    while pending:
        dependant = pending.pop()
        name = getattr(dependant.call, "__name__", "")
        if name.startswith("allowed_"):
            found.append(Action[name.removeprefix("allowed_").upper()])
        pending.extend(dependant.dependencies)
    return found


def test_every_api_route_asks_the_policy_once_and_the_rules_match_the_table(
    app: FastAPI,
) -> None:
    """The same boundary seen from the code: one policy check per route, and the roles
    the table refuses (403) are exactly those the rule of that check leaves out."""
    rows = {(method, path): statuses for method, path, statuses, _ in MATRIX}
    checked = 0
    for path, route in api_routes(app):
        actions = _allowed_actions(route)
        assert len(actions) == 1, (path, actions)
        for method in route.methods:
            table = expected(rows[method, path])
            allowed = {role for role in ACCOUNT_ROLES if table[role][0] != 403}
            assert set(RULES[actions[0]]) == allowed, (method, path, actions[0])
            checked += 1
    assert checked >= len([row for row in MATRIX if row[1].startswith(API)])


def _send(client: TestClient, method: str, path: str, call: Call, headers: dict[str, str]) -> Any:
    url = path.format(**call.ids)
    method = "GET" if method == "*" else method
    if call.form is not None:
        return client.request(method, url, headers=headers, follow_redirects=False, **call.form)
    return client.request(
        method, url, headers=headers, json=call.json, params=call.params, follow_redirects=False
    )


@pytest.mark.parametrize(
    ("method", "path", "statuses", "build"),
    MATRIX,
    ids=[f"{method} {path}" for method, path, _, _ in MATRIX],
)
def test_route_by_role_and_organisation(
    client: TestClient,
    db: Database,
    world: World,
    revoked: list[Caller],
    method: str,
    path: str,
    statuses: str,
    build: Callable[[Scene, str], Call],
) -> None:
    scene = Scene(client, db, world)
    table = expected(statuses)
    callers: dict[str, list[dict[str, str]]] = {
        role: [getattr(world, role).headers] for role in ACCOUNT_ROLES
    }
    callers["anonymous"] = [{}]
    callers["revoked"] = [caller.headers for caller in revoked]
    seen: dict[tuple[str, str], list[int]] = {}
    for scope in SCOPES:
        for role in ROLES:
            for headers in callers[role]:
                response = _send(client, method, path, build(scene, scope), headers)
                seen.setdefault((role, scope), []).append(response.status_code)
                if response.status_code >= 400 and path.startswith(API):
                    assert response.headers["content-type"] == PROBLEM_JSON
    wrong = {
        f"{role} ({scope})": (table[role][SCOPES.index(scope)], got)
        for (role, scope), got in seen.items()
        if any(status != table[role][SCOPES.index(scope)] for status in got)
    }
    assert not wrong, f"{method} {path}: role (object): (expected, got) {wrong}"


def _ids(response: Any) -> set[str]:
    body = response.json()
    return {str(item["id"]) for item in body}


def test_listings_show_the_reachable_objects_only(
    client: TestClient, db: Database, world: World
) -> None:
    """Lists are the other way an object could leak: each role sees its organisation's
    (a client: the releases granted to it), the platform roles see both."""
    scene = Scene(client, db, world)
    for scope in SCOPES:
        scene.release(scope)
        scene.spare_key(scope)
    both = {scope: scene.dataset(scope) for scope in SCOPES}
    releases = {scope: scene.release(scope) for scope in SCOPES}
    for caller in (world.admin, world.auditor):
        listed = _ids(client.get("/v1/datasets", headers=caller.headers))
        assert set(both.values()) <= listed
        listed = _ids(client.get("/v1/releases", headers=caller.headers))
        assert set(releases.values()) <= listed
    listed = _ids(client.get("/v1/datasets", headers=world.owner.headers))
    assert both["own"] in listed and both["other"] not in listed
    for caller in (world.owner, world.client):
        listed = _ids(client.get("/v1/releases", headers=caller.headers))
        assert releases["own"] in listed and releases["other"] not in listed
        keys = client.get("/v1/keys", headers=caller.headers).json()
        assert {k["organisation_id"] for k in keys} == {str(caller.organisation_id)}
    granted = client.get(f"/v1/releases/{releases['own']}", headers=world.client.headers).json()
    assert granted["grantees"] == [str(world.client.organisation_id)]
    events = client.get("/v1/audit/events", headers=world.auditor.headers).json()["events"]
    assert {e["organisation_id"] for e in events} >= {
        str(world.owner.organisation_id),
        str(world.other_owner.organisation_id),
    }
