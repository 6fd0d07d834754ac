"""The dashboard in a real browser: Debian's Chromium, headless, driven by Playwright.

The app runs under uvicorn in a background thread against the tests' database; the
data is made through the API and the worker-side functions (tests/dashboard/factories).
A privacy officer signs in, reads the overview, opens a dataset and finds the API's
figures, filters and exports the audit log, changes a cap (admin) or is refused (auditor),
and signs out, after which the old cookie is worthless.

Screenshots of the overview and a dataset page go to ``artifacts/``; the overview is also
written to ``docs/dashboard.png`` for the README. Skipped when ``/usr/bin/chromium`` is
absent (``apt-get install chromium``) or the ``playwright`` package is not installed;
``playwright install`` is never needed (the Python package carries its driver).
"""

from __future__ import annotations

import csv
import io
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient

from app.config import Settings
from app.db import Database
from app.main import create_app
from tests.dashboard import factories as dash
from tests.service import factories
from tests.service.conftest import DATA_KEY

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "artifacts"
README_SCREENSHOT = REPO / "docs" / "dashboard.png"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TIMEOUT_MS = 30_000


@pytest.fixture(scope="module")
def live_server(settings: Settings) -> Iterator[str]:
    """The real app under uvicorn, on a free port of 127.0.0.1, for this module."""
    application = create_app(settings)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(application, log_config=None, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        listener.close()
        application.state.database.dispose()


@pytest.fixture(scope="module")
def playwright() -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.skip(
            f"Chromium is not installed at {CHROMIUM} (apt-get install -y chromium); "
            "skipping the browser tests"
        )
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="the playwright package is not installed (pip install)"
    )
    with sync_api.sync_playwright() as driver:
        yield driver


@pytest.fixture
def browser(playwright: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable]:
    """``browser()``: a new headless Chromium with a fresh profile; its first page."""
    contexts: list[Any] = []

    def launch() -> Any:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")),
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 800},
            device_scale_factor=1,
            locale="en-GB",
            timezone_id="UTC",
            accept_downloads=True,
        )
        context.set_default_timeout(TIMEOUT_MS)
        contexts.append(context)
        return context.pages[0] if context.pages else context.new_page()

    yield launch
    for context in contexts:
        context.close()


@pytest.fixture
def seeded(
    client: TestClient, db: Database, world: factories.World, database_url: str
) -> dash.Seeded:
    """The platform's data, an admin made as operators make one (``keyseed admin
    create-user``), and an auditor."""
    environment = {
        **os.environ,
        "DATABASE_URL": database_url,
        "KEYSEED_DATA_KEY": DATA_KEY,
        "KEYSEED_ADMIN_PASSWORD": dash.PASSWORD,
    }
    environment.pop("KEYSEED_DATABASE_URL", None)
    command = ["admin", "create-user", "--username", "ada", "--role", "admin"]
    created = subprocess.run(
        [sys.executable, "-m", "app.cli", *command],
        cwd=REPO,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert created.returncode == 0, created.stderr
    dash.person(db, "audrey", "auditor")
    return dash.seed(client, db, world)


def expect(subject: Any) -> Any:
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(subject)


def api(live_server: str, caller: factories.Caller, path: str, **params: Any) -> Any:
    response = httpx.get(f"{live_server}{path}", headers=caller.headers, params=params, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def sign_in(page: Any, live_server: str, username: str, password: str = dash.PASSWORD) -> None:
    page.goto(f"{live_server}/admin")
    expect(page).to_have_url(re.compile(r"/admin/sign-in\?next="))
    page.get_by_label("Name", exact=True).fill(username)
    page.get_by_label("Password", exact=True).fill(password)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Privacy budget by dataset")).to_be_visible()


KINDS = {"reserve": "reserve", "commit": "commit (spent)", "release": "reservation freed"}


def signed_in(browser: Callable, live_server: str, username: str) -> Any:
    """A new browser's page, signed in as ``username``."""
    page = browser()
    sign_in(page, live_server, username)
    return page


def exact(element: Any) -> str:
    """The exact value of the figure in ``element`` (its ``data-exact``, also its hover
    ``title``), else the element's text."""
    figure = element.locator(".fig")
    if figure.count() == 1:
        value = figure.get_attribute("data-exact")
        assert figure.get_attribute("title") == value
        return str(value)
    return str(element.inner_text()).strip()


def cells(row: Any) -> dict[str, str]:
    values = {}
    for cell in row.locator("[data-field]").all():
        values[cell.get_attribute("data-field")] = exact(cell)
    return values


def screenshot(page: Any, name: str, **options: Any) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path), **options)
    return path


def test_sign_in_read_the_overview_and_a_dataset_as_the_api_has_them(
    browser: Callable, live_server: str, seeded: dash.Seeded, world: factories.World
) -> None:
    page = browser()
    page.goto(f"{live_server}/admin/sign-in")
    page.get_by_label("Name", exact=True).fill("ada")
    page.get_by_label("Password", exact=True).fill("not the password")
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("#sign-in-error")).to_have_text("The name or the password is wrong.")
    sign_in(page, live_server, "ada")

    datasets = {d["id"]: d for d in api(live_server, world.admin, "/v1/datasets")}
    rows = page.locator("#datasets tbody tr")
    expect(rows).to_have_count(4)
    for row in rows.all():
        dataset_id = row.get_attribute("data-dataset-id")
        shown, figures = cells(row), datasets[dataset_id]["budget"]
        for name in ("epsilon_cap", "spent", "reserved", "remaining"):
            assert float(shown[name]) == figures[name], (datasets[dataset_id]["name"], name)
    near = page.locator("tr.near-cap")
    expect(near).to_have_count(1)
    expect(near.locator("th")).to_have_text("Orthopaedics 2024")
    expect(near).to_contain_text("Near its cap: 4.8 % of the ε cap is left (under 10 %)")
    expect(near).to_contain_text("General Hospital")
    screenshot(page, "dashboard-overview.png", full_page=True)
    README_SCREENSHOT.parent.mkdir(exist_ok=True)
    page.screenshot(path=str(README_SCREENSHOT))

    page.get_by_role("link", name="Dataset", exact=True).click()
    expect(page).to_have_url(re.compile(r"sort=name&order=asc"))
    expect(page.locator("#datasets tbody th")).to_have_text(
        ["Cardiology notes", "Discharge summaries", "Oncology pilot", "Orthopaedics 2024"]
    )
    page.get_by_role("link", name="Dataset", exact=True).click()  # again: descending
    expect(page).to_have_url(re.compile(r"sort=name&order=desc"))
    expect(page.locator("#datasets tbody th").first).to_have_text("Orthopaedics 2024")

    page.get_by_role("link", name="Cardiology notes").click()
    expect(page.get_by_role("heading", name="Cardiology notes", exact=True)).to_be_visible()
    ledger = api(live_server, world.auditor, f"/v1/datasets/{seeded.cardiology}/ledger")
    for name in ("epsilon_cap", "spent", "reserved", "remaining", "delta_cap"):
        figure = exact(page.locator(f'#budget dd[data-field="{name}"]'))
        assert float(figure) == ledger["budget"][name], name
    expect(page.locator("#accountant")).to_have_text(ledger["budget"]["accountant"])
    page.get_by_text("ledger entries (as").click()  # open the <details>
    entries = page.locator("#ledger-entries tbody tr")
    expect(entries).to_have_count(len(ledger["entries"]))
    for row, entry in zip(entries.all(), ledger["entries"], strict=True):
        assert row.get_attribute("data-entry-id") == str(entry["id"])
        shown = cells(row)
        assert shown["kind"] == KINDS[entry["kind"]] and float(shown["epsilon"]) == entry["epsilon"]
    by_job = page.locator("#ledger-jobs tbody tr")
    expect(by_job).to_have_count(2)
    expect(by_job.filter(has_text="spent")).to_contain_text("vocabulary 0.5 · kde 0.5")
    expect(by_job.filter(has_text="spent")).to_contain_text("owner key")
    expect(by_job.filter(has_text="reserved")).to_contain_text("vocabulary 0.25 · kde 0.25")
    chart = page.locator("#epsilon-chart")
    expect(chart).to_be_visible()
    assert float(chart.get_attribute("data-final-spent")) == ledger["budget"]["spent"]
    expect(chart.locator("polyline.spent")).to_have_count(1)
    expect(page.locator("#jobs tbody tr")).to_have_count(2)
    release = page.locator(f'#releases tr[data-release-id="{seeded.release}"]')
    expect(release.locator('[data-field="grantees"]')).to_have_text("Research Lab, Vendor Inc")
    expect(release.locator('[data-field="downloads"]')).to_have_text("2")
    expect(page.locator('#downloads td[data-field="organisation"]')).to_have_text(
        ["Vendor Inc", "Research Lab"]
    )
    screenshot(page, "dashboard-dataset.png", full_page=True)

    page.goto(f"{live_server}/admin/datasets/{seeded.discharge}")
    running = page.locator("#jobs tbody tr").filter(has_text="running")
    expect(running.locator("progress")).to_have_attribute("value", "0.4")
    expect(running).to_contain_text("embed")


def test_filter_and_export_the_audit_log(
    browser: Callable, live_server: str, seeded: dash.Seeded, world: factories.World
) -> None:
    page = signed_in(browser, live_server, "ada")
    page.get_by_role("link", name="Audit log").click()
    expect(page.get_by_role("heading", name="Audit log")).to_be_visible()
    page.get_by_label("Organisation").select_option(label="St Mary's Hospital")
    expect(page).to_have_url(re.compile(r"organisation="))  # a list choice applies at once
    page.get_by_label("Kind").select_option("release.downloaded")
    expect(page).to_have_url(re.compile(r"kind=release\.downloaded"))
    today = datetime.now(UTC).date().isoformat()
    page.get_by_label("From (UTC)").fill(today)
    page.get_by_label("To (UTC, inclusive)").fill(today)
    page.get_by_role("button", name="Filter").click()
    expect(page).to_have_url(re.compile(rf"from={today}&to={today}"))

    events = api(
        live_server,
        world.auditor,
        "/v1/audit/events",
        organisation_id=str(world.owner.organisation_id),
        kind="release.downloaded",
    )["events"]
    assert len(events) == 2
    rows = page.locator("#events tbody tr")
    expect(rows).to_have_count(2)
    assert [r.get_attribute("data-event-id") for r in rows.all()] == [str(e["id"]) for e in events]
    expect(rows.locator('[data-field="kind"]')).to_have_text(
        ["release.downloaded (released corpus downloaded by a client)"] * 2
    )
    expect(rows.first).to_contain_text("client key")

    with page.expect_download() as download_info:
        page.get_by_role("link", name="Export CSV").click()
    download = download_info.value
    assert download.suggested_filename.startswith("keyseed-audit-")
    exported = list(csv.DictReader(io.StringIO(Path(download.path()).read_text("utf-8"))))
    assert [r["id"] for r in exported] == [str(e["id"]) for e in events]
    assert {r["kind"] for r in exported} == {"release.downloaded"}
    assert {r["organisation"] for r in exported} == {"St Mary's Hospital"}
    assert {r["target_id"] for r in exported} == {seeded.release}
    assert sorted(r["actor_organisation"] for r in exported) == ["Research Lab", "Vendor Inc"]
    screenshot(page, "dashboard-audit.png", full_page=True)


def test_the_admin_changes_a_cap_and_revokes_a_key(
    browser: Callable, live_server: str, seeded: dash.Seeded, world: factories.World
) -> None:
    page = signed_in(browser, live_server, "ada")
    page.get_by_role("link", name="Orthopaedics 2024").click()
    expect(page.locator(".flag-box")).to_contain_text("Near its cap")
    page.get_by_role("link", name="Change the cap…").click()
    page.get_by_label("New ε cap").fill("3")
    page.get_by_role("button", name="Change the cap").click()
    # the reason is required: the browser keeps the form until one is given
    expect(page).to_have_url(re.compile(r"/cap$"))
    page.get_by_label("Reason").fill("Second study approved by the ethics board, ref. EB-17")
    page.get_by_role("button", name="Change the cap").click()
    expect(page.locator("#changed")).to_be_visible()
    expect(page.locator('#budget dd[data-field="epsilon_cap"]')).to_have_text("3")
    expect(page.locator('#budget dd[data-field="remaining"]')).to_have_text("2")
    expect(page.locator(".flag-box")).to_have_count(0)
    expect(page.locator("#cap-changes tbody tr")).to_contain_text(
        ["Second study approved by the ethics board, ref. EB-17"]
    )
    budget = api(live_server, world.auditor, f"/v1/datasets/{seeded.orthopaedics}")["budget"]
    assert budget["epsilon_cap"] == 3.0 and budget["remaining"] == 2.0

    page.get_by_role("link", name="Audit log").click()
    page.get_by_label("Kind").select_option("dataset.cap_changed")
    expect(page.locator("#events tbody tr")).to_have_count(1)
    event = page.locator("#events tbody tr").first
    expect(event).to_contain_text("ada (admin)")
    expect(event).to_contain_text("EB-17")
    expect(event).to_contain_text('"previous": 1.05')

    page.get_by_role("link", name="API keys").click()
    owner_key = next(
        k
        for k in api(live_server, world.admin, "/v1/keys")
        if k["organisation_id"] == str(world.other_owner.organisation_id)
    )
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name=f"Revoke key {owner_key['prefix']}").click()
    expect(page.locator("#revoked")).to_contain_text(owner_key["prefix"])
    row = page.locator(f'tr[data-key-prefix="{owner_key["prefix"]}"]')
    expect(row.locator('[data-field="state"]')).to_contain_text("revoked")
    refused = httpx.get(f"{live_server}/v1/datasets", headers=world.other_owner.headers)
    assert refused.status_code == 401


def test_the_auditor_sees_everything_and_is_refused_a_change(
    browser: Callable, live_server: str, seeded: dash.Seeded, world: factories.World
) -> None:
    page = signed_in(browser, live_server, "audrey")
    expect(page.locator(".role")).to_have_text("auditor")
    page.get_by_role("link", name="Cardiology notes").click()
    expect(page.get_by_text("Only admins change a cap")).to_be_visible()
    expect(page.get_by_role("link", name="Change the cap…")).to_have_count(0)

    response = page.goto(f"{live_server}/admin/datasets/{seeded.cardiology}/cap")
    assert response is not None and response.status == 403
    expect(page.get_by_role("heading", name="403 · Forbidden")).to_be_visible()
    expect(page.locator("#problem-detail")).to_contain_text("the auditor role may not")
    screenshot(page, "dashboard-auditor-refused.png")

    # Post the admin's form anyway, with the auditor's own valid CSRF token.
    page.goto(f"{live_server}/admin/datasets/{seeded.cardiology}")
    with page.expect_navigation() as navigation:
        page.evaluate(
            """([action, token]) => {
                const form = document.createElement("form");
                form.method = "post";
                form.action = action;
                for (const [name, value] of [["csrf_token", token], ["epsilon_cap", "50"],
                                             ["reason", "the auditor tries"]]) {
                    const input = document.createElement("input");
                    input.type = "hidden"; input.name = name; input.value = value;
                    form.append(input);
                }
                document.body.append(form);
                form.submit();
            }""",
            [
                f"/admin/datasets/{seeded.cardiology}/cap",
                page.locator('input[name="csrf_token"]').first.input_value(),
            ],
        )
    assert navigation.value.status == 403
    expect(page.locator("#problem-detail")).to_contain_text("the auditor role may not")
    budget = api(live_server, world.auditor, f"/v1/datasets/{seeded.cardiology}")["budget"]
    assert budget["epsilon_cap"] == 5.0

    page.goto(f"{live_server}/admin/keys")
    expect(page.locator("#keys tbody tr")).to_have_count(6)
    expect(page.get_by_role("button", name=re.compile("Revoke"))).to_have_count(0)


def test_sign_out_and_the_old_cookie_no_longer_works(
    browser: Callable, live_server: str, seeded: dash.Seeded
) -> None:
    page = signed_in(browser, live_server, "ada")
    [cookie] = [c for c in page.context.cookies() if c["name"] == "keyseed_admin"]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/admin"
    assert page.evaluate("document.cookie") == ""  # HttpOnly: no script reads it
    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_text("You are signed out.")).to_be_visible()
    page.goto(f"{live_server}/admin")
    expect(page).to_have_url(re.compile(r"/admin/sign-in\?next="))

    # The old cookie, put back in another browser, opens nothing.
    other = browser()
    other.context.add_cookies([cookie])
    other.goto(f"{live_server}/admin")
    expect(other).to_have_url(re.compile(r"/admin/sign-in\?next="))
    replay = httpx.get(
        f"{live_server}/admin",
        cookies={"keyseed_admin": cookie["value"]},
        follow_redirects=False,
    )
    assert replay.status_code == 303
    assert replay.headers["location"].startswith("/admin/sign-in")


def test_the_organisation_page_draws_its_spend_and_shows_exact_values_on_hover(
    browser: Callable,
    live_server: str,
    seeded: dash.Seeded,
    world: factories.World,
    client: TestClient,
    db: Database,
) -> None:
    gaussian = {"epsilon_vocab": None, "epsilon_kde": None, "epsilon": 1.0, "delta": 1e-6}
    radiology = factories.dataset(
        client, world.owner, cap=3.0, delta_cap="1e-6", name="Radiology reports"
    )
    factories.run_job(db, factories.job(client, world.owner, radiology, **gaussian))
    page = signed_in(browser, live_server, "audrey")  # an auditor reads it
    row = page.locator(f'#datasets tr[data-dataset-id="{radiology}"]')
    row.get_by_role("link", name="St Mary's Hospital").click()
    expect(page.get_by_role("heading", name="St Mary's Hospital", exact=True)).to_be_visible()
    owner = world.owner.organisation_id
    budget = api(live_server, world.auditor, f"/v1/organisations/{owner}/budget")

    spent = page.locator('.fig[data-field="spent"]')
    spent.hover()
    assert spent.get_attribute("title") == repr(budget["spent"])  # exact, as the JSON has it
    assert float(spent.get_attribute("data-exact")) == budget["spent"]
    assert len(spent.inner_text().replace(".", "").lstrip("0")) <= 3  # 3 significant figures
    expect(page.locator("#organisation-accountant")).to_have_text(budget["accountant"])
    expect(page.locator("footer")).to_contain_text(budget["accountant"])

    chart = page.locator("#organisation-chart")
    expect(chart).to_be_visible()
    box = chart.bounding_box()
    assert box is not None and box["width"] > 300 and box["height"] > 100
    assert float(chart.get_attribute("data-final-spent")) == budget["spent"]
    expect(chart.locator("polyline.spent")).to_have_count(1)
    expect(chart.locator("polyline.delta")).to_have_count(1)
    expect(chart.locator(".delta-axis text").last).to_have_text("δ")
    markers = chart.locator("circle.marker")
    expect(markers).to_have_count(4)  # the four jobs that spent
    markers.last.hover()
    title = markers.last.locator("title").text_content()
    assert title is not None and f"exact {budget['spent']!r}" in title
    assert "Radiology reports" in title

    datasets = page.locator("#organisation-datasets tbody tr")
    expect(datasets).to_have_count(4)
    listed = {d["id"]: d for d in api(live_server, world.owner, "/v1/datasets")}
    for dataset_row in datasets.all():
        shown = cells(dataset_row)
        figures = listed[dataset_row.get_attribute("data-dataset-id")]["budget"]
        for name in ("epsilon_cap", "delta_cap", "spent", "reserved", "remaining"):
            assert float(shown[name]) == figures[name], name
    screenshot(page, "dashboard-organisation.png", full_page=True)

    page.get_by_role("link", name="Radiology reports").click()
    ledger = api(live_server, world.auditor, f"/v1/datasets/{radiology}/ledger")
    figure = page.locator('#budget dd[data-field="spent"] .fig')
    expect(figure).to_have_text("1.00")
    assert figure.get_attribute("title") == repr(ledger["budget"]["spent"]) != "1.0"
    expect(page.locator("#why-parallel")).to_contain_text("cost as one")
    chart = page.locator("#epsilon-chart")
    assert chart.get_attribute("data-final-delta") == "1e-06"
    expect(chart.locator("polyline.delta")).to_have_count(1)
    screenshot(page, "dashboard-dataset-pld.png", full_page=True)
