"""Progress a person can follow (issue 67, item 3): the stage that runs, as stage k of n,
a fraction and a time estimate for the stages whose work is public only, the same on
the terminal, and no time stamp that times the private stages for others than the owner.

The jobs run the real engine in-process, as a worker runs them (``tests/service/
test_worker.py``'s context); the CLI's bars are drawn into a string.
"""

from __future__ import annotations

import io
import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.db import Database
from app.jobs import runner, stages
from app.jobs.stages import WorkerContext
from tests.service import factories
from tests.service.test_worker import cache_dir, job_of, submit, worker  # noqa: F401
from workers.methods.dpkps import stages as dpkps_stages
from workers.methods.progress import run_stages, stage_number, time_left
from workers.progress_bars import StageBars

PUBLIC_WORK = {"embed", "sequences", "prompts"}  # DP-KPS, independent mode


def _seen_by(client: TestClient, caller: factories.Caller, job_id: str) -> dict[str, Any]:
    response = client.get(f"/v1/jobs/{job_id}", headers=caller.headers)
    assert response.status_code == 200, response.text
    return dict(response.json())


@pytest.mark.parametrize(
    ("method", "options", "names"),
    [
        (
            "dpkps",
            {"llm": "local"},
            ["extract", "private_vocabulary", "embed", "dp_kde", "sequences", "prompts"],
        ),
        (
            "dpkps",
            {"llm": "none"},
            ["extract", "private_vocabulary", "embed", "dp_kde", "sequences"],
        ),
        ("aug-pe", {}, ["load", "class_counts", "initial_population", "iteration", "release"]),
        ("pate-tutor", {}, ["load", "public_pools", "tutor", "votes", "release"]),
        ("dp-eda", {}, ["load", "initial_population", "iteration", "release"]),
    ],
)
def test_each_method_has_its_stages_from_public_parameters(
    method: str, options: dict[str, Any], names: list[str]
) -> None:
    found = run_stages(method, **options)
    assert [s.name for s in found] == names
    assert [stage_number(found, name) for name in names] == list(range(1, len(names) + 1))
    assert stage_number(found, "no such stage") is None
    # a stored spec names the same stages (a spec from before methods is DP-KPS's)
    assert runner.stages_of({"method": method, **options}) == found
    # the stages that read the private corpus never have public work
    private = {"extract", "private_vocabulary", "dp_kde", "class_counts", "tutor", "votes"}
    assert not any(s.public_work for s in found if s.name in private | {"load", "iteration"})


def test_iterative_sampling_between_private_reads_shows_no_fraction() -> None:
    independent = {s.name: s.public_work for s in run_stages("dpkps", llm="none")}
    iterative = {s.name: s.public_work for s in run_stages("dpkps", mode="iterative", llm="none")}
    assert independent["sequences"] and not iterative["sequences"]
    assert independent["embed"] and iterative["embed"]
    with pytest.raises(ValueError, match="no stages"):
        run_stages("pe")


def test_the_time_left_is_the_rate_so_far_times_the_work_left() -> None:
    assert time_left(0.25, 0.0, 10.0) == pytest.approx(30.0)
    assert time_left(0.5, 0.25, 10.0) == pytest.approx(20.0)  # resumed at a quarter
    assert time_left(1.0, 0.0, 7.0) == 0.0
    assert time_left(0.0, 0.0, 10.0) is None  # no work done yet: no rate
    assert time_left(0.3, 0.3, 10.0) is None


def test_the_running_stage_is_shown_while_it_runs_with_k_of_n_and_public_fractions(
    client: TestClient,
    world: factories.World,
    worker: WorkerContext,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, job_id = submit(client, world, llm="local")
    monkeypatch.setattr(dpkps_stages, "EMBED_CHUNK", 3)  # Ṽ's 8 phrases: 3 chunks, 3 reports
    during_embedding: list[dict[str, Any]] = []
    embedded = dpkps_stages._embedded

    def watched(*args: Any, **kwargs: Any) -> Any:
        during_embedding.append(_seen_by(client, world.auditor, job_id))
        return embedded(*args, **kwargs)

    monkeypatch.setattr(dpkps_stages, "_embedded", watched)
    seen: list[dict[str, Any]] = []
    worker.stage_hooks.append(lambda *_: seen.append(_seen_by(client, world.auditor, job_id)))

    assert stages.run_sequences(worker, uuid.UUID(job_id)) == "prompting"

    # while the embedding runs, the job names it (not the stage that ended before it)
    [running] = during_embedding
    assert running["stage"] == "embed"
    assert running["current_stage"] == {
        "name": "embed",
        "title": "embedding the vocabulary",
        "number": 3,
        "count": 6,
        "public_work": True,
        "fraction": 0.0,
        "seconds_left": None,  # no work done yet: no rate to go by
        "started_at": None,  # the owner's only
    }
    shown = [job["current_stage"] for job in seen]
    numbers = [stage["number"] for stage in shown]
    assert numbers == sorted(numbers) and set(numbers) == {1, 2, 3, 4, 5}  # k never goes down
    assert {stage["count"] for stage in shown} == {6}
    for stage in shown:
        # a fraction and a time estimate in the public-work stages only
        assert (stage["fraction"] is not None) == (stage["name"] in PUBLIC_WORK), stage
        if stage["name"] not in PUBLIC_WORK:
            assert stage["seconds_left"] is None, stage
        elif stage["fraction"] > 0:
            assert stage["seconds_left"] is not None and stage["seconds_left"] >= 0, stage
    embedding = [s["fraction"] for s in shown if s["name"] == "embed"]
    assert embedding == [0.0, 3 / 8, 6 / 8, 1.0]  # by chunks of Ṽ's phrases, monotone
    sampling = [s["fraction"] for s in shown if s["name"] == "sequences"]
    assert sampling == sorted(sampling) and sampling[-1] == 1.0
    # the private stages show their start and end as the job's progress, nothing between
    for job in seen:
        if job["current_stage"]["name"] not in PUBLIC_WORK:
            assert job["progress"] in (0.0, 1.0)


def test_prompting_shows_its_fraction_and_time_left_and_only_the_owner_sees_times(
    client: TestClient,
    world: factories.World,
    worker: WorkerContext,  # noqa: F811
    db: Database,
) -> None:
    _, job_id = submit(client, world, llm="local")
    assert stages.run_sequences(worker, uuid.UUID(job_id)) == "prompting"
    waiting = _seen_by(client, world.auditor, job_id)["current_stage"]
    assert (waiting["name"], waiting["number"], waiting["count"]) == ("prompts", 6, 6)
    assert (waiting["fraction"], waiting["seconds_left"]) == (0.0, None)

    with db.transaction() as session:  # the prompting task claims the job, one text done
        runner.claim(session, uuid.UUID(job_id))
        runner.save_outcome(session, uuid.UUID(job_id), 0, text="A note.", error=None, attempts=1)

    owner = _seen_by(client, world.owner, job_id)
    stage = owner["current_stage"]
    assert (stage["name"], stage["fraction"]) == ("prompts", 0.25)
    assert stage["seconds_left"] is not None and stage["seconds_left"] >= 0
    assert stage["started_at"] is not None
    assert owner["updated_at"] is not None
    for other in (world.admin, world.auditor):
        seen = _seen_by(client, other, job_id)
        assert seen["current_stage"]["fraction"] == 0.25
        assert seen["current_stage"]["seconds_left"] is not None
        # no time stamp that could time the private stages
        assert seen["current_stage"]["started_at"] is None
        assert (seen["updated_at"], seen["finished_at"]) == (None, None)
        listed = client.get(f"/v1/datasets/{owner['dataset_id']}/jobs", headers=other.headers)
        assert [j["updated_at"] for j in listed.json()] == [None]


def test_a_job_without_llm_has_five_stages_and_none_once_it_succeeded(
    client: TestClient,
    world: factories.World,
    worker: WorkerContext,  # noqa: F811
) -> None:
    _, job_id = submit(client, world)  # llm none: keyphrases are the texts
    seen: list[dict[str, Any]] = []
    worker.stage_hooks.append(lambda *_: seen.append(_seen_by(client, world.admin, job_id)))
    assert stages.run_sequences(worker, uuid.UUID(job_id)) == "succeeded"
    assert {job["current_stage"]["count"] for job in seen} == {5}
    assert seen[-1]["current_stage"]["name"] == "sequences"
    done = _seen_by(client, world.owner, job_id)
    assert (done["state"], done["current_stage"]) == ("succeeded", None)
    assert done["finished_at"] is not None  # the owner sees its own times
    assert _seen_by(client, world.auditor, job_id)["finished_at"] is None


def test_the_terminal_draws_a_bar_per_stage_with_k_of_n_and_no_share_of_private_work() -> None:
    out = io.StringIO()
    bars = StageBars(run_stages("dpkps", llm="local"), file=out)
    for stage, fraction in [
        ("extract", 0.0),
        ("extract", 1.0),
        ("embed", 0.0),
        ("embed", 0.5),
        ("extract", 1.0),  # an earlier stage than the one drawn: not drawn again
        ("embed", 1.0),
    ]:
        bars(stage, fraction)
    bars.prompts(1, 4)
    bars.close()
    lines = out.getvalue().replace("\r", "\n").splitlines()
    extract = [line for line in lines if line.startswith("[1/6] extracting keyphrases")]
    assert extract and not any("%" in line for line in extract)  # time only: no share
    assert extract[-1].endswith("done")
    embed = [line for line in lines if line.startswith("[3/6] embedding the vocabulary")]
    assert any(" 50%|#####     |" in line for line in embed)
    assert "100%|##########|" in embed[-1]
    prompts = [line for line in lines if line.startswith("[6/6] prompting the LLM")]
    assert prompts and " 25%|##5       |" in prompts[-1]
    assert all(not line.startswith("[1/6]") for line in lines[lines.index(embed[0]) :])
