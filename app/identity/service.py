"""Organisations, API keys and people.

An API key reads ``ks_<prefix>_<secret>``: 12 hex characters to find it, 32 random bytes
to prove it. Only the SHA-256 of the whole key is stored; the key is shown once. A key is
tied to an organisation and a role, and the role must fit the organisation's kind:
owner keys to owner organisations, client keys to client organisations, admin and
auditor keys (and people) to the platform organisation.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
import re
import secrets
import threading
import uuid
from collections.abc import Sequence
from datetime import timedelta
from decimal import Decimal

from argon2 import PasswordHasher
from sqlalchemy.orm import Session

from app.db import write_later
from app.errors import Conflict, NotFound, Unauthorized, Unprocessable
from app.identity import repository
from app.identity.policy import Actor, Principal, organisation_scope
from app.ledger import audit
from app.models import ApiKey, Organisation, User, utcnow

PLATFORM_ORGANISATION = "platform"
ROLE_KIND = {"owner": "owner", "client": "client", "admin": "platform", "auditor": "platform"}
_LAST_USED_RESOLUTION = timedelta(minutes=5)
_password_hasher = PasswordHasher()
_CHECKS = threading.BoundedSemaphore(max(1, (os.cpu_count() or 2) - 1))
_KEY_FORMAT = re.compile(r"^ks_(?P<prefix>[0-9a-f]{12})_[A-Za-z0-9_-]{43}$")


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def _new_key() -> tuple[str, str]:
    prefix = secrets.token_hex(6)
    return prefix, f"ks_{prefix}_{secrets.token_urlsafe(32)}"


def create_organisation(
    session: Session,
    actor: Actor,
    *,
    name: str,
    kind: str,
    epsilon_budget: Decimal = Decimal(0),
    delta_budget: Decimal = Decimal(0),
) -> Organisation:
    """A new organisation; an owner organisation gets its privacy budget (ε, δ) here,
    exact decimals (:mod:`app.ledger.amounts`); other kinds hold none."""
    if name == PLATFORM_ORGANISATION or repository.organisation_named(session, name):
        raise Conflict("an organisation of that name exists", field="name")
    if kind != "owner":
        epsilon_budget = delta_budget = Decimal(0)
    organisation = Organisation(
        name=name, kind=kind, epsilon_budget=epsilon_budget, delta_budget=delta_budget
    )
    repository.add(session, organisation)
    budget = {"epsilon": float(epsilon_budget), "delta": float(delta_budget)}
    audit.record_about(
        session,
        "organisation.created",
        actor,
        organisation,
        organisation_kind=kind,
        **({"budget": budget} if kind == "owner" else {}),
    )
    return organisation


def list_organisations(session: Session, kind: str | None = None) -> Sequence[Organisation]:
    return repository.list_organisations(session, kind)


def platform_organisation(session: Session) -> Organisation:
    """The organisation of admins and auditors, made on first use."""
    existing = repository.first_organisation_of_kind(session, "platform")
    if existing is not None:
        return existing
    organisation = Organisation(name=PLATFORM_ORGANISATION, kind="platform")
    repository.add(session, organisation)
    return organisation


def create_key(
    session: Session,
    actor: Actor,
    *,
    organisation_id: uuid.UUID | None,
    role: str,
    name: str = "",
) -> tuple[ApiKey, str]:
    """A new key and its plaintext (to show once). Admin and auditor keys may omit the
    organisation: they belong to the platform organisation."""
    if organisation_id is None and ROLE_KIND[role] == "platform":
        organisation = platform_organisation(session)
    else:
        found = repository.get_organisation(session, organisation_id) if organisation_id else None
        if found is None:
            raise Unprocessable("no such organisation", field="organisation_id")
        organisation = found
    if organisation.kind != ROLE_KIND[role]:
        raise Unprocessable(
            f"a {role} key needs an organisation of kind {ROLE_KIND[role]!r} "
            f"(this one is {organisation.kind!r})",
            field="role",
        )
    prefix, plaintext = _new_key()
    key = ApiKey(
        prefix=prefix,
        secret_hash=hash_key(plaintext),
        name=name,
        role=role,
        organisation_id=organisation.id,
    )
    repository.add(session, key)
    audit.record_about(
        session,
        "key.created",
        actor,
        key,
        role=role,
        prefix=prefix,
    )
    return key, plaintext


def list_keys(
    session: Session, principal: Principal, organisation_id: uuid.UUID | None = None
) -> Sequence[ApiKey]:
    return repository.list_keys(session, organisation_scope(principal) or organisation_id)


def revoke_key(session: Session, actor: Actor, key_id: uuid.UUID) -> ApiKey:
    key = repository.get_key(session, key_id)
    if key is None:
        raise NotFound("no such key")
    if key.revoked_at is None:
        key.revoked_at = utcnow()
        session.flush()
        audit.record_about(
            session,
            "key.revoked",
            actor,
            key,
            prefix=key.prefix,
        )
    return key


def bootstrap(session: Session, *, force: bool = False) -> tuple[ApiKey, str]:
    """The first admin key; refused while an active admin key exists unless ``force``."""
    if repository.active_admin_key_exists(session) and not force:
        raise Conflict("an admin key exists already (use --force to make another)")
    return create_key(
        session, Actor.system("bootstrap"), organisation_id=None, role="admin", name="bootstrap"
    )


def authenticate(session: Session, token: str) -> Principal:
    match = _KEY_FORMAT.match(token)
    if match is None:
        raise Unauthorized("the API key is malformed", invalid=True)
    key = repository.key_by_prefix(session, match["prefix"])
    if key is None or not hmac.compare_digest(key.secret_hash, hash_key(token)):
        raise Unauthorized("the API key is not valid", invalid=True)
    if key.revoked_at is not None:
        raise Unauthorized("the API key was revoked", invalid=True)
    now = utcnow()
    if key.last_used_at is None or now - key.last_used_at > _LAST_USED_RESOLUTION:
        write_later(session, key, last_used_at=now)
    return Principal("key", key.id, key.role, key.organisation_id)


def hash_password(password: str) -> str:
    return _password_hasher.hash(password)


def verify_password(user: User, password: str) -> bool:
    from argon2.exceptions import InvalidHashError, VerificationError

    try:
        return _password_hasher.verify(user.password_hash, password)
    except (VerificationError, InvalidHashError):
        return False


@functools.cache
def _decoy_hash() -> str:
    return hash_password(secrets.token_urlsafe(16))


def check_password(user: User | None, password: str) -> bool:
    """Whether ``password`` is the user's. With no user, a decoy hash is verified all the
    same, so that an unknown name takes as long to refuse as a wrong password.

    Blocking and CPU-bound (argon2: ~0.2-0.7 s, 64 MiB): never call it on the event loop.
    At most :data:`_CHECKS` run at once in a process, the rest wait their turn, so that a
    burst of sign-ins cannot take every core from the requests beside them."""
    with _CHECKS:
        if user is None:
            verify_password(User(password_hash=_decoy_hash()), password)
            return False
        return verify_password(user, password)


def create_user(
    session: Session,
    actor: Actor,
    *,
    username: str,
    role: str,
    password: str,
    email: str | None = None,
) -> User:
    if len(password) < 12:
        raise Unprocessable("a password has at least 12 characters", field="password")
    if repository.user_named(session, username) is not None:
        raise Conflict("a user of that name exists", field="username")
    organisation = platform_organisation(session)
    user = User(
        username=username,
        email=email,
        role=role,
        organisation_id=organisation.id,
        password_hash=hash_password(password),
    )
    repository.add(session, user)
    audit.record_about(
        session,
        "user.created",
        actor,
        user,
        role=role,
    )
    return user
