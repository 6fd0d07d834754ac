"""The prompt log of a job (issue 66, item 4): recorded as the worker prompts, served with
the release, tied to the report by its head hash and checked by ``keyseed verify-prompts``
run as a subprocess, as a reader of the report would."""

from __future__ import annotations

import json
import subprocess
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from app.config import Settings
from app.db import Database
from app.jobs import repository as jobs_repo
from app.jobs import runner, stages
from app.jobs.recovery import LeaseLost
from app.jobs.stages import WorkerContext
from app.models import utcnow
from tests.fake_llm import FakeLLM
from tests.service import factories
from tests.service.method_jobs import check_prompt_log, llm_worker, prompt_log
from tests.service.test_worker import saved_sequences, submit
from workers.llm.attestation import GENESIS, Prompt, read_jsonl

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def worker(app: FastAPI, settings: Settings, tmp_path: Path, fake_llm: FakeLLM) -> WorkerContext:
    return llm_worker(app, settings, tmp_path / "cache", fake_llm, llm_max_retries=2)


def verify_prompts(*args: str) -> subprocess.CompletedProcess[str]:
    """``keyseed verify-prompts ARGS…`` with nothing of the service's environment."""
    return factories.keyseed(
        "verify-prompts", *args, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    )


def test_a_jobs_prompts_are_logged_once_served_and_verified_against_the_report(
    client: TestClient,
    world: factories.World,
    worker: WorkerContext,
    fake_llm: FakeLLM,
    db: Database,
    tmp_path: Path,
) -> None:
    _, job_id = submit(client, world, llm="vllm")
    assert stages.run_sequences(worker, uuid.UUID(job_id)) == "prompting"
    fake_llm.script("500", "429:0", "401")  # one prompt fails for good: the job fails
    assert stages.run_prompts(worker, uuid.UUID(job_id)) == "failed"
    before = check_prompt_log(db, job_id, fake_llm)
    assert len(before) == 4  # every prompt recorded once, though 6 calls were made

    retried = client.post(f"/v1/jobs/{job_id}/retry", headers=world.owner.headers)
    assert retried.status_code == 202, retried.text
    assert stages.run_prompts(worker, uuid.UUID(job_id)) == "succeeded"
    assert len(fake_llm.chat_requests) == 7  # the failed prompt was sent again
    logged = check_prompt_log(db, job_id, fake_llm)
    assert logged == before  # the retry neither forked nor lengthened the chain
    drawn = saved_sequences(db, job_id)
    # one record per released sequence, in position order, built from it
    assert [line["key"] for line in logged] == [f"dpkps/sequence/{p}" for p, _, _ in drawn]
    assert [line["content"]["inputs"]["keyphrases"] for line in logged] == [
        phrases for _, _, phrases in drawn
    ]
    assert all(line["refs"]["model"] == fake_llm.model for line in logged)

    release_id = factories.release(client, world, job_id)["id"]
    report = client.get(f"/v1/releases/{release_id}/report", headers=world.client.headers)
    attested = report.json()["prompt_log"]
    assert attested["recorded"] is True and attested["prompts"] == 4
    assert attested["head"] == logged[-1]["hash"]
    assert attested["log"] == f"/v1/releases/{release_id}/prompts"
    assert f"--head {attested['head']}" in attested["verify"]
    html = client.get(
        f"/v1/releases/{release_id}/report", params={"format": "html"}, headers=world.client.headers
    )
    assert attested["head"] in html.text and "keyseed verify-prompts" in html.text

    path = f"/v1/releases/{release_id}/prompts"
    served = client.get(path, headers=world.client.headers)
    assert served.status_code == 200
    assert served.headers["content-type"].startswith("application/x-ndjson")
    assert read_jsonl(served.text) == logged
    log_file = tmp_path / "prompts.jsonl"
    log_file.write_text(served.text, encoding="utf-8")
    download = client.get(f"/v1/releases/{release_id}/download", headers=world.client.headers)
    release_file = tmp_path / "release.jsonl"
    release_file.write_text(download.text, encoding="utf-8")

    done = verify_prompts(str(log_file), "--head", attested["head"], "--release", str(release_file))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "OK: the chain is intact and ends on the report's head" in done.stdout
    assert "rendered again from their inputs and identical: 4" in done.stdout

    # a prompt edited after the fact: the verifier names the record and fails
    line = json.loads(served.text.splitlines()[2])
    phrase = line["content"]["inputs"]["keyphrases"][0]
    tampered = served.text.replace(json.dumps(phrase), json.dumps(phrase + "s"), 1)
    log_file.write_text(tampered, encoding="utf-8")
    broken = verify_prompts(str(log_file), "--head", attested["head"])
    assert broken.returncode == 1
    assert "BROKEN" in broken.stdout and "dpkps/sequence/" in broken.stdout

    # platform roles: the chain and the digests, no prompt in clear; it verifies the same
    platform = client.get(path, headers=world.auditor.headers)
    assert platform.status_code == 200
    records = read_jsonl(platform.text)
    assert [r["hash"] for r in records] == [r["hash"] for r in logged]
    assert all("content" not in r for r in records)
    log_file.write_text(platform.text, encoding="utf-8")
    assert verify_prompts(str(log_file), "--head", attested["head"]).returncode == 0
    # whoever may not read the report may not read the log
    assert client.get(path, headers=world.other_owner.headers).status_code == 404


def test_a_job_without_an_llm_attests_that_no_prompt_was_sent(
    client: TestClient, world: factories.World, worker: WorkerContext
) -> None:
    _, job_id = submit(client, world, llm="none")
    assert stages.run_sequences(worker, uuid.UUID(job_id)) == "succeeded"
    release_id = factories.release(client, world, job_id)["id"]
    report = client.get(f"/v1/releases/{release_id}/report", headers=world.owner.headers).json()
    assert report["prompt_log"]["prompts"] == 0 and report["prompt_log"]["head"] == GENESIS
    assert "No LLM was used" in report["prompt_log"]["in_words"]
    served = client.get(f"/v1/releases/{release_id}/prompts", headers=world.owner.headers)
    assert served.status_code == 200 and served.text == ""


def test_a_process_that_lost_the_job_records_nothing(
    client: TestClient, world: factories.World, worker: WorkerContext, db: Database
) -> None:
    _, job_id = submit(client, world, llm="vllm")
    assert stages.run_sequences(worker, uuid.UUID(job_id)) == "prompting"
    prompt = Prompt("test/0", "test", [{"role": "user", "content": "x"}])
    holder = "worker-7.example:2:1"  # a process of another machine, alive for an hour
    with db.transaction() as session:
        job = jobs_repo.get(session, uuid.UUID(job_id), for_update=True)
        assert job is not None
        job.worker_id = holder
        jobs_repo.renew_worker(session, holder, utcnow() + timedelta(hours=1))
    with pytest.raises(LeaseLost), db.transaction() as session:
        runner.append_prompts(session, uuid.UUID(job_id), [prompt])
    with pytest.raises(LeaseLost):
        stages.JobPromptLog(db, uuid.UUID(job_id)).append([prompt])
    assert prompt_log(db, job_id) == []
