"""Who may do what, in one place.

Two questions, asked in this order by every route:

1. May this role perform this action at all? (:data:`RULES`; no → 403)
2. Is the object in the caller's reach? (:func:`ensure_visible`; no → 404, so that the
   objects of other organisations are indistinguishable from objects that do not exist)

Platform roles (admin, auditor) reach every object; an owner reaches its organisation's
objects; a client reaches the releases granted to its organisation.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, TypeVar

from app.errors import Forbidden, NotFound

PLATFORM_ROLES = frozenset({"admin", "auditor"})


@dataclass(frozen=True)
class Actor:
    """Whoever caused a change: ``key:<id>``, ``user:<id>`` or ``system:<name>``."""

    ref: str
    organisation_id: uuid.UUID | None = None

    @classmethod
    def system(cls, name: str) -> Actor:
        return cls(f"system:{name}")


@dataclass(frozen=True)
class Principal:
    """An authenticated caller: an API key or a signed-in person."""

    kind: str  # "key" | "user"
    id: uuid.UUID
    role: str
    organisation_id: uuid.UUID

    @property
    def actor(self) -> Actor:
        return Actor(f"{self.kind}:{self.id}", self.organisation_id)

    @property
    def platform(self) -> bool:
        return self.role in PLATFORM_ROLES


class Action(StrEnum):
    ORGANISATION_CREATE = "organisation.create"
    ORGANISATION_LIST = "organisation.list"
    ORGANISATION_READ_BUDGET = "organisation.read_budget"
    ORGANISATION_SET_BUDGET = "organisation.set_budget"
    KEY_CREATE = "key.create"
    KEY_LIST = "key.list"
    KEY_REVOKE = "key.revoke"
    DATASET_CREATE = "dataset.create"
    DATASET_READ = "dataset.read"
    DATASET_DELETE = "dataset.delete"
    DATASET_SET_CAP = "dataset.set_cap"
    LEDGER_READ = "ledger.read"
    VOCABULARY_READ = "vocabulary.read"
    VOCABULARY_CREATE = "vocabulary.create"
    JOB_SUBMIT = "job.submit"
    JOB_READ = "job.read"
    JOB_CANCEL = "job.cancel"
    JOB_RETRY = "job.retry"
    RELEASE_CREATE = "release.create"
    RELEASE_READ = "release.read"
    RELEASE_DOWNLOAD = "release.download"
    AUDIT_READ = "audit.read"
    DASHBOARD_USE = "dashboard.use"
    METRICS_READ = "metrics.read"


_OWNER, _CLIENT, _ADMIN, _AUDITOR = "owner", "client", "admin", "auditor"

RULES: dict[Action, frozenset[str]] = {
    Action.ORGANISATION_CREATE: frozenset({_ADMIN}),
    Action.ORGANISATION_LIST: frozenset({_ADMIN, _AUDITOR}),
    # An owner reads its own organisation's budget (others: 404); only admins set one.
    Action.ORGANISATION_READ_BUDGET: frozenset({_OWNER, _ADMIN, _AUDITOR}),
    Action.ORGANISATION_SET_BUDGET: frozenset({_ADMIN}),
    Action.KEY_CREATE: frozenset({_ADMIN}),
    Action.KEY_LIST: frozenset({_ADMIN, _AUDITOR, _OWNER, _CLIENT}),  # others: own org
    Action.KEY_REVOKE: frozenset({_ADMIN}),
    Action.DATASET_CREATE: frozenset({_OWNER}),
    Action.DATASET_READ: frozenset({_OWNER, _ADMIN, _AUDITOR}),
    Action.DATASET_DELETE: frozenset({_OWNER, _ADMIN}),
    Action.DATASET_SET_CAP: frozenset({_ADMIN}),
    Action.LEDGER_READ: frozenset({_OWNER, _ADMIN, _AUDITOR}),
    Action.VOCABULARY_READ: frozenset({_OWNER, _ADMIN, _AUDITOR}),
    Action.VOCABULARY_CREATE: frozenset({_OWNER, _ADMIN}),
    Action.JOB_SUBMIT: frozenset({_OWNER}),
    Action.JOB_READ: frozenset({_OWNER, _ADMIN, _AUDITOR}),
    Action.JOB_CANCEL: frozenset({_OWNER, _ADMIN}),
    # Prompting again from the persisted sequences: no private read, no budget.
    Action.JOB_RETRY: frozenset({_OWNER, _ADMIN}),
    Action.RELEASE_CREATE: frozenset({_OWNER}),
    Action.RELEASE_READ: frozenset({_OWNER, _CLIENT, _ADMIN, _AUDITOR}),
    # A released corpus is readable by its owner and its grantees only (service.md).
    Action.RELEASE_DOWNLOAD: frozenset({_OWNER, _CLIENT}),
    Action.AUDIT_READ: frozenset({_ADMIN, _AUDITOR}),
    # The admin dashboard is for people (signed in, never an API key) of the platform.
    Action.DASHBOARD_USE: frozenset({_ADMIN, _AUDITOR}),
    # /metrics (or the configured metrics token): operations data of every organisation.
    Action.METRICS_READ: frozenset({_ADMIN, _AUDITOR}),
}


def authorize(principal: Principal, action: Action) -> Principal:
    if principal.role not in RULES[action]:
        raise Forbidden(f"the {principal.role} role may not {action.value.replace('.', ' ')}")
    return principal


def authorize_dashboard(principal: Principal) -> Principal:
    """The admin dashboard serves signed-in people of the platform roles; an API key is
    refused whatever its role (machines use the API)."""
    if principal.kind != "user":
        raise Forbidden("API keys cannot use the admin dashboard; people sign in at /admin")
    return authorize(principal, Action.DASHBOARD_USE)


def can_reach(
    principal: Principal,
    owner: uuid.UUID | None,
    grantees: Collection[uuid.UUID] = (),
) -> bool:
    if principal.platform:
        return True
    if principal.role == _CLIENT:
        return principal.organisation_id in grantees
    return owner is not None and principal.organisation_id == owner


def ensure_visible(
    principal: Principal,
    owner: uuid.UUID | None,
    what: str,
    grantees: Collection[uuid.UUID] = (),
) -> None:
    if not can_reach(principal, owner, grantees):
        raise NotFound(f"no such {what}")


class Owned(Protocol):
    @property
    def organisation_id(self) -> uuid.UUID: ...


OwnedT = TypeVar("OwnedT", bound=Owned)


def visible(principal: Principal, found: OwnedT | None, what: str) -> OwnedT:
    """``found`` if it exists and is in the caller's reach; else 404, the same either way."""
    if found is None:
        raise NotFound(f"no such {what}")
    ensure_visible(principal, found.organisation_id, what)
    return found


def organisation_scope(principal: Principal) -> uuid.UUID | None:
    """The organisation a listing is limited to (None: every organisation)."""
    return None if principal.platform else principal.organisation_id
