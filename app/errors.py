"""One exception hierarchy and one way to answer it: RFC 9457 ``application/problem+json``.

Services raise a :class:`Problem` subclass; :func:`install` turns it (and framework
errors, request validation errors and the core's ``ConfigError``) into a problem body.
Bodies name fields, rows and figures, never a value taken from an uploaded document:
validation errors are stripped of the ``input`` pydantic would echo.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from html import escape
from http import HTTPStatus
from typing import Any, ClassVar

import structlog
from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel, Field
from sqlalchemy.exc import DataError, IntegrityError
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.logging import exception_fields
from app.schemas import with_examples
from workers.errors import KeyseedError

PROBLEM_JSON = "application/problem+json"
log = structlog.get_logger("keyseed.errors")


# Problem types: one stable URI per kind of error, relative to the API's root (RFC 9457
# §3.1.1 allows a relative reference; it resolves against the request's URL to this
# server's own page for the type, ``GET /problems/{slug}``). The URIs never change once
# published: clients may branch on them.
PROBLEMS_PATH = "/problems"


@dataclass(frozen=True)
class ProblemType:
    """One kind of error: its slug, usual HTTP status, title and what it means."""

    slug: str
    status: int
    title: str
    meaning: str

    @property
    def uri(self) -> str:
        return f"{PROBLEMS_PATH}/{self.slug}"


PROBLEM_TYPES: dict[str, ProblemType] = {
    t.slug: t
    for t in (
        ProblemType(
            "bad-request",
            400,
            "Bad Request",
            "The request cannot be read at all: a malformed multipart or form body, say. The "
            "web framework answers it before the service sees the request (a malformed JSON "
            "body is a `validation-error`).",
        ),
        ProblemType(
            "unauthorized",
            401,
            "Unauthorized",
            "No API key, a malformed `Authorization` header, or a key that is unknown or "
            "revoked. Send `Authorization: Bearer <key>`; the `WWW-Authenticate` header says "
            'whether the key itself was refused (`error="invalid_token"`).',
        ),
        ProblemType(
            "forbidden",
            403,
            "Forbidden",
            "The key is valid but its role may not do this (a client key submitting a job, an "
            "auditor changing a budget, a platform key downloading a released corpus).",
        ),
        ProblemType(
            "not-found",
            404,
            "Not Found",
            "No such path, or no such object visible to the caller: an object of another "
            "organisation answers 404 too, so that its existence is not revealed.",
        ),
        ProblemType(
            "method-not-allowed",
            405,
            "Method Not Allowed",
            "The path exists but does not take this HTTP method; the `Allow` header lists the "
            "ones it takes.",
        ),
        ProblemType(
            "conflict",
            409,
            "Conflict",
            "The request conflicts with the current state of an object: a name already in use, "
            "a job that is no longer in a state that allows the action (cancel, retry, "
            "release), a dataset with jobs still running, or two requests that raced.",
        ),
        ProblemType(
            "budget-exceeded",
            409,
            "Privacy budget exceeded",
            "The privacy budget cannot cover the request: a job's (ε, δ) is more than the "
            "dataset's cap has left, or a dataset's cap more than its organisation's budget "
            "has left. `detail` names what was asked and what remains; nothing is reserved.",
        ),
        ProblemType(
            "limit-exceeded",
            409,
            "Organisation limit exceeded",
            "A job is over one of the limits each organisation has, so that no organisation "
            "holds the workers for everyone: jobs queued or running at once, LLM calls or "
            "tokens (calls × max_tokens) per job, LLM requests in flight. The dry run and the "
            "submission refuse it alike; `limit` names the limit, `value` gives it, `asked` "
            "what the job would take, and `field` the spec field to change where one is to "
            "blame. Nothing is reserved.",
        ),
        ProblemType(
            "content-too-large",
            413,
            "Content Too Large",
            "The request body is over the server's limit (one limit for JSON bodies, a larger "
            "one for uploads), or an upload has more rows or longer texts than allowed. The "
            "body is refused as it streams in; nothing of it is stored.",
        ),
        ProblemType(
            "unsupported-media-type",
            415,
            "Unsupported Media Type",
            "An uploaded file is not UTF-8 text (binary data, a compressed file, another "
            "encoding), or a dashboard form was not posted as "
            "`application/x-www-form-urlencoded`.",
        ),
        ProblemType(
            "validation-error",
            422,
            "Unprocessable Content",
            "The request does not match the schema (a missing field, a wrong type, a value out "
            "of bounds, an unknown field) or breaks a rule between its fields. `field` names "
            "the first offending field; `errors` lists every error as `loc`, `msg` and `type`, "
            "never echoing the value sent.",
        ),
        ProblemType(
            "unprocessable",
            422,
            "Unprocessable Content",
            "The request matches the schema but cannot be carried out as asked: engine "
            "parameters that do not fit together or do not fit the dataset (a job spec the "
            "engine would refuse), an LLM this server does not offer, an upload with rows that "
            "cannot be used, a value the database cannot store. `field` names the field when "
            "one is to blame.",
        ),
        ProblemType(
            "range-not-satisfiable",
            416,
            "Range Not Satisfiable",
            "A download's `Range` header cannot be served: it is not of the form `bytes=a-b` "
            "(ranges separated by commas, `a-` and `-n` allowed), a range ends before it starts, "
            "or no range starts within the file. `Content-Range: bytes */size` gives the "
            "file's size; ask again without `Range`, or within it.",
        ),
        ProblemType(
            "internal-error",
            500,
            "Internal Server Error",
            "An unexpected error in the service. The body says nothing more; the server's log "
            "has the error's type and the request id (the `X-Request-ID` response header).",
        ),
        ProblemType(
            "service-unavailable",
            503,
            "Service Unavailable",
            "`GET /readyz`: the database or the task broker cannot be reached; `checks` names "
            "which.",
        ),
        ProblemType(
            "http-error",
            0,
            "HTTP error",
            "Any other HTTP error the web framework raises before the request reaches the "
            "service (`status` gives the code); no endpoint of this API raises one itself.",
        ),
    )
}

# The type of an error raised by the framework (or a handler) with only a status code.
_TYPE_OF_STATUS: dict[int, str] = {
    400: "bad-request",
    401: "unauthorized",
    403: "forbidden",
    404: "not-found",
    405: "method-not-allowed",
    409: "conflict",
    413: "content-too-large",
    415: "unsupported-media-type",
    416: "range-not-satisfiable",
    422: "unprocessable",
    500: "internal-error",
    503: "service-unavailable",
}


def type_of_status(status: int) -> ProblemType:
    """The problem type an error known only by its HTTP status has."""
    return PROBLEM_TYPES[_TYPE_OF_STATUS.get(status, "http-error")]


class ProblemDetail(BaseModel):
    """An RFC 9457 problem; extension members (``field``, ``errors`` …) may follow."""

    model_config = with_examples(
        {
            "type": "/problems/budget-exceeded",
            "title": "Privacy budget exceeded",
            "status": 409,
            "detail": "the job asks for ε = 2 at δ = 0 (basic) but the dataset has ε = 0.5 "
            "left at δ = 0 (cap ε = 1, δ = 0; spent ε = 0.5, reserved ε = 0; with this "
            "job: ε = 2.5 at δ = 0)",
            "instance": "/v1/datasets/3f0c9a52-8d55-4a0e-9d43-0b7c3a9e5f21/jobs",
        },
        extra="allow",
    )

    type: str = Field(
        description="The kind of error: a URI reference, relative to the API's root, of a "
        "page describing it (`/problems/{slug}`, one per kind; see `GET /problems`). Stable: "
        "clients may branch on it."
    )
    title: str = Field(
        description="A short summary of the kind of error, the same for every occurrence of a type"
    )
    status: int = Field(description="The HTTP status code of the response (100-599)")
    detail: str | None = Field(
        default=None,
        description="What went wrong in this occurrence, in English; names fields, rows and "
        "figures, never a value taken from an uploaded document",
    )
    instance: str | None = Field(default=None, description="The path of the request that failed")


class Problem(Exception):
    status: ClassVar[int] = 500
    title: ClassVar[str] = "Internal Server Error"
    type_slug: ClassVar[str] = "internal-error"

    def __init__(
        self, detail: str | None = None, *, headers: dict[str, str] | None = None, **extra: Any
    ) -> None:
        super().__init__(detail or self.title)
        self.detail = detail
        self.headers = headers
        self.extra = extra

    @classmethod
    def problem_type(cls) -> ProblemType:
        return PROBLEM_TYPES[cls.type_slug]


class BadRequest(Problem):
    status, title, type_slug = 400, "Bad Request", "bad-request"


class Unauthorized(Problem):
    status, title, type_slug = 401, "Unauthorized", "unauthorized"

    def __init__(self, detail: str, *, invalid: bool = False) -> None:
        challenge = 'Bearer error="invalid_token"' if invalid else "Bearer"
        super().__init__(detail, headers={"WWW-Authenticate": challenge})


class Forbidden(Problem):
    status, title, type_slug = 403, "Forbidden", "forbidden"


class NotFound(Problem):
    status, title, type_slug = 404, "Not Found", "not-found"


class Conflict(Problem):
    status, title, type_slug = 409, "Conflict", "conflict"


class BudgetExceeded(Conflict):
    title, type_slug = "Privacy budget exceeded", "budget-exceeded"


class LimitExceeded(Conflict):
    title, type_slug = "Organisation limit exceeded", "limit-exceeded"


class ContentTooLarge(Problem):
    status, title, type_slug = 413, "Content Too Large", "content-too-large"


class UnsupportedMediaType(Problem):
    status, title, type_slug = 415, "Unsupported Media Type", "unsupported-media-type"


class RangeNotSatisfiable(Problem):
    status, title, type_slug = 416, "Range Not Satisfiable", "range-not-satisfiable"

    def __init__(self, size: int) -> None:
        super().__init__(
            "the Range header asks for no bytes of this file (its size is in Content-Range)",
            headers={"Content-Range": f"bytes */{size}"},
        )


class Unprocessable(Problem):
    status, title, type_slug = 422, "Unprocessable Content", "unprocessable"


class ServiceUnavailable(Problem):
    status, title, type_slug = 503, "Service Unavailable", "service-unavailable"


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
    problem_type: ProblemType | None = None,
    **extra: Any,
) -> JSONResponse:
    """A problem+json response; ``problem_type`` defaults to the type of ``status``."""
    uri = (problem_type or type_of_status(status)).uri
    body = {"type": uri, "title": title, "status": status, "detail": detail}
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
            problem_type=exc.problem_type(),
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
            problem_type=PROBLEM_TYPES["validation-error"],
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
    app.include_router(problems_router)


def problems(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries documenting problem+json bodies for ``statuses``, each
    naming the problem types a response of that status may carry."""
    schema = {"$ref": "#/components/schemas/ProblemDetail"}
    entries: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        types = [t for t in PROBLEM_TYPES.values() if t.status == status]
        named = ", ".join(f"`{t.uri}`" for t in types) or f"`{type_of_status(status).uri}`"
        example = (types or [type_of_status(status)])[0]
        entries[status] = {
            "description": f"{_title(status)} (problem type {named})",
            "content": {
                PROBLEM_JSON: {
                    "schema": schema,
                    "example": {
                        "type": example.uri,
                        "title": example.title,
                        "status": status,
                        "detail": _EXAMPLE_DETAIL.get(example.slug, example.title),
                    },
                }
            },
        }
    return entries


_EXAMPLE_DETAIL = {
    "bad-request": "There was an error parsing the body",
    "unauthorized": "the API key is not valid",
    "forbidden": "the client role may not job submit",
    "not-found": "no such dataset",
    "conflict": "only a succeeded job can be released (this one is running)",
    "content-too-large": "the request body is larger than 1048576 bytes",
    "unsupported-media-type": "the file holds binary data; upload UTF-8 CSV or JSONL text",
    "validation-error": "the request does not match the schema",
    "service-unavailable": "not ready: broker",
}


def _page(problem: ProblemType) -> str:
    status = f"HTTP {problem.status}" if problem.status else "any other HTTP status"
    return (
        f"<h2 id='{problem.slug}'><code>{escape(problem.uri)}</code></h2>"
        f"<p><strong>{escape(problem.title)}</strong>, {status}.</p>"
        f"<p>{escape(problem.meaning)}</p>"
    )


def _html(title: str, body: str) -> HTMLResponse:
    return HTMLResponse(
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{escape(title)}</title></head><body><h1>{escape(title)}</h1>{body}"
        f"<p><a href='{PROBLEMS_PATH}'>Every problem type</a> · <a href='/docs'>API docs</a>"
        "</p></body></html>"
    )


problems_router = APIRouter(prefix=PROBLEMS_PATH, include_in_schema=False)


@problems_router.get("")
async def problem_types(request: Request) -> Any:
    """Every problem type: HTML, or JSON when the client asks for JSON only."""
    if _wants_json(request):
        return JSONResponse([_as_json(t) for t in PROBLEM_TYPES.values()])
    return _html("keyseed problem types", "".join(_page(t) for t in PROBLEM_TYPES.values()))


@problems_router.get("/{slug}")
async def problem_type(slug: str, request: Request) -> Any:
    """The page of one problem type (the URI in a problem's ``type``)."""
    found = PROBLEM_TYPES.get(slug)
    if found is None:
        raise NotFound("no such problem type")
    if _wants_json(request):
        return JSONResponse(_as_json(found))
    return _html(f"keyseed problem: {found.title}", _page(found))


def _wants_json(request: Request) -> bool:
    accept = request.headers.get("accept", "")
    return "json" in accept and "html" not in accept


def _as_json(problem: ProblemType) -> dict[str, Any]:
    return {
        "type": problem.uri,
        "title": problem.title,
        "status": problem.status or None,
        "meaning": problem.meaning,
    }
