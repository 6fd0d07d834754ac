"""Job specs, budget reservation (and its race), reading, cancelling, queueing."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from app.db import Database
from app.jobs import runner
from app.jobs.schemas import JobSpec
from app.worker import RUN_SEQUENCES
from tests.service import factories
from workers.methods.dpkps.config import GenerationConfig
from workers.methods.dpkps.params import ENGINE_FIELDS, PUBLIC_FIELDS, RESEARCH_FIELDS


def test_the_spec_carries_every_public_engine_parameter_with_the_engine_defaults() -> None:
    import dataclasses

    engine = {f.name: f.default for f in dataclasses.fields(GenerationConfig)}
    assert set(ENGINE_FIELDS) == set(engine) - {"device"}
    assert set(PUBLIC_FIELDS) <= set(JobSpec.model_fields)
    assert not RESEARCH_FIELDS & set(JobSpec.model_fields)  # the benchmarks' (issue 64)
    spec = JobSpec(vocabulary="english", document_type="note", epsilon=1)
    for name in PUBLIC_FIELDS:
        if engine[name] is not dataclasses.MISSING and name != "epsilon":
            assert getattr(spec, name) == engine[name], name


def test_submission_reserves_the_whole_epsilon(client: TestClient, world: factories.World) -> None:
    dataset_id = factories.dataset(client, world.owner, cap=3)
    body = {**factories.spec(epsilon_count=0.5, total=20)}
    del body["per_class"]  # with noisy class counts, `total` is split by them
    response = client.post(
        f"/v1/datasets/{dataset_id}/jobs", headers=world.owner.headers, json=body
    )
    assert response.status_code == 202, response.text
    job = response.json()
    assert job["state"] == "queued" and job["progress"] == 0.0
    assert job["epsilon"] == {
        "requested": 1.5,
        "by_mechanism": {"vocabulary": 0.5, "kde": 0.5, "class_counts": 0.5},
        "budget_state": "reserved",
        "charged": {"epsilon": 1.5, "delta": 0.0, "accountant": "exact-sum"},
    }
    assert job["spec"]["per_class"] is None and job["spec"]["total"] == 20
    budget = client.get(f"/v1/datasets/{dataset_id}", headers=world.owner.headers).json()
    assert (budget["budget"]["reserved"], budget["budget"]["remaining"]) == (1.5, 1.5)


def test_over_budget_is_409_naming_what_was_asked_and_what_remains(
    client: TestClient, world: factories.World
) -> None:
    dataset_id = factories.dataset(client, world.owner, cap=1.5)
    factories.job(client, world.owner, dataset_id)
    response = factories.submit(client, world.owner, dataset_id)
    assert response.status_code == 409
    assert response.headers["content-type"] == "application/problem+json"
    body = response.json()
    assert body["requested"] == {"epsilon": 1.0, "delta": 0.0}
    assert body["remaining"] == {"epsilon": 0.5, "delta": 0.0}
    assert (body["accountant"], body["cap"]) == ("exact-sum", {"epsilon": 1.5, "delta": 0.0})
    assert "asks for ε = 1 at δ = 0" in body["detail"] and "ε = 0.5 left" in body["detail"]
    jobs = client.get(f"/v1/datasets/{dataset_id}/jobs", headers=world.owner.headers).json()
    assert len(jobs) == 1


def test_decimal_budget_arithmetic_fits_ten_tenths_in_one(
    client: TestClient, world: factories.World
) -> None:
    dataset_id = factories.dataset(client, world.owner, cap=1)
    for _ in range(10):
        factories.job(client, world.owner, dataset_id, epsilon_vocab=0.05, epsilon_kde=0.05)
    assert (
        factories.submit(
            client, world.owner, dataset_id, epsilon_vocab=0.05, epsilon_kde=0.05
        ).status_code
        == 409
    )


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"epsilon_vocab": -1}, "epsilon_vocab"),
        ({"epsilon_kde": 0}, "epsilon_kde"),
        ({"epsilon_kde": 5000}, "epsilon_kde"),
        # a floor and a ceiling per mechanism (a job at ε = 2e-9 is a free probe)
        ({"epsilon_vocab": 2e-9}, "epsilon_vocab"),
        ({"epsilon_kde": 0.0009}, "epsilon_kde"),
        ({"epsilon_count": 1e-4, "total": 10}, "epsilon_count"),
        ({"epsilon_vocab": 100.5}, "epsilon_vocab"),
        # sequences per job: per_class × 2 declared labels, or total (server cap 100,000)
        ({"per_class": 50_001}, "per_class"),
        ({"epsilon_count": 1, "total": 100_001}, "total"),
        ({"api_key": "sk-secret"}, "api_key"),
        ({"base_url": "http://evil"}, "base_url"),
        ({"mode": "greedy"}, "mode"),
        ({"num_features": 10**9}, "num_features"),
        ({"vocabulary": "klingon"}, "vocabulary"),
        ({"vocabulary": str(uuid.uuid4())}, "vocabulary"),
        ({"llm": "gpt-4o-with-my-key"}, "llm"),
        ({"vocabulary_size": 10**6}, "vocabulary_size"),
        ({"vocabulary_size": 150_000}, "vocabulary_size"),
        ({"vocabulary_size": 4, "sequence_length": 8}, "sequence_length"),
        ({"epsilon_count": 0.5}, "total"),
        ({"total": 10}, "total"),
        ({"template": "no placeholder here"}, "template"),
        ({"few_shot": ["an example"], "template": "Write {keyphrases}"}, "template"),
        ({"few_shot": [""]}, "few_shot.0"),
        ({"document_type": ""}, "document_type"),
        ({"max_llm_calls": 10**8}, "max_llm_calls"),
        ({"seed": -1}, "seed"),
        # research levers and values (docs/parameters.md): the benchmarks', not a spec's;
        # and a lever removed from the engine (issue 64)
        ({"noise_floor": 1.0}, "noise_floor"),
        ({"label_prior_lead": 32.0}, "label_prior_lead"),
        ({"kde_method": "moments"}, "kde_method"),
        ({"vocabulary_method": "threshold"}, "vocabulary_method"),
    ],
)
def test_bad_specs_are_422_naming_the_field(
    client: TestClient, world: factories.World, overrides: dict[str, Any], field: str
) -> None:
    dataset_id = factories.dataset(client, world.owner)
    response = factories.submit(client, world.owner, dataset_id, **overrides)
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["field"] == field
    assert "sk-secret" not in response.text


@pytest.mark.parametrize(
    ("lever", "message"),
    [
        ("noise_floor", "is a research setting, not a parameter of the product"),
        ("document_window", "was removed from the engine: it measured no gain"),  # issue 64
    ],
)
def test_a_research_or_removed_lever_in_a_new_spec_is_a_422_that_says_so(
    client: TestClient, world: factories.World, lever: str, message: str
) -> None:
    dataset_id = factories.dataset(client, world.owner)
    for dry_run in ("false", "true"):
        response = client.post(
            f"/v1/datasets/{dataset_id}/jobs?dry_run={dry_run}",
            headers=world.owner.headers,
            json=factories.spec(**{lever: 300}),
        )
        assert response.status_code == 422, response.text
        assert response.headers["content-type"] == "application/problem+json"
        problem = response.json()
        assert problem["field"] == lever
        assert problem["errors"][0]["msg"] == f"{lever} {message} (docs/parameters.md)"


def test_non_finite_numbers_and_broken_json_are_422(
    client: TestClient, world: factories.World
) -> None:
    dataset_id = factories.dataset(client, world.owner)
    path = f"/v1/datasets/{dataset_id}/jobs"
    headers = {**world.owner.headers, "Content-Type": "application/json"}
    nan = client.post(
        path,
        headers=headers,
        content=b'{"vocabulary": "medical", '
        b'"document_type": "n", "epsilon_vocab": NaN, "epsilon_kde": 1}',
    )
    assert nan.status_code == 422 and nan.json()["field"] == "epsilon_vocab"
    broken = client.post(path, headers=headers, content=b'{"vocabulary": ')
    assert broken.status_code == 422


def test_a_configured_llm_endpoint_is_chosen_by_name(
    client: TestClient, world: factories.World
) -> None:
    dataset_id = factories.dataset(client, world.owner)
    response = factories.submit(
        client,
        world.owner,
        dataset_id,
        llm="vllm",
        max_llm_calls=500,
        few_shot=["A public example."],
        template="{examples}Write a {document_type} with {keyphrases}.",
    )
    assert response.status_code == 202, response.text
    assert response.json()["spec"]["llm"] == "vllm"


def test_who_may_submit_and_read_jobs(client: TestClient, world: factories.World) -> None:
    dataset_id = factories.dataset(client, world.owner)
    job_id = factories.job(client, world.owner, dataset_id)
    assert factories.submit(client, world.other_owner, dataset_id).status_code == 404
    assert factories.submit(client, world.owner, str(uuid.uuid4())).status_code == 404
    for name in ("admin", "auditor", "client"):
        assert factories.submit(client, getattr(world, name), dataset_id).status_code == 403
    for name in ("owner", "admin", "auditor"):
        caller = getattr(world, name)
        assert client.get(f"/v1/jobs/{job_id}", headers=caller.headers).status_code == 200
        listed = client.get(f"/v1/datasets/{dataset_id}/jobs", headers=caller.headers)
        assert [j["id"] for j in listed.json()] == [job_id]
    assert client.get(f"/v1/jobs/{job_id}", headers=world.other_owner.headers).status_code == 404
    assert client.get(f"/v1/jobs/{job_id}", headers=world.client.headers).status_code == 403
    other_list = client.get(f"/v1/datasets/{dataset_id}/jobs", headers=world.other_owner.headers)
    assert other_list.status_code == 404
    assert client.get(f"/v1/jobs/{uuid.uuid4()}", headers=world.owner.headers).status_code == 404


def test_cancelling_a_queued_job_releases_its_reservation(
    client: TestClient, world: factories.World
) -> None:
    dataset_id = factories.dataset(client, world.owner, cap=2)
    job_id = factories.job(client, world.owner, dataset_id)
    for name in ("other_owner",):
        caller = getattr(world, name)
        assert client.post(f"/v1/jobs/{job_id}/cancel", headers=caller.headers).status_code == 404
    for name in ("auditor", "client"):
        caller = getattr(world, name)
        assert client.post(f"/v1/jobs/{job_id}/cancel", headers=caller.headers).status_code == 403
    response = client.post(f"/v1/jobs/{job_id}/cancel", headers=world.owner.headers)
    assert response.status_code == 200
    assert response.json()["state"] == "cancelled"
    assert response.json()["epsilon"]["budget_state"] == "released"
    dataset = client.get(f"/v1/datasets/{dataset_id}", headers=world.owner.headers).json()
    assert dataset["budget"]["reserved"] == 0 and dataset["budget"]["remaining"] == 2
    again = client.post(f"/v1/jobs/{job_id}/cancel", headers=world.admin.headers)
    assert again.status_code == 409


def test_cancelling_a_running_job_keeps_its_spend(
    client: TestClient, world: factories.World, db: Database
) -> None:
    dataset_id = factories.dataset(client, world.owner, cap=2)
    job_id = factories.job(client, world.owner, dataset_id)
    with db.transaction() as session:
        assert runner.start_sequences(session, uuid.UUID(job_id)) is not None
    response = client.post(f"/v1/jobs/{job_id}/cancel", headers=world.admin.headers)
    assert response.status_code == 200
    job = response.json()
    assert job["state"] == "running" and job["cancel_requested"] is True
    assert job["epsilon"]["budget_state"] == "committed"
    with db.transaction() as session:
        assert runner.cancel_requested(session, uuid.UUID(job_id)) is True
    job = client.get(f"/v1/jobs/{job_id}", headers=world.owner.headers).json()
    assert job["state"] == "cancelled" and job["epsilon"]["budget_state"] == "committed"
    budget = client.get(f"/v1/datasets/{dataset_id}", headers=world.owner.headers).json()
    assert budget["budget"]["spent"] == 1.0 and budget["budget"]["remaining"] == 1.0


def test_concurrent_submissions_never_overspend_on_postgres(
    app: FastAPI, client: TestClient, world: factories.World
) -> None:
    dataset_id = factories.dataset(client, world.owner, cap=5)
    statuses = factories.concurrent_submissions(app, world.owner, dataset_id, 8)
    assert statuses == [202] * 5 + [409] * 3
    ledger = client.get(f"/v1/datasets/{dataset_id}/ledger", headers=world.owner.headers).json()
    assert ledger["budget"]["reserved"] == 5.0 and ledger["budget"]["remaining"] == 0.0
    assert len(ledger["entries"]) == 5


def test_submission_queues_one_message_with_the_job_id_and_request_id(
    app: FastAPI, client: TestClient, world: factories.World
) -> None:
    dataset_id = factories.dataset(client, world.owner)
    response = client.post(
        f"/v1/datasets/{dataset_id}/jobs",
        headers={**world.owner.headers, "X-Request-ID": "req-0123456789"},
        json=factories.spec(),
    )
    job_id = response.json()["id"]
    found = factories.queued_message(app, "cpu", job_id)
    assert found.headers["task"] == RUN_SEQUENCES
    assert found.headers["request_id"] == "req-0123456789"
    refused = factories.submit(client, world.owner, dataset_id, epsilon_kde=100)
    assert refused.status_code == 409


def test_a_dry_run_plans_the_releases_without_a_job_or_a_reservation(
    client: TestClient, world: factories.World
) -> None:
    # a δ in the cap: a Gaussian job on a cap of δ = 0 would not fit, and a dry run says
    # so with the submission's 409 (issue 66, item 5; test_dry_run_noise.py)
    dataset_id = factories.dataset(client, world.owner, cap=3, delta_cap="1e-6")
    before = client.get(f"/v1/datasets/{dataset_id}", headers=world.owner.headers).json()
    spec = factories.spec(epsilon=1.0, delta=1e-7, total=20)
    for name in ("epsilon_vocab", "epsilon_kde", "per_class"):
        del spec[name]
    response = client.post(
        f"/v1/datasets/{dataset_id}/jobs?dry_run=true", headers=world.owner.headers, json=spec
    )
    assert response.status_code == 200, response.text
    plan = response.json()
    assert plan["dry_run"] is True
    assert plan["epsilon"] <= 1.0 and plan["delta"] == 1e-7
    assert plan["accountant"].startswith("pld(dp-accounting")
    mechanisms = {e["mechanism"]: e["noise"] for e in plan["events"]}
    # a total Gaussian budget defaults to class centroids over a public Ṽ (issue 16): no
    # vocabulary release, the class counts and one centroid per class
    assert mechanisms == {"class_counts": "gaussian", "kde": "gaussian"}
    assert all(e["scale"] > 0 for e in plan["events"])
    jobs = client.get(f"/v1/datasets/{dataset_id}/jobs", headers=world.owner.headers).json()
    assert jobs == []
    after = client.get(f"/v1/datasets/{dataset_id}", headers=world.owner.headers).json()
    assert after["budget"] == before["budget"]
    # the same checks as a submission: a bad spec is a 422 naming the field
    bad = client.post(
        f"/v1/datasets/{dataset_id}/jobs?dry_run=true",
        headers=world.owner.headers,
        json={**spec, "delta": 0.5},
    )
    assert bad.status_code == 422 and "delta" in bad.text
