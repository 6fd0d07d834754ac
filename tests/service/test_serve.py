"""``keyseed serve``: the embedded mode for real, as a subprocess.

SQLite in a fresh data folder, kombu's SQLAlchemy transport as the broker (no server),
a real Celery worker, the packaged LLM server and uvicorn; a job with the local LLM for
two documents runs to success over HTTP, the workers' metrics reach ``/metrics``, and
SIGTERM stops every child.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.cli import build_parser
from app.serve import free_port
from tests.service import factories

REPO = Path(__file__).resolve().parents[2]
PHRASES = (
    "chest pain",
    "heart failure",
    "shortness of breath",
    "atrial fibrillation",
    "anticoagulation",
    "fracture",
    "femur",
    "fall",
    "knee",
    "arthritis",
    "joint pain",
)
FOREIGN = ("DATABASE_URL", "REDIS_URL", "PROMETHEUS_MULTIPROC_DIR")


def test_serve_and_demo_are_keyseed_commands() -> None:
    parser = build_parser()
    args = parser.parse_args(["serve", "--port", "9000", "--workers", "2", "--no-llm"])
    assert (args.handler, args.port, args.workers, args.no_llm) == ("app.serve:main", 9000, 2, True)
    assert parser.parse_args(["demo"]).handler == "app.demo:main"


def test_serve_refuses_a_server_database_without_a_document_key(tmp_path: Path) -> None:
    env = _env(tmp_path)
    env["KEYSEED_DATABASE_URL"] = "postgresql://postgres@127.0.0.1:5432/none"
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "serve", "--no-llm"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
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


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    port = free_port()
    log = tmp_path / "serve.log"
    with open(log, "wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve", "--port", str(port)],
            cwd=REPO,
            env=_env(tmp_path),
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=output,
        )
    handle = Server(process, log, f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + 600
        while True:
            assert process.poll() is None, f"keyseed serve exited:\n{handle.text()[-3000:]}"
            assert time.monotonic() < deadline, f"not ready in 10 minutes:\n{handle.text()[-3000:]}"
            try:
                if httpx.get(f"{handle.base}/readyz", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        yield handle
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=240)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _bootstrap(tmp_path: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "admin", "bootstrap"],
        cwd=REPO,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def _ok(response: httpx.Response, status: int) -> Any:
    assert response.status_code == status, response.text
    return response.json()


@pytest.mark.slow
@pytest.mark.llm
def test_the_embedded_service_runs_a_job_with_the_local_llm(server: Server, tmp_path: Path) -> None:
    started = time.monotonic()
    data = tmp_path / "data"
    assert {p.name for p in data.iterdir()} >= {"keyseed.sqlite3", "broker.sqlite3", "data.key"}
    http = httpx.Client(base_url=server.base, timeout=120)
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
    owner = keys["owner"]
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
            files={"file": ("phrases.txt", "\n".join(PHRASES).encode())},
        ),
        201,
    )
    spec = factories.spec(
        vocabulary=vocabulary["id"],
        llm="local",
        per_class=1,
        vocabulary_size=8,
        sequence_length=3,
        num_features=64,
    )
    job = _ok(http.post(f"/v1/datasets/{dataset['id']}/jobs", headers=owner, json=spec), 202)
    deadline = time.monotonic() + 900
    while job["state"] in ("queued", "running"):
        assert time.monotonic() < deadline, f"the job is still {job['state']}"
        time.sleep(0.5)
        job = _ok(http.get(f"/v1/jobs/{job['id']}", headers=owner), 200)
    assert job["state"] == "succeeded", (job, server.text()[-4000:])
    assert job["counts"]["texts_done"] == 2 and job["epsilon"]["budget_state"] == "committed"

    release = _ok(
        http.post(
            f"/v1/jobs/{job['id']}/release",
            headers=owner,
            json={"client_organisations": [orgs["client"]]},
        ),
        201,
    )
    download = http.get(f"/v1/releases/{release['id']}/download", headers=keys["client"])
    assert download.status_code == 200
    lines = download.text.splitlines()
    assert len(lines) == 2 and all('"text": "' in line for line in lines)
    budget = _ok(http.get(f"/v1/datasets/{dataset['id']}", headers=owner), 200)["budget"]
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
