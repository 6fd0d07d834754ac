"""Releasing a finished job's corpus to client organisations, and downloading it.

A release carries its manifest: the method and the density estimate that ran (derived
from the job's configuration), every parameter, the vocabulary (built in or uploaded,
with its fingerprint), the models (name, package version and file digest of the packaged
ones: :mod:`workers.provenance`), the ε charged by mechanism (and the engine's exact
per-mechanism report when the worker recorded one), and the time. All of it is public:
DP outputs and settings.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.config import Settings
from app.datasets import repository as datasets_repo
from app.errors import Conflict, Forbidden, NotFound, Unprocessable
from app.identity import policy
from app.identity import repository as identity_repo
from app.identity.policy import Principal
from app.jobs import repository as jobs_repo
from app.jobs import service as jobs
from app.jobs.schemas import JobLLMCosts
from app.ledger import audit
from app.models import Download, Job, KeyphraseSequence, Release, utcnow
from app.releases import repository
from app.releases.schemas import ReleaseIn, ReleaseOut
from workers.methods.registry import METHODS
from workers.privacy.accountant import EXACT_SUM as ACCOUNTANT
from workers.provenance import models_section

ADJACENCY = "one row of the uploaded file added or removed"


def privacy_of(job: Job, report: dict[str, Any]) -> dict[str, Any]:
    """The privacy block: adjacency, (ε, δ) charged, the accountant, every event."""
    unit = report.get("unit", "row")
    adjacency = ADJACENCY if unit == "row" else f"one unit ({unit}) added or removed"
    planned = report.get("planned") or {}
    return {
        "adjacency": adjacency,
        "unit": unit,
        "accountant": report.get("accountant", ACCOUNTANT),
        "epsilon_charged": job.epsilon,
        "delta": report.get("delta", 0.0),
        "epsilon_by_mechanism": job.epsilon_by_mechanism,
        "events_charged": planned.get("events", []),
        "events_released": report.get("events", []),
    }


def _texts_only(job: Job) -> bool:
    return job.spec.get("llm") != "none"


def llm_costs_of(job: Job) -> dict[str, Any]:
    """The job's LLM work (calls, tokens, wall time) and the method that did it."""
    return {"method": jobs.method_of(job.spec), **JobLLMCosts(**(job.llm_costs or {})).model_dump()}


def manifest(job: Job, settings: Settings, documents: int, classes: int) -> dict[str, Any]:
    """The public manifest of a release of ``job`` (its dataset declares ``classes``
    labels): its method's part (:attr:`workers.methods.registry.Method.release`: what
    ran, its parameters, its prompt, what else the method records), then the job, the
    models, the privacy block, the LLM costs and the documents released."""
    spec = job.spec
    method = METHODS[jobs.method_of(spec)]
    engine = job.manifest or {}
    llm = spec.get("llm", "none")
    endpoint = settings.llm_endpoints.get(llm)
    ran = engine.get("models") or {}  # the models an LLM method's run names
    return {
        **method.release(spec, engine, classes, job.sequences_total),
        "method_id": method.id,
        "job_id": str(job.id),
        "models": models_section(
            llm=llm,
            llm_model=ran.get("llm") or (endpoint.model if endpoint else None),
            embedding=ran.get("embedding", engine.get("embedding_model", settings.embedding_model)),
        ),
        "privacy": privacy_of(job, engine.get("privacy") or {}),
        "llm_costs": llm_costs_of(job),
        "documents": documents,
        "created_at": utcnow().isoformat(),
    }


AUDIT_METHOD = (
    "one-run audit (Steinke, Nasr & Jagielski, NeurIPS 2023) with canaries shaped as in "
    "Meeus et al. (ICML 2025): a public prefix naming a class, then rare words of the public "
    "vocabulary; each included in the generation input by a fair coin; a membership test on "
    "the released corpus alone (the canary's words in its class's released documents); the "
    "surest quarter of the canaries guessed in, the surest quarter out"
)
CANARIES_IN_RELEASE = (
    "Canaries are public documents made by the worker; they are never stored as dataset "
    "rows and never released as documents (each released document is drawn from the DP "
    "releases; copied_as_documents counts the canaries found whole in one, and is 0). "
    "Canary-influenced content can reach the release only through the DP mechanism, as any "
    "input document's can."
)


def empirical_audit(session: Session, job: Job) -> dict[str, Any] | None:
    """The audit of ``job``'s released corpus (:mod:`workers.privacy.audit`), for its
    release's manifest; None for a job that ran without canaries. Public from the
    release on: the figures, and the canaries with their coins and seed (so the owner or
    an auditor can rerun it); a function of the released corpus and public randomness."""
    from workers.privacy.audit import CanarySet, run_audit

    stored = (job.manifest or {}).get("audit")
    if not stored:
        return None
    canary_set = CanarySet.from_dict(stored)
    released = [
        (label, text or "")
        for label, text in session.execute(
            select(KeyphraseSequence.label, KeyphraseSequence.text).where(
                KeyphraseSequence.job_id == job.id, KeyphraseSequence.text.is_not(None)
            )
        ).all()
    ]
    privacy = (job.manifest or {}).get("privacy") or {}
    result = run_audit(
        canary_set,
        released,
        claimed_epsilon=float(job.epsilon),
        delta=float(privacy.get("delta", 0.0) or 0.0),
    )
    return {
        **result.to_dict(),
        "method": AUDIT_METHOD,
        "canaries_in_release": CANARIES_IN_RELEASE,
        "canary_set": canary_set.to_dict(),
    }


def _with_audit(found: dict[str, Any], audit: dict[str, Any] | None) -> dict[str, Any]:
    return found if audit is None else {**found, "empirical_audit": audit}


def create_release(
    session: Session, principal: Principal, job_id: uuid.UUID, body: ReleaseIn, settings: Settings
) -> Release:
    job = jobs.get_job(session, principal, job_id)
    if job.state != "succeeded":
        raise Conflict(f"only a succeeded job can be released (this one is {job.state})")
    if repository.of_job(session, job.id) is not None:
        raise Conflict("the job's corpus is released already")
    wanted = list(dict.fromkeys(body.client_organisations))
    found = identity_repo.organisations_by_id(session, wanted)
    bad = [str(i) for i in wanted if i not in found or found[i].kind != "client"]
    if bad:
        raise Unprocessable(
            "not client organisations: " + ", ".join(bad), field="client_organisations"
        )
    dataset = datasets_repo.get(session, job.dataset_id)
    if dataset is None:  # a job's dataset row outlives it (deletion only marks it)
        raise NotFound("no such dataset")
    documents = jobs_repo.count_sequences(session, job.id, with_text_only=_texts_only(job))
    release = repository.add(
        session,
        Release(
            job_id=job.id,
            dataset_id=job.dataset_id,
            organisation_id=job.organisation_id,
            name=body.name or f"job {job.id}",
            documents=documents,
            manifest=_with_audit(
                manifest(job, settings, documents, len(dataset.labels)),
                empirical_audit(session, job),
            ),
            created_by=principal.actor.ref,
        ),
        wanted,
    )
    audit.record_about(
        session,
        "release.created",
        principal.actor,
        release,
        job_id=str(job.id),
        grantees=[str(g) for g in wanted],
        documents=documents,
    )
    return release


def get_release(
    session: Session, principal: Principal, release_id: uuid.UUID
) -> tuple[Release, list[uuid.UUID]]:
    release = repository.get(session, release_id)
    if release is None:
        raise NotFound("no such release")
    grantees = repository.grantees(session, release.id)
    policy.ensure_visible(principal, release.organisation_id, "release", grantees)
    return release, grantees


def list_releases(session: Session, principal: Principal) -> Sequence[Release]:
    if principal.platform:
        return repository.list_releases(session)
    if principal.role == "client":
        return repository.list_releases(session, grantee=principal.organisation_id)
    return repository.list_releases(session, owner=principal.organisation_id)


def ensure_downloadable(
    principal: Principal, release: Release, grantees: Sequence[uuid.UUID]
) -> None:
    """A released corpus is read by its owner organisation and its grantees only: never
    with a platform key (admin, auditor), whatever reach those roles have elsewhere."""
    if principal.platform or principal.organisation_id not in (
        release.organisation_id,
        *grantees,
    ):
        raise Forbidden("only the owner organisation and the grantees download a release")


def download_source(session: Session, release: Release) -> tuple[uuid.UUID, bool]:
    """The job whose sequences a release's files are rendered from, and whether only the
    sequences with a text are released."""
    job = jobs_repo.get(session, release.job_id)
    assert job is not None
    return job.id, _texts_only(job)


def record_download(
    session: Session, principal: Principal, release: Release, fmt: str, compression: str = "none"
) -> None:
    """Audit one download (before its first byte is sent)."""
    repository.add_download(
        session,
        Download(
            release_id=release.id,
            organisation_id=principal.organisation_id,
            actor=principal.actor.ref,
            format=fmt,
        ),
    )
    audit.record_about(
        session,
        "release.downloaded",
        principal.actor,
        release,
        format=fmt,
        compression=compression,
    )


def to_out(release: Release, grantees: list[uuid.UUID], principal: Principal) -> ReleaseOut:
    shown = grantees if principal.role != "client" else [principal.organisation_id]
    return ReleaseOut(
        id=release.id,
        job_id=release.job_id,
        dataset_id=release.dataset_id,
        organisation_id=release.organisation_id,
        name=release.name,
        documents=release.documents,
        grantees=shown,
        manifest=release.manifest,
        created_by=release.created_by,
        created_at=release.created_at,
    )
