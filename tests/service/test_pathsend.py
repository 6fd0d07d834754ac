"""The API's uvicorn protocol (:mod:`app.server`) speaks ASGI's ``http.response.pathsend``:
a ``FileResponse`` hands over the path, and the file goes to the socket by
``os.sendfile`` (counted here), on uvloop as on asyncio's own loop; ranges, HEAD,
keep-alive and a client that goes away mid-file all behave."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.responses import FileResponse

from app.config import get_settings
from app.server import PATHSEND, GuardedH11Protocol, server_options
from tests.service import factories

SIZE = 3 * 2**20 + 123


@pytest.fixture
def blob(tmp_path: Path) -> tuple[Path, bytes]:
    data = os.urandom(SIZE)
    path = tmp_path / "blob.bin"
    path.write_bytes(data)
    return path, data


@contextlib.contextmanager
def _serve(app: Any, loop: str) -> Iterator[str]:
    options = server_options(get_settings())
    config = uvicorn.Config(app, loop=loop, lifespan="off", **options)
    server = uvicorn.Server(config)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()

    def started() -> bool:
        assert thread.is_alive(), "uvicorn stopped"
        return server.started

    factories.wait_for(started, "uvicorn starts", timeout=30, interval=0.02)
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_file_response_goes_by_sendfile(
    blob: tuple[Path, bytes], loop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, data = blob
    assert GuardedH11Protocol is server_options(get_settings())["http"]
    seen: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(dict(scope.get("extensions") or {}))
        await FileResponse(path)(scope, receive, send)

    sent: list[int] = []
    real = os.sendfile

    def counted(out: int, in_fd: int, offset: int | None, count: int) -> int:
        n = real(out, in_fd, offset, count)
        sent.append(n)
        return n

    monkeypatch.setattr(os, "sendfile", counted)
    with _serve(app, loop) as url:
        with httpx.Client(timeout=30) as client:  # one connection, kept alive
            for _ in range(3):
                response = client.get(url)
                assert response.status_code == 200 and response.content == data
            assert sum(sent) == 3 * SIZE  # every byte by the kernel, none by Python
            ranged = client.get(url, headers={"Range": "bytes=5-9"})
            assert ranged.status_code == 206 and ranged.content == data[5:10]
            head = client.head(url)
            assert head.headers["content-length"] == str(SIZE) and head.content == b""
            assert sum(sent) == 3 * SIZE
        # a client that goes away after the first bytes leaves the server serving
        with socket.create_connection(("127.0.0.1", int(url.split(":")[2].strip("/")))) as raw:
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            raw.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert raw.recv(1024).startswith(b"HTTP/1.1 200")
        time.sleep(0.2)
        assert httpx.get(url, timeout=30).content == data
    assert seen and all(PATHSEND in extensions for extensions in seen)
