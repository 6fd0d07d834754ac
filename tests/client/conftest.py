"""The service as the client meets it: uvicorn on a free port of 127.0.0.1 serving the
app on a fresh Postgres database, and a REAL Celery worker process on Redis (the one of
``tests/proof/realworker.py``) that runs the jobs the client submits. The first admin
key is made as ``keyseed admin bootstrap`` makes it; everything else goes through
:class:`keyseed.client.Client` over HTTP.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import uvicorn

from app.db import Database
from app.identity import service as identity
from app.main import create_app
from tests.proof.realworker import REDIS_URL, RealWorker, fresh_prefix, worker_env
from tests.service.conftest import database_url, make_settings

__all__ = ["Service", "database_url"]

UPLOAD_LIMIT = 4 * 1024 * 1024


@dataclass(frozen=True)
class Service:
    url: str
    database: Database
    admin_key: str
    worker: RealWorker


@pytest.fixture(scope="module")
def prefix() -> Iterator[str]:
    yield from fresh_prefix("client")


@pytest.fixture(scope="module")
def service(
    database_url: str, prefix: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    root = tmp_path_factory.mktemp("service")
    keyring = root / "keyring"
    settings = make_settings(
        database_url,
        root / "api",
        broker_url=REDIS_URL,
        broker_key_prefix=prefix,
        keyring_dir=keyring,
        max_upload_bytes=UPLOAD_LIMIT,
    )
    app = create_app(settings)
    database: Database = app.state.database
    with database.transaction() as session:
        _, admin_key = identity.bootstrap(session)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, http="h11", lifespan="on", log_config=None, access_log=False)
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    worker: RealWorker | None = None
    try:
        deadline = time.monotonic() + 60
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.05)
        env = worker_env(
            database_url,
            prefix,
            root / "cache",
            KEYSEED_KEYRING_DIR=str(keyring),  # the API's: the dataset keys
            KEYSEED_PROGRESS_INTERVAL="0.2",
        )
        worker = RealWorker.start(env, Path(root / "worker.log"), prefix.rstrip(":"))
        yield Service(f"http://127.0.0.1:{port}", database, admin_key, worker)
    finally:
        if worker is not None:
            worker.stop()
        server.should_exit = True
        thread.join(timeout=30)
        listener.close()
        database.dispose()
