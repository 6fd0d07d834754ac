"""The dashboard for people (issue 66, item 6) over HTTP: figures to 3 significant figures
with the exact value in ``title``/``data-exact`` (the JSON keeps it), the accountant in
force named on every page and in the footer, one word for each meaning of "release", δ on
the cumulative chart, and the organisation pages."""

from __future__ import annotations

import html
import re
import uuid

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from app.admin import formatting
from app.db import Database
from tests.dashboard import factories as dash
from tests.service import factories
from workers.privacy.accountant import EXACT_SUM, PLD_NAME

GAUSSIAN = {"epsilon_vocab": None, "epsilon_kde": None, "epsilon": 1.0, "delta": 1e-6}


@pytest.fixture
def admin(db: Database, app: FastAPI) -> TestClient:
    return dash.signed_in(app, db, "ada", "admin")


@pytest.fixture
def auditor(db: Database, app: FastAPI) -> TestClient:
    return dash.signed_in(app, db, "audrey", "auditor")


def _figure(html: str, field: str) -> tuple[str, str]:
    """(exact, shown) of the figure named ``field`` (in a ``dd``/``td`` or on the span)."""
    found = re.search(
        rf'data-field="{field}"(?:>\s*<span class="fig")? title="([^"]*)" data-exact="([^"]*)">'
        r"([^<]*)<",
        html,
    )
    assert found is not None, field
    title, exact, shown = found.groups()
    assert title == exact  # the exact value is what a person sees on hover
    return exact, shown


def _text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def _gaussian_dataset(client: TestClient, db: Database, world: factories.World) -> str:
    """A dataset whose one job (ε = 1, δ = 1e-6, Gaussian) has spent: the PLD's figures."""
    dataset_id = factories.dataset(
        client, world.owner, cap=3.0, delta_cap="1e-6", name="Radiology reports"
    )
    factories.run_job(db, factories.job(client, world.owner, dataset_id, **GAUSSIAN))
    return dataset_id


def test_figures_read_to_3_significant_figures_with_the_exact_value_kept(
    admin: TestClient, client: TestClient, world: factories.World, db: Database
) -> None:
    dataset_id = _gaussian_dataset(client, db, world)
    api = client.get(f"/v1/datasets/{dataset_id}/ledger", headers=world.auditor.headers).json()
    spent = api["budget"]["spent"]
    assert api["budget"]["accountant"] == PLD_NAME
    assert 0.99 < spent <= 1.0 and len(repr(spent)) > 5  # the JSON keeps every digit
    page = admin.get(f"/admin/datasets/{dataset_id}").text
    exact, shown = _figure(page, "spent")
    assert exact == repr(spent) and float(exact) == spent
    assert shown == formatting.significant(spent) == "1.00"
    exact, shown = _figure(page, "remaining")
    assert float(exact) == api["budget"]["remaining"] and shown == "2.00"
    exact, shown = _figure(page, "delta_cap")
    assert (exact, shown) == ("1e-06", "1 × 10⁻⁶")
    assert _figure(page, "spent_delta") == ("1e-06", "1 × 10⁻⁶")
    [entry] = [e for e in api["entries"] if e["kind"] == "commit"]
    row = re.search(rf'<tr data-entry-id="{entry["id"]}">(.*?)</tr>', page, re.S)
    assert row is not None
    assert f'data-exact="{entry["epsilon"]!r}">1.00<' in row.group(1)
    overview = admin.get("/admin").text
    assert f'title="{spent!r}" data-exact="{spent!r}">1.00<' in overview
    # no raw float of more than 3 significant figures is left in the text a person reads
    assert repr(spent) not in _text(page.split("<footer")[0]).replace(f"exact {spent!r}", "")


def test_the_footer_and_every_page_name_the_accountant_in_force(
    admin: TestClient, client: TestClient, world: factories.World, db: Database
) -> None:
    gaussian = _gaussian_dataset(client, db, world)
    pure = factories.dataset(client, world.owner, cap=2.0, name="Pure notes")
    factories.run_job(db, factories.job(client, world.owner, pure))

    page = admin.get(f"/admin/datasets/{gaussian}").text
    footer = page.split('<footer id="footer">')[1]
    assert "basic composition" not in page and "sums of ε" not in page
    assert re.findall(r'data-accountant="([^"]+)"', footer) == [PLD_NAME]
    assert "Accountant of this page&#39;s figures" in footer
    assert f'<code id="accountant" data-field="accountant">{PLD_NAME}</code>' in page
    assert "Google's dp-accounting privacy-loss distributions" in html.unescape(page)

    pure_page = admin.get(f"/admin/datasets/{pure}").text
    footer = pure_page.split('<footer id="footer">')[1]
    assert re.findall(r'data-accountant="([^"]+)"', footer) == [EXACT_SUM]
    assert "basic composition" not in pure_page

    overview = admin.get("/admin").text  # both accountants are in force there
    footer = overview.split('<footer id="footer">')[1]
    assert re.findall(r'data-accountant="([^"]+)"', footer) == sorted([EXACT_SUM, PLD_NAME])
    accountants = re.findall(r'data-field="accountant"><code>([^<]+)</code>', overview)
    assert sorted(accountants) == sorted([EXACT_SUM, PLD_NAME])

    for path in ("/admin/audit", "/admin/keys", "/admin/organisations"):
        shown = admin.get(path).text
        assert "basic composition" not in shown, path
        assert f'data-accountant="{PLD_NAME}"' in shown.split("<footer")[1], path

    organisation = admin.get(f"/admin/organisations/{world.owner.organisation_id}").text
    budget = client.get(
        f"/v1/organisations/{world.owner.organisation_id}/budget", headers=world.auditor.headers
    ).json()
    assert budget["accountant"] == PLD_NAME
    assert f'id="organisation-accountant" data-field="accountant">{PLD_NAME}<' in organisation


def test_one_word_for_each_meaning_of_release(
    admin: TestClient, client: TestClient, world: factories.World, db: Database
) -> None:
    seeded = dash.seed(client, db, world)
    cardiology = admin.get(f"/admin/datasets/{seeded.cardiology}").text
    # the DP sense: a noisy release, a measurement
    assert "Every noisy release (measurement), as charged and as the engine made it" in cardiology
    assert '<th scope="col" class="num">Measurements</th>' in cardiology
    assert "Noisy releases, charged and made" in cardiology
    # a grant: released to a client
    assert '<h2 id="releases-title">Corpora released to clients</h2>' in cardiology
    assert '<th scope="col">Released to clients by</th>' in cardiology
    # the ledger's "release" kind: a reservation freed
    oncology = admin.get(f"/admin/datasets/{seeded.oncology}").text
    kinds = re.findall(r'data-field="kind" data-value="([a-z]+)">([^<]+)<', oncology)
    assert kinds == [("reserve", "reserve"), ("release", "reservation freed")]
    state = re.search(r'data-field="budget_state" data-value="released">(.*?)</td>', oncology)
    assert state is not None and "reservation freed" in state.group(1)
    assert '<th scope="col">Reservation freed at</th>' in oncology
    # no heading or label says a bare "Released"/"Releases" any more
    for page in (cardiology, oncology):
        labels = re.findall(r"<(?:th|h2|caption)[^>]*>([^<]*)<", page)
        assert not [x for x in labels if re.fullmatch(r"\s*Releas(e|es|ed)( at| made)?\s*", x)]
    audit = admin.get("/admin/audit", params={"kind": "release.created"}).text
    assert "release.created (corpus released to clients)" in audit
    assert re.search(r'data-field="kind" data-value="release.created">release.created \(', audit)
    # the API keeps its names
    ledger = client.get(
        f"/v1/datasets/{seeded.oncology}/ledger", headers=world.auditor.headers
    ).json()
    assert [e["kind"] for e in ledger["entries"]] == ["reserve", "release"]


def test_each_release_links_its_report_and_per_class_releases_are_explained(
    admin: TestClient, client: TestClient, world: factories.World, db: Database
) -> None:
    seeded = dash.seed(client, db, world)
    page = admin.get(f"/admin/datasets/{seeded.cardiology}").text
    row = re.search(rf'<tr data-release-id="{seeded.release}">(.*?)</tr>', page, re.S)
    assert row is not None
    assert f'href="/admin/releases/{seeded.release}/report"' in row.group(1)
    explained = _text(page.split('id="why-parallel"')[1].split("</div>")[0])
    assert "Each unit (a patient, say) lies in exactly one class" in explained
    assert "cost ε = 1, not 24" in explained
    assert "Here: kde is measured in 2 classes, charged as one." in explained


def test_the_cumulative_chart_shows_delta(
    admin: TestClient, client: TestClient, world: factories.World, db: Database
) -> None:
    gaussian = _gaussian_dataset(client, db, world)
    page = admin.get(f"/admin/datasets/{gaussian}").text
    chart = page.split('<svg id="epsilon-chart"')[1].split("</svg>")[0]
    assert 'data-final-delta="1e-06"' in chart
    assert chart.count('<polyline class="delta"') == 1
    assert "δ the spent ε is stated at" in chart and "cap δ = 1 × 10⁻⁶" in chart
    deltas = re.findall(r'data-exact="([^"]+)"><title>δ = ', chart)
    assert deltas == ["0", "1e-06"]  # the right axis, labelled
    assert "δ the spent ε is stated at (right axis, against the cap's δ)" in page

    seeded = dash.seed(client, db, world)
    pure = admin.get(f"/admin/datasets/{seeded.cardiology}").text
    assert 'data-final-delta="0"' in pure and 'id="epsilon-chart-pure"' in pure


def test_the_organisation_page(
    admin: TestClient, client: TestClient, world: factories.World, db: Database
) -> None:
    seeded = dash.seed(client, db, world)
    owner = world.owner.organisation_id
    overview = admin.get("/admin").text
    assert f'href="/admin/organisations/{owner}"' in overview
    listing = admin.get("/admin/organisations").text
    rows = re.findall(r'<tr data-organisation-id="([^"]+)">', listing)
    assert sorted(rows) == sorted([str(owner), str(world.other_owner.organisation_id)])

    response = admin.get(f"/admin/organisations/{owner}")
    assert response.status_code == 200
    page = response.text
    api = client.get(f"/v1/organisations/{owner}/budget", headers=world.auditor.headers).json()
    assert float(_figure(page, "budget_epsilon")[0]) == api["budget"]["epsilon"]
    assert float(_figure(page, "budget_delta")[0]) == api["budget"]["delta"]
    assert float(_figure(page, "allocated_epsilon")[0]) == api["allocated"]["epsilon"] == 10.0
    assert float(_figure(page, "remaining_epsilon")[0]) == api["remaining"]["epsilon"]
    assert float(_figure(page, "spent")[0]) == api["spent"]
    assert float(_figure(page, "reserved")[0]) == api["reserved"]
    # each dataset's cap and spend, as the API has them
    table = page.split('id="organisation-datasets"')[1]
    listed = {d["id"]: d for d in client.get("/v1/datasets", headers=world.owner.headers).json()}
    shown = re.findall(r'<tr class="[^"]*" data-dataset-id="([^"]+)">(.*?)</tr>', table, re.S)
    assert sorted(d for d, _ in shown) == sorted(
        [seeded.cardiology, seeded.oncology, seeded.discharge]
    )
    for dataset_id, body in shown:
        for name in ("epsilon_cap", "spent", "reserved", "remaining"):
            exact = re.search(rf'data-field="{name}"><span [^>]*data-exact="([^"]+)"', body)
            assert exact is not None and float(exact.group(1)) == listed[dataset_id]["budget"][name]
    assert seeded.orthopaedics not in page  # another hospital's
    # spend over time: the chart's last point is the organisation's spent
    chart = re.search(r'<svg id="organisation-chart"[^>]*data-final-spent="([^"]+)"', page)
    assert chart is not None and float(chart.group(1)) == api["spent"] == 2.6  # 1 + 1 + 0.6
    markers = re.findall(r'<circle class="marker"[^>]*><title>([^<]+)</title>', page)
    assert len(markers) == 3 and all("exact" in m for m in markers)  # three jobs spent
    # the tests' owners hold ε = 100,000: named above the chart, not drawn to scale
    assert "budget ε = 100000 (far above: not to scale)" in page
    assert '<line class="cap"' not in page.split('id="organisation-chart"')[1]
    # no raw count of an upload: only budget figures
    assert "documents" not in _text(page.split("<main")[1].split("</main>")[0]).replace(
        "documents purged", ""
    )


def test_who_may_read_the_organisation_page(
    admin: TestClient,
    auditor: TestClient,
    client: TestClient,
    world: factories.World,
    db: Database,
    app: FastAPI,
) -> None:
    dash.seed(client, db, world)
    path = f"/admin/organisations/{world.owner.organisation_id}"
    page = auditor.get(path)
    assert page.status_code == 200 and "Only admins change a budget" in page.text
    assert "<form" not in page.text.split("<main")[1].split("</main>")[0]  # nothing to change
    assert auditor.get("/admin/organisations").status_code == 200
    for caller in (world.owner, world.client, world.other_owner):  # not the platform's
        refused = client.get(path, headers=caller.headers)
        assert refused.status_code == 403, caller.role
        assert refused.headers["content-type"].startswith("application/problem+json")
    nobody = TestClient(app).get(path, follow_redirects=False)
    assert nobody.status_code == 303 and "/admin/sign-in" in nobody.headers["location"]
    assert admin.get(f"/admin/organisations/{uuid.uuid4()}").status_code == 404
    client_org = admin.get(f"/admin/organisations/{world.client.organisation_id}")
    assert client_org.status_code == 200 and 'id="no-budget"' in client_org.text
