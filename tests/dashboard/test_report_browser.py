"""The release report in a real browser (Debian's Chromium, headless, via Playwright): a
privacy officer opens it from a dataset's release list on the dashboard, and an owner
reads the API's HTML rendering with its key. Skipped like tests/dashboard/test_browser.py
when Chromium or the playwright package is missing."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from tests.dashboard import factories as dash
from tests.dashboard import test_browser as base
from tests.dashboard.test_browser import expect, screenshot, sign_in
from tests.service import factories

pytestmark = pytest.mark.browser

# the browser tests' fixtures: a live server, Chromium, the seeded platform
live_server, playwright, browser, seeded = (
    base.live_server,
    base.playwright,
    base.browser,
    base.seeded,
)

SECTIONS = (
    "What is protected",
    "The spend",
    "What was released, to whom, when",
    "What the data is good for",
    "Provenance",
    "Sample documents",
)


def _sections_visible(page: Any) -> None:
    for name in SECTIONS:
        expect(page.get_by_role("heading", name=name, exact=True)).to_be_visible()
    expect(page.locator("#protection")).to_contain_text("one row of the uploaded file")
    expect(page.locator("#protection")).to_contain_text("exact-sum")
    expect(page.locator("#classes tbody tr")).to_have_count(2)


def test_the_auditor_opens_a_release_report_from_the_dataset_page(
    browser: Callable[[], Any], live_server: str, seeded: dash.Seeded
) -> None:
    page = browser()
    sign_in(page, live_server, "audrey")
    page.goto(f"{live_server}/admin/datasets/{seeded.cardiology}")
    row = page.locator(f'#releases tr[data-release-id="{seeded.release}"]')
    row.locator('[data-field="report"]').click()
    expect(page).to_have_url(re.compile(rf"/admin/releases/{seeded.release}/report$"))
    expect(
        page.get_by_role("heading", name="Release report: Cardiology synthetic v1")
    ).to_be_visible()
    _sections_visible(page)
    expect(page.locator("#samples")).to_contain_text(
        "read by the owner organisation and the grantees only"
    )
    expect(page.locator("#dataset-spend")).to_contain_text("The dataset's cap is ε = 5")
    expect(page.locator("#released")).to_contain_text("Research Lab, Vendor Inc")
    # the page is styled by the dashboard's stylesheet (CSP: same origin only)
    background = page.locator("header.top").evaluate("e => getComputedStyle(e).backgroundColor")
    assert background == "rgb(22, 50, 79)"
    screenshot(page, "release-report.png", full_page=True)
    pdf = page.request.get(f"{live_server}/admin/releases/{seeded.release}/report?format=pdf")
    assert pdf.status == 200 and pdf.headers["content-type"] == "application/pdf"
    assert pdf.body().startswith(b"%PDF-")


def test_the_owner_reads_the_api_html_report_with_its_key(
    browser: Callable[[], Any], live_server: str, seeded: dash.Seeded, world: factories.World
) -> None:
    page = browser()
    page.set_extra_http_headers(world.owner.headers)
    page.goto(f"{live_server}/v1/releases/{seeded.release}/report?format=html")
    expect(
        page.get_by_role("heading", name="Release report: Cardiology synthetic v1")
    ).to_be_visible()
    _sections_visible(page)
    expect(page.locator("#raw-counts")).to_be_visible()  # the owner's own raw counts
    expect(page.locator("blockquote.sample")).to_have_count(2)
    expect(page.get_by_role("navigation", name="Dashboard")).to_have_count(0)
