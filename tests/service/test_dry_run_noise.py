"""A dry run shows each planned release's noise per score beside the signal it must carry
(issue 16), so an owner sees before spending whether a budget is too small."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from tests.service import factories


def _dry_run(client: TestClient, caller: factories.Caller, dataset_id: str, **spec: Any) -> Any:
    response = client.post(
        f"/v1/datasets/{dataset_id}/jobs?dry_run=true",
        headers=caller.headers,
        json=factories.spec(**spec),
    )
    assert response.status_code == 200, response.text
    return response.json()


def test_the_noise_per_score_is_shown_beside_the_documents_it_must_stand_out_from(
    client: TestClient, world: factories.World
) -> None:
    dataset_id = factories.dataset(client, world.owner, cap=50, delta_cap="1e-5")
    plans = {
        epsilon: _dry_run(
            client,
            world.owner,
            dataset_id,
            epsilon_vocab=None,
            epsilon_kde=None,
            epsilon=epsilon,
            delta=1e-6,
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
    plan = _dry_run(client, world.owner, dataset_id)  # ε per mechanism: pure Laplace
    for row, event in zip(plan["noise"], plan["events"], strict=True):
        assert row["noise"] == event["noise"]
        if event["noise"] in ("laplace", "discrete_laplace"):
            assert abs(row["noise_std"] - 2**0.5 * event["scale"]) < 1e-12
