"""``keyseed demo`` (``make demo``): the main job end to end, over HTTP, as its three kinds
of user would run it, on the embedded default.

1. a fresh data folder (``./out/demo``, an old one is removed) and ``keyseed serve`` in
   the background (SQLite, serverless broker, a real worker, the packaged LLM);
2. the platform admin's first key (``keyseed admin bootstrap``), then, as the admin, a
   hospital (data owner), a research lab (client) and a key for each;
3. as the hospital: upload the public HPO sample corpus (phenotype definitions labelled
   by organ system; redistributable, see ``workers/samples.py``) with its labels
   declared and a budget cap, submit a job with the packaged LLM, follow its progress,
   release the result to the lab;
4. as the lab: list and download the release (JSONL);
5. the privacy ledger of the dataset and where the corpus was saved; the server stops.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx

HANDLER = "app.demo"
DEFAULT_OUT = Path("out/demo")
CAP = 10.0
DELTA_CAP = 1e-6  # the whole of a new organisation's default δ budget
EPSILON = 1.0  # the default total budget README recommends
DELTA = 1e-6
# Variables that would point the demo at another deployment: the demo is self-contained.
FOREIGN = (
    "DATABASE_URL",
    "REDIS_URL",
    "KEYSEED_DATABASE_URL",
    "KEYSEED_BROKER_URL",
    "KEYSEED_REDIS_URL",
    "KEYSEED_DATA_KEY",
    "KEYSEED_DATA_KEY_FILE",
    "KEYSEED_LOCAL_LLM_URL",
    "PROMETHEUS_MULTIPROC_DIR",
)


def register(subparsers: Any) -> None:
    demo = subparsers.add_parser(
        "demo", help="run the main job end to end over HTTP on the embedded service"
    )
    demo.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder (./out/demo)")
    demo.add_argument("--per-class", type=int, default=2, help="synthetic documents per label (2)")
    demo.set_defaults(handler=f"{HANDLER}:main")


class DemoError(Exception):
    pass


def _section(title: str) -> None:
    print(f"\n== {title}", flush=True)


def _line(text: str = "") -> None:
    print(f"   {text}" if text else "", flush=True)


def _check(response: httpx.Response, expected: int) -> Any:
    if response.status_code != expected:
        raise DemoError(
            f"{response.request.method} {response.request.url.path} answered "
            f"{response.status_code}: {response.text[:500]}"
        )
    media = response.headers.get("content-type", "").split(";")[0].strip()
    if media in ("application/json", "application/problem+json"):
        return response.json()
    return response.text


def _free_port() -> int:
    from app.serve import free_port

    return free_port()


class Demo:
    def __init__(self, out: Path, per_class: int) -> None:
        self.out = out.resolve()
        self.per_class = per_class
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.env = {k: v for k, v in os.environ.items() if k not in FOREIGN}
        self.env.update(
            KEYSEED_DATA_DIR=str(self.out / "data"),
            KEYSEED_LOG_JSON="true",
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
        )
        self.server: subprocess.Popen[bytes] | None = None
        self.http = httpx.Client(base_url=self.base, timeout=120.0)

    # ------------------------------------------------------------- the server

    def start_server(self) -> None:
        _section("Starting the embedded service (keyseed serve)")
        log = open(self.out / "serve.log", "wb")  # noqa: SIM115 (closed with the process)
        self.server = subprocess.Popen(  # noqa: S603 (our own interpreter and arguments)
            [sys.executable, "-m", "app.cli", "serve", "--port", str(self.port)],
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
        log.close()
        started = time.monotonic()
        while time.monotonic() - started < 600:
            if self.server.poll() is not None:
                raise DemoError(f"keyseed serve exited with status {self.server.returncode}")
            try:
                if self.http.get("/readyz", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            raise DemoError("the service did not become ready within 10 minutes")
        _line(f"ready at {self.base} after {time.monotonic() - started:.1f} s")
        _line(f"data folder {self.out / 'data'} (SQLite, serverless broker, document key)")
        _line(f"server log {self.out / 'serve.log'}")

    def stop_server(self) -> None:
        if self.server is None or self.server.poll() is not None:
            return
        _section("Stopping the service")
        self.server.send_signal(signal.SIGTERM)
        try:
            self.server.wait(timeout=180)
        except subprocess.TimeoutExpired:
            self.server.kill()
            self.server.wait()
        _line(f"stopped (status {self.server.returncode})")

    def tail(self, lines: int = 30) -> str:
        path = self.out / "serve.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    # ------------------------------------------------------------- the people

    def bootstrap(self) -> str:
        _section("Platform admin: the first admin key")
        done = subprocess.run(
            [sys.executable, "-m", "app.cli", "admin", "bootstrap"],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if done.returncode != 0 or not done.stdout.strip():
            raise DemoError(f"keyseed admin bootstrap failed: {done.stderr.strip()[-500:]}")
        key = done.stdout.strip().splitlines()[-1]
        _line(f"keyseed admin bootstrap → {key[:12]}… (shown once)")
        return key

    def organisations(self, admin: str) -> tuple[str, str, str, str]:
        _section("Platform admin: organisations and their keys")
        headers = {"Authorization": f"Bearer {admin}"}
        made: dict[str, tuple[str, str]] = {}
        for kind, name in (("owner", "St Elsewhere Hospital"), ("client", "Example Research Lab")):
            organisation = _check(
                self.http.post(
                    "/v1/organisations", headers=headers, json={"name": name, "kind": kind}
                ),
                201,
            )
            key = _check(
                self.http.post(
                    "/v1/keys",
                    headers=headers,
                    json={"role": kind, "organisation_id": organisation["id"], "name": "demo"},
                ),
                201,
            )
            made[kind] = (organisation["id"], key["key"])
            _line(f"{name} ({kind}) {organisation['id']}, key {key['prefix']}")
        return made["owner"][0], made["owner"][1], made["client"][0], made["client"][1]

    def upload(self, owner: str, corpus: Path) -> tuple[str, list[str]]:
        _section("Hospital: upload the (public) HPO sample corpus as its private dataset")
        with open(corpus, encoding="utf-8", newline="") as handle:
            labels = sorted({row["label"] for row in csv.DictReader(handle)})
        with open(corpus, "rb") as handle:
            dataset = _check(
                self.http.post(
                    "/v1/datasets",
                    headers={"Authorization": f"Bearer {owner}"},
                    data={
                        "name": "HPO definitions by organ system",
                        "text_column": ["text"],
                        "label_column": "label",
                        "labels": labels,
                        "epsilon_cap": str(CAP),
                        "delta_cap": str(DELTA_CAP),
                    },
                    files={"file": (corpus.name, handle, "text/csv")},
                ),
                201,
            )
        _line(f"dataset {dataset['id']}: {dataset['documents']} documents, sealed at rest")
        _line(f"declared labels: {', '.join(labels)}")
        _line(f"budget cap ε = {dataset['budget']['epsilon_cap']:g}")
        return dataset["id"], labels

    def run_job(self, owner: str, dataset_id: str, labels: list[str]) -> dict[str, Any]:
        _section("Hospital: submit a DP-KPS job (local LLM) and follow it")
        headers = {"Authorization": f"Bearer {owner}"}
        # The default a user should copy: a total (ε, δ), split by the engine among its
        # releases (Gaussian noise since δ > 0); every other parameter at its default.
        spec = {
            "vocabulary": "medical",
            "llm": "local",
            "document_type": "short clinical definition of a phenotype",
            "epsilon": EPSILON,
            "delta": DELTA,
            "per_class": self.per_class,
        }
        job = _check(
            self.http.post(f"/v1/datasets/{dataset_id}/jobs", headers=headers, json=spec), 202
        )
        by_mechanism = ", ".join(f"{k} {v:g}" for k, v in job["epsilon"]["by_mechanism"].items())
        _line(f"job {job['id']} queued: ε = {job['epsilon']['requested']:g} ({by_mechanism})")
        _line(f"reserved against the cap; {self.per_class * len(labels)} documents to write")
        started, shown = time.monotonic(), None
        while job["state"] in ("queued", "running"):
            if time.monotonic() - started > 1800:
                raise DemoError("the job did not finish within 30 minutes")
            time.sleep(1.0)
            job = _check(self.http.get(f"/v1/jobs/{job['id']}", headers=headers), 200)
            counts = job["counts"]
            stage = job.get("current_stage") or {}
            fraction = stage.get("fraction")
            now = (job["state"], stage.get("name"), round((fraction or 0) * 10))
            if now != shown:
                shown = now
                where = ""
                if stage:
                    where = f" · stage {stage['number']} of {stage['count']}: {stage['title']}"
                    if fraction is not None and stage.get("public_work"):
                        where += f" {fraction:.0%}"
                    if stage.get("seconds_left") is not None:
                        where += f", about {stage['seconds_left']:.0f} s left"
                texts = f" · texts {counts['texts_done']}/{counts['sequences']}"
                _line(
                    f"[{time.monotonic() - started:6.1f} s] {job['state']}{where}"
                    + (texts if counts["sequences"] else "")
                    + f" · budget {job['epsilon']['budget_state']}"
                )
        if job["state"] != "succeeded":
            error = job.get("error") or {}
            raise DemoError(f"the job ended {job['state']}: {error.get('message')}")
        calls = job["counts"]["llm_calls"]
        _line(f"succeeded in {time.monotonic() - started:.1f} s, {calls} LLM calls")
        return dict(job)

    def release(self, owner: str, job_id: str, client_org: str) -> dict[str, Any]:
        _section("Hospital: release the synthetic corpus to the research lab")
        release = _check(
            self.http.post(
                f"/v1/jobs/{job_id}/release",
                headers={"Authorization": f"Bearer {owner}"},
                json={"client_organisations": [client_org], "name": "HPO synthetic sample"},
            ),
            201,
        )
        _line(f"release {release['id']}: {release['documents']} documents")
        return dict(release)

    def download(self, client: str, release_id: str) -> Path:
        _section("Research lab: list and download what was released to it")
        headers = {"Authorization": f"Bearer {client}"}
        listed = _check(self.http.get("/v1/releases", headers=headers), 200)
        _line(f"{len(listed)} release(s) granted: " + ", ".join(r["name"] for r in listed))
        response = self.http.get(
            f"/v1/releases/{release_id}/download", params={"format": "jsonl"}, headers=headers
        )
        body = _check(response, 200)
        path = self.out / "synthetic.jsonl"
        path.write_text(body, encoding="utf-8")
        records = [json.loads(line) for line in body.splitlines() if line.strip()]
        _line(f"{len(records)} documents → {path}")
        for record in records[:3]:
            _line()
            _line(f"[{record['label']}] keyphrases: {', '.join(record['keyphrases'])}")
            for part in textwrap.wrap(record["text"] or "", width=88)[:4]:
                _line(f"    {part}")
        return path

    def ledger(self, owner: str, dataset_id: str) -> None:
        _section("Hospital: the dataset's privacy ledger")
        ledger = _check(
            self.http.get(
                f"/v1/datasets/{dataset_id}/ledger", headers={"Authorization": f"Bearer {owner}"}
            ),
            200,
        )
        budget = ledger["budget"]
        _line(
            f"cap ε = {budget['epsilon_cap']:g} · spent {budget['spent']:g} · reserved "
            f"{budget['reserved']:g} · remaining {budget['remaining']:g}"
        )
        _line(f"accountant: {budget['accountant']}")
        for entry in ledger["entries"]:
            mechanisms = ", ".join(f"{k} {v:g}" for k, v in entry["epsilon_by_mechanism"].items())
            _line(
                f"#{entry['id']} {entry['kind']:<8} ε = {entry['epsilon']:g} ({mechanisms}) "
                f"job {entry['job_id'][:8]} by {entry['actor']} at {entry['created_at'][:19]}"
            )

    @staticmethod
    def manifest(release: dict[str, Any], path: Path) -> None:
        manifest = release["manifest"]
        privacy = manifest["privacy"]
        path.write_text(json.dumps(manifest, indent=2), encoding="utf-8")
        _section("The release's manifest")
        _line(manifest["method"])
        _line(
            f"ε charged {privacy['epsilon_charged']:g} (δ = {privacy['delta']:g}), by mechanism "
            + ", ".join(f"{k} {v:g}" for k, v in privacy["epsilon_by_mechanism"].items())
        )
        models = manifest["models"]
        llm = models["llm"]
        _line(
            f"embedding model {models['embedding']['name']}; LLM {llm['endpoint']}"
            + (f" ({llm['model']})" if llm["model"] else "")
        )
        _line(f"→ {path}")

    # ------------------------------------------------------------- all of it

    def run(self) -> int:
        from workers.samples import PRIVATE_FILE, attribution, build_hpo_sample

        began = time.monotonic()
        if self.out.exists():
            shutil.rmtree(self.out)
        self.out.mkdir(parents=True)
        _section("Sample corpus")
        build_hpo_sample(self.out / "sample")
        corpus = self.out / "sample" / PRIVATE_FILE
        _line(f"{corpus} (and a held-out test split beside it)")
        for line in textwrap.wrap(" ".join(attribution().split()), width=88)[:3]:
            _line(line)
        try:
            self.start_server()
            admin = self.bootstrap()
            _, owner, client_org, client = self.organisations(admin)
            dataset_id, labels = self.upload(owner, corpus)
            job = self.run_job(owner, dataset_id, labels)
            release = self.release(owner, job["id"], client_org)
            path = self.download(client, release["id"])
            self.ledger(owner, dataset_id)
            self.manifest(release, self.out / "manifest.json")
        except (DemoError, httpx.HTTPError) as exc:
            print(f"\ndemo failed: {exc}", file=sys.stderr)
            print(f"--- last lines of {self.out / 'serve.log'} ---\n{self.tail()}", file=sys.stderr)
            return 1
        finally:
            self.http.close()
            self.stop_server()
        _section("Done")
        _line(f"synthetic corpus: {path}")
        _line(f"wall time {time.monotonic() - began:.0f} s")
        return 0


def main(args: argparse.Namespace | None = None) -> int:
    if args is None:
        parser = argparse.ArgumentParser(prog="python -m app.demo")
        sub = parser.add_subparsers()
        register(sub)
        args = parser.parse_args(["demo", *sys.argv[1:]])
    if args.per_class < 1:
        print("--per-class must be at least 1", file=sys.stderr)
        return 2
    return Demo(args.out, args.per_class).run()


if __name__ == "__main__":
    sys.exit(main())
