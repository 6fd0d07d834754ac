"""The release report (issue 66, item 1): one model, three renderings (JSON, HTML, PDF),
for the owner, the grantees and the platform roles, each in its own view."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.db import Database
from app.releases import report
from tests.service import factories

ONLY_CARDIO = (
    ("cardio", ("heart failure", "chest pain")),
    ("cardio", ("atrial fibrillation",)),
)


def _released(client: TestClient, world: factories.World, db: Database, **job: Any) -> str:
    """A job run to success and released as "cardio v1": the release id."""
    return factories.released(client, world, db, name="cardio v1", **job)[1]


def _report(client: TestClient, caller: factories.Caller, release_id: str) -> dict[str, Any]:
    response = client.get(f"/v1/releases/{release_id}/report", headers=caller.headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    body: dict[str, Any] = response.json()
    return body


def test_the_report_has_every_part_a_privacy_officer_signs(
    client: TestClient, world: factories.World, db: Database
) -> None:
    release_id = _released(client, world, db)
    body = _report(client, world.owner, release_id)
    assert body["view"] == "owner"
    protection = body["protection"]
    assert protection["epsilon"] > 0 and protection["delta"] == 0
    assert protection["accountant"] == "exact-sum"
    assert "one row of the uploaded file" in protection["unit_in_words"]
    assert f"ε = {protection['epsilon']:.6g}" in protection["guarantee_in_words"]
    assert "pure ε-differential privacy" in protection["guarantee_in_words"]
    assert "parallel" in protection["parallel_composition"]

    spend = body["spend"]
    mechanisms = {m["mechanism"]: m for m in spend["by_mechanism"]}
    assert mechanisms and any(m["per_class"] for m in mechanisms.values())
    assert spend["dataset"]["spent_after_this_release"] == pytest.approx(protection["epsilon"])
    assert spend["dataset"]["epsilon_cap"] == 5.0
    assert spend["organisation_budget"]["budget"]["epsilon"] == float(factories.OWNER_BUDGET)

    released = body["released"]
    assert released["name"] == "cardio v1"
    assert [g["name"] for g in released["grantees"]] == ["Research Lab"]
    assert released["owner_organisation"]["name"] == "St Mary's Hospital"
    assert released["documents_asked"] == 4 and released["documents_released"] == 3
    by_label = {c["label"]: c for c in released["classes"]}
    assert by_label["cardio"] == {
        "label": "cardio",
        "asked": 2,
        "drawn": 2,
        "released": 2,
        "flagged": False,
    }
    assert released["classes_without_documents"] == []
    assert released["dataset_raw_counts"] == {
        "documents": 4,
        "skipped_empty": 0,
        "skipped_duplicate": 0,
    }

    provenance = body["provenance"]
    assert provenance["method_id"] == "dpkps" and provenance["method"]
    assert provenance["vocabulary"]["fingerprint"]
    assert provenance["vocabulary"]["source"] == "built in"
    assert provenance["parameters"]["per_class"] == 2
    embedding, llm = provenance["models"]
    assert embedding["name"] == "test-model" and embedding["file_digest"] == "not recorded"
    assert llm["endpoint"] == "none"
    assert [s["label"] for s in body["samples"]] == ["cardio", "ortho"]
    assert body["samples"][0]["keyphrases"] == ["heart failure", "chest pain"]
    assert "train" in body["what_the_data_is_good_for"]


def test_a_class_that_received_no_documents_is_flagged(
    client: TestClient, world: factories.World, db: Database
) -> None:
    release_id = _released(client, world, db, sequences=ONLY_CARDIO)
    body = _report(client, world.auditor, release_id)
    released = body["released"]
    assert released["documents_asked"] == 4 and released["documents_released"] == 2
    assert released["classes_without_documents"] == ["ortho"]
    ortho = next(c for c in released["classes"] if c["label"] == "ortho")
    assert ortho["flagged"] and ortho["released"] == 0 and ortho["asked"] == 2
    assert "2 documents released of 4 asked" in released["summary"]
    assert "received none: ortho" in released["summary"]
    assert "cannot learn it" in body["what_the_data_is_good_for"]
    page = client.get(
        f"/v1/releases/{release_id}/report", params={"format": "html"}, headers=world.owner.headers
    )
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert 'id="empty-classes"' in page.text and "no documents" in page.text


def test_an_llm_release_counts_only_documents_with_a_text_and_names_the_llm(
    client: TestClient, world: factories.World, db: Database
) -> None:
    release_id = _released(client, world, db, llm="vllm", texts=["one", None, "three"])
    body = _report(client, world.client, release_id)
    by_label = {c["label"]: c for c in body["released"]["classes"]}
    assert (by_label["cardio"]["drawn"], by_label["cardio"]["released"]) == (2, 2)
    assert (by_label["ortho"]["drawn"], by_label["ortho"]["released"]) == (1, 0)
    assert by_label["ortho"]["flagged"]
    llm = body["provenance"]["models"][1]
    assert llm["name"] == "open-model" and llm["endpoint"] == "vllm"
    assert llm["version"] == "not recorded" and llm["file_digest"] == "not recorded"
    assert [s["text"] for s in body["samples"]] == ["one"]  # a sequence without text: none


def test_the_words_follow_the_unit_of_protection(
    client: TestClient, world: factories.World, db: Database
) -> None:
    rows = [("Heart failure", "cardio", "P-1"), ("Fracture", "ortho", "P-2")]
    content = factories.csv_bytes(rows, header=("text", "label", "patient"))
    release_id = _released(client, world, db, upload={"content": content, "unit_column": "patient"})
    protection = _report(client, world.owner, release_id)["protection"]
    assert protection["unit"] == "patient"
    assert protection["unit_in_words"].startswith(
        "one patient (all rows sharing a unit id, the unit column 'patient') added or removed"
    )
    assert protection["adjacency"] == "one unit (patient) added or removed"
    assert "one patient is in the private corpus" in protection["guarantee_in_words"]
    assert "Each patient belongs to exactly one class" in protection["parallel_composition"]
    # and without a unit column: one row
    assert report.unit_in_words("row").startswith("one row of the uploaded file")
    assert "δ = 1e-06 is the probability" in report.guarantee_in_words(1.0, 1e-6, "row")


def test_each_role_gets_its_view_and_other_organisations_none(
    client: TestClient, world: factories.World, db: Database
) -> None:
    release_id = _released(client, world, db)
    views = {
        name: _report(client, caller, release_id)
        for name, caller in (
            ("owner", world.owner),
            ("client", world.client),
            ("admin", world.admin),
            ("auditor", world.auditor),
        )
    }
    assert {n: v["view"] for n, v in views.items()} == {
        "owner": "owner",
        "client": "grantee",
        "admin": "platform",
        "auditor": "platform",
    }
    # platform roles: the ledger and the budget, never a document nor the raw counts
    for name in ("admin", "auditor"):
        assert views[name]["samples"] is None
        assert views[name]["released"]["dataset_raw_counts"] is None
        assert views[name]["spend"]["dataset"] == views["owner"]["spend"]["dataset"]
    # a grantee: sample documents and its own grant, not the owner's ledger or budget
    grantee = views["client"]
    assert grantee["samples"] == views["owner"]["samples"]
    assert grantee["spend"]["dataset"] is None and grantee["spend"]["organisation_budget"] is None
    assert grantee["released"]["dataset_raw_counts"] is None
    assert [g["organisation_id"] for g in grantee["released"]["grantees"]] == [
        str(world.client.organisation_id)
    ]
    for caller in (world.other_owner, world.other_client):
        for fmt in ("json", "html", "pdf"):
            response = client.get(
                f"/v1/releases/{release_id}/report", params={"format": fmt}, headers=caller.headers
            )
            assert response.status_code == 404, (caller.role, fmt)
            assert "cardio" not in response.text
    missing = client.get(f"/v1/releases/{uuid.uuid4()}/report", headers=world.owner.headers)
    assert missing.status_code == 404
    assert client.get(f"/v1/releases/{release_id}/report").status_code == 401
    bad = client.get(
        f"/v1/releases/{release_id}/report", params={"format": "docx"}, headers=world.owner.headers
    )
    assert bad.status_code == 422


def test_the_html_report_has_every_section(
    client: TestClient, world: factories.World, db: Database
) -> None:
    release_id = _released(client, world, db)
    page = client.get(
        f"/v1/releases/{release_id}/report", params={"format": "html"}, headers=world.admin.headers
    )
    assert page.status_code == 200
    assert "Content-Security-Policy" in page.headers
    for section in ("protection", "spend", "released", "good-for", "provenance", "samples"):
        assert f'id="{section}"' in page.text, section
    assert "Released documents are read by the owner organisation and the grantees only" in (
        page.text
    )
    assert "Research Lab" in page.text and "exact-sum" in page.text


def _pdf_tools() -> None:
    if shutil.which("pdftoppm") is None:
        pytest.skip("poppler-utils (pdftoppm) is not installed")


def test_the_pdf_renders_with_the_guarantee(
    client: TestClient, world: factories.World, db: Database, tmp_path: Path
) -> None:
    _pdf_tools()
    release_id = _released(client, world, db, sequences=ONLY_CARDIO)
    body = _report(client, world.owner, release_id)
    response = client.get(
        f"/v1/releases/{release_id}/report", params={"format": "pdf"}, headers=world.owner.headers
    )
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/pdf"
    assert response.content.startswith(b"%PDF-")
    pdf = tmp_path / "report.pdf"
    pdf.write_bytes(response.content)
    subprocess.run(["pdftoppm", "-r", "40", "-png", str(pdf), str(tmp_path / "page")], check=True)
    pages = sorted(tmp_path.glob("page*.png"))
    assert len(pages) >= 1
    from PIL import Image

    with Image.open(pages[0]) as image:
        grey = image.convert("L")
        histogram = grey.histogram()
        dark, light = sum(histogram[:128]), sum(histogram[128:])
        assert dark > 500 and light > dark  # ink on paper, not a blank (or black) page
    if shutil.which("pdftotext") is not None:
        text = subprocess.run(
            ["pdftotext", "-layout", str(pdf), "-"], check=True, capture_output=True, text=True
        ).stdout
        assert f"ε = {body['protection']['epsilon']:g}, δ = 0" in text
        assert "What is protected" in text and "Sample documents" in text
        assert "NO DOCUMENTS" in text and "ortho" in text


def test_a_total_split_by_noisy_counts_asks_no_fixed_number_per_class(
    client: TestClient, world: factories.World, db: Database
) -> None:
    release_id = _released(client, world, db, total=6, epsilon_count=0.2)
    released = _report(client, world.owner, release_id)["released"]
    assert released["documents_asked"] == 6 and released["documents_released"] == 3
    assert [c["asked"] for c in released["classes"]] == [None, None]
    assert "3 documents released of 6 asked" in released["summary"]


def test_without_a_unicode_font_the_pdf_spells_epsilon_out(
    client: TestClient,
    world: factories.World,
    db: Database,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if shutil.which("pdftotext") is None:
        pytest.skip("poppler-utils (pdftotext) is not installed")
    from app.releases import report_pdf

    release_id = _released(client, world, db)
    built = report.ReleaseReport.model_validate(_report(client, world.client, release_id))
    monkeypatch.setattr(report_pdf, "FONT_DIRS", (tmp_path / "no fonts here",))
    pdf = tmp_path / "report.pdf"
    pdf.write_bytes(report_pdf.render(built))
    text = subprocess.run(
        ["pdftotext", str(pdf), "-"], check=True, capture_output=True, text=True
    ).stdout
    assert f"epsilon = {built.protection.epsilon:g}, delta = 0" in text
    assert "What is protected" in text and "Helvetica" in pdf.read_text("latin-1")
