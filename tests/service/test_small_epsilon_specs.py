"""The small-ε options of DP-KPS in a job spec (issue 16): ``kde_method`` centroid,
``vocabulary_method`` and ``public_vocabulary_size``. A bad value or a combination the
engine refuses is a 422 problem naming the field; a good one is planned as asked, and a
dry run shows it. The research levers and values (the moments density, the thresholded
vocabulary, ``kde_weighting``, the label names' prior: docs/parameters.md) are refused in
a spec, naming the field; their maths and accounting are tested in the engine's tests
(tests/core/dpkps/test_thresholded_vocabulary.py and the like)."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.service import factories

GAUSSIAN = {"epsilon_vocab": None, "epsilon_kde": None, "epsilon": 1.0, "delta": 1e-6}


def _spec(**overrides: Any) -> dict[str, Any]:
    values = factories.spec(**overrides)
    return {k: v for k, v in values.items() if v is not None}


def _post(
    client: TestClient, world: factories.World, dataset_id: str, spec: dict[str, Any], **query: str
) -> Any:
    path = f"/v1/datasets/{dataset_id}/jobs"
    if query:
        path += "?" + "&".join(f"{k}={v}" for k, v in query.items())
    return client.post(path, headers=world.owner.headers, json=spec)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"kde_method": "kernel"}, "kde_method"),
        ({"vocabulary_method": "top"}, "vocabulary_method"),
        ({"kde_weighting": "l3"}, "kde_weighting"),
        ({"public_vocabulary_size": 0}, "public_vocabulary_size"),
        ({"public_vocabulary_size": 10**6}, "public_vocabulary_size"),
        ({"public_vocabulary_size": True}, "public_vocabulary_size"),
        # Gaussian-only mechanisms with a pure-ε (Laplace) budget
        ({"kde_method": "centroid"}, "kde_method"),
        ({"kde_method": "moments"}, "kde_method"),
        ({"vocabulary_method": "threshold"}, "vocabulary_method"),
        ({"kde_weighting": "l2"}, "kde_weighting"),
        # and other combinations that do not fit together
        ({**GAUSSIAN, "kde_method": "centroid", "mode": "iterative"}, "kde_method"),
        ({**GAUSSIAN, "kde_weighting": "l2"}, "kde_weighting"),  # centroids have no weights
        (
            {
                **GAUSSIAN,
                "kde_method": "exact",
                "vocabulary_method": "public",
                "public_vocabulary_size": 50_000,
            },
            "public_vocabulary_size",
        ),
        ({**GAUSSIAN, "noise": "laplace"}, "delta"),
    ],
)
def test_bad_small_epsilon_options_are_422_naming_the_field(
    client: TestClient, world: factories.World, overrides: dict[str, Any], field: str
) -> None:
    dataset_id = factories.dataset(client, world.owner, cap=50, delta_cap="1e-5")
    for query in ({}, {"dry_run": "true"}):
        response = _post(client, world, dataset_id, _spec(**overrides), **query)
        assert response.status_code == 422, response.text
        assert response.headers["content-type"] == "application/problem+json"
        assert response.json()["field"] == field, response.text


@pytest.mark.parametrize(
    ("overrides", "mechanisms", "described"),
    [
        # class centroids embed a sample of 4,000 units a class by default: the class
        # counts are released for its rate
        ({"kde_method": "centroid"}, {"class_counts", "kde"}, "class centroids"),
        (
            {"kde_method": "centroid", "vocabulary_method": "public", "public_vocabulary_size": 40},
            {"class_counts", "kde"},
            "first 40 phrases of the public vocabulary",
        ),
        (
            {"kde_method": "exact", "vocabulary_method": "histogram"},
            {"vocabulary", "kde"},
            "exact Gaussian kernel density",
        ),
    ],
)
def test_each_small_epsilon_option_is_planned_as_asked_and_shown_by_a_dry_run(
    client: TestClient,
    world: factories.World,
    overrides: dict[str, Any],
    mechanisms: set[str],
    described: str,
) -> None:
    dataset_id = factories.dataset(client, world.owner, cap=50, delta_cap="1e-5")
    response = _post(client, world, dataset_id, _spec(**GAUSSIAN, **overrides), dry_run="true")
    assert response.status_code == 200, response.text
    plan = response.json()
    assert described in plan["method"]
    assert {e["mechanism"] for e in plan["events"]} == mechanisms
    assert plan["epsilon"] <= 1.0 and plan["delta"] == 1e-6
    for name, value in overrides.items():
        assert plan["parameters"][name] == value, name
    kde = [e for e in plan["events"] if e["mechanism"] == "kde"]
    dimensions = {"centroid": 384, "moments": 384 + 384 * 385 // 2}
    if overrides["kde_method"] in dimensions:
        assert {e["dimension"] for e in kde} == {dimensions[overrides["kde_method"]]}
    if overrides.get("kde_weighting") == "l2":
        assert "L2 norm 1" in plan["method"]
    vocabulary = [e for e in plan["events"] if e["mechanism"] == "vocabulary"]
    spent = [e["delta"] for e in plan["events"] if "delta" in e]
    if overrides.get("vocabulary_method") == "threshold":
        # δ_thr is spent by the vocabulary release, once, inside the job's δ
        assert spent == ["5E-7"] and vocabulary[0]["delta"] == "5E-7"
    else:
        assert spent == []


def test_a_thresholded_job_is_refused_at_submission_naming_the_field(
    client: TestClient, world: factories.World
) -> None:
    # the thresholded vocabulary is a research value (no default chooses it, it measured
    # no gain); its δ_thr accounting stays in tests/core/dpkps/test_thresholded_vocabulary.py
    spec = _spec(**GAUSSIAN, kde_method="exact", vocabulary_method="threshold")
    dataset_id = factories.dataset(client, world.owner, cap=50, delta_cap="1e-6")
    response = _post(client, world, dataset_id, spec)
    assert response.status_code == 422, response.text
    assert response.json()["field"] == "vocabulary_method"
    budget = client.get(f"/v1/datasets/{dataset_id}", headers=world.owner.headers).json()
    assert budget["budget"]["reserved"] == 0  # nothing reserved


@pytest.mark.parametrize(
    ("overrides", "size"),
    [
        ({"kde_method": "centroid"}, 30_000),  # noise on 384 coordinates whatever |Ṽ| is
        ({"kde_method": "exact", "vocabulary_method": "public"}, 5_000),  # noise per phrase
        ({"kde_method": "centroid", "public_vocabulary_size": 7_000}, 7_000),
    ],
)
def test_the_public_vocabulary_size_defaults_by_density_method(
    client: TestClient, world: factories.World, overrides: dict[str, Any], size: int
) -> None:
    dataset_id = factories.dataset(client, world.owner, cap=50, delta_cap="1e-5")
    response = _post(client, world, dataset_id, _spec(**GAUSSIAN, **overrides), dry_run="true")
    assert response.status_code == 200, response.text
    plan = response.json()
    assert plan["parameters"]["public_vocabulary_size"] == size
    assert plan["parameters"]["vocabulary_method"] == "public"
    assert f"first {size:,} phrases of the public vocabulary" in plan["method"]


@pytest.mark.parametrize(
    ("overrides", "cells"),
    [
        ({"epsilon": 1.0}, 1),  # below ε = 4: the class sum alone, one release
        ({"epsilon": 6.0}, 8),  # from ε = 4 on: up to 8 cells, a second release
        ({"epsilon": 6.0, "centroid_cells": 1}, 1),
        ({"epsilon": 1.0, "centroid_cells": 3}, 3),
    ],
)
def test_a_dry_run_shows_the_cells_and_their_release(
    client: TestClient, world: factories.World, overrides: dict[str, Any], cells: int
) -> None:
    dataset_id = factories.dataset(client, world.owner, cap=50, delta_cap="1e-5")
    spec = _spec(**{**GAUSSIAN, **overrides})
    response = _post(client, world, dataset_id, spec, dry_run="true")
    assert response.status_code == 200, response.text
    plan = response.json()
    assert plan["parameters"]["centroid_cells"] == cells
    released = [e for e in plan["events"] if e["mechanism"] == "kde_cells"]
    assert len(released) == (len(plan["events"]) // 2 if cells > 1 else 0)
    assert all(e["dimension"] == cells * 384 for e in released)
    assert float(plan["epsilon"]) <= overrides["epsilon"]
    # the noise report names the second release beside the first
    assert {r["mechanism"] for r in plan["noise"]} >= (
        {"kde", "kde_cells"} if cells > 1 else {"kde"}
    )


def test_cells_with_another_density_are_422_naming_the_field(
    client: TestClient, world: factories.World
) -> None:
    dataset_id = factories.dataset(client, world.owner, cap=50, delta_cap="1e-5")
    spec = _spec(**GAUSSIAN, kde_method="exact", centroid_cells=4)
    response = _post(client, world, dataset_id, spec, dry_run="true")
    assert response.status_code == 422, response.text
    assert response.json()["field"] == "centroid_cells"


@pytest.mark.parametrize("value", [0.0, 0.5, 2.0, -1.0])
def test_the_label_prior_is_the_engine_s_and_a_spec_naming_it_is_refused(
    client: TestClient, world: factories.World, value: float
) -> None:
    # a research lever (docs/parameters.md): at its measured default in every run
    dataset_id = factories.dataset(client, world.owner, cap=50, delta_cap="1e-5")
    spec = _spec(**GAUSSIAN, label_prior=value)
    response = _post(client, world, dataset_id, spec, dry_run="true")
    assert response.status_code == 422, response.text
    assert response.json()["field"] == "label_prior"
    assert "research setting" in response.json()["errors"][0]["msg"]
    default = _post(client, world, dataset_id, _spec(**GAUSSIAN), dry_run="true").json()
    assert "label_prior" not in default["parameters"]


@pytest.mark.parametrize(("extra", "dimension"), [(0, 384), (20, 128)])
def test_a_dry_run_shows_the_subspace_the_declared_labels_choose(
    client: TestClient, world: factories.World, extra: int, dimension: int
) -> None:
    # the default subspace is chosen by the declared label set (public): 20 or more
    # classes with one cell each are released in the public phrases' top 128 directions
    labels = [*factories.LABELS, *(f"extra {i}" for i in range(extra))]
    dataset_id = factories.dataset(client, world.owner, cap=50, delta_cap="1e-5", labels=labels)
    response = _post(client, world, dataset_id, _spec(**GAUSSIAN), dry_run="true")
    assert response.status_code == 200, response.text
    plan = response.json()
    assert plan["parameters"]["subspace"] == dimension
    assert {e["dimension"] for e in plan["events"] if e["mechanism"] == "kde"} == {dimension}
    assert ("top 128 principal directions" in plan["method"]) == (dimension == 128)
