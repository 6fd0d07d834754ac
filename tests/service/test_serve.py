"""``keyseed serve``: the embedded mode for real, as a subprocess.

SQLite in a fresh data folder, kombu's SQLAlchemy transport as the broker (no server),
a real Celery worker, the packaged LLM server and uvicorn; a job with the local LLM for
two documents runs to success over HTTP, the workers' metrics reach ``/metrics``, and
SIGTERM stops every child.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.cli import build_parser
from app.serve import Child, Supervisor, free_port
from tests.fake_llm import FakeLLM
from tests.service import factories

REPO = Path(__file__).resolve().parents[2]
FOREIGN = ("DATABASE_URL", "REDIS_URL", "PROMETHEUS_MULTIPROC_DIR")


def test_serve_and_demo_are_keyseed_commands() -> None:
    parser = build_parser()
    args = parser.parse_args(["serve", "--port", "9000", "--workers", "2", "--no-llm"])
    assert (args.handler, args.port, args.workers, args.no_llm) == ("app.serve:main", 9000, 2, True)
    assert parser.parse_args(["demo"]).handler == "app.demo:main"


def test_serve_refuses_a_server_database_without_a_document_key(tmp_path: Path) -> None:
    env = _env(tmp_path)
    env["KEYSEED_DATABASE_URL"] = "postgresql://postgres@127.0.0.1:5432/none"
    done = factories.keyseed("serve", "--no-llm", env=env)
    assert done.returncode == 2 and "KEYSEED_DATA_KEY" in done.stderr


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEYSEED_") and k not in FOREIGN}
    env.update(
        KEYSEED_DATA_DIR=str(tmp_path / "data"),
        KEYSEED_CACHE_DIR=str(tmp_path / "cache"),
        KEYSEED_LLM_MAX_TOKENS="48",
        KEYSEED_PROGRESS_INTERVAL="0.5",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    return env


class Server:
    def __init__(self, process: subprocess.Popen[bytes], log: Path, base: str) -> None:
        self.process = process
        self.log = log
        self.base = base

    def text(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def children(self) -> dict[str, int]:
        return {
            name: int(pid)
            for name, pid in re.findall(r"keyseed serve: started (.+?) \(pid (\d+)\)", self.text())
        }


@contextlib.contextmanager
def serving(tmp_path: Path, *args: str, **env: str) -> Iterator[Server]:
    """``keyseed serve ARGS`` on a fresh data folder, once its API is ready; SIGTERM at
    the end."""
    port = free_port()
    log = tmp_path / "serve.log"
    with open(log, "wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve", "--port", str(port), *args],
            cwd=REPO,
            env={**_env(tmp_path), **env},
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=output,
        )
    handle = Server(process, log, f"http://127.0.0.1:{port}")

    def ready() -> bool:
        assert process.poll() is None, f"keyseed serve exited:\n{handle.text()[-3000:]}"
        return factories.http_ok(f"{handle.base}/readyz")

    try:
        factories.wait_for(
            ready, lambda: f"ready:\n{handle.text()[-3000:]}", timeout=600, interval=0.5
        )
        yield handle
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=240)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    with serving(tmp_path) as handle:
        yield handle


def _bootstrap(tmp_path: Path) -> str:
    done = factories.keyseed("admin", "bootstrap", env=_env(tmp_path), timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def _ok(response: httpx.Response, status: int) -> Any:
    assert response.status_code == status, response.text
    return response.json()


@dataclass(frozen=True)
class Tenants:
    admin: dict[str, str]  # the Authorization header of each key
    owner: dict[str, str]
    client: dict[str, str]
    client_organisation: str


def _tenants(http: httpx.Client, tmp_path: Path) -> Tenants:
    """A bootstrapped admin, and an owner and a client organisation with a key each."""
    admin = {"Authorization": f"Bearer {_bootstrap(tmp_path)}"}
    keys: dict[str, dict[str, str]] = {}
    orgs: dict[str, str] = {}
    for kind in ("owner", "client"):
        org = _ok(
            http.post("/v1/organisations", headers=admin, json={"name": kind, "kind": kind}), 201
        )
        key = _ok(
            http.post("/v1/keys", headers=admin, json={"role": kind, "organisation_id": org["id"]}),
            201,
        )
        orgs[kind], keys[kind] = org["id"], {"Authorization": f"Bearer {key['key']}"}
    return Tenants(admin, keys["owner"], keys["client"], orgs["client"])


def _submit_job(http: httpx.Client, owner: dict[str, str], *, llm: str) -> tuple[str, Any]:
    """Upload the factories' corpus and a vocabulary, submit a job of two documents with
    ``llm``; the dataset's id and the job."""
    dataset = _ok(
        http.post(
            "/v1/datasets",
            headers=owner,
            data={
                "name": "notes",
                "text_column": ["text"],
                "label_column": "label",
                "labels": list(factories.LABELS),
                "epsilon_cap": "5",
            },
            files={"file": ("notes.csv", factories.csv_bytes(factories.ROWS))},
        ),
        201,
    )
    vocabulary = _ok(
        http.post(
            "/v1/vocabularies",
            headers=owner,
            data={"name": "cardio-ortho"},
            files={"file": ("phrases.txt", "\n".join(factories.PHRASES).encode())},
        ),
        201,
    )
    spec = factories.spec(
        vocabulary=vocabulary["id"],
        llm=llm,
        per_class=1,
        vocabulary_size=8,
        sequence_length=3,
        num_features=64,
    )
    job = _ok(http.post(f"/v1/datasets/{dataset['id']}/jobs", headers=owner, json=spec), 202)
    return str(dataset["id"]), job


def _until_ended(http: httpx.Client, owner: dict[str, str], job: Any) -> Any:
    """The job as it stands once it has ended."""

    def ended() -> Any:
        latest = _ok(http.get(f"/v1/jobs/{job['id']}", headers=owner), 200)
        return None if latest["state"] in ("queued", "running") else latest

    return factories.wait_for(ended, "the job ends", timeout=900, interval=0.5)


@pytest.mark.slow
@pytest.mark.llm
def test_the_embedded_service_runs_a_job_with_the_local_llm(server: Server, tmp_path: Path) -> None:
    started = time.monotonic()
    data = tmp_path / "data"
    assert {p.name for p in data.iterdir()} >= {"keyseed.sqlite3", "broker.sqlite3", "data.key"}
    http = httpx.Client(base_url=server.base, timeout=120)
    tenants = _tenants(http, tmp_path)
    admin, owner, client = tenants.admin, tenants.owner, tenants.client
    dataset_id, job = _submit_job(http, owner, llm="local")
    job = _until_ended(http, owner, job)
    assert job["state"] == "succeeded", (job, server.text()[-4000:])
    assert job["counts"]["texts_done"] == 2 and job["epsilon"]["budget_state"] == "committed"

    release = _ok(
        http.post(
            f"/v1/jobs/{job['id']}/release",
            headers=owner,
            json={"client_organisations": [tenants.client_organisation]},
        ),
        201,
    )
    download = http.get(f"/v1/releases/{release['id']}/download", headers=client)
    assert download.status_code == 200
    lines = download.text.splitlines()
    assert len(lines) == 2 and all('"text": "' in line for line in lines)

    # what the LLM saw: the command the report prints checks the log over HTTP
    attested = _ok(http.get(f"/v1/releases/{release['id']}/report", headers=client), 200)
    attested = attested["prompt_log"]
    assert attested["recorded"] and attested["prompts"] == 2
    command = attested["verify"].replace("<server>", server.base).split()
    assert command[:2] == ["keyseed", "verify-prompts"]
    key = client["Authorization"].removeprefix("Bearer ")
    verified = factories.keyseed(
        *command[1:], env={**_env(tmp_path), "PYTHONPATH": str(REPO), "KEYSEED_API_KEY": key}
    )
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "rendered again from their inputs and identical: 2" in verified.stdout
    budget = _ok(http.get(f"/v1/datasets/{dataset_id}", headers=owner), 200)["budget"]
    assert (budget["spent"], budget["reserved"], budget["remaining"]) == (1.0, 0.0, 4.0)

    # what the worker process counted is on the API's /metrics (one folder for all)
    metrics = http.get("/metrics", headers=admin).text
    assert 'keyseed_job_stage_duration_seconds_count{stage="prompts"}' in metrics
    assert 'stage="dp_kde"' not in metrics  # a private stage is not timed
    assert 'keyseed_llm_calls_total{endpoint="local",outcome="ok"} 2.0' in metrics
    assert 'keyseed_worker_epsilon_committed_total{mechanism="kde"} 0.5' in metrics
    http.close()
    print(f"embedded job in {time.monotonic() - started:.1f} s")

    # SIGTERM stops the children, in order, and nothing of them is left
    children = server.children()
    assert set(children) == {"local LLM", "worker", "API"}
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(timeout=240) == 0
    assert "keyseed serve: stopped" in server.text()
    for pid in children.values():
        with pytest.raises(ProcessLookupError):
            os.killpg(pid, 0)  # the child's whole process group is gone


# ------------------------------------------------------------------ restarts


def _gone(pid: int) -> bool:
    """Whether nothing of process ``pid`` is left (a zombie counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state == "Z"


def _pool(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


# a main process with a child of its own in its group, as a Celery worker and its pool
WITH_A_CHILD = (
    "import subprocess, sys, time; "
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
    "time.sleep(600)"
)


def test_a_child_whose_main_process_dies_is_started_again_after_a_back_off(
    capsys: pytest.CaptureFixture[str],
) -> None:
    supervisor = Supervisor(dict(os.environ), backoff_base=0.5, backoff_max=0.5)
    child = supervisor.start("sleeper", [sys.executable, "-c", WITH_A_CHILD], grace=5.0)
    try:
        first = child.pid
        factories.wait_for(lambda: _pool(first), "the child starts its own child", timeout=30)
        [grandchild] = _pool(first)
        os.kill(first, signal.SIGKILL)
        killed = time.monotonic()
        factories.wait_for(
            lambda: supervisor.check() is None and child.pid != first, "a restart", timeout=30
        )
        assert time.monotonic() - killed >= 0.5  # the back-off
        assert child.alive() and _gone(first)
        factories.wait_for(
            lambda: _gone(grandchild), "what was left of the dead child's group goes", timeout=10
        )
        said = capsys.readouterr().err
        assert f"sleeper (pid {first}) exited with status -9; restarting it in 0.5 s" in said
        assert f"started sleeper (pid {child.pid})" in said
    finally:
        supervisor.stop_all()
    assert _gone(child.pid)


def test_a_crash_loop_is_given_up_after_the_restarts_allowed_a_minute(
    capsys: pytest.CaptureFixture[str],
) -> None:
    supervisor = Supervisor(dict(os.environ), backoff_base=0.01, backoff_max=0.04, max_restarts=3)
    child = supervisor.start("crasher", [sys.executable, "-c", "raise SystemExit(3)"])
    given_up: list[Child] = []

    def gave_up() -> bool:
        dead = supervisor.check()
        given_up.extend([dead] if dead is not None else [])
        return dead is not None

    try:
        factories.wait_for(gave_up, "the supervisor gives the crash loop up", timeout=60)
    finally:
        supervisor.stop_all()
    assert given_up == [child] and len(child.restarted) == 3
    said = capsys.readouterr().err
    assert said.count("started crasher") == 4  # the start and 3 restarts
    delays = re.findall(r"exited with status 3; restarting it in ([\d.]+) s", said)
    assert delays == ["0.01", "0.02", "0.04"]  # doubling, capped
    assert "exited with status 3, after 3 restarts within 60 s; giving up" in said


@pytest.mark.slow
def test_the_embedded_worker_is_restarted_when_its_main_process_dies(tmp_path: Path) -> None:
    """Issue 65: a killed worker main process no longer stops the embedded service; a new
    worker comes up and runs the next job."""
    with FakeLLM() as llm:
        endpoints = {"fake": {"base_url": llm.base_url, "model": llm.model}}
        with serving(tmp_path, "--no-llm", KEYSEED_LLM_ENDPOINTS=json.dumps(endpoints)) as server:
            first = server.children()["worker"]
            factories.wait_for(
                lambda: server.text().count(" ready.") == 1, "the worker is ready", timeout=300
            )
            pool = _pool(first)
            assert pool, "the worker has no pool process"
            os.kill(first, signal.SIGKILL)  # its main process alone, as the OOM killer would

            factories.wait_for(
                lambda: server.children()["worker"] != first, "a new worker is started", timeout=60
            )
            assert f"worker (pid {first}) exited with status -9; restarting it in 1 s" in (
                server.text()
            )
            factories.wait_for(
                lambda: all(map(_gone, [first, *pool])), "the old worker is gone", timeout=30
            )
            factories.wait_for(
                lambda: server.text().count(" ready.") == 2, "the new worker is ready", timeout=300
            )

            http = httpx.Client(base_url=server.base, timeout=120)
            owner = _tenants(http, tmp_path).owner
            _, job = _submit_job(http, owner, llm="fake")
            job = _until_ended(http, owner, job)
            assert job["state"] == "succeeded", (job, server.text()[-4000:])
            assert job["counts"]["texts_done"] == 2 == len(llm.chat_requests)
            assert server.process.poll() is None
            http.close()
