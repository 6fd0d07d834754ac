"""Signing people in to the dashboard: sessions, CSRF tokens, failed sign-ins.

People are the platform's admins and auditors (``users``, argon2 password hashes, made
with ``keyseed admin create-user``). Signing in makes a server-side session row; the
cookie holds a random token of which only the SHA-256 is stored, so a database dump
holds no usable cookie, and signing out (or the session expiring, or an hour without a
request) makes the cookie worthless at once.

Each session has its own CSRF token, which every form it posts must carry. The sign-in
form, posted before any session exists, carries a token that must equal the one in a
short-lived cookie set with the form (double submit).

Failed sign-ins are throttled in the database, so that every API process sees them; no
account is ever locked (an attacker elsewhere cannot lock its owner out):

* per name and client address: :data:`NAME_LIMIT` failures within :data:`WINDOW` refuse
  further attempts at that name from that address (the right password included) until
  older failures age out; a name that is no account's counts the same way, so the answer
  never tells whether an account exists;
* per client address: :data:`ADDRESS_LIMIT` failures within :data:`WINDOW` refuse every
  attempt from that address.

A failure row holds the address and a keyed digest of the name typed
(:meth:`~app.crypto.DocumentCipher.digest`), never the name. The client address is the
peer's, or what a configured proxy forwarded (``KEYSEED_TRUSTED_PROXIES``).

Signing in takes three steps, none on the event loop (the route hands it to a thread):
a read-only transaction (throttles, the account), the argon2 check outside any
transaction, then a short writing transaction that counts the throttles again (attempts
made meanwhile count) and records the outcome. So the database's write lock (SQLite) is
never held while a password is checked.

Every failed or refused sign-in is an audit event ``user.sign_in_failed`` naming the
client address, the reason and, when the name is an account's, that account. It never
holds the password, nor a name that matches no account (people type passwords into the
name field).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from app.admin import repository
from app.crypto import DocumentCipher
from app.db import Database, write_later
from app.errors import Forbidden
from app.identity import repository as identity_repo
from app.identity import service as identity
from app.identity.policy import Actor, Principal
from app.ledger import audit
from app.models import AdminSession, User, utcnow

IDLE_TIMEOUT = timedelta(hours=1)
NAME_LIMIT = 5
ADDRESS_LIMIT = 20
WINDOW = timedelta(minutes=15)
MAX_PASSWORD_LENGTH = 1024
_TOUCH_RESOLUTION = timedelta(minutes=1)
_TOKEN = re.compile(r"^[A-Za-z0-9_-]{43}$")  # secrets.token_urlsafe(32)
DASHBOARD = Actor.system("dashboard")


def new_token() -> str:
    return secrets.token_urlsafe(32)


def well_formed(token: str | None) -> bool:
    return token is not None and _TOKEN.match(token) is not None


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("ascii")).hexdigest()


@dataclass(frozen=True)
class Badge:
    """What every page shows of the signed-in person (plain values, kept for error pages
    rendered after the request's transaction has ended)."""

    username: str
    role: str
    csrf_token: str


@dataclass(frozen=True)
class SignedIn:
    """A person with a live dashboard session."""

    user: User
    record: AdminSession

    @property
    def principal(self) -> Principal:
        return Principal("user", self.user.id, self.user.role, self.user.organisation_id)

    @property
    def csrf_token(self) -> str:
        return self.record.csrf_token

    @property
    def badge(self) -> Badge:
        return Badge(self.user.username, self.user.role, self.record.csrf_token)


@dataclass(frozen=True)
class SignInResult:
    """A new session and its cookie token, or why there is none."""

    signed_in: SignedIn | None = None
    token: str | None = None
    refused: str | None = None  # bad_credentials | rate_limited
    retry_after: timedelta | None = None


def _throttled(session: Session, address: str, name: str, now: datetime) -> bool:
    since = now - WINDOW
    return (
        repository.failures_since(session, address, since) >= ADDRESS_LIMIT
        or repository.failures_since(session, address, since, name=name) >= NAME_LIMIT
    )


def _refuse(
    session: Session, user: User | None, address: str, name: str, reason: str, now: datetime
) -> SignInResult:
    repository.add_failure(session, address, name, now)
    audit.record(
        session,
        "user.sign_in_failed",
        DASHBOARD,
        organisation_id=user.organisation_id if user is not None else None,
        target=("user", user.id) if user is not None else None,
        address=address,
        reason=reason,
    )
    throttled = reason == "rate_limited"
    return SignInResult(refused=reason, retry_after=WINDOW if throttled else None)


def sign_in(
    database: Database,
    cipher: DocumentCipher,
    *,
    username: str,
    password: str,
    address: str,
    lifetime: timedelta,
) -> SignInResult:
    """Check the credentials against both throttles; a session when they are right.

    Blocking (database, argon2): call it from a worker thread. Failures are committed
    (failure row, audit event) although the caller answers with an error.
    """
    now = utcnow()
    name = cipher.digest("sign-in-name", username)
    with database.transaction(write=False) as session:
        throttled = _throttled(session, address, name, now)
        found = identity_repo.user_named(session, username) if username else None
    # the slow check, in no transaction; a decoy hash for a name that is no account's
    right = (
        not throttled
        and len(password) <= MAX_PASSWORD_LENGTH
        and identity.check_password(found, password)
    )
    with database.transaction() as session:
        repository.prune_failures(session, now - WINDOW)
        user = identity_repo.get_user(session, found.id) if found is not None else None
        if throttled or _throttled(session, address, name, now):
            return _refuse(session, user, address, name, "rate_limited", now)
        if (
            found is None
            or user is None
            or not right
            or user.disabled_at is not None
            or user.password_hash != found.password_hash  # changed meanwhile
        ):
            return _refuse(session, user, address, name, "bad_credentials", now)
        repository.clear_failures(session, address, name)
        user.last_sign_in_at = now
        repository.prune_sessions(session, user.id, now)
        token = new_token()
        record = repository.add_session(
            session,
            AdminSession(
                token_hash=hash_token(token),
                csrf_token=new_token(),
                user_id=user.id,
                address=address,
                created_at=now,
                last_seen_at=now,
                expires_at=now + lifetime,
            ),
        )
        signed_in = SignedIn(user, record)
        audit.record_about(
            session,
            "user.signed_in",
            signed_in.principal.actor,
            user,
            address=address,
        )
        return SignInResult(signed_in=signed_in, token=token)


def resolve(session: Session, token: str | None) -> SignedIn | None:
    """The live session of a cookie token, or None (unknown, ended, expired, idle, or its
    person disabled)."""
    if not well_formed(token):
        return None
    assert token is not None
    record = repository.session_by_token_hash(session, hash_token(token))
    now = utcnow()
    if (
        record is None
        or record.ended_at is not None
        or record.expires_at <= now
        or record.last_seen_at + IDLE_TIMEOUT <= now
    ):
        return None
    user = identity_repo.get_user(session, record.user_id)
    if user is None or user.disabled_at is not None:
        return None
    if now - record.last_seen_at >= _TOUCH_RESOLUTION:
        write_later(session, record, last_seen_at=now)
    return SignedIn(user, record)


def sign_out(session: Session, signed_in: SignedIn) -> None:
    signed_in.record.ended_at = utcnow()
    audit.record_about(
        session,
        "user.signed_out",
        signed_in.principal.actor,
        signed_in.user,
    )


def check_token(expected: str | None, submitted: object) -> None:
    """Refuse a form whose CSRF token is missing or not the expected one."""
    if (
        expected is None
        or not isinstance(submitted, str)
        or not hmac.compare_digest(expected.encode(), submitted.encode())
    ):
        raise Forbidden("the form's CSRF token is missing or stale: reload the page and retry")
