"""A dry run shows each planned release's noise per score beside the signal it must carry
(issue 16), so an owner sees before spending whether a budget is too small."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from tests.service import factories

# a total budget (ε 1, δ 1e-6) in place of ε per mechanism: the Gaussian mechanism
GAUSSIAN: dict[str, Any] = {
    "epsilon_vocab": None,
    "epsilon_kde": None,
    "epsilon": 1.0,
    "delta": 1e-6,
}


def test_the_noise_per_score_is_shown_beside_the_documents_it_must_stand_out_from(
    client: TestClient, world: factories.World
) -> None:
    dataset_id = factories.dataset(client, world.owner, cap=50, delta_cap="1e-5")
    plans = {
        epsilon: factories.dry_run(
            client, world.owner, dataset_id, **{**GAUSSIAN, "epsilon": epsilon}
        )
        for epsilon in (1.0, 3.0)  # below ε = 4: the same releases (no cells)
    }
    rows = {
        eps: {(r["mechanism"], r["partition"]): r for r in p["noise"]} for eps, p in plans.items()
    }
    assert rows[1.0].keys() == rows[3.0].keys() and rows[1.0]
    for key, row in rows[1.0].items():
        event = next(e for e in plans[1.0]["events"] if (e["mechanism"], e.get("partition")) == key)
        assert row["noise_std"] == event["scale"]  # Gaussian: σ is the std
        assert row["unit_contribution"] == event["sensitivity"]
        documents = len(factories.ROWS) if key[1] is None else len(factories.ROWS) // 2
        assert row["documents"] == documents
        assert row["noise_share"] == row["noise_std"] / documents
        # three times the budget, less noise per score
        assert rows[3.0][key]["noise_std"] < row["noise_std"]


def test_a_laplace_plan_reports_its_standard_deviation(
    client: TestClient, world: factories.World
) -> None:
    dataset_id = factories.dataset(client, world.owner, cap=50)
    plan = factories.dry_run(client, world.owner, dataset_id)  # ε per mechanism: pure Laplace
    for row, event in zip(plan["noise"], plan["events"], strict=True):
        assert row["noise"] == event["noise"]
        if event["noise"] in ("laplace", "discrete_laplace"):
            assert abs(row["noise_std"] - 2**0.5 * event["scale"]) < 1e-12


# -- the verdict and the budget's answer (issue 66, item 5) ------------------------------


def test_a_dry_run_that_would_not_fit_is_refused_as_the_submission_would_be(
    client: TestClient, world: factories.World
) -> None:
    dataset_id = factories.dataset(client, world.owner, cap=2, delta_cap="1e-5")
    spec = {**GAUSSIAN, "epsilon": 3.0}
    dry = factories.submit(client, world.owner, dataset_id, dry_run=True, **spec)
    real = factories.submit(client, world.owner, dataset_id, **spec)
    assert dry.status_code == real.status_code == 409
    assert dry.headers["content-type"].startswith("application/problem+json")
    assert dry.json()["detail"] == real.json()["detail"]
    assert dry.json()["remaining"] == real.json()["remaining"] == {"epsilon": 2.0, "delta": 1e-5}
    # a job that fits shows the figures as they would stand with it reserved
    fits = factories.dry_run(client, world.owner, dataset_id, **GAUSSIAN)
    after = fits["budget_after"]
    assert after["epsilon_cap"] == 2.0 and after["spent"] == 0.0
    # the job is ε = 1 at its δ = 1e-6; the ledger states it at the cap's δ = 1e-5: less
    assert 0.5 < after["reserved"] < 1.0
    assert abs(after["remaining"] - (2.0 - after["reserved"])) < 1e-9
    # and nothing was reserved by either dry run
    ledger = client.get(f"/v1/datasets/{dataset_id}/ledger", headers=world.owner.headers).json()
    assert ledger["budget"]["reserved"] == 0 and ledger["entries"] == []


def test_the_owner_gets_a_verdict_in_words_and_others_none(
    client: TestClient, world: factories.World
) -> None:
    dataset_id = factories.dataset(client, world.owner, cap=50, delta_cap="1e-5")
    plan = factories.dry_run(client, world.owner, dataset_id, **GAUSSIAN)
    verdict = plan["verdict"]
    # two documents a class against σ = 4.25: weak, and no ε up to 10 makes it strong
    assert verdict["level"] == "weak"
    kde = [e for e in plan["events"] if e["mechanism"] == "kde"]
    assert abs(verdict["signal_to_noise"] - 2 / max(e["scale"] for e in kde)) < 1e-3
    assert verdict["epsilon_for_strong"] is None
    assert "weak class separation" in verdict["summary"]
    assert "too few documents a class" in verdict["summary"]
    admin = factories.submit(client, world.admin, dataset_id, dry_run=True, **GAUSSIAN)
    if admin.status_code == 200:  # platform roles may plan; they get no raw-count verdict
        assert admin.json()["verdict"] is None
    else:
        assert admin.status_code in (403, 404)
