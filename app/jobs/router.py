"""Jobs: submitted against a dataset's budget, read, cancelled, their prompting retried."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Body, Query, Response, status

from app.deps import SessionDep, SettingsDep, allowed
from app.errors import problems
from app.identity.policy import Action, Principal
from app.jobs import service
from app.jobs.schemas import AnyJobSpec, JobOut, JobPlanOut

router = APIRouter(prefix="/v1", tags=["jobs"], responses=problems(401, 403, 404, 413, 422))


@router.post(
    "/datasets/{dataset_id}/jobs",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=JobOut | JobPlanOut,
    responses={
        **problems(400, 409),
        200: {"model": JobPlanOut, "description": "With dry_run=true: the plan, nothing stored"},
    },
)
def submit_job(
    dataset_id: uuid.UUID,
    spec: Annotated[AnyJobSpec, Body()],
    session: SessionDep,
    settings: SettingsDep,
    principal: Annotated[Principal, allowed(Action.JOB_SUBMIT)],
    response: Response,
    dry_run: Annotated[bool, Query(description="plan only: no job, no budget, no read")] = False,
) -> JobOut | JobPlanOut:
    """Validate the spec, reserve its whole (ε, δ) against the dataset's cap (409 when it
    does not fit, naming what was asked and what remains) and queue the job. With
    ``dry_run=true``: the planned releases, their noise scales and the composed (ε, δ),
    before any private read and without touching the budget (200)."""
    if dry_run:
        response.status_code = status.HTTP_200_OK
        return JobPlanOut(**service.dry_run(session, principal, dataset_id, spec, settings))
    job = service.submit(session, principal, dataset_id, spec, settings)
    return service.to_out(session, job, principal)


@router.get("/datasets/{dataset_id}/jobs", response_model=list[JobOut])
def list_jobs(
    dataset_id: uuid.UUID,
    session: SessionDep,
    principal: Annotated[Principal, allowed(Action.JOB_READ)],
) -> list[JobOut]:
    return [
        service.to_out(session, j, principal)
        for j in service.list_jobs(session, principal, dataset_id)
    ]


@router.get("/jobs/{job_id}", response_model=JobOut)
def get_job(
    job_id: uuid.UUID,
    session: SessionDep,
    principal: Annotated[Principal, allowed(Action.JOB_READ)],
) -> JobOut:
    return service.to_out(session, service.get_job(session, principal, job_id), principal)


@router.post("/jobs/{job_id}/cancel", response_model=JobOut, responses=problems(409))
def cancel_job(
    job_id: uuid.UUID,
    session: SessionDep,
    principal: Annotated[Principal, allowed(Action.JOB_CANCEL)],
) -> JobOut:
    """A job that has not read private data is cancelled and its reservation released;
    a running one is asked to stop, and the ε it committed stays spent (one whose worker
    died is cancelled at once)."""
    return service.to_out(session, service.cancel(session, principal, job_id), principal)


@router.post(
    "/jobs/{job_id}/retry",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=JobOut,
    responses=problems(409),
)
def retry_job(
    job_id: uuid.UUID,
    session: SessionDep,
    principal: Annotated[Principal, allowed(Action.JOB_RETRY)],
) -> JobOut:
    """Prompt the LLM again for the sequences of a failed job that have no text (after
    an LLM outage, say). Only jobs whose keyphrase sequences were saved qualify: the
    private documents are not read again and no budget is reserved or spent. A queued
    or running job whose worker died resumes from what was saved (409 while a live
    worker runs it): its budget is not reserved or spent again."""
    return service.to_out(session, service.retry(session, principal, job_id), principal)
