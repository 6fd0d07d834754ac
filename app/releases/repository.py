"""SQL for releases, their grants and downloads."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.models import Download, Release, ReleaseGrant


def add(session: Session, release: Release, grantees: Sequence[uuid.UUID]) -> Release:
    session.add(release)
    session.flush()
    session.add_all(ReleaseGrant(release_id=release.id, organisation_id=g) for g in grantees)
    session.flush()
    return release


def get(session: Session, release_id: uuid.UUID) -> Release | None:
    return session.get(Release, release_id)


def of_job(session: Session, job_id: uuid.UUID) -> Release | None:
    return session.scalar(select(Release).where(Release.job_id == job_id))


def ids_of_dataset(session: Session, dataset_id: uuid.UUID) -> list[uuid.UUID]:
    return list(session.scalars(select(Release.id).where(Release.dataset_id == dataset_id)))


def grantees(session: Session, release_id: uuid.UUID) -> list[uuid.UUID]:
    query = select(ReleaseGrant.organisation_id).where(ReleaseGrant.release_id == release_id)
    return list(session.scalars(query.order_by(ReleaseGrant.organisation_id)))


def list_releases(
    session: Session, *, owner: uuid.UUID | None = None, grantee: uuid.UUID | None = None
) -> Sequence[Release]:
    query = select(Release).order_by(Release.created_at.desc())
    if owner is not None:
        query = query.where(Release.organisation_id == owner)
    if grantee is not None:
        query = query.join(ReleaseGrant).where(ReleaseGrant.organisation_id == grantee)
    return session.scalars(query).all()


def add_download(session: Session, download: Download) -> None:
    session.add(download)
    session.flush()
