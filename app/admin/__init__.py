"""The admin dashboard at ``/admin``: privacy-budget audits in a browser (see router)."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from app.admin.router import router
from app.admin.templating import STATIC


def install(app: FastAPI) -> None:
    """Mount the dashboard's pages and its static files (served by the app itself)."""
    app.include_router(router)
    app.mount("/admin/static", StaticFiles(directory=STATIC), name="admin-static")
