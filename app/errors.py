"""One exception hierarchy and one way to answer it: RFC 9457 ``application/problem+json``.

Services raise a :class:`Problem` subclass; :func:`install` turns it (and framework
errors, request validation errors and the core's ``ConfigError``) into a problem body.
Bodies name fields, rows and figures, never a value taken from an uploaded document:
validation errors are stripped of the ``input`` pydantic would echo.
"""

from __future__ import annotations

import re
from http import HTTPStatus
from typing import Any, ClassVar

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict
from sqlalchemy.exc import DataError, IntegrityError
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.logging import exception_fields
from workers.errors import KeyseedError

PROBLEM_JSON = "application/problem+json"
log = structlog.get_logger("keyseed.errors")


class ProblemDetail(BaseModel):
    """An RFC 9457 problem; extension members (``field``, ``errors`` …) may follow."""

    model_config = ConfigDict(extra="allow")

    type: str = "about:blank"
    title: str
    status: int
    detail: str | None = None
    instance: str | None = None


class Problem(Exception):
    status: ClassVar[int] = 500
    title: ClassVar[str] = "Internal Server Error"

    def __init__(
        self, detail: str | None = None, *, headers: dict[str, str] | None = None, **extra: Any
    ) -> None:
        super().__init__(detail or self.title)
        self.detail = detail
        self.headers = headers
        self.extra = extra


class BadRequest(Problem):
    status, title = 400, "Bad Request"


class Unauthorized(Problem):
    status, title = 401, "Unauthorized"

    def __init__(self, detail: str, *, invalid: bool = False) -> None:
        challenge = 'Bearer error="invalid_token"' if invalid else "Bearer"
        super().__init__(detail, headers={"WWW-Authenticate": challenge})


class Forbidden(Problem):
    status, title = 403, "Forbidden"


class NotFound(Problem):
    status, title = 404, "Not Found"


class Conflict(Problem):
    status, title = 409, "Conflict"


class BudgetExceeded(Conflict):
    title = "Privacy budget exceeded"


class ContentTooLarge(Problem):
    status, title = 413, "Content Too Large"


class UnsupportedMediaType(Problem):
    status, title = 415, "Unsupported Media Type"


class Unprocessable(Problem):
    status, title = 422, "Unprocessable Content"


class ServiceUnavailable(Problem):
    status, title = 503, "Service Unavailable"


class BodyTooLarge(StarletteHTTPException):
    """Raised while a request body is read (FastAPI lets HTTP exceptions through)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body is larger than {limit} bytes")


def problem_response(
    status: int,
    title: str,
    detail: str | None = None,
    *,
    instance: str | None = None,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> JSONResponse:
    body = {"type": "about:blank", "title": title, "status": status, "detail": detail}
    if instance:
        body["instance"] = instance
    body.update(extra)
    return JSONResponse(body, status_code=status, headers=headers, media_type=PROBLEM_JSON)


def _title(status: int) -> str:
    modern = {413: ContentTooLarge.title, 422: Unprocessable.title}
    try:
        return modern.get(status) or HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def _clean_validation_errors(errors: Any) -> list[dict[str, Any]]:
    return [
        {"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": e.get("type")}
        for e in errors
    ]


_FIELD_PART = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


def _field(error: dict[str, Any]) -> str | None:
    """The dotted name of the field an error is about: ``labels.0``, ``epsilon_cap``.

    Past the location (``body``, ``query`` …) come names and list indexes, and perhaps
    pydantic's tags of a union's branches (``literal['csv','jsonl']``, a job's
    ``method=aug-pe``), which are left out. Malformed JSON is located by a character
    offset, which names no field.
    """
    if error.get("type") == "json_invalid":
        return None
    parts: list[str] = []
    for part in error["loc"][1:]:
        if isinstance(part, int) or _FIELD_PART.match(str(part)):
            parts.append(str(part))
    return ".".join(parts) or None


def install(app: FastAPI) -> None:
    """Register the handlers that render every error as problem+json."""

    async def on_problem(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, Problem)
        return problem_response(
            exc.status,
            exc.title,
            exc.detail,
            instance=request.url.path,
            headers=exc.headers,
            **exc.extra,
        )

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        detail = exc.detail if isinstance(exc.detail, str) else None
        return problem_response(
            exc.status_code,
            _title(exc.status_code),
            detail,
            instance=request.url.path,
            headers=dict(exc.headers or {}),
        )

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        errors = _clean_validation_errors(exc.errors())
        field = _field(errors[0]) if errors else None
        # A rule between fields (a model's own validator: ``value_error``) is no bound the
        # schema can state; the rest are the schema's own bounds and types.
        semantic = bool(errors) and all(e.get("type") == "value_error" for e in errors)
        return problem_response(
            422,
            Unprocessable.title,
            "the request breaks a rule between its fields"
            if semantic
            else "the request does not match the schema",
            instance=request.url.path,
            field=field,
            errors=errors,
        )

    async def on_core(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, KeyseedError)
        return problem_response(
            422, Unprocessable.title, exc.message, instance=request.url.path, field=exc.field
        )

    async def on_data(request: Request, exc: Exception) -> JSONResponse:
        # A value the database cannot hold (a NUL byte, a number out of range) that
        # validation let through: the client's error, never echoed back.
        log.warning("http.unstorable_value", error=type(exc).__name__)
        return problem_response(
            422, Unprocessable.title, "a value cannot be stored", instance=request.url.path
        )

    async def on_integrity(request: Request, exc: Exception) -> JSONResponse:
        # A uniqueness race the service checks could not see (two requests at once).
        log.warning("http.integrity_conflict", error=type(exc).__name__)
        return problem_response(
            409,
            Conflict.title,
            "the change conflicts with existing data",
            instance=request.url.path,
        )

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        # The message of an arbitrary exception may quote data: log its type and frames.
        log.error("http.unhandled_error", **exception_fields(exc))
        return problem_response(500, Problem.title, "an unexpected error occurred")

    app.add_exception_handler(Problem, on_problem)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(KeyseedError, on_core)
    app.add_exception_handler(DataError, on_data)
    app.add_exception_handler(IntegrityError, on_integrity)
    app.add_exception_handler(Exception, on_unexpected)


def problems(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries documenting problem+json bodies for ``statuses``."""
    schema = {"$ref": "#/components/schemas/ProblemDetail"}
    return {
        status: {"description": _title(status), "content": {PROBLEM_JSON: {"schema": schema}}}
        for status in statuses
    }
