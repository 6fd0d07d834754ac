"""The API as it runs (``keyseed api``, a real uvicorn process on the embedded SQLite
file), against clients that misbehave (issue 14, items 10 and 12):

* a header of 1 MiB is refused (uvicorn's httptools protocol read 16 MiB whole), by 431;
* a request that never finishes arriving (headers or body sent a byte now and then, or
  not at all) is answered 408 and its connection closed once ``request_timeout`` has
  passed; a complete request arriving slowly but in time is served;
* ``X-Forwarded-For`` is believed from configured proxies only: a client on loopback
  can neither get round the per-address sign-in throttle by naming a fresh address per
  attempt nor put an address of its choice in the audit log.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from sqlalchemy import select

import migrations
from app.admin import sessions
from app.config import Settings
from app.db import Database
from app.models import AuditEvent
from app.serve import api_command, free_port
from tests.dashboard import factories as dash

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Server:
    url: str
    database: Database
    log: Path

    def events(self, kind: str) -> list[AuditEvent]:
        with self.database.session() as session:
            query = select(AuditEvent).where(AuditEvent.kind == kind).order_by(AuditEvent.id)
            return list(session.scalars(query))


@contextmanager
def api_server(tmp_path: Path, **settings: str) -> Iterator[Server]:
    """``keyseed api`` on a fresh embedded data folder, with ``KEYSEED_<NAME>`` settings."""
    data_dir = tmp_path / f"data-{len(list(tmp_path.iterdir()))}"
    scrubbed = ("DATABASE_URL", "REDIS_URL")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEYSEED_")}
    env = {k: v for k, v in env.items() if k not in scrubbed}
    env |= {"KEYSEED_DATA_DIR": str(data_dir), "KEYSEED_BROKER_URL": "memory://"}
    env |= {f"KEYSEED_{name.upper()}": value for name, value in settings.items()}
    url = Settings(data_dir=data_dir, database_url="", data_key="").sqlalchemy_url
    migrations.upgrade(url)
    port = free_port()
    log = tmp_path / f"server-{port}.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            api_command("127.0.0.1", port), cwd=REPO, env=env, stdout=output, stderr=output
        )
    database = Database.from_url(url)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the API did not start"
            try:
                if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        yield Server(base, database, log)
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=20)
        database.dispose()


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def _read_all(connection: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    received = b""
    while chunk := connection.recv(65536):
        received += chunk
    return received


def test_headers_over_the_limit_are_refused(tmp_path: Path) -> None:
    with api_server(tmp_path, max_header_bytes="16384") as server:
        fine = httpx.get(f"{server.url}/healthz", headers={"X-Padding": "a" * 12_000})
        assert fine.status_code == 200
        for size in (20_000, 2**20):
            started = time.monotonic()
            refused = httpx.get(f"{server.url}/healthz", headers={"X-Padding": "a" * size})
            assert refused.status_code == 431, size
            assert time.monotonic() - started < 5
        many = {f"X-Header-{i}": "b" * 100 for i in range(300)}  # 30 kB in many lines
        assert httpx.get(f"{server.url}/healthz", headers=many).status_code == 431
        assert httpx.get(f"{server.url}/healthz").status_code == 200


def test_unfinished_requests_time_out(tmp_path: Path) -> None:
    with api_server(tmp_path, request_timeout="1.5") as server:
        # nothing at all after connecting
        with _connect(server.url) as idle:
            started = time.monotonic()
            assert _read_all(idle).startswith(b"HTTP/1.1 408 ")
            assert 1.0 < time.monotonic() - started < 5
        # headers a byte at a time, never finished: the deadline does not move
        with _connect(server.url) as dripping:
            started = time.monotonic()
            dripping.settimeout(0.3)
            answer = b""
            for byte in b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"z" * 100:
                try:
                    dripping.send(bytes([byte]))
                    answer = dripping.recv(65536)
                except TimeoutError:
                    continue
                except (BrokenPipeError, ConnectionResetError):
                    break
                if answer == b"" or answer.startswith(b"HTTP/"):
                    break
            assert answer.startswith(b"HTTP/1.1 408 ") or answer == b"", answer
            assert time.monotonic() - started < 5
        # a body that stops arriving
        with _connect(server.url) as stalled:
            stalled.sendall(
                b"POST /v1/datasets HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 1000\r\n\r\n" + b"{" * 10
            )
            started = time.monotonic()
            answer = _read_all(stalled)
            assert time.monotonic() - started < 5
            assert answer == b"" or answer.startswith(b"HTTP/1.1 "), answer
        # a whole request, slowly but within the deadline, is served
        with _connect(server.url) as slow:
            head = (b"GET /healthz HTTP/1.1\r\n", b"Host: x\r\n", b"Connection: close\r\n\r\n")
            for part in head:
                slow.sendall(part)
                time.sleep(0.3)
            assert _read_all(slow).startswith(b"HTTP/1.1 200 ")
        assert httpx.get(f"{server.url}/healthz").status_code == 200
        logs = server.log.read_text()
        assert '"http.request_timeout"' in logs and '"stage": "body"' in logs


def _sign_in(client: httpx.Client, username: str, password: str, **headers: str) -> httpx.Response:
    form = client.get("/admin/sign-in")
    assert form.status_code == 200, form.text
    return client.post(
        "/admin/sign-in",
        data={"username": username, "password": password, "csrf_token": dash.csrf_token(form.text)},
        headers=headers,
        follow_redirects=False,
    )


def test_forwarded_addresses_count_only_from_trusted_proxies(tmp_path: Path) -> None:
    with api_server(tmp_path) as server:
        dash.person(server.database, "ada", "admin")
        with httpx.Client(base_url=server.url) as client:
            statuses = [
                _sign_in(
                    client, f"guess-{i}", "wrong", **{"X-Forwarded-For": f"203.0.113.{i}"}
                ).status_code
                for i in range(sessions.ADDRESS_LIMIT + 2)
            ]
            assert statuses == [401] * sessions.ADDRESS_LIMIT + [429, 429]
            # the throttle holds the address, whatever the request claims
            refused = _sign_in(client, "ada", dash.PASSWORD, **{"X-Forwarded-For": "198.51.100.7"})
            assert refused.status_code == 429
        addresses = {event.details.get("address") for event in server.events("user.sign_in_failed")}
        assert addresses == {"127.0.0.1"}

    with api_server(tmp_path, trusted_proxies="127.0.0.1") as proxied:
        dash.person(proxied.database, "ada", "admin")
        with httpx.Client(base_url=proxied.url) as client:
            chain = "192.0.2.1, 198.51.100.7"  # the proxy appends the address it saw
            wrong = _sign_in(client, "ada", "wrong", **{"X-Forwarded-For": chain})
            assert wrong.status_code == 401
            right = _sign_in(client, "ada", dash.PASSWORD, **{"X-Forwarded-For": chain})
            assert right.status_code == 303
        failed = proxied.events("user.sign_in_failed")
        signed_in = proxied.events("user.signed_in")
        assert [e.details["address"] for e in failed + signed_in] == ["198.51.100.7"] * 2
