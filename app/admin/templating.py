"""Jinja2 pages of the dashboard, their error page, and the headers every page carries.

Templates autoescape everything. Pages allow scripts, styles and images from the app
itself only (``Content-Security-Policy``): no CDN, no inline script or style; bars and
charts are SVG drawn on the server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import jinja2
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse
from starlette.responses import Response

from app.admin import formatting
from app.errors import Problem

HERE = Path(__file__).resolve().parent
TEMPLATES = HERE / "templates"
STATIC = HERE / "static"
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'; object-src 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}

environment = jinja2.Environment(
    loader=jinja2.FileSystemLoader(TEMPLATES),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
environment.filters.update(
    eps=formatting.epsilon,
    fig=formatting.figure,
    sig=formatting.significant,
    exact=formatting.exact_text,
    entry_kind=formatting.entry_kind,
    budget_state=formatting.budget_state,
    audit_kind=formatting.audit_kind,
    accountant=formatting.accountant,
    pct=formatting.percent,
    when=formatting.when,
    iso=formatting.iso,
    mechanisms=formatting.mechanisms,
    details=formatting.details,
    short=lambda value: str(value)[:8],
    seconds=formatting.seconds,
    job_stage=lambda job: _job_stage(job),
)


def _job_stage(job: Any) -> Any:
    """A job's running stage as the platform roles see it (never its start time)."""
    from app.jobs.service import current_stage

    return current_stage(job, owner=False)


def root(request: Request) -> str:
    """The path the app is mounted under (behind a proxy), prefixed to every link."""
    return str(request.scope.get("root_path", "")).rstrip("/")


def render(
    request: Request,
    template: str,
    context: dict[str, Any],
    *,
    status_code: int = 200,
    headers: dict[str, str] | None = None,
) -> HTMLResponse:
    values: dict[str, Any] = {"root": root(request), "badge": None, "section": ""}
    values.update(context)
    # the footer names the accountants behind the page's figures (the ledger's own names)
    in_force = list(context.get("accountants", ()))
    values["accountants"] = formatting.accountants(in_force)
    values["accountant_scope"] = "this page's figures" if in_force else "the ledger"
    html = environment.get_template(template).render(values)
    return secured(HTMLResponse(html, status_code=status_code, headers=headers))


R = TypeVar("R", bound=Response)


def secured(response: R) -> R:
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    return response


def error_page(request: Request, exc: Problem | RequestValidationError) -> HTMLResponse:
    if isinstance(exc, Problem):
        status, title, detail = exc.status, exc.title, exc.detail or exc.title
        headers = dict(exc.headers or {})
        headers.pop("WWW-Authenticate", None)
    else:
        status, title, detail = 422, "Unprocessable Content", "the request is not valid"
        headers = {}
    return render(
        request,
        "error.html",
        {
            "status": status,
            "title": title,
            "detail": detail,
            "badge": getattr(request.state, "admin_badge", None),
        },
        status_code=status,
        headers=headers,
    )
