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
import traceback
import uuid
from collections.abc import Callable
from typing import Any

import structlog
from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

REQUEST_ID_HEADER = "X-Request-ID"
_VALID_ID = re.compile(r"^[A-Za-z0-9._:-]{8,64}$")
log = structlog.get_logger("keyseed.http")


def exception_fields(error: BaseException) -> dict[str, Any]:
    """What a log line says of an exception: its type, the types of its causes, and the
    last frames of where it was raised (file, line, code), never its message nor its
    arguments, which may quote private data."""
    chain: list[str] = []
    seen: BaseException | None = error
    while seen is not None and len(chain) < 5:
        chain.append(type(seen).__name__)
        seen = seen.__cause__ or seen.__context__
    fields: dict[str, Any] = {"error": chain[0]}
    if len(chain) > 1:
        fields["error_causes"] = chain[1:]
    fields["frames"] = traceback.format_tb(error.__traceback__)[-8:]
    return fields


def _exception_types_only(_: Any, __: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    """Replace an exception attached to a log line (``exc_info``, as ``log.exception``
    and the standard library's loggers attach one) by :func:`exception_fields`. A line
    of another library that carries an exception keeps its message template but not its
    arguments (Celery, for one, formats the exception into them)."""
    info = event_dict.pop("exc_info", None)
    event_dict.pop("exception", None)
    if info is True:
        info = sys.exc_info()
    error = info if isinstance(info, BaseException) else info[1] if info else None
    if isinstance(error, BaseException):
        for name, value in exception_fields(error).items():
            event_dict.setdefault(name, value)
        record = event_dict.get("_record")
        if isinstance(record, logging.LogRecord) and not event_dict.get("_from_structlog"):
            event_dict["event"] = str(record.msg)
    return event_dict


def configure_logging(*, level: str = "INFO", json: bool = True) -> None:
    """structlog and the standard library both render through the same processors;
    exceptions are logged by type only (:func:`exception_fields`)."""
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _exception_types_only,
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
    for name in ("uvicorn", "uvicorn.error"):  # uvicorn's lines go through these handlers
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True
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
