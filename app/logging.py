"""structlog JSON logs with dotted event names and a request id that follows the work.

The id comes from ``X-Request-ID`` (when it looks like an id) or is made up, is bound in
structlog's context variables for the life of the request, is returned in the response
header, and travels into Celery tasks as a message header (:func:`task_headers`), where
:func:`bind_task_context` binds it again. Log lines carry ids, counts and codes only.
"""

from __future__ import annotations

import logging
import re
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import structlog
from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

REQUEST_ID_HEADER = "X-Request-ID"
_VALID_ID = re.compile(r"^[A-Za-z0-9._:-]{8,64}$")
log = structlog.get_logger("keyseed.http")


def configure_logging(*, level: str = "INFO", json: bool = True) -> None:
    """structlog and the standard library both render through the same processors."""
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: Any = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer()
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn.access",):  # replaced by the http.request line below
        logging.getLogger(name).disabled = True


def current_request_id() -> str | None:
    value = structlog.contextvars.get_contextvars().get("request_id")
    return value if isinstance(value, str) else None


def task_headers() -> dict[str, str]:
    """Celery message headers carrying the current request id (nothing else)."""
    request_id = current_request_id()
    return {"request_id": request_id} if request_id else {}


def bind_task_context(task_id: str | None, request_id: object) -> None:
    """Called by the worker before each task: the request id of the call that queued it."""
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(
        task_id=task_id,
        request_id=request_id if isinstance(request_id, str) else None,
    )


Observer = Callable[[str, str, int, float], None]  # method, route template, status, seconds


class RequestContextMiddleware:
    """Binds the request id, echoes it in the response, logs one line per request and
    hands the same facts to ``observe`` (the metrics)."""

    def __init__(self, app: ASGIApp, observe: Observer | None = None) -> None:
        self.app = app
        self.observe = observe

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        offered = Headers(scope=scope).get(REQUEST_ID_HEADER, "")
        request_id = offered if _VALID_ID.match(offered) else uuid.uuid4().hex
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(request_id=request_id)
        scope.setdefault("state", {})["request_id"] = request_id
        status = 500
        started = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                MutableHeaders(scope=message)[REQUEST_ID_HEADER] = request_id
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            seconds = time.perf_counter() - started
            route = getattr(scope.get("route"), "path", None) or (
                scope["path"] if "endpoint" in scope else "unmatched"
            )
            log.info(
                "http.request",
                method=scope["method"],
                route=route,
                status=status,
                duration_ms=round(seconds * 1000, 1),
            )
            if self.observe is not None:
                self.observe(scope["method"], route, status, seconds)
            structlog.contextvars.clear_contextvars()
