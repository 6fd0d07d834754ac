"""Request dependencies, defined once: the session, the settings, the caller.

The session commits when the route returns and rolls back when it raises (read-only for
``GET`` routes, see :func:`get_session`); it ends before the response is sent
(``scope="function"``), so a failed commit is an error response, never a success the
database does not hold. Routes never commit.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Iterator
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from app.config import Settings
from app.crypto import DocumentCipher
from app.db import Database
from app.errors import Unauthorized
from app.identity import policy
from app.identity import service as identity
from app.identity.policy import Action, Principal

_bearer = HTTPBearer(
    auto_error=False, bearerFormat="ks_<prefix>_<secret>", description="An API key"
)


def get_database(request: Request) -> Database:
    database: Database = request.app.state.database
    return database


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_cipher(request: Request) -> DocumentCipher:
    cipher: DocumentCipher = request.app.state.cipher
    return cipher


SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
_WRITES = "keyseed_writes"


def writing(endpoint: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a ``GET`` route that writes (a download is an audit event): its session is a
    writing one. Every other ``GET`` route reads only."""
    setattr(endpoint, _WRITES, True)
    return endpoint


def get_session(
    request: Request, database: Annotated[Database, Depends(get_database)]
) -> Iterator[Session]:
    """The request's session: read-only for a safe method (it takes no write lock), unless
    the route is marked :func:`writing`."""
    endpoint = request.scope.get("endpoint")
    write = request.method not in SAFE_METHODS or getattr(endpoint, _WRITES, False)
    with database.transaction(write=write) as session:
        yield session


DatabaseDep = Annotated[Database, Depends(get_database)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
CipherDep = Annotated[DocumentCipher, Depends(get_cipher)]
SessionDep = Annotated[Session, Depends(get_session, scope="function")]


def get_principal(
    session: SessionDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    if credentials is None or not credentials.credentials:
        raise Unauthorized("send an API key: Authorization: Bearer ks_…")
    return identity.authenticate(session, credentials.credentials)


CurrentPrincipal = Annotated[Principal, Depends(get_principal, scope="function")]


def read_metrics(
    session: SessionDep,
    settings: SettingsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """``/metrics`` answers the configured metrics token (``KEYSEED_METRICS_TOKEN``, for
    a Prometheus scraper) or an admin or auditor key."""
    given = credentials.credentials if credentials is not None else ""
    if not given:
        raise Unauthorized("send the metrics token or an admin or auditor key: Bearer …")
    token = settings.metrics_token.get_secret_value()
    if token and hmac.compare_digest(given.encode(), token.encode()):
        return
    policy.authorize(identity.authenticate(session, given), Action.METRICS_READ)


MetricsReader = Depends(read_metrics, scope="function")


def allowed(action: Action) -> Any:
    """``Annotated[Principal, allowed(Action.X)]``: the caller, if its role may do X."""

    def dependency(principal: CurrentPrincipal) -> Principal:
        return policy.authorize(principal, action)

    dependency.__name__ = f"allowed_{action.name.lower()}"
    check: Callable[..., Principal] = dependency
    return Depends(check, scope="function")
