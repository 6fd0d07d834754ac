"""An OpenAI-compatible HTTP server around :class:`~workers.llm.engine.BatchEngine`.

Routes (the subset of OpenAI's API the clients of keyseed use):

* ``GET /v1/models``: the one model served, under its alias;
* ``POST /v1/chat/completions``: ``messages``, ``max_tokens``, ``temperature``,
  ``top_p``, ``seed``, ``stop``, ``n = 1``, ``stream = false``; the answer carries
  ``usage`` (prompt and completion tokens);
* ``GET /health``: 200 once the model is loaded;
* ``GET /slots``: the engine's counters (slots, busy, largest number busy at once,
  queued, requests, prompt tokens reused from a slot's cache …), for tests and operators.

Every connection has its own thread (``ThreadingHTTPServer``, HTTP/1.1 keep-alive); a
chat request is tokenised there and waits for the engine's future, so any number of
clients may be connected while ``slots`` completions are decoded at once and the rest
queue in arrival order. Errors are OpenAI-shaped JSON (``{"error": {"message", "type",
"code"}}``); neither they nor the log ever quote a prompt or a completion.

Run it directly (the local LLM manager :mod:`workers.llm.local` does)::

    python -m workers.llm.serve --model path/to/model.gguf --port 8081 --slots 8
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from workers.llm.engine import (
    DEFAULT_BATCH,
    DEFAULT_CTX_PER_SLOT,
    DEFAULT_LANES,
    DEFAULT_SLOTS,
    DEFAULT_WEIGHT_TYPE,
    WEIGHT_TYPES,
    BatchEngine,
    EngineError,
    RequestTooLong,
    SamplingParams,
)

logger = logging.getLogger(__name__)

MAX_BODY = 1 << 20  # bytes; a chat request of keyseed is a few kB
ROLES = frozenset({"system", "user", "assistant"})


class BadRequest(Exception):
    """The request cannot be served as sent (HTTP 400); the message names the field."""


@dataclass(frozen=True)
class ChatRequest:
    messages: list[dict[str, str]]
    params: SamplingParams


def _number(body: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise BadRequest(f"{name} must be a number")
    if not low <= value <= high:
        raise BadRequest(f"{name} must be between {low:g} and {high:g}")
    return float(value)


def _integer(
    body: dict[str, Any], name: str, default: int | None, low: int, high: int
) -> int | None:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{name} must be an integer")
    if not low <= value <= high:
        raise BadRequest(f"{name} must be between {low} and {high}")
    return value


def parse_chat_request(body: object, *, max_tokens_limit: int) -> ChatRequest:
    """The messages and sampling parameters of a chat request; BadRequest otherwise."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list")
    cleaned = []
    for message in messages:
        if not isinstance(message, dict):
            raise BadRequest("each message must be an object")
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise BadRequest(f"message role must be one of {sorted(ROLES)}")
        if not isinstance(content, str):
            raise BadRequest("message content must be a string")
        cleaned.append({"role": str(role), "content": content})
    if _integer(body, "n", 1, 1, 1) != 1:
        raise BadRequest("n must be 1")
    if body.get("stream"):
        raise BadRequest("stream is not supported")
    stop = body.get("stop")
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,)
    elif isinstance(stop, list) and len(stop) <= 4 and all(isinstance(s, str) for s in stop):
        stops = tuple(stop)
    else:
        raise BadRequest("stop must be a string or a list of at most 4 strings")
    max_tokens = _integer(body, "max_tokens", None, 1, max_tokens_limit)
    if max_tokens is None:
        max_tokens = _integer(body, "max_completion_tokens", 256, 1, max_tokens_limit)
    assert max_tokens is not None
    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 0.8, 0.0, 2.0),
        top_p=_number(body, "top_p", 0.95, 0.0, 1.0),
        frequency_penalty=_number(body, "frequency_penalty", 0.0, -2.0, 2.0),
        presence_penalty=_number(body, "presence_penalty", 0.0, -2.0, 2.0),
        seed=_integer(body, "seed", None, 0, 2**63 - 1),
        stop=stops,
    )
    return ChatRequest(cleaned, params)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256
    engine: BatchEngine
    alias: str
    request_timeout: float


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: _Server
    timeout = 300  # an idle keep-alive connection closes eventually

    def log_message(self, format: str, *args: Any) -> None:  # no per-request stderr lines
        return None

    def _json(self, code: int, data: Any) -> None:
        payload = json.dumps(data).encode()
        try:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except OSError:  # the client went away (its own timeout): nobody to answer
            self.close_connection = True

    def _error(self, code: int, message: str, kind: str) -> None:
        self._json(code, {"error": {"message": message, "type": kind, "code": code}})

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if path in ("/v1/models", "/models"):
            model = {"id": self.server.alias, "object": "model", "owned_by": "keyseed"}
            self._json(200, {"object": "list", "data": [model]})
        elif path == "/health":
            self._json(200, {"status": "ok"})
        elif path == "/slots":
            self._json(200, self.server.engine.stats.as_dict())
        else:
            self._error(404, "not found", "not_found_error")

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit() or int(length) > MAX_BODY:
            self.close_connection = True
            self._error(
                413 if length and length.isdigit() else 411,
                "bad body length",
                "invalid_request_error",
            )
            return
        raw = self.rfile.read(int(length))
        if path not in ("/v1/chat/completions", "/chat/completions"):
            self._error(404, "not found", "not_found_error")
            return
        engine = self.server.engine
        try:
            request = parse_chat_request(json.loads(raw), max_tokens_limit=engine.ctx_per_slot - 1)
            prompt = engine.chat_prompt(request.messages)
            future = engine.submit(prompt, request.params)
            generation = future.result(timeout=self.server.request_timeout)
        except (ValueError, BadRequest, RequestTooLong) as exc:  # JSONDecodeError is a ValueError
            message = str(exc) if isinstance(exc, BadRequest | RequestTooLong) else "invalid JSON"
            self._error(400, message, "invalid_request_error")
            return
        except TimeoutError:
            self._error(503, "the request waited too long for a slot", "server_error")
            return
        except EngineError as exc:
            self._error(500, str(exc), "server_error")
            return
        self._json(
            200,
            {
                "id": f"chatcmpl-{uuid.uuid4().hex}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": self.server.alias,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": generation.text},
                        "finish_reason": generation.finish_reason,
                        "logprobs": None,
                    }
                ],
                "usage": {
                    "prompt_tokens": generation.prompt_tokens,
                    "completion_tokens": generation.completion_tokens,
                    "total_tokens": generation.prompt_tokens + generation.completion_tokens,
                },
            },
        )


def make_server(
    engine: BatchEngine, *, host: str, port: int, alias: str, request_timeout: float = 600.0
) -> ThreadingHTTPServer:
    """A bound (not yet serving) HTTP server for a started ``engine``."""
    server = _Server((host, port), _Handler)
    server.engine = engine
    server.alias = alias
    server.request_timeout = request_timeout
    return server


def _exit_with(parent: int, server: ThreadingHTTPServer) -> None:
    """Stop ``server`` once ``parent`` has exited (this process is then re-parented)."""
    while os.getppid() == parent:
        time.sleep(1.0)
    logger.info("the launching process %d exited; stopping", parent)
    server.shutdown()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m workers.llm.serve",
        description="Serve a gguf model with continuous batching through an OpenAI-compatible API.",
    )
    parser.add_argument("--model", type=Path, required=True, help="a gguf file")
    parser.add_argument("--alias", required=True, help="the model name clients send")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8081)
    parser.add_argument("--slots", type=int, default=DEFAULT_SLOTS)
    parser.add_argument("--ctx-per-slot", type=int, default=DEFAULT_CTX_PER_SLOT)
    parser.add_argument(
        "--threads", type=int, default=None, help="llama.cpp threads in all (default: every CPU)"
    )
    parser.add_argument(
        "--lanes", type=int, default=DEFAULT_LANES, help="independent contexts sharing the slots"
    )
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH)
    parser.add_argument(
        "--weight-type",
        choices=[*sorted(WEIGHT_TYPES), "as-is"],
        default=DEFAULT_WEIGHT_TYPE,
        help="the weights' encoding in memory (as-is: the file's own)",
    )
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument("--verbose", action="store_true", help="llama.cpp's own log")
    parser.add_argument(
        "--exit-with-parent",
        action="store_true",
        help="stop when the process that started this one exits (the launcher, "
        "workers.llm.local, passes it: a launcher killed with SIGKILL leaves no server)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        engine = BatchEngine(
            args.model,
            slots=args.slots,
            ctx_per_slot=args.ctx_per_slot,
            threads=args.threads,
            lanes=args.lanes,
            batch_size=args.batch_size,
            weight_type=None if args.weight_type == "as-is" else args.weight_type,
            cache_dir=args.cache_dir,
            verbose=args.verbose,
        ).start()
    except (ValueError, EngineError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        server = make_server(engine, host=args.host, port=args.port, alias=args.alias)
    except OSError as exc:  # the port is taken
        engine.close()
        print(f"error: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1

    def _shutdown(signum: int, frame: object) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, _shutdown)
    signal.signal(signal.SIGINT, _shutdown)
    if args.exit_with_parent:
        threading.Thread(target=_exit_with, args=(os.getppid(), server), daemon=True).start()
    logger.info("serving %s on %s:%d", args.alias, args.host, args.port)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
        with contextlib.suppress(Exception):
            engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
