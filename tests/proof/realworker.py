"""A real Celery worker in a subprocess, for tests that kill it and start another.

The worker is the one of the end-to-end test (``tests/service/test_end_to_end.py``):
``celery -A app.worker worker`` on every queue, prefork with one child, on Redis under a
broker key prefix of the test's own, against the test's Postgres database. It runs in a
session of its own, so :meth:`RealWorker.kill` SIGKILLs the main process and its pool
child at once, as a crash of the machine or the container would.

A task that was running when its worker died stays in the broker's ``unacked`` index
until the visibility timeout has passed (kombu's Redis transport); then the next worker
that starts puts it back on its queue. The service's visibility timeout is longer than
a task may live (:func:`app.worker.transport_options`), so :func:`expire_visibility`
plays the passing of that time: it backdates the delivery time of every unacked message
of the prefix, and the next worker restores them when it starts.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import cast
from urllib.parse import urlsplit, urlunsplit

import redis

from tests.service.test_end_to_end import (
    REDIS_URL,
    Worker,
    base_env,
    fresh_prefix,
    purge,
    worker_env,
)

__all__ = [
    "REDIS_URL",
    "BrokerProxy",
    "RealWorker",
    "base_env",
    "expire_visibility",
    "fresh_prefix",
    "purge",
    "worker_env",
]


# a started worker (``RealWorker.start(env, log, name)``): its process group can be
# killed, its log read
RealWorker = Worker


def expire_visibility(prefix: str) -> int:
    """Backdate every unacked message of ``prefix`` past any visibility timeout; how
    many there are. The next worker to start puts them back on their queues."""
    store = redis.Redis.from_url(REDIS_URL)
    try:
        index = f"{prefix}unacked_index"
        tags = cast(list[bytes], store.zrange(index, 0, -1))
        if tags:
            store.zadd(index, dict.fromkeys(tags, 0.0))
        return len(tags)
    finally:
        store.close()


class BrokerProxy:
    """A TCP relay to the test Redis whose traffic the test can hold, then cut.

    A worker given :attr:`url` as its broker talks to Redis through it. After
    :meth:`hold`, what either side sends is kept (:attr:`held` counts the chunks) instead
    of forwarded, so a worker that publishes a task waits for Redis' answer; :meth:`cut`
    closes every connection and drops what was held: the task never reaches Redis.
    """

    def __init__(self) -> None:
        upstream = urlsplit(REDIS_URL)
        self.upstream = (upstream.hostname or "127.0.0.1", upstream.port or 6379)
        self.listener = socket.create_server(("127.0.0.1", 0))
        port = self.listener.getsockname()[1]
        self.url = urlunsplit(upstream._replace(netloc=f"127.0.0.1:{port}"))
        self.flowing = threading.Event()
        self.flowing.set()
        self.held = 0
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def hold(self) -> None:
        self.flowing.clear()

    def cut(self) -> None:
        with self._lock:
            self._closed = True
            sockets, self._sockets = set(self._sockets), set()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self.flowing.set()  # the pumps wake to closed sockets: nothing held is sent

    def close(self) -> None:
        self.cut()
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._closed:
                    client.close()
                    server.close()
                    continue
                self._sockets.update((client, server))
            for source, target in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, target), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                if not self.flowing.is_set():
                    with self._lock:
                        self.held += 1
                    self.flowing.wait()
                with self._lock:
                    if self._closed:
                        return
                target.sendall(data)
        except OSError:
            return
