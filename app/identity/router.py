"""``/v1/organisations`` and ``/v1/keys`` (platform administration)."""

from __future__ import annotations

import uuid
from typing import Annotated, Literal

from fastapi import APIRouter, Query, status

from app.deps import SessionDep, SettingsDep, allowed
from app.errors import problems
from app.identity import policy, service
from app.identity.policy import Action, Principal
from app.identity.schemas import KeyCreated, KeyIn, KeyOut, OrganisationIn, OrganisationOut
from app.ledger import service as ledger
from app.ledger.schemas import BudgetChange, OrganisationBudgetOut

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
    settings: SettingsDep,
    principal: Annotated[Principal, allowed(Action.ORGANISATION_CREATE)],
) -> OrganisationOut:
    """An owner organisation gets the privacy budget given, else the server's default."""
    budget = ledger.initial_budget(settings, body.epsilon_budget, body.delta_budget)
    organisation = service.create_organisation(
        session,
        principal.actor,
        name=body.name,
        kind=body.kind,
        epsilon_budget=budget.epsilon,
        delta_budget=budget.delta,
    )
    return OrganisationOut.model_validate(organisation)


@router.get("/organisations", response_model=list[OrganisationOut])
def list_organisations(
    session: SessionDep,
    principal: Annotated[Principal, allowed(Action.ORGANISATION_LIST)],
    kind: Annotated[Literal["platform", "owner", "client"] | None, Query()] = None,
) -> list[OrganisationOut]:
    return [OrganisationOut.model_validate(o) for o in service.list_organisations(session, kind)]


@router.get(
    "/organisations/{organisation_id}/budget",
    response_model=OrganisationBudgetOut,
    responses=problems(404),
)
def get_organisation_budget(
    organisation_id: uuid.UUID,
    session: SessionDep,
    principal: Annotated[Principal, allowed(Action.ORGANISATION_READ_BUDGET)],
) -> OrganisationBudgetOut:
    """The budget, what the organisation's datasets carve out of it, and their spend.
    Owners read their own organisation's."""
    policy.ensure_visible(principal, organisation_id, "organisation")
    return ledger.organisation_budget_out(ledger.get_organisation_budget(session, organisation_id))


@router.patch(
    "/organisations/{organisation_id}/budget",
    response_model=OrganisationBudgetOut,
    responses=problems(400, 404, 409),
)
def set_organisation_budget(
    organisation_id: uuid.UUID,
    body: BudgetChange,
    session: SessionDep,
    principal: Annotated[Principal, allowed(Action.ORGANISATION_SET_BUDGET)],
) -> OrganisationBudgetOut:
    """Set an owner organisation's privacy budget (admin only; the reason goes to the
    audit trail). Its datasets' caps are carved out of it, so it cannot go below them."""
    budget = ledger.Amount.granted(body.epsilon, body.delta)
    figures = ledger.set_organisation_budget(
        session, principal.actor, organisation_id, budget, body.reason
    )
    return ledger.organisation_budget_out(figures)


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
