"""``keyseed serve``: the whole service on one machine, with nothing else to install.

By default (no ``DATABASE_URL``) everything lives in the data folder
(``KEYSEED_DATA_DIR``, default ``./var``): the SQLite database, the Celery broker (kombu's
SQLAlchemy transport on a second SQLite file: no broker server), the document key and
the metrics of every process. With ``DATABASE_URL`` and ``REDIS_URL`` set, the same
command runs on Postgres and Redis instead (and needs ``KEYSEED_DATA_KEY``).

It brings the schema up to date, then supervises three children, each in its own
process group:

* the packaged LLM server (``python -m workers.llm.local``; ``--no-llm`` leaves it
  out, and a job naming the ``local`` LLM then starts one for its prompting);
* a real Celery worker on every queue (``--workers`` processes);
* the API (``keyseed api``: uvicorn with the settings' limits; ``--host``, ``--port``).

A child that dies (its main process killed by the OOM killer, say) is started again with
the same command after a back-off (1 s, doubling up to 30 s), and the restart is logged; a
job its worker was running is taken up again by the new worker (``app.jobs.recovery``).
A child that dies a sixth time within a minute is a crash loop, not a mishap: the others
are stopped too and the command exits with status 1, for whoever runs the service to see.
SIGINT or SIGTERM stops them in order (API, worker, LLM), each first asked politely and
killed after a grace period.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any

HANDLER = "app.serve"
QUEUES = "cpu,gpu,llm"


def register(subparsers: Any) -> None:
    serve = subparsers.add_parser(
        "serve",
        help="run the API, a worker and the local LLM on this machine",
        description="Run the API, a Celery worker and the packaged LLM on this machine "
        "(SQLite and a serverless broker unless DATABASE_URL and REDIS_URL are set).",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address of the API (127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port of the API (8000)")
    serve.add_argument(
        "--workers", type=int, default=1, help="worker processes running job tasks (1)"
    )
    serve.add_argument(
        "--no-llm",
        action="store_true",
        help="do not run the packaged LLM server (jobs naming 'local' then start one "
        "for their prompting)",
    )
    serve.add_argument(
        "--data-dir", type=Path, default=None, help="data folder ($KEYSEED_DATA_DIR or ./var)"
    )
    serve.set_defaults(handler=f"{HANDLER}:main")
    api = subparsers.add_parser(
        "api",
        help="run the API alone (as in production), with the limits of the settings",
        description="Run the API under uvicorn with the settings' limits (header size, "
        "request timeout, trusted proxies); database and broker as the settings say.",
    )
    api.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    api.add_argument("--port", type=int, default=8000, help="port (8000)")
    api.add_argument(
        "--workers",
        type=int,
        default=int(os.environ.get("UVICORN_WORKERS", "1")),
        help="uvicorn processes ($UVICORN_WORKERS or 1)",
    )
    api.set_defaults(handler="app.server:main")


def worker_command(
    name: str,
    *,
    concurrency: int = 1,
    log_level: str = "INFO",
    python: str = sys.executable,
) -> list[str]:
    """The command of a Celery worker on every queue, as ``keyseed serve`` runs it (the
    tests and benchmarks start theirs the same way). Gossip, mingle and heartbeats are
    off: a single machine's worker has no peers to talk to."""
    return [
        python,
        "-m",
        "celery",
        "-A",
        "app.worker",
        "worker",
        "--queues",
        QUEUES,
        "--concurrency",
        str(concurrency),
        "--hostname",
        f"{name}@%h",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        "--loglevel",
        log_level,
    ]


def api_command(host: str, port: int, *, python: str = sys.executable) -> list[str]:
    """The command of the API, as ``keyseed serve`` runs it: ``keyseed api``, uvicorn with
    the limits of the settings (:mod:`app.server`)."""
    return [python, "-m", "app.cli", "api", "--host", host, "--port", str(port)]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def _say(message: str) -> None:
    print(f"keyseed serve: {message}", file=sys.stderr, flush=True)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@dataclass
class Child:
    name: str
    argv: list[str]
    stop_signal: signal.Signals
    grace: float  # seconds between the polite signal and the kill
    process: subprocess.Popen[bytes]
    restarted: deque[float] = field(default_factory=deque)  # when (monotonic), recent ones
    due: float | None = None  # when a dead child is to be started again

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(self.stop_signal)
            try:
                self.process.wait(timeout=self.grace)
            except subprocess.TimeoutExpired:
                _say(f"{self.name} did not stop within {self.grace:g} s; killing it")
        # whatever is left of the group (a worker's pool, say) goes too
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)


class Supervisor:
    """Children started in order and stopped in reverse order; one that dies is started
    again after a back-off, unless it died ``max_restarts`` times within ``window`` seconds.

    Built on the standard library's ``subprocess`` rather than a process manager: this is
    the whole of what ``keyseed serve`` needs, and supervisord or circus would add a daemon
    with a configuration file of its own, yet gate no start on another child's readiness
    (the worker needs the local LLM's address) and keep restarting a crash loop (supervisord
    caps retries only for a child that dies while starting) instead of stopping the
    service with an exit status.
    """

    def __init__(
        self,
        env: dict[str, str],
        output: IO[bytes] | None = None,
        *,
        backoff_base: float = 1.0,
        backoff_max: float = 30.0,
        max_restarts: int = 5,
        window: float = 60.0,
    ) -> None:
        self.env = env
        self.output = output
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.max_restarts = max_restarts
        self.window = window
        self.children: list[Child] = []

    def _spawn(self, name: str, argv: Sequence[str]) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(  # noqa: S603 (our own interpreter and arguments)
            list(argv),
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=self.output,
            stderr=self.output,
            start_new_session=True,  # Ctrl-C reaches the supervisor only: it stops in order
        )
        _say(f"started {name} (pid {process.pid})")
        return process

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        stop_signal: signal.Signals = signal.SIGTERM,
        grace: float = 30.0,
    ) -> Child:
        child = Child(name, list(argv), stop_signal, grace, self._spawn(name, argv))
        self.children.append(child)
        return child

    def check(self) -> Child | None:
        """Note the children that died, start again those whose back-off is over; the
        child that died once too often, if one did (the caller then stops the rest)."""
        now = time.monotonic()
        for child in self.children:
            if child.alive():
                continue
            if child.due is None:  # found dead just now
                status = child.process.returncode
                child.stop()  # what is left of its process group goes
                while child.restarted and now - child.restarted[0] > self.window:
                    child.restarted.popleft()
                count = len(child.restarted)
                if count >= self.max_restarts:
                    _say(
                        f"{child.name} (pid {child.pid}) exited with status {status}, "
                        f"after {count} restarts within {self.window:g} s; giving up"
                    )
                    return child
                delay = min(self.backoff_max, self.backoff_base * 2.0**count)
                child.due = now + delay
                _say(
                    f"{child.name} (pid {child.pid}) exited with status {status}; "
                    f"restarting it in {delay:g} s"
                )
            elif now >= child.due:
                child.restarted.append(now)
                child.due = None
                child.process = self._spawn(child.name, child.argv)
        return None

    def stop_all(self) -> None:
        for child in reversed(self.children):
            if child.alive():
                _say(f"stopping {child.name} (pid {child.pid})")
            child.stop()
        self.children.clear()


def _wait_http(url: str, *, timeout: float, child: Child, stopping: Callable[[], bool]) -> bool:
    """Poll ``url`` until it answers 200; False when ``child`` dies, a stop is asked for
    or time runs out."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not stopping():
        if not child.alive():
            return False
        try:
            if httpx.get(url, timeout=2.0).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    return False


def main(args: argparse.Namespace) -> int:
    if args.workers < 1:
        _say("--workers must be at least 1")
        return 2
    if args.data_dir is not None:
        os.environ["KEYSEED_DATA_DIR"] = str(args.data_dir)
    from app.config import Settings

    settings = Settings()
    data_dir = settings.data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    try:
        settings.document_key()  # made once here in embedded mode; required otherwise
    except RuntimeError as exc:
        _say(str(exc))
        return 2
    import migrations

    try:
        migrations.upgrade(settings.sqlalchemy_url)
    except Exception as exc:
        _say(f"cannot bring the database schema up to date ({type(exc).__name__})")
        return 1
    metrics_dir = data_dir / "metrics"
    shutil.rmtree(metrics_dir, ignore_errors=True)
    metrics_dir.mkdir()
    env = dict(
        os.environ,
        KEYSEED_DATA_DIR=str(data_dir),
        KEYSEED_BROKER_URL=settings.celery_broker_url,
        PROMETHEUS_MULTIPROC_DIR=str(metrics_dir),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    database = "SQLite" if settings.embedded else "Postgres"
    broker = settings.celery_broker_url.split(":", 1)[0]
    _say(f"data in {data_dir} ({database}, broker {broker})")

    # The handler only notes the signal, so that no start or restart is cut in two (a
    # child started but not recorded would outlive the service); every wait checks it.
    signalled: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        signalled.append(signum)

    def stopping() -> bool:
        return bool(signalled)

    previous = {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS}
    supervisor = Supervisor(env)
    python = sys.executable
    status = 0
    try:
        if not args.no_llm:
            llm_port = free_port()
            llm = supervisor.start(
                "local LLM",
                [python, "-m", "workers.llm.local", "--port", str(llm_port)],
                grace=20.0,
            )
            base_url = f"http://127.0.0.1:{llm_port}/v1"
            if not _wait_http(f"{base_url}/models", timeout=300.0, child=llm, stopping=stopping):
                if stopping():
                    return 0
                _say("the local LLM server did not start")
                return 1
            env["KEYSEED_LOCAL_LLM_URL"] = base_url
            _say(f"local LLM ready at {base_url}")
        supervisor.start(
            "worker",
            worker_command(
                f"keyseed-{os.getpid()}",
                concurrency=args.workers,
                log_level=settings.log_level,
                python=python,
            ),
            grace=60.0,
        )
        api = supervisor.start("API", api_command(args.host, args.port, python=python))
        host = "127.0.0.1" if args.host in ("0.0.0.0", "::", "") else args.host  # noqa: S104
        ready_url = f"http://{host}:{args.port}/readyz"
        if not _wait_http(ready_url, timeout=180.0, child=api, stopping=stopping):
            if stopping():
                return 0
            _say("the API did not become ready")
            return 1
        _say(f"ready: http://{host}:{args.port} (OpenAPI at /docs); Ctrl-C stops")
        while not stopping():
            if supervisor.check() is not None:
                status = 1
                break
            time.sleep(0.2)
    finally:
        if stopping():
            _say("stopping")
        # a second Ctrl-C must not interrupt the orderly stop
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
        supervisor.stop_all()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _say("stopped")
    return status
