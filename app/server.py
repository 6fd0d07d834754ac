"""``keyseed api``: the API as it runs in production, uvicorn with the settings' limits.

uvicorn's defaults leave cheap attacks open; here every option comes from the settings:

* ``max_header_bytes``: the request line and headers together. The h11 protocol
  enforces it (400 above it); the httptools protocol uvicorn prefers has no limit at all
  (a 16 MiB header was read whole).
* ``request_timeout``: a request's line and headers must arrive within it, and its body
  may not pause for longer; otherwise the answer is 408 and the connection is closed
  (:class:`GuardedH11Protocol`). uvicorn itself times out idle connections only, so a
  client sending one byte now and then held a connection forever.
* ``keep_alive_timeout``: idle connections between requests.
* ``trusted_proxies``: the addresses whose ``X-Forwarded-For`` and ``X-Forwarded-Proto``
  are believed (none by default). uvicorn believes every loopback peer unless told
  otherwise, so any local process, and every client of ``keyseed serve``, could name
  itself any address: a fresh address per guess got round the sign-in throttle, and the
  audit log recorded whatever address the client chose.

uvicorn's own log handlers are not installed: its lines go through the service's
logging (:func:`app.logging.configure_logging`), which renders exceptions by type only.

The protocol also speaks the ASGI ``http.response.pathsend`` extension, which uvicorn
does not: Starlette's ``FileResponse`` then hands over a file's path instead of its
bytes, and the kernel copies the file to the socket (``os.sendfile``, zero copy, on
uvloop as on asyncio's loop: :func:`_sendfile`). Release downloads are served this way
(:mod:`app.releases.files`); a byte range is still read and sent by Starlette.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
from typing import IO, Any

import h11
import structlog
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol, RequestResponseCycle

from app.config import Settings, get_settings

APP = "app.main:create_app"
_HEAD_END = re.compile(rb"\r?\n\r?\n")


def _answer(status: bytes, text: bytes) -> bytes:
    """A whole response that closes the connection (sent before any request is read)."""
    return (
        b"HTTP/1.1 %s\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
        b"content-length: %d\r\n\r\n%s" % (status, len(text), text)
    )


PATHSEND = "http.response.pathsend"
_FALLBACK_CHUNK = 1 << 20
_TIMEOUT = _answer(b"408 Request Timeout", b"the request did not arrive in time\n")
_HEADERS_TOO_LARGE = _answer(
    b"431 Request Header Fields Too Large", b"the request line and headers are too large\n"
)
log = structlog.get_logger("keyseed.http")


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with an exact limit on the size of a request's head and a
    deadline on every unfinished request.

    The head (request line and headers) may hold ``max_header_bytes`` (431 above it: h11
    alone checks only what is still buffered after each read of up to 64 KiB). The
    deadline starts when the connection opens or the first byte of a request comes, and
    the head must be complete before it passes; while the body streams in, every arrival
    of data starts it again. A complete request is the app's to answer, at its pace;
    between requests uvicorn's keep-alive timeout applies.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        settings = get_settings()
        self.request_timeout = settings.request_timeout
        self.max_header_bytes = settings.max_header_bytes
        self._head = b""  # the head received so far, while it is incomplete
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE:
            self._head += data
            if len(self._head) > self.max_header_bytes and not _HEAD_END.search(
                self._head, 0, self.max_header_bytes
            ):
                log.warning("http.headers_too_large", limit=self.max_header_bytes)
                self._disarm()
                self._close(_HEADERS_TOO_LARGE)
                return
        super().data_received(data)
        state = self.conn.their_state
        if state is not h11.IDLE:
            self._head = b""
        if state is h11.SEND_BODY:
            self._arm()
        elif state is h11.IDLE:  # a request line or headers, not yet complete
            if self._deadline is None:
                self._arm()
        else:  # the request is complete (or the connection is ending)
            self._disarm()

    def handle_events(self) -> None:
        before = getattr(self, "cycle", None)
        super().handle_events()
        cycle = getattr(self, "cycle", None)
        if cycle is not None and cycle is not before:  # a new request: its task not yet run
            cycle.scope.setdefault("extensions", {})[PATHSEND] = {}
            cycle.send = _PathSender(cycle, cycle.send)

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.request_timeout, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        cycle = self.cycle if self.conn.their_state is h11.SEND_BODY else None
        log.warning(
            "http.request_timeout",
            seconds=self.request_timeout,
            stage="body" if cycle is not None else "headers",
        )
        if cycle is not None:  # the app, perhaps reading the body, sees a disconnect
            cycle.disconnected = True
            cycle.message_event.set()
        self._close(_TIMEOUT if cycle is None or not cycle.response_started else b"")

    def _close(self, answer: bytes) -> None:
        if answer:
            self.transport.write(answer)
        self.transport.close()


class _Passthrough:
    """What h11 is told is the body (its length), handed back unchanged
    (``send_with_data_passthrough``) where the file's bytes are to go."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size


class _PathSender:
    """A request's ``send`` that also takes ``http.response.pathsend``: the whole file at
    ``path`` as the response's body (after ``http.response.start``, whose headers give
    its length)."""

    def __init__(self, cycle: RequestResponseCycle, send: Any) -> None:
        self.cycle = cycle
        self.send = send

    async def __call__(self, message: Any) -> None:
        if message["type"] != PATHSEND:
            await self.send(message)
            return
        cycle = self.cycle
        if cycle.flow.write_paused and not cycle.disconnected:
            await cycle.flow.drain()
        if cycle.disconnected:
            return
        if not cycle.response_started or cycle.response_complete:
            raise RuntimeError(f"unexpected ASGI message {PATHSEND!r}")
        if cycle.scope["method"] != "HEAD":
            with open(message["path"], "rb") as file:
                size = os.fstat(file.fileno()).st_size
                # h11 takes any object with a length here, and hands it back as is
                body = h11.Data(data=_Passthrough(size))  # type: ignore[arg-type]
                pieces = cycle.conn.send_with_data_passthrough(body)
                for piece in pieces or ():
                    if isinstance(piece, _Passthrough):
                        if not await _sendfile(cycle, file, size):
                            return
                    else:
                        cycle.transport.write(piece)
        await self.send({"type": "http.response.body", "body": b"", "more_body": False})


async def _sendfile(cycle: RequestResponseCycle, file: IO[bytes], size: int) -> bool:
    """``size`` bytes of ``file`` to the connection; False when the client went away.

    ``os.sendfile`` on a duplicate of the connection's socket, once the transport has
    written all it holds (so nothing is reordered), waiting for the socket to take more
    through the loop's writer callbacks on the duplicate (asyncio and uvloop both allow
    that; uvloop has no ``loop.sendfile``). A transport without a plain socket (TLS)
    gets the file read and written a MiB at a time."""
    transport = cycle.transport
    sock = transport.get_extra_info("socket")
    try:
        if sock is None or transport.get_extra_info("sslcontext") is not None:
            return await _copy(cycle, file, size)
        while transport.get_write_buffer_size():
            if cycle.disconnected or transport.is_closing():
                return False
            await asyncio.sleep(0.001)
        loop = asyncio.get_running_loop()
        out = os.dup(sock.fileno())
        try:
            offset = 0
            while offset < size:
                try:
                    sent = os.sendfile(out, file.fileno(), offset, size - offset)
                except (BlockingIOError, InterruptedError):
                    await _writable(loop, out)
                    continue
                if sent == 0:
                    raise OSError("the file is shorter than its length")
                offset += sent
        finally:
            os.close(out)
        return True
    except OSError:  # the client closed the connection, or the file cannot be read
        cycle.disconnected = True
        transport.close()
        return False


async def _writable(loop: asyncio.AbstractEventLoop, fd: int) -> None:
    ready = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_writer(fd, wake)
    try:
        await ready
    finally:
        loop.remove_writer(fd)


async def _copy(cycle: RequestResponseCycle, file: IO[bytes], size: int) -> bool:
    loop = asyncio.get_running_loop()
    left = size
    while left > 0:
        chunk = await loop.run_in_executor(None, file.read, min(_FALLBACK_CHUNK, left))
        if not chunk:
            raise OSError("the file is shorter than its length")
        cycle.transport.write(chunk)
        left -= len(chunk)
        if cycle.flow.write_paused:
            await cycle.flow.drain()
        if cycle.disconnected or cycle.transport.is_closing():
            return False
    return True


def server_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's options for the API, from ``settings``."""
    return {
        "http": GuardedH11Protocol,
        "h11_max_incomplete_event_size": settings.max_header_bytes,
        "timeout_keep_alive": settings.keep_alive_timeout,
        "proxy_headers": bool(settings.trusted_proxies),
        "forwarded_allow_ips": list(settings.trusted_proxies) or None,
        "server_header": False,
        "access_log": False,  # the app logs one line per request
        "log_config": None,
    }


def main(args: argparse.Namespace) -> int:
    settings = get_settings()
    uvicorn.run(
        APP,
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        log_level=settings.log_level.lower(),
        **server_options(settings),
    )
    return 0
