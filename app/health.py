"""``/healthz`` (the process answers), ``/readyz`` (database and broker), ``/metrics``
(the metrics token, or an admin or auditor key)."""

from __future__ import annotations

from celery import Celery
from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, Field
from sqlalchemy import text

from app import metrics
from app.db import Database
from app.deps import DatabaseDep, MetricsReader
from app.errors import ServiceUnavailable, problems
from app.schemas import with_examples

router = APIRouter(tags=["operations"])


class Health(BaseModel):
    model_config = with_examples({"status": "ok", "checks": {"database": "ok", "broker": "ok"}})

    status: str = Field(
        description="ok when the service answers (and, for /readyz, every check passed)"
    )
    checks: dict[str, str] = Field(
        default={},
        description=(
            "/readyz: each dependency (database, broker) and whether it is ok or unavailable; "
            "empty for /healthz"
        ),
    )


def _database_ok(database: Database) -> bool:
    try:
        with database.engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    except Exception:
        return False
    return True


def _broker_ok(celery: Celery) -> bool:
    try:
        with celery.connection_for_write() as connection:
            connection.ensure_connection(max_retries=1, interval_start=0, timeout=3)
    except Exception:
        return False
    return True


@router.get("/healthz", response_model=Health)
def healthz() -> Health:
    return Health(status="ok")


@router.get("/readyz", response_model=Health, responses=problems(503))
def readyz(request: Request, database: DatabaseDep) -> Health:
    checks = {
        "database": "ok" if _database_ok(database) else "unavailable",
        "broker": "ok" if _broker_ok(request.app.state.celery) else "unavailable",
    }
    if any(v != "ok" for v in checks.values()):
        down = ", ".join(k for k, v in checks.items() if v != "ok")
        raise ServiceUnavailable(f"not ready: {down}", checks=checks)
    return Health(status="ok", checks=checks)


@router.get(
    "/metrics",
    response_class=Response,
    dependencies=[MetricsReader],
    responses={
        200: {"content": {"text/plain": {"schema": {"type": "string"}}}},
        **problems(401, 403),
    },
)
def prometheus_metrics(database: DatabaseDep) -> Response:
    """Prometheus text, for the metrics token or an admin or auditor key."""
    return Response(metrics.render(database), media_type="text/plain; version=0.0.4")
