"""The FastAPI application: ``create_app(settings)`` wires settings, database, broker,
document key, error handlers, middleware and the routers of every domain.

Run it with ``keyseed api`` (:mod:`app.server`: uvicorn with the settings' limits on
header size, unfinished requests and trusted proxies); a bare ``uvicorn --factory
app.main:create_app`` has none of them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app import admin, docs, errors, health, metrics
from app.config import Settings, get_settings
from app.crypto import DocumentCipher
from app.datasets import service as datasets_service
from app.datasets.router import router as datasets_router
from app.db import Database
from app.identity.router import router as identity_router
from app.jobs.router import router as jobs_router
from app.ledger.router import router as audit_router
from app.logging import RequestContextMiddleware, configure_logging
from app.releases.router import router as releases_router
from app.vocabularies.router import router as vocabularies_router
from app.worker import create_celery, declare_queues, declares_queues

MULTIPART_OVERHEAD = 2**20  # form fields and boundaries around an upload

DESCRIPTION = """\
Differentially private synthetic text by keyphrase prompt seeding (DP-KPS).

Data owners upload labelled corpora (encrypted at rest, never readable through the API),
submit generation jobs that reserve privacy budget against each dataset's cap, and
release the synthetic corpora to client organisations. Every error is
`application/problem+json` (RFC 9457).
"""


def _description() -> str:
    """The API's description, ending with the table of problem types."""
    rows = "\n".join(
        f"| [`{t.uri}`]({t.uri}) | {t.status or 'any other'} | {t.title} |"
        for t in errors.PROBLEM_TYPES.values()
    )
    return (
        f"{DESCRIPTION}\n"
        "## Problem types\n\n"
        "An error's `type` is one of these URIs, relative to the API's root; each is a page "
        "of this server saying what the error means (`GET /problems` lists them all; send "
        "`Accept: application/json` for JSON). They never change once published.\n\n"
        "| `type` | status | title |\n| --- | --- | --- |\n"
        f"{rows}\n"
    )


def _version() -> str:
    try:
        return version("keyseed")
    except PackageNotFoundError:
        return "0"


class BodyLimitMiddleware:
    """Refuse request bodies over the limit (413) while they stream in, before they are
    spooled anywhere: uploads (multipart, and chunks as application/octet-stream) get
    the upload limit of one request, everything else the JSON limit."""

    def __init__(self, app: ASGIApp, *, json_limit: int, upload_limit: int) -> None:
        self.app = app
        self.json_limit = json_limit
        self.upload_limit = upload_limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        content_type = headers.get("content-type", "")
        upload = content_type.startswith(("multipart/form-data", "application/octet-stream"))
        limit = self.upload_limit if upload else self.json_limit
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            too_large = errors.BodyTooLarge(limit)
            response = errors.problem_response(
                413, errors.ContentTooLarge.title, str(too_large.detail), instance=scope["path"]
            )
            await response(scope, receive, send)
            return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise errors.BodyTooLarge(limit)
            return message

        await self.app(scope, limited, send)


def _openapi(app: FastAPI) -> Any:
    def build() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
            )
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            components["ProblemDetail"] = errors.ProblemDetail.model_json_schema()
            app.openapi_schema = schema
        return app.openapi_schema

    return build


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    configure_logging(level=settings.log_level, json=settings.log_json)
    celery = create_celery(settings)
    if declares_queues(settings):
        declare_queues(celery)
    database = Database.from_settings(settings, celery=celery)
    cipher = DocumentCipher.from_settings(settings)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await run_in_threadpool(datasets_service.destroy_deleted_keys, database, cipher)
        yield
        database.dispose()

    app = FastAPI(
        title="keyseed",
        version=_version(),
        description=_description(),
        lifespan=lifespan,
        docs_url=None,  # served from the installed package by app.docs, not from a CDN
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.database = database
    app.state.celery = celery
    app.state.cipher = cipher
    errors.install(app)
    for router in (
        health.router,
        identity_router,
        datasets_router,
        vocabularies_router,
        jobs_router,
        releases_router,
        audit_router,
    ):
        app.include_router(router)
    admin.install(app)
    docs.install(app)
    app.add_middleware(
        BodyLimitMiddleware,
        json_limit=settings.max_json_bytes,
        upload_limit=settings.upload_request_limit + MULTIPART_OVERHEAD,
    )
    app.add_middleware(RequestContextMiddleware, observe=metrics.observe_request)
    app.openapi = _openapi(app)  # type: ignore[method-assign]
    return app
