"""A real OpenAI-compatible HTTP server whose every answer the test scripts.

Tests of the prompting stage, of the service's reliability and of privacy (canaries)
need an LLM endpoint that fails on demand and remembers exactly what reached it. A mock
of the openai client would test the mock; this is a real server on 127.0.0.1 (a free
port, a background thread, the stdlib ``ThreadingHTTPServer`` speaking HTTP/1.1 with
keep-alive), so the client, its connection pool, its timeouts and its JSON parsing all
run for real.

It serves ``GET /v1/models`` and ``POST /v1/chat/completions``. What a chat call gets is
decided, in this order, by:

1. ``responder(request)`` if one was given and it returns a :class:`Behaviour`;
2. the first :meth:`FakeLLM.script_for` rule whose marker occurs in the prompt (a queue per
   marker: deterministic even under concurrency, when the order of calls is not);
3. the global queue filled by :meth:`FakeLLM.script` (one entry per call, in arrival order);
4. ``default`` (``"ok"`` unless told otherwise).

A behaviour is a :class:`Behaviour` or a short string:

====================  ==========================================================
``"ok"``              200 with a completion derived from the prompt (see below)
``"500"``, ``"401"``  that status with an OpenAI-style error body
``"429:2"``           status 429 with ``Retry-After: 2`` (any status takes ``:N``)
``"timeout"``         answer nothing for 30 s (``"timeout:5"``: 5 s), then 200 ok
``"malformed"``       200, ``application/json``, a body that is not JSON
``"invalid"``         200, valid JSON that is not a chat completion (no choices)
``"empty"``           200, a completion whose content is ``""``
``"disconnect"``      close the connection without answering
====================  ==========================================================

The ``ok`` content is ``content_fn(body)``; by default ``"[fake] "`` followed by the last
user message, so the keyphrases of the prompt come back in the text. ``latency`` (seconds)
delays every chat answer; ``Behaviour.delay`` adds to it per call.

Every request is recorded (:attr:`FakeLLM.requests`): method, path, headers, raw body,
parsed JSON, the behaviour applied and when it started and finished. ``max_in_flight``
is the largest number of chat calls the server was handling at once.

Usage::

    with FakeLLM(latency=0.05) as llm:
        llm.script("429:1", "500", "ok")
        llm.script_for("canary-7f3a", "timeout", "ok")
        outcomes = run_prompts(seqs, endpoint=llm.endpoint(timeout=0.5), spec=spec)
        assert all("secret" not in p for p in llm.prompts())
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from workers.llm.client import LLMEndpoint

KINDS = ("ok", "status", "timeout", "malformed", "invalid", "empty", "disconnect")


@dataclass(frozen=True)
class Behaviour:
    """How the server answers one chat call."""

    kind: str = "ok"
    status: int = 200  # for kind "status"
    retry_after: float | str | None = None  # Retry-After header value, if any
    delay: float = 0.0  # seconds, added to the server's latency
    content: str | None = None  # for "ok": a fixed text instead of content_fn
    hang: float = 30.0  # for "timeout": how long to answer nothing

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown behaviour kind {self.kind!r}; one of {KINDS}")

    @classmethod
    def parse(cls, value: str | int | Behaviour) -> Behaviour:
        if isinstance(value, Behaviour):
            return value
        name, _, argument = str(value).partition(":")
        if name.isdigit():
            return cls("status", status=int(name), retry_after=argument or None)
        if name == "timeout":
            return cls("timeout", hang=float(argument) if argument else 30.0)
        if name == "ok" and argument:
            return cls("ok", delay=float(argument))
        if argument:
            raise ValueError(f"behaviour {value!r} takes no argument")
        return cls(name)


def ok(content: str | None = None, *, delay: float = 0.0) -> Behaviour:
    return Behaviour("ok", content=content, delay=delay)


def status(code: int, *, retry_after: float | str | None = None) -> Behaviour:
    return Behaviour("status", status=code, retry_after=retry_after)


def timeout(hang: float = 30.0) -> Behaviour:
    return Behaviour("timeout", hang=hang)


BehaviourLike = str | int | Behaviour


@dataclass
class RecordedRequest:
    """One request as the server saw it."""

    method: str
    path: str
    headers: dict[str, str]
    raw: bytes
    body: Any  # parsed JSON, or None
    started: float  # time.monotonic()
    finished: float | None = None
    behaviour: Behaviour | None = None

    @property
    def messages(self) -> list[dict[str, Any]]:
        if isinstance(self.body, dict) and isinstance(self.body.get("messages"), list):
            return list(self.body["messages"])
        return []

    @property
    def user_text(self) -> str:
        """The user messages' content, joined by blank lines."""
        return "\n\n".join(
            str(m.get("content", "")) for m in self.messages if m.get("role") == "user"
        )

    @property
    def prompt_text(self) -> str:
        """Every message's content (system included), joined by blank lines."""
        return "\n\n".join(str(m.get("content", "")) for m in self.messages)


def default_content(body: Any) -> str:
    user = [m for m in body.get("messages", []) if m.get("role") == "user"]
    return "[fake] " + (str(user[-1].get("content", "")) if user else "")


class Topical:
    """A ``content_fn`` for the news-article tests of the LLM methods: a short text on the
    topic of the label the last message quotes (``"Sports"``, else business), numbered so
    that no two answers are the same. ``{n}`` in a template is the call's number."""

    def __init__(
        self,
        sports: str = "The team won the match with a late goal, report {n}.",
        business: str = "Shares and bank profits moved the market, report {n}.",
    ) -> None:
        self.sports = sports
        self.business = business
        self.calls = 0
        self._lock = threading.Lock()

    def __call__(self, body: Any) -> str:
        messages = body.get("messages")
        user = str(messages[-1]["content"]) if isinstance(messages, list) else ""
        with self._lock:
            self.calls += 1
            n = self.calls
        return (self.sports if '"Sports"' in user else self.business).format(n=n)


# The LLM methods' prompts (workers/methods/aug_pe/prompts.py), as the ``content_fn`` of a
# test reads them: a request for a new text of a class (the class quoted), and a variation
# or a fill-in of a given text (the text after "Text: " or "Input: ").
ASKED = re.compile(r'Write one .* of the category "([^"]+)"')
ECHOED = re.compile(r"(?:Text|Input): (.*?)(?:\n\nAnswer:)?$", re.S)


def last_message(body: Any) -> str:
    """The content of the request's last message."""
    return str(body["messages"][-1]["content"])


def asked_class(prompt: str) -> str | None:
    """The class ``prompt`` asks a new text of, or None when it asks for none."""
    asked = ASKED.search(prompt)
    return asked.group(1) if asked is not None else None


def echoed_text(prompt: str) -> str | None:
    """The text ``prompt`` gives to vary or fill in, or None when it gives none."""
    echoed = ECHOED.search(prompt)
    return echoed.group(1) if echoed is not None else None


class Turns:
    """How many answers each class has had (thread-safe): :meth:`next` counts one more for
    ``label`` and returns how many it had before (0, 1, …)."""

    def __init__(self) -> None:
        self._given: Counter[str] = Counter()
        self._lock = threading.Lock()

    def next(self, label: str) -> int:
        with self._lock:
            n = self._given[label]
            self._given[label] += 1
            return n


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 512  # a burst of connections must not overflow the backlog
    fake: FakeLLM


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # else headers and body meet delayed ACK: +40 ms a call
    server: _Server
    timeout = 60  # idle keep-alive connections close eventually

    def setup(self) -> None:
        super().setup()
        self.server.fake._connections.add(self.connection)

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            super().finish()
        self.server.fake._connections.discard(self.connection)

    def log_message(self, format: str, *args: Any) -> None:  # silence the stdlib's stderr
        return None

    # ----------------------------------------------------------------- helpers

    def _send(self, code: int, payload: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)
        self.wfile.flush()

    def _send_json(self, code: int, data: Any, headers: dict[str, str] | None = None) -> None:
        self._send(code, json.dumps(data).encode(), headers)

    def _record(self, raw: bytes) -> RecordedRequest:
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        request = RecordedRequest(
            method=self.command,
            path=self.path,
            headers={k.lower(): v for k, v in self.headers.items()},
            raw=raw,
            body=body,
            started=time.monotonic(),
        )
        self.server.fake._append(request)
        return request

    def _authorised(self) -> bool:
        key = self.server.fake.api_key
        if key is None or self.headers.get("Authorization") == f"Bearer {key}":
            return True
        self._send_json(401, {"error": {"message": "invalid api key", "type": "auth", "code": 401}})
        return False

    # ----------------------------------------------------------------- routes

    def do_GET(self) -> None:
        request = self._record(b"")
        try:
            if not self._authorised():
                return
            if self.path.rstrip("/") in ("/v1/models", "/models"):
                model = {"id": self.server.fake.model, "object": "model", "owned_by": "fake"}
                self._send_json(200, {"object": "list", "data": [model]})
            else:
                self._send_json(404, {"error": {"message": "not found", "code": 404}})
        finally:
            request.finished = time.monotonic()

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        request = self._record(raw)
        if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
            self._send_json(404, {"error": {"message": "not found", "code": 404}})
            request.finished = time.monotonic()
            return
        fake = self.server.fake
        fake._enter()
        try:
            if not self._authorised():
                return
            behaviour = fake._next_behaviour(request)
            request.behaviour = behaviour
            wait = fake.latency + behaviour.delay
            if wait > 0 and fake._stopping.wait(wait):
                self.close_connection = True
                return
            self._answer(behaviour, request)
        except OSError:  # the client went away (its timeout); nothing to answer
            self.close_connection = True
        finally:
            request.finished = time.monotonic()
            fake._leave()

    def _answer(self, behaviour: Behaviour, request: RecordedRequest) -> None:
        fake = self.server.fake
        if behaviour.kind == "disconnect":
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        if behaviour.kind == "timeout":
            if fake._stopping.wait(behaviour.hang):
                self.close_connection = True
                return
            behaviour = ok()
        if behaviour.kind == "status":
            headers = {}
            if behaviour.retry_after is not None:
                headers["Retry-After"] = str(behaviour.retry_after)
            error = {"message": f"scripted {behaviour.status}", "type": "fake", "code": None}
            self._send_json(behaviour.status, {"error": error}, headers)
            return
        if behaviour.kind == "malformed":
            self._send(200, b'{"id": "chatcmpl-broken", "choices": [ this is not json')
            return
        if behaviour.kind == "invalid":
            self._send_json(200, {"object": "chat.completion", "choices": []})
            return
        body = request.body if isinstance(request.body, dict) else {}
        if behaviour.kind == "empty":
            content = ""
        elif behaviour.content is not None:
            content = behaviour.content
        else:
            content = fake.content_fn(body)
        self._send_json(200, fake._completion(body, content))


class FakeLLM:
    """A scripted OpenAI-compatible server on 127.0.0.1; a context manager."""

    def __init__(
        self,
        *,
        model: str = "fake-model",
        latency: float = 0.0,
        default: BehaviourLike = "ok",
        content_fn: Callable[[Any], str] = default_content,
        responder: Callable[[RecordedRequest], Behaviour | None] | None = None,
        api_key: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.model = model
        self.latency = latency
        self.default = Behaviour.parse(default)
        self.content_fn = content_fn
        self.responder = responder
        self.api_key = api_key
        self._address = (host, port)
        self._lock = threading.Lock()
        self._queue: deque[Behaviour] = deque()
        self._rules: list[tuple[str, deque[Behaviour]]] = []
        self._requests: list[RecordedRequest] = []
        self._in_flight = 0
        self._max_in_flight = 0
        self._stopping = threading.Event()
        self._connections: set[socket.socket] = set()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._counter = 0

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> FakeLLM:
        if self._server is not None:
            return self
        self._stopping.clear()
        server = _Server(self._address, _Handler)
        server.fake = self
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        self._stopping.set()  # wakes every handler that is sleeping or hanging
        self._server.shutdown()
        for connection in list(self._connections):
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None
        self._thread = None

    def __enter__(self) -> FakeLLM:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the fake LLM is not running")
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def endpoint(self, **overrides: Any) -> LLMEndpoint:
        """An :class:`LLMEndpoint` for this server (``timeout=``, ``max_tokens=`` …)."""
        values: dict[str, Any] = {"base_url": self.base_url, "model": self.model}
        if self.api_key is not None:
            values["api_key"] = self.api_key
        values.update(overrides)
        return LLMEndpoint(**values)

    # ----------------------------------------------------------------- scripting

    def script(self, *behaviours: BehaviourLike) -> FakeLLM:
        """Append behaviours for the next chat calls, in arrival order."""
        with self._lock:
            self._queue.extend(Behaviour.parse(b) for b in behaviours)
        return self

    def script_for(self, marker: str, *behaviours: BehaviourLike) -> FakeLLM:
        """Behaviours for the calls whose prompt contains ``marker``, one per call."""
        with self._lock:
            for existing, queue in self._rules:
                if existing == marker:
                    queue.extend(Behaviour.parse(b) for b in behaviours)
                    break
            else:
                self._rules.append((marker, deque(Behaviour.parse(b) for b in behaviours)))
        return self

    def reset(self) -> None:
        """Forget the scripts, the recorded requests and the in-flight maximum."""
        with self._lock:
            self._queue.clear()
            self._rules.clear()
            self._requests.clear()
            self._max_in_flight = self._in_flight

    # ----------------------------------------------------------------- records

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    @property
    def chat_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.method == "POST" and "chat" in r.path]

    def prompts(self) -> list[str]:
        """The user text of every chat call, in arrival order."""
        return [r.user_text for r in self.chat_requests]

    def calls_for(self, marker: str) -> int:
        return sum(marker in r.prompt_text for r in self.chat_requests)

    @property
    def max_in_flight(self) -> int:
        with self._lock:
            return self._max_in_flight

    @property
    def in_flight(self) -> int:
        with self._lock:
            return self._in_flight

    @property
    def unused_script(self) -> list[Behaviour]:
        """Scripted behaviours no call consumed (global queue, then per marker)."""
        with self._lock:
            left = list(self._queue)
            for _, queue in self._rules:
                left.extend(queue)
            return left

    # ----------------------------------------------------------------- internals

    def _append(self, request: RecordedRequest) -> None:
        with self._lock:
            self._requests.append(request)

    def _enter(self) -> None:
        with self._lock:
            self._in_flight += 1
            self._max_in_flight = max(self._max_in_flight, self._in_flight)

    def _leave(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def _next_behaviour(self, request: RecordedRequest) -> Behaviour:
        if self.responder is not None:
            chosen = self.responder(request)
            if chosen is not None:
                return Behaviour.parse(chosen)
        text = request.prompt_text
        with self._lock:
            for marker, queue in self._rules:
                if marker in text and queue:
                    return queue.popleft()
            if self._queue:
                return self._queue.popleft()
            return self.default

    def _completion(self, body: dict[str, Any], content: str) -> dict[str, Any]:
        with self._lock:
            self._counter += 1
            number = self._counter
        prompt_tokens = sum(
            len(str(m.get("content", "")).split()) for m in body.get("messages", [])
        )
        completion_tokens = len(content.split())
        return {
            "id": f"chatcmpl-fake-{number}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": str(body.get("model", self.model)),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop",
                    "logprobs": None,
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }


def behaviours(values: Iterable[BehaviourLike]) -> list[Behaviour]:
    """Parse a list of behaviour strings (handy in parametrised tests)."""
    return [Behaviour.parse(v) for v in values]


__all__ = [
    "Behaviour",
    "FakeLLM",
    "RecordedRequest",
    "Topical",
    "Turns",
    "asked_class",
    "behaviours",
    "default_content",
    "echoed_text",
    "last_message",
    "ok",
    "status",
    "timeout",
]
