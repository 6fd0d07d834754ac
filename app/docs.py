"""The API docs (Swagger UI at ``/docs``, ReDoc at ``/redoc``) with every asset served by
this app, so that they work on a machine with no internet.

FastAPI's own pages load Swagger UI and ReDoc from a CDN (and ReDoc its fonts from Google),
which leaves them blank offline. The scripts and stylesheet here are the builds that the
``fastapi-offline`` package ships (MIT, Swagger UI 5 and ReDoc 2), read from its installed
``static`` folder and served under :data:`STATIC_URL`.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

DOCS_URL = "/docs"
REDOC_URL = "/redoc"
STATIC_URL = "/docs/static"
OAUTH2_REDIRECT_URL = "/docs/oauth2-redirect"

# The files this app serves, each read from fastapi-offline's installed package.
ASSETS = ("swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js", "favicon.png")


def asset_directory() -> Path:
    """The installed folder holding :data:`ASSETS`; raises if a file is missing, so a broken
    install fails at start-up instead of serving blank pages."""
    directory = Path(str(files("fastapi_offline") / "static"))
    missing = [name for name in ASSETS if not (directory / name).is_file()]
    if missing:
        raise RuntimeError(f"fastapi-offline lacks the docs assets {', '.join(missing)}")
    return directory


def install(app: FastAPI) -> None:
    """Serve ``/docs``, ``/redoc`` and their assets; ``app`` is made with
    ``docs_url=None, redoc_url=None`` so FastAPI's CDN pages are not registered."""
    app.mount(STATIC_URL, StaticFiles(directory=asset_directory()), name="docs-static")
    openapi_url = app.openapi_url or "/openapi.json"

    def root(request: Request) -> str:
        return str(request.scope.get("root_path", ""))

    @app.get(DOCS_URL, include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        prefix = root(request)
        return get_swagger_ui_html(
            openapi_url=f"{prefix}{openapi_url}",
            title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{prefix}{STATIC_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{prefix}{STATIC_URL}/swagger-ui.css",
            swagger_favicon_url=f"{prefix}{STATIC_URL}/favicon.png",
            oauth2_redirect_url=f"{prefix}{OAUTH2_REDIRECT_URL}",
            # No badge from swagger.io's online validator: nothing leaves this server.
            swagger_ui_parameters={"validatorUrl": None, **(app.swagger_ui_parameters or {})},
        )

    @app.get(OAUTH2_REDIRECT_URL, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get(REDOC_URL, include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        prefix = root(request)
        return get_redoc_html(
            openapi_url=f"{prefix}{openapi_url}",
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{prefix}{STATIC_URL}/redoc.standalone.js",
            redoc_favicon_url=f"{prefix}{STATIC_URL}/favicon.png",
            with_google_fonts=False,
        )
