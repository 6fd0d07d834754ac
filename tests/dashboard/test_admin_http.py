"""The dashboard over HTTP (no browser): sign-in, cookies, CSRF, who may do what, rate
limits, audit of failed sign-ins, and the figures against the API's."""

from __future__ import annotations

import csv
import io
import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import select, update

import migrations
from app.admin import sessions
from app.db import Database
from app.jobs import runner
from app.ledger import service as ledger
from app.main import create_app
from app.models import AdminSession, AuditEvent, Job, User
from tests.dashboard import factories as dash
from tests.service import factories
from tests.service.conftest import make_settings

HTML = "text/html; charset=utf-8"
KINDS = {"reserve": "reserve", "commit": "commit (spent)", "release": "reservation freed"}


@pytest.fixture
def browser(app: FastAPI) -> Iterator[TestClient]:
    """A client with its own cookie jar, like one browser."""
    yield TestClient(app)


@pytest.fixture
def admin(db: Database, browser: TestClient) -> TestClient:
    dash.person(db, "ada", "admin")
    assert dash.sign_in(browser, "ada").status_code == 303
    return browser


@pytest.fixture
def auditor(db: Database, app: FastAPI) -> TestClient:
    return dash.signed_in(app, db, "audrey", "auditor")


@pytest.fixture
def seeded(client: TestClient, db: Database, world: factories.World) -> dash.Seeded:
    return dash.seed(client, db, world)


def main_pages(seeded: dash.Seeded) -> tuple[str, ...]:
    """The overview, a dataset's page, the audit log and the keys."""
    return ("/admin", f"/admin/datasets/{seeded.cardiology}", "/admin/audit", "/admin/keys")


def _events(db: Database, kind: str) -> list[AuditEvent]:
    with db.session() as session:
        query = select(AuditEvent).where(AuditEvent.kind == kind).order_by(AuditEvent.id)
        return list(session.scalars(query))


def _cell(text: str) -> str:
    """A cell's text, or the exact value of the one figure in it (``data-exact``)."""
    exact = re.fullmatch(
        r'\s*<span class="fig" title="[^"]*" data-exact="([^"]*)">[^<]*</span>\s*', text
    )
    return exact.group(1) if exact else re.sub(r"<[^>]+>", "", text).strip()


def _fields(html: str, row_attribute: str) -> dict[str, dict[str, str]]:
    """``{row id: {data-field: text}}`` of the table rows marked ``row_attribute`` (a
    figure's exact value, as the API has it, where the cell is one figure)."""
    rows: dict[str, dict[str, str]] = {}
    pattern = rf'<tr[^>]*{row_attribute}="([^"]+)"[^>]*>(.*?)</tr>'
    for row_id, body in re.findall(pattern, html, flags=re.S):
        cells = re.findall(r'data-field="([a-z_]+)"[^>]*>(.*?)</t[dh]>', body, flags=re.S)
        rows[row_id] = {name: _cell(text) for name, text in cells}
    return rows


def _text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", html))


# -- signing in and out -------------------------------------------------------------------


def test_sign_in_sets_a_strict_http_only_cookie_and_is_audited(
    db: Database, browser: TestClient
) -> None:
    user_id = dash.person(db, "ada", "admin")
    form = browser.get("/admin/sign-in")
    assert form.headers["content-type"] == HTML
    pre = form.headers["set-cookie"]
    assert "HttpOnly" in pre and "SameSite=strict" in pre and "Path=/admin" in pre
    response = dash.sign_in(browser, "ada", next_page="/admin/audit")
    assert response.status_code == 303
    assert response.headers["location"] == "/admin/audit"
    cookie = next(c for c in response.headers.get_list("set-cookie") if "keyseed_admin=" in c)
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/admin" in cookie
    assert "Secure" not in cookie  # plain http: a Secure cookie would never come back
    token = browser.cookies.get("keyseed_admin")
    with db.session() as session:
        stored = session.scalar(select(AdminSession))
    assert stored is not None and stored.token_hash == sessions.hash_token(token or "")
    assert token not in stored.token_hash  # only the hash is stored
    page = browser.get("/admin")
    assert page.status_code == 200 and "Privacy budget by dataset" in page.text
    assert 'id="me-name">ada<' in page.text
    [event] = _events(db, "user.signed_in")
    assert event.actor == f"user:{user_id}" and event.details == {"address": "testclient"}


def test_the_cookie_is_secure_over_https_or_when_configured(
    db: Database, app: FastAPI, database_url: str, tmp_path: Path
) -> None:
    dash.person(db, "ada", "admin")
    over_https = TestClient(app, base_url="https://testserver")
    response = dash.sign_in(over_https, "ada")
    cookie = next(c for c in response.headers.get_list("set-cookie") if "keyseed_admin=" in c)
    assert "Secure" in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie

    always = create_app(make_settings(database_url, tmp_path, admin_cookie_secure="always"))
    try:
        # over plain http a Secure cookie never comes back: the form's own cookie shows it
        form = TestClient(always).get("/admin/sign-in")
        assert "Secure" in form.headers["set-cookie"]
    finally:
        always.state.database.dispose()


def test_a_browser_without_a_session_is_sent_to_the_sign_in_form(
    browser: TestClient, world: factories.World, client: TestClient
) -> None:
    dataset_id = factories.dataset(client, world.owner)
    response = browser.get("/admin/audit?kind=key.created", follow_redirects=False)
    assert response.status_code == 303
    expected = "/admin/sign-in?next=%2Fadmin%2Faudit%3Fkind%3Dkey.created"
    assert response.headers["location"] == expected
    posted = browser.post(
        f"/admin/datasets/{dataset_id}/cap", data={"epsilon_cap": "9", "reason": "more"}
    )
    assert posted.status_code == 401 and posted.headers["content-type"] == HTML
    assert "Sign in" in posted.text


def test_sign_in_never_redirects_out_of_the_dashboard(db: Database, browser: TestClient) -> None:
    dash.person(db, "ada", "admin")
    for target in ("https://evil.example/admin", "//evil.example/admin", "/v1/datasets", "/\\x"):
        response = dash.sign_in(browser, "ada", next_page=target)
        assert response.headers["location"] == "/admin", target
        browser.cookies.clear()


def test_sign_out_ends_the_session_for_good(db: Database, admin: TestClient) -> None:
    old_cookie = admin.cookies.get("keyseed_admin")
    assert old_cookie is not None
    page = admin.get("/admin")
    response = admin.post(
        "/admin/sign-out", data={"csrf_token": dash.csrf_token(page.text)}, follow_redirects=False
    )
    assert response.status_code == 303
    assert response.headers["location"] == "/admin/sign-in?signed_out=true"
    assert 'keyseed_admin=""' in response.headers["set-cookie"]  # the cookie is cleared
    with db.session() as session:
        record = session.scalar(select(AdminSession))
    assert record is not None and record.ended_at is not None
    assert len(_events(db, "user.signed_out")) == 1

    replayed = TestClient(admin.app)
    replayed.cookies.set("keyseed_admin", old_cookie, path="/admin")
    again = replayed.get("/admin", follow_redirects=False)
    assert again.status_code == 303 and again.headers["location"].startswith("/admin/sign-in")


def test_expired_and_idle_sessions_end(db: Database, admin: TestClient) -> None:
    assert admin.get("/admin", follow_redirects=False).status_code == 200
    past = datetime.now(UTC) - timedelta(minutes=1)
    with db.transaction() as session:
        session.execute(update(AdminSession).values(expires_at=past))
    assert admin.get("/admin", follow_redirects=False).status_code == 303
    with db.transaction() as session:
        session.execute(
            update(AdminSession).values(
                expires_at=past + timedelta(hours=8),
                last_seen_at=past - sessions.IDLE_TIMEOUT,
            )
        )
    assert admin.get("/admin", follow_redirects=False).status_code == 303


# -- API keys -----------------------------------------------------------------------------


def test_api_keys_never_reach_the_dashboard(
    client: TestClient, world: factories.World, db: Database
) -> None:
    dataset_id = factories.dataset(client, world.owner)
    paths = ("/admin", "/admin/audit", f"/admin/datasets/{dataset_id}", "/admin/keys")
    for name, caller in world.callers().items():
        for path in paths:
            response = client.get(path, headers=caller.headers, follow_redirects=False)
            assert response.status_code == 403, (name, path)
            assert response.headers["content-type"] == "application/problem+json"
        posted = client.post(
            f"/admin/datasets/{dataset_id}/cap",
            headers=caller.headers,
            data={"epsilon_cap": "50", "reason": "a key tries"},
        )
        assert posted.status_code == 403, name
        assert posted.headers["content-type"] == "application/problem+json"
    for headers in (
        factories.auth("ks_000000000000_" + "x" * 43),
        factories.auth("nonsense"),
        {"Authorization": "Basic dXNlcjpwYXNz"},
    ):
        response = client.get("/admin", headers=headers, follow_redirects=False)
        assert response.status_code == 401
        assert response.headers["content-type"] == "application/problem+json"
    dash.person(db, "ada", "admin")
    signed_in_with_a_key = TestClient(client.app)
    assert dash.sign_in(signed_in_with_a_key, "ada").status_code == 303
    response = signed_in_with_a_key.get("/admin", headers=world.owner.headers)
    assert response.status_code == 403  # a session does not lend a key the dashboard
    cap = client.get(f"/v1/datasets/{dataset_id}", headers=world.owner.headers).json()
    assert cap["budget"]["epsilon_cap"] == 5.0


# -- CSRF ---------------------------------------------------------------------------------


def test_forged_forms_without_the_csrf_token_are_refused(
    admin: TestClient, app: FastAPI, db: Database, client: TestClient, world: factories.World
) -> None:
    dataset_id = factories.dataset(client, world.owner)
    change = {"epsilon_cap": "50", "reason": "forged"}
    missing = admin.post(f"/admin/datasets/{dataset_id}/cap", data=change)
    assert missing.status_code == 403 and "CSRF" in missing.text
    wrong = admin.post(f"/admin/datasets/{dataset_id}/cap", data={**change, "csrf_token": "x" * 43})
    assert wrong.status_code == 403

    dash.person(db, "bob", "admin")
    other = TestClient(app)
    assert dash.sign_in(other, "bob").status_code == 303
    others_token = dash.csrf_token(other.get("/admin").text)
    borrowed = admin.post(
        f"/admin/datasets/{dataset_id}/cap", data={**change, "csrf_token": others_token}
    )
    assert borrowed.status_code == 403

    token = dash.csrf_token(admin.get("/admin").text)
    cross_site = admin.post(
        f"/admin/datasets/{dataset_id}/cap",
        data={**change, "csrf_token": token},
        headers={"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"},
    )
    assert cross_site.status_code == 403
    sign_out = admin.post("/admin/sign-out", data={"next": "/"}, follow_redirects=False)
    assert sign_out.status_code == 403
    as_text = admin.post(  # <form enctype="text/plain">: not a form the dashboard reads
        "/admin/sign-out",
        content=f"csrf_token={token}",
        headers={"Content-Type": "text/plain"},
        follow_redirects=False,
    )
    assert as_text.status_code == 415
    assert admin.get("/admin", follow_redirects=False).status_code == 200  # still signed in
    keys = client.get("/v1/keys", headers=world.admin.headers).json()
    revoke = admin.post(f"/admin/keys/{keys[0]['id']}/revoke", data={"confirm": "yes"})
    assert revoke.status_code == 403

    api = client.get(f"/v1/datasets/{dataset_id}", headers=world.owner.headers).json()
    assert api["budget"]["epsilon_cap"] == 5.0
    assert client.get("/v1/keys", headers=world.admin.headers).json()[0]["revoked_at"] is None
    assert _events(db, "dataset.cap_changed") == []


def test_the_sign_in_form_needs_its_token_too(db: Database, browser: TestClient) -> None:
    dash.person(db, "ada", "admin")
    no_cookie = browser.post(
        "/admin/sign-in",
        data={"username": "ada", "password": dash.PASSWORD, "csrf_token": "x" * 43},
    )
    assert no_cookie.status_code == 403
    browser.get("/admin/sign-in")
    no_token = browser.post("/admin/sign-in", data={"username": "ada", "password": dash.PASSWORD})
    assert no_token.status_code == 403
    assert "keyseed_admin" not in {c for c in browser.cookies if c != "keyseed_admin_sign_in"}


# -- roles --------------------------------------------------------------------------------


def test_the_auditor_reads_everything_and_changes_nothing(
    auditor: TestClient, client: TestClient, world: factories.World, seeded: dash.Seeded
) -> None:
    for path in main_pages(seeded):
        page = auditor.get(path)
        assert page.status_code == 200, path
        assert '/cap"' not in page.text and "Revoke" not in page.text, path
    form = auditor.get(f"/admin/datasets/{seeded.cardiology}/cap")
    assert form.status_code == 403 and form.headers["content-type"] == HTML
    assert "the auditor role may not" in form.text

    token = dash.csrf_token(auditor.get("/admin").text)
    change = auditor.post(
        f"/admin/datasets/{seeded.cardiology}/cap",
        data={"epsilon_cap": "50", "reason": "the auditor tries", "csrf_token": token},
    )
    assert change.status_code == 403
    keys = client.get("/v1/keys", headers=world.admin.headers).json()
    revoke = auditor.post(f"/admin/keys/{keys[0]['id']}/revoke", data={"csrf_token": token})
    assert revoke.status_code == 403

    api = client.get(f"/v1/datasets/{seeded.cardiology}", headers=world.owner.headers).json()
    assert api["budget"]["epsilon_cap"] == 5.0
    keys = client.get("/v1/keys", headers=world.admin.headers).json()
    assert all(k["revoked_at"] is None for k in keys)


def test_the_admin_changes_a_cap_with_a_reason_and_revokes_a_key(
    admin: TestClient, client: TestClient, world: factories.World, db: Database, seeded: dash.Seeded
) -> None:
    form = admin.get(f"/admin/datasets/{seeded.cardiology}/cap")
    assert form.status_code == 200
    token = dash.csrf_token(form.text)
    url = f"/admin/datasets/{seeded.cardiology}/cap"

    no_reason = admin.post(url, data={"epsilon_cap": "7.5", "reason": "", "csrf_token": token})
    assert no_reason.status_code == 422 and "reason" in no_reason.text
    too_low = admin.post(url, data={"epsilon_cap": "1", "reason": "shrink", "csrf_token": token})
    assert too_low.status_code == 409 and "cannot go below" in too_low.text
    nan = admin.post(url, data={"epsilon_cap": "lots", "reason": "x y", "csrf_token": token})
    assert nan.status_code == 422

    reason = '=HYPERLINK("http://x") approved by the DPO, ticket 42'
    changed = admin.post(
        url,
        data={"epsilon_cap": "7.5", "reason": reason, "csrf_token": token},
        follow_redirects=False,
    )
    assert changed.status_code == 303
    assert changed.headers["location"] == f"/admin/datasets/{seeded.cardiology}?changed=true"
    page = admin.get(changed.headers["location"])
    assert re.search(r'data-field="epsilon_cap"><span class="fig" title="7.5"', page.text)
    assert "approved by the DPO" in page.text
    api = client.get(f"/v1/datasets/{seeded.cardiology}", headers=world.owner.headers).json()
    assert api["budget"]["epsilon_cap"] == 7.5 and api["budget"]["remaining"] == 6.0
    [event] = _events(db, "dataset.cap_changed")
    with db.session() as session:
        ada = session.scalar(select(User).where(User.username == "ada"))
    assert ada is not None and event.actor == f"user:{ada.id}"
    assert event.details == {"previous": 5.0, "epsilon_cap": 7.5, "reason": reason}

    keys = client.get("/v1/keys", headers=world.admin.headers).json()
    owner_key = next(k for k in keys if k["organisation_id"] == str(world.owner.organisation_id))
    listing = admin.get("/admin/keys")
    assert f'data-key-prefix="{owner_key["prefix"]}"' in listing.text
    revoked = admin.post(
        f"/admin/keys/{owner_key['id']}/revoke",
        data={"csrf_token": token},
        follow_redirects=False,
    )
    assert revoked.status_code == 303
    assert admin.get(revoked.headers["location"]).text.count("revoked <time") == 1
    assert client.get("/v1/datasets", headers=world.owner.headers).status_code == 401
    [key_event] = _events(db, "key.revoked")
    assert key_event.actor == f"user:{ada.id}"


# -- failed sign-ins ----------------------------------------------------------------------


def test_failed_sign_ins_are_audited_without_the_password_and_throttled(
    db: Database, browser: TestClient
) -> None:
    user_id = dash.person(db, "ada", "admin")
    wrong = "Tr0ub4dor&3-not-it"
    for _ in range(sessions.NAME_LIMIT):
        response = dash.sign_in(browser, "ada", wrong)
        assert response.status_code == 401
        assert "The name or the password is wrong." in response.text
    throttled = dash.sign_in(browser, "ada")  # the right password, from the same address
    assert throttled.status_code == 429 and int(throttled.headers["retry-after"]) > 0
    assert "Too many failed sign-ins" in throttled.text
    assert "keyseed_admin" not in browser.cookies
    unknown = dash.sign_in(browser, "nobody-" + wrong, wrong)
    assert unknown.status_code == 401

    failed = _events(db, "user.sign_in_failed")
    assert [e.details["reason"] for e in failed] == [
        *["bad_credentials"] * sessions.NAME_LIMIT,
        "rate_limited",
        "bad_credentials",
    ]
    assert all(e.target_id == str(user_id) for e in failed[:-1])
    assert failed[-1].target_id is None  # an unknown name is not recorded
    assert all(e.details["address"] == "testclient" for e in failed)
    assert all(e.actor == "system:dashboard" for e in failed)
    written = repr([(e.details, e.target_id, e.actor) for e in failed])
    assert wrong not in written and dash.PASSWORD not in written and "nobody" not in written


def test_failed_sign_ins_are_rate_limited_per_address_across_processes(
    db: Database, app: FastAPI, database_url: str, tmp_path: Path
) -> None:
    dash.person(db, "ada", "admin")
    first = TestClient(app)
    for i in range(sessions.ADDRESS_LIMIT):
        assert dash.sign_in(first, f"guess-{i}", "wrong password").status_code == 401
    other_process = create_app(make_settings(database_url, tmp_path))
    try:
        refused = dash.sign_in(TestClient(other_process), "ada")
        assert refused.status_code == 429
        assert "Too many failed sign-ins" in refused.text
    finally:
        other_process.state.database.dispose()
    reasons = [e.details["reason"] for e in _events(db, "user.sign_in_failed")]
    assert reasons[-1] == "rate_limited"
    assert len(reasons) == sessions.ADDRESS_LIMIT + 1


def test_a_successful_sign_in_clears_the_failures_of_its_name(
    db: Database, browser: TestClient
) -> None:
    user_id = dash.person(db, "ada", "admin")
    for _ in range(sessions.NAME_LIMIT - 1):
        assert dash.sign_in(browser, "ada", "wrong password").status_code == 401
    assert dash.sign_in(browser, "ada").status_code == 303
    for _ in range(sessions.NAME_LIMIT - 1):  # the count started again
        assert dash.sign_in(TestClient(browser.app), "ada", "wrong password").status_code == 401
    with db.session() as session:
        user = session.get(User, user_id)
    assert user is not None and user.last_sign_in_at is not None


# -- pages and figures --------------------------------------------------------------------


def test_every_figure_is_the_apis(
    admin: TestClient, client: TestClient, world: factories.World, seeded: dash.Seeded
) -> None:
    overview = admin.get("/admin")
    rows = _fields(overview.text, "data-dataset-id")
    listed = client.get("/v1/datasets", headers=world.admin.headers).json()
    api = {d["id"]: d["budget"] for d in listed}
    assert set(rows) == set(api) and len(rows) == 4
    for dataset_id, figures in api.items():
        for name in ("epsilon_cap", "spent", "reserved", "remaining"):
            assert float(rows[dataset_id][name]) == figures[name], (dataset_id, name)
    assert api[seeded.cardiology] | {"accountant": ""} == {
        "epsilon_cap": 5.0,
        "delta_cap": 0.0,
        "spent": 1.0,
        "reserved": 0.5,
        "remaining": 3.5,
        "accountant": "",
    }
    # only the orthopaedics dataset is near its cap, and the page says why
    near = re.findall(r'<tr class="near-cap" data-dataset-id="([^"]+)"', overview.text)
    assert near == [seeded.orthopaedics]
    assert "Near its cap: 4.8 % of the ε cap is left (under 10 %)" in overview.text
    # sorted by the share left, nearest the cap first; and by name on request
    assert next(iter(rows)) == seeded.orthopaedics
    by_name = list(_fields(admin.get("/admin?sort=name&order=asc").text, "data-dataset-id"))
    assert by_name == [seeded.cardiology, seeded.discharge, seeded.oncology, seeded.orthopaedics]
    by_spent = list(_fields(admin.get("/admin?sort=spent&order=desc").text, "data-dataset-id"))
    assert by_spent[0] == seeded.discharge

    for dataset_id in (seeded.cardiology, seeded.oncology, seeded.discharge):
        page = admin.get(f"/admin/datasets/{dataset_id}").text
        ledger = client.get(f"/v1/datasets/{dataset_id}/ledger", headers=world.auditor.headers)
        body = ledger.json()
        budget = dict(
            re.findall(r'<dd data-field="([a-z_]+)">\s*<span [^>]*data-exact="([^"]*)"', page)
        )
        for name in ("epsilon_cap", "spent", "reserved", "remaining", "delta_cap"):
            assert float(budget[name]) == body["budget"][name], (dataset_id, name)
        accountant = re.search(r'id="accountant" data-field="accountant">([^<]*)<', page)
        assert f'data-accountant="{body["budget"]["accountant"]}"' in page  # the footer's
        assert accountant is not None and accountant.group(1) == body["budget"]["accountant"]
        entries = _fields(page, "data-entry-id")
        assert list(entries) == [str(e["id"]) for e in body["entries"]]
        for entry in body["entries"]:
            shown = entries[str(entry["id"])]
            assert shown["kind"] == KINDS[entry["kind"]]  # the API's kind, in words
            assert float(shown["epsilon"]) == entry["epsilon"]
        kinds = re.findall(r'data-field="kind" data-value="([a-z]+)"', page)
        assert kinds == [e["kind"] for e in body["entries"]]
        spent = re.search(r'data-final-spent="([^"]+)"', page)
        assert spent is not None and float(spent.group(1)) == body["budget"]["spent"]

    cardiology = admin.get(f"/admin/datasets/{seeded.cardiology}").text
    ledger_jobs = _fields(cardiology, "data-ledger-job")
    assert sorted(j["budget_state"] for j in ledger_jobs.values()) == ["reserved", "spent"]
    assert sorted(j["state"] for j in _fields(cardiology, "data-job-id").values()) == [
        "queued",
        "succeeded",
    ]
    assert "vocabulary 0.5 · kde 0.5" in _text(cardiology)
    releases = _fields(cardiology, "data-release-id")
    assert releases[seeded.release]["grantees"] == "Research Lab, Vendor Inc"
    assert releases[seeded.release]["downloads"] == "2"
    assert cardiology.count('<td data-field="organisation">') == 2
    discharge = admin.get(f"/admin/datasets/{seeded.discharge}").text
    assert 'value="0.4"' in discharge and "embed" in discharge  # the running job's progress
    oncology = _fields(admin.get(f"/admin/datasets/{seeded.oncology}").text, "data-ledger-job")
    assert [(j["budget_state"], j["state"]) for j in oncology.values()] == [
        ("reservation freed", "cancelled")
    ]


def test_the_audit_log_filters_pages_and_exports_csv(
    admin: TestClient, client: TestClient, world: factories.World, seeded: dash.Seeded
) -> None:
    for i in range(60):
        client.post(
            "/v1/organisations",
            json={"name": f"clinic {i}", "kind": "client"},
            headers=world.admin.headers,
        )
    page = admin.get("/admin/audit")
    assert page.status_code == 200
    first = _fields(page.text, "data-event-id")
    assert len(first) == 50
    older = re.search(r'href="/admin/audit\?cursor=(\d+)" id="older"', page.text)
    assert older is not None
    second = _fields(admin.get(f"/admin/audit?cursor={older.group(1)}").text, "data-event-id")
    assert not set(first) & set(second)
    assert min(int(i) for i in first) > max(int(i) for i in second)

    owner_org = str(world.owner.organisation_id)
    params = {"organisation": owner_org, "kind": "release.downloaded"}
    filtered = _fields(admin.get("/admin/audit", params=params).text, "data-event-id")
    api = client.get(
        "/v1/audit/events",
        params={"organisation_id": owner_org, "kind": "release.downloaded"},
        headers=world.auditor.headers,
    ).json()["events"]
    assert list(filtered) == [str(e["id"]) for e in api] and len(api) == 2
    today = datetime.now(UTC).date().isoformat()
    dated = admin.get("/admin/audit", params={**params, "from": today, "to": today})
    assert list(_fields(dated.text, "data-event-id")) == list(filtered)
    tomorrow = (datetime.now(UTC) + timedelta(days=1)).date().isoformat()
    none = admin.get("/admin/audit", params={**params, "from": tomorrow})
    assert _fields(none.text, "data-event-id") == {} and "No event matches" in none.text
    actor = f"key:{uuid.uuid4()}"
    assert _fields(admin.get("/admin/audit", params={"actor": actor}).text, "data-event-id") == {}
    bad = admin.get("/admin/audit", params={"from": "23/11/2026", "kind": "nope"})
    assert bad.status_code == 422 and "a date reads YYYY-MM-DD" in bad.text

    export = admin.get("/admin/audit.csv", params=params)
    assert export.status_code == 200
    assert export.headers["content-type"] == "text/csv; charset=utf-8"
    assert export.headers["content-disposition"].startswith('attachment; filename="keyseed-audit-')
    rows = list(csv.DictReader(io.StringIO(export.text)))
    assert [r["id"] for r in rows] == [str(e["id"]) for e in api]
    assert {r["kind"] for r in rows} == {"release.downloaded"}
    assert {r["organisation"] for r in rows} == {"St Mary's Hospital"}
    assert {r["actor_organisation"] for r in rows} == {"Research Lab", "Vendor Inc"}
    assert all(r["target_id"] == seeded.release for r in rows)
    everything = list(csv.DictReader(io.StringIO(admin.get("/admin/audit.csv").text)))
    total = client.get("/v1/audit/events?limit=500", headers=world.admin.headers).json()
    assert [r["id"] for r in everything] == [str(e["id"]) for e in total["events"]]


def test_csv_cells_that_look_like_formulas_are_escaped(
    admin: TestClient, client: TestClient, world: factories.World
) -> None:
    dataset_id = factories.dataset(client, world.owner)
    token = dash.csrf_token(admin.get("/admin").text)
    reason = "=cmd|' /C calc'!A0"
    admin.post(
        f"/admin/datasets/{dataset_id}/cap",
        data={"epsilon_cap": "6", "reason": reason, "csrf_token": token},
    )
    export = admin.get("/admin/audit.csv?kind=dataset.cap_changed")
    rows = list(csv.DictReader(io.StringIO(export.text)))
    assert len(rows) == 1 and reason in rows[0]["details"]
    assert not any(value.startswith("=") for value in rows[0].values())


def test_pages_carry_security_headers_and_load_nothing_from_elsewhere(
    admin: TestClient, seeded: dash.Seeded
) -> None:
    for path in main_pages(seeded):
        page = admin.get(path)
        assert "script-src 'self'" in page.headers["content-security-policy"]
        assert page.headers["x-frame-options"] == "DENY"
        assert page.headers["cache-control"] == "no-store"
        assert not re.search(r'(src|href)="(https?:)?//', page.text), path
        assert "<script>" not in page.text and "style=" not in page.text
    for asset, media in (("admin.css", "text/css"), ("admin.js", "text/javascript")):
        response = admin.get(f"/admin/static/{asset}")
        assert response.status_code == 200 and response.headers["content-type"].startswith(media)
    assert admin.get(f"/admin/datasets/{uuid.uuid4()}").status_code == 404


def test_the_dashboard_on_the_embedded_sqlite_database(tmp_path: Path) -> None:
    settings = factories.embedded_settings(tmp_path)
    migrations.upgrade(settings.sqlalchemy_url)
    embedded = create_app(settings)
    try:
        database: Database = embedded.state.database
        world = factories.build_world(database)
        api = TestClient(embedded)
        seeded = dash.seed(api, database, world)
        dash.person(database, "ada", "admin")
        browser = TestClient(embedded)
        assert dash.sign_in(browser, "ada", "not the password").status_code == 401
        assert dash.sign_in(browser, "ada").status_code == 303
        rows = _fields(browser.get("/admin").text, "data-dataset-id")
        for dataset in api.get("/v1/datasets", headers=world.admin.headers).json():
            assert float(rows[dataset["id"]]["remaining"]) == dataset["budget"]["remaining"]
        page = browser.get(f"/admin/datasets/{seeded.cardiology}")
        assert page.status_code == 200 and 'id="epsilon-chart"' in page.text
        changed = browser.post(
            f"/admin/datasets/{seeded.cardiology}/cap",
            data={
                "epsilon_cap": "8",
                "reason": "embedded",
                "csrf_token": dash.csrf_token(page.text),
            },
            follow_redirects=False,
        )
        assert changed.status_code == 303
        budget = api.get(f"/v1/datasets/{seeded.cardiology}", headers=world.owner.headers).json()
        assert budget["budget"]["epsilon_cap"] == 8.0
        failed = api.get(
            "/v1/audit/events?kind=user.sign_in_failed", headers=world.auditor.headers
        ).json()["events"]
        assert [e["details"]["reason"] for e in failed] == ["bad_credentials"]
        cookie = browser.cookies.get("keyseed_admin")
        token = dash.csrf_token(browser.get("/admin").text)
        browser.post("/admin/sign-out", data={"csrf_token": token})
        replayed = TestClient(embedded)
        replayed.cookies.set("keyseed_admin", cookie or "", path="/admin")
        assert replayed.get("/admin", follow_redirects=False).status_code == 303
    finally:
        embedded.state.database.dispose()


def test_the_dataset_page_shows_the_organisation_budget_the_cap_is_carved_from(
    admin: TestClient, client: TestClient, world: factories.World
) -> None:
    dataset_id = factories.dataset(client, world.owner, cap=4)
    factories.dataset(client, world.owner, cap=2.5)
    page = admin.get(f"/admin/datasets/{dataset_id}").text
    api = client.get(
        f"/v1/organisations/{world.owner.organisation_id}/budget", headers=world.auditor.headers
    ).json()
    shown = dict(re.findall(r'data-field="(organisation_[a-z]+)" [^>]*data-exact="([^"]*)"', page))
    assert float(shown["organisation_epsilon"]) == api["budget"]["epsilon"]
    assert float(shown["organisation_delta"]) == api["budget"]["delta"]
    assert float(shown["organisation_allocated"]) == api["allocated"]["epsilon"] == 6.5
    assert float(shown["organisation_remaining"]) == api["remaining"]["epsilon"]
    assert "its 2 datasets hold" in page


def test_the_dataset_page_lists_every_release_as_charged_and_as_made(
    admin: TestClient, client: TestClient, world: factories.World, db: Database
) -> None:
    dataset_id = factories.dataset(client, world.owner, cap=5)
    waiting = factories.job(client, world.owner, dataset_id)
    matched = factories.job(client, world.owner, dataset_id, epsilon_kde=1.0)
    differing = factories.job(client, world.owner, dataset_id)
    planned = client.get(f"/v1/datasets/{dataset_id}/ledger", headers=world.auditor.headers).json()[
        "entries"
    ][1]["events"]
    made = [
        {**e, "sensitivity": 1.5, "scale": 1.5 * e["scale"] / e["sensitivity"]} for e in planned
    ]
    with db.transaction() as session:
        runner.start_sequences(session, uuid.UUID(matched))
    with db.transaction() as session:
        job = session.get(Job, uuid.UUID(matched))
        assert job is not None
        ledger.record_report(session, job, {"events": made}, runner.WORKER)
    factories.run_job(db, matched)  # the engine's report above stands: one per job
    factories.run_job(db, differing)  # a report that names no release at all
    page = admin.get(f"/admin/datasets/{dataset_id}").text
    jobs = _fields(page, "data-ledger-job")
    assert jobs[waiting]["reconciliation"] == "no report yet"
    assert jobs[matched]["reconciliation"] == "matches the engine’s report"
    assert jobs[differing]["reconciliation"].startswith(
        "differs: kde (cardio): 1 releases planned, 0 made"
    )
    rows = re.findall(
        r'<tr data-event-job="([^"]+)" data-event-source="([a-z]+)">(.*?)</tr>', page, re.S
    )
    assert sorted((job, source) for job, source, _ in rows) == sorted(
        [(job, "charged") for job in (waiting, matched, differing) for _ in range(3)]
        + [(matched, "made")] * 3
    )
    cells = [
        {
            name: _cell(text)
            for name, text in re.findall(r'data-field="([a-z_]+)"[^>]*>(.*?)</t[dh]>', body, re.S)
        }
        for job, source, body in rows
        if (job, source) == (matched, "made")
    ]
    ortho = next(c for c in cells if c["partition"] == "ortho")
    assert ortho == {
        "source": "made",
        "mechanism": "kde",
        "partition": "ortho",
        "noise": "laplace",
        "sensitivity": "1.5 (l1)",
        "scale": ortho["scale"],
        "dimension": ortho["dimension"],
        "count": "1",
        "epsilon": ortho["epsilon"],
    }
    assert float(ortho["epsilon"]) == 1.0 and float(ortho["scale"]) == pytest.approx(1.5)


def test_the_dataset_page_shows_each_jobs_method_and_llm_costs(
    db: Database, admin: TestClient, client: TestClient, world: factories.World
) -> None:
    dataset_id = factories.dataset(client, world.owner, cap=5.0)
    job_id = factories.job(client, world.owner, dataset_id)
    costs = {"calls": 7, "prompt_tokens": 120, "completion_tokens": 45, "wall_seconds": 2.5}
    with db.transaction() as session:
        job = session.get(Job, uuid.UUID(job_id))
        assert job is not None
        job.llm_costs = costs
    page = admin.get(f"/admin/datasets/{dataset_id}")
    assert page.status_code == 200
    row = _fields(page.text, "data-job-id")[job_id]
    assert row["method"] == "dpkps"
    assert (row["llm_calls"], row["llm_tokens"], row["llm_seconds"]) == ("7", "120 / 45", "2.5")
