"""``/v1/organisations`` and ``/v1/keys`` (platform administration)."""

from __future__ import annotations

import uuid
from typing import Annotated, Literal

from fastapi import APIRouter, Query, status

from app.deps import SessionDep, allowed
from app.errors import problems
from app.identity import service
from app.identity.policy import Action, Principal
from app.identity.schemas import KeyCreated, KeyIn, KeyOut, OrganisationIn, OrganisationOut

router = APIRouter(prefix="/v1", tags=["identity"], responses=problems(401, 403, 413, 422))


@router.post(
    "/organisations",
    status_code=status.HTTP_201_CREATED,
    response_model=OrganisationOut,
    responses=problems(400, 409),
)
def create_organisation(
    body: OrganisationIn,
    session: SessionDep,
    principal: Annotated[Principal, allowed(Action.ORGANISATION_CREATE)],
) -> OrganisationOut:
    organisation = service.create_organisation(
        session, principal.actor, name=body.name, kind=body.kind
    )
    return OrganisationOut.model_validate(organisation)


@router.get("/organisations", response_model=list[OrganisationOut])
def list_organisations(
    session: SessionDep,
    principal: Annotated[Principal, allowed(Action.ORGANISATION_LIST)],
    kind: Annotated[Literal["platform", "owner", "client"] | None, Query()] = None,
) -> list[OrganisationOut]:
    return [OrganisationOut.model_validate(o) for o in service.list_organisations(session, kind)]


@router.post(
    "/keys",
    status_code=status.HTTP_201_CREATED,
    response_model=KeyCreated,
    responses=problems(400),
)
def create_key(
    body: KeyIn,
    session: SessionDep,
    principal: Annotated[Principal, allowed(Action.KEY_CREATE)],
) -> KeyCreated:
    key, plaintext = service.create_key(
        session,
        principal.actor,
        organisation_id=body.organisation_id,
        role=body.role,
        name=body.name,
    )
    return KeyCreated.model_validate({**KeyOut.model_validate(key).model_dump(), "key": plaintext})


@router.get("/keys", response_model=list[KeyOut])
def list_keys(
    session: SessionDep,
    principal: Annotated[Principal, allowed(Action.KEY_LIST)],
    organisation_id: Annotated[uuid.UUID | None, Query()] = None,
) -> list[KeyOut]:
    """Admins and auditors see every key (optionally of one organisation); others see
    their organisation's keys."""
    return [
        KeyOut.model_validate(k) for k in service.list_keys(session, principal, organisation_id)
    ]


@router.post("/keys/{key_id}/revoke", response_model=KeyOut, responses=problems(404))
def revoke_key(
    key_id: uuid.UUID,
    session: SessionDep,
    principal: Annotated[Principal, allowed(Action.KEY_REVOKE)],
) -> KeyOut:
    return KeyOut.model_validate(service.revoke_key(session, principal.actor, key_id))
