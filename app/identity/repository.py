"""SQL for organisations, API keys and people."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from sqlalchemy import exists, select
from sqlalchemy.orm import Session

from app.db import add_row, first_row
from app.models import ApiKey, Organisation, User


def add(session: Session, obj: Organisation | ApiKey | User) -> None:
    add_row(session, obj)


def get_organisation(session: Session, organisation_id: uuid.UUID) -> Organisation | None:
    return session.get(Organisation, organisation_id)


def organisation_named(session: Session, name: str) -> Organisation | None:
    return session.scalar(select(Organisation).where(Organisation.name == name))


def first_organisation_of_kind(session: Session, kind: str) -> Organisation | None:
    query = select(Organisation).where(Organisation.kind == kind).order_by(Organisation.created_at)
    return session.scalars(query.limit(1)).first()


def organisations_by_id(
    session: Session, ids: Sequence[uuid.UUID]
) -> dict[uuid.UUID, Organisation]:
    query = select(Organisation).where(Organisation.id.in_(ids))
    return {org.id: org for org in session.scalars(query)}


def list_organisations(session: Session, kind: str | None) -> Sequence[Organisation]:
    query = select(Organisation).order_by(Organisation.created_at, Organisation.name)
    if kind is not None:
        query = query.where(Organisation.kind == kind)
    return session.scalars(query).all()


def key_by_prefix(session: Session, prefix: str) -> ApiKey | None:
    return session.scalar(select(ApiKey).where(ApiKey.prefix == prefix))


def get_key(session: Session, key_id: uuid.UUID) -> ApiKey | None:
    return session.get(ApiKey, key_id)


def list_keys(session: Session, organisation_id: uuid.UUID | None) -> Sequence[ApiKey]:
    query = select(ApiKey).order_by(ApiKey.created_at)
    if organisation_id is not None:
        query = query.where(ApiKey.organisation_id == organisation_id)
    return session.scalars(query).all()


def active_admin_key_exists(session: Session) -> bool:
    query = select(exists().where(ApiKey.role == "admin", ApiKey.revoked_at.is_(None)))
    return bool(session.scalar(query))


def user_named(session: Session, username: str, *, for_update: bool = False) -> User | None:
    return first_row(session, select(User).where(User.username == username), for_update=for_update)


def get_user(session: Session, user_id: uuid.UUID) -> User | None:
    return session.get(User, user_id)


def list_users(session: Session) -> Sequence[User]:
    return session.scalars(select(User).order_by(User.username)).all()


def users_by_id(session: Session, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, User]:
    return {user.id: user for user in session.scalars(select(User).where(User.id.in_(ids)))}


def keys_by_id(session: Session, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, ApiKey]:
    return {key.id: key for key in session.scalars(select(ApiKey).where(ApiKey.id.in_(ids)))}
