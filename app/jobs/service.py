"""Submitting, reading and cancelling jobs.

A submission is one transaction: the spec is validated by the engine's own checks, the
dataset row is locked, the job's whole ε is reserved against the cap, the job is
written, and its first task is sent to the broker only once all of that has committed.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from app.config import Settings
from app.datasets import repository as datasets_repo
from app.errors import Conflict, Unprocessable
from app.identity import policy
from app.identity.policy import Actor, Principal
from app.jobs import admission, holdout, limits, recovery, repository, runner
from app.jobs.schemas import (
    AnySpec,
    JobCharge,
    JobCounts,
    JobEpsilon,
    JobError,
    JobLLMCosts,
    JobOut,
    JobShardsOut,
    JobStage,
    ShardOut,
    ShardRoundOut,
)
from app.jobs.verdict import noise_std, verdict
from app.ledger import amounts, audit
from app.ledger import service as ledger
from app.logging import current_request_id
from app.models import Job, utcnow
from app.vocabularies import service as vocabularies
from workers.errors import ConfigError
from workers.methods.dpkps.plan import Plan
from workers.methods.progress import time_left
from workers.methods.registry import DPKPS, METHODS
from workers.privacy.accountant import compose, epsilon_by_mechanism
from workers.privacy.events import PrivacyEvent

TERMINAL_STATES = ("succeeded", "failed", "cancelled")


def planned_run(spec: AnySpec, labels: list[str], vocabulary_size: int | None) -> Plan:
    """Every release a run of ``spec``'s method will make (public inputs only: the label
    set and the size of the vocabulary it reads), composed at its δ."""
    params = spec.params()
    events = tuple(METHODS[spec.method].plan(params, labels, vocabulary_size))
    composition = compose(events)
    return Plan(events, composition.epsilon(params.delta), params.delta, composition.name)


def method_of(spec: Mapping[str, Any]) -> str:
    """The method of a stored spec (specs stored before there were methods are DP-KPS)."""
    return str(spec.get("method", DPKPS))


def _check_llm(spec: AnySpec, settings: Settings) -> None:
    if spec.llm not in settings.llm_names:
        raise Unprocessable(
            f"unknown LLM endpoint; this server offers {', '.join(settings.llm_names)}",
            field="llm",
        )
    if spec.max_llm_calls is not None and spec.max_llm_calls > settings.llm_max_calls:
        raise Unprocessable(
            f"must be at most {settings.llm_max_calls} on this server", field="max_llm_calls"
        )


def _check_run(spec: AnySpec, params: Any, classes: int, settings: Settings) -> None:
    """A job within the server's limits: an LLM named where the method writes its texts
    with one, the documents it can release, its prompt, and, for a method that writes
    within the run, the LLM calls it will make (public parameters only; a DP-KPS job's
    prompting stage stops at its cap instead)."""
    method = METHODS[spec.method]
    if method.writes_texts and spec.llm == "none":
        raise Unprocessable(f"{method.title} needs an LLM: name one", field="llm")
    released = method.max_released(params, classes)
    if released > settings.max_sequences_per_job:
        raise Unprocessable(
            f"may release up to {released} documents; this server makes at most "
            f"{settings.max_sequences_per_job} per job",
            field=method.released_field(params),
        )
    _check_llm(spec, settings)
    prompt = spec.prompt()
    if prompt is not None:
        prompt.validate()
    if not method.writes_texts:
        return
    calls = method.planned_calls(params, classes)
    allowed = spec.max_llm_calls or settings.llm_max_calls
    if calls > allowed:
        raise Unprocessable(
            f"the run makes up to {calls} LLM calls, more than the {allowed} allowed",
            field="max_llm_calls" if spec.max_llm_calls else method.calls_field(params),
        )


def _check_vocabulary(params: Any, vocabulary: Any) -> None:
    """A run that asks for N of the vocabulary's phrases needs that many."""
    wanted = getattr(params, "vocabulary_size", None)
    if wanted is not None and wanted > vocabulary.size:
        raise Unprocessable(
            f"asks for {wanted} phrases but vocabulary {vocabulary.name!r} has {vocabulary.size}",
            field="vocabulary_size",
        )


def prompt_provenance(spec: AnySpec, actor: Actor) -> dict[str, Any]:
    """Who supplied the job's few-shot examples and prompt template, and a SHA-256 of
    each (for the audit trail: the texts themselves are in the spec, not the event);
    nothing for a job without a prompt of its own."""
    supplied: dict[str, Any] = {}
    few_shot, template = getattr(spec, "few_shot", None), getattr(spec, "template", None)
    if few_shot:
        supplied["few_shot"] = {
            "supplied_by": actor.ref,
            "organisation_id": str(actor.organisation_id),
            "examples": len(few_shot),
            "sha256": _sha256(json.dumps(few_shot, ensure_ascii=False)),
        }
    if template:
        supplied["template"] = {
            "supplied_by": actor.ref,
            "organisation_id": str(actor.organisation_id),
            "sha256": _sha256(template),
        }
    return supplied


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _prepare(
    session: Session,
    principal: Principal,
    dataset_id: uuid.UUID,
    spec: AnySpec,
    settings: Settings,
) -> tuple[Any, Any, Plan, Plan]:
    """Every check of a job spec, and its planned releases (public inputs only); the
    vocabulary the run reads, resolved (None for a method that reads none). The last two
    are the job's plan and its generation's alone (the same without a holdout)."""
    dataset = policy.visible(principal, datasets_repo.get(session, dataset_id), "dataset")
    if dataset.state != "ready":  # a resumable upload not sealed yet (app.datasets.service)
        raise Conflict("the dataset's upload is not sealed: POST /v1/datasets/{id}/seal first")
    params = spec.params()  # DP-KPS: the engine's own checks, errors naming the field
    classes = len(dataset.labels)
    _check_run(spec, params, classes, settings)
    limits.check_spec(spec, classes, settings)  # after the spec's own checks
    vocabulary = None
    name = METHODS[spec.method].vocabulary(params)
    if name is not None:
        vocabulary = vocabularies.resolve(session, principal, name)
        _check_vocabulary(params, vocabulary)
    size = vocabulary.size if vocabulary is not None else None
    generation = planned_run(spec, list(dataset.labels), size)
    return dataset, vocabulary, holdout.plan(spec, generation, classes), generation


def description(spec: AnySpec, classes: int) -> str:
    """What the method of ``spec`` runs on a label set of ``classes`` classes, in words."""
    return METHODS[spec.method].described(spec.params(), classes)


def dry_run(
    session: Session,
    principal: Principal,
    dataset_id: uuid.UUID,
    spec: AnySpec,
    settings: Settings,
) -> dict[str, Any]:
    """What a job of ``spec`` would release and spend, checked like a submission but with
    no job, no reservation and no private read: the planned releases with their noise,
    the composed (ε, δ) and the accountant that composed them."""
    dataset, vocabulary, the_plan, generation = _prepare(
        session, principal, dataset_id, spec, settings
    )
    owner = principal.organisation_id == dataset.organisation_id
    limits.check_active_jobs(session, dataset.organisation_id, settings)
    # the same 409 a submission would get, before anything runs
    after = ledger.check_fits(session, dataset, the_plan.events)
    return {
        "dry_run": True,
        "dataset_id": str(dataset.id),
        "method": description(spec, len(dataset.labels)),
        "epsilon": float(the_plan.epsilon),
        "delta": the_plan.delta,
        "accountant": the_plan.accountant,
        "by_mechanism": epsilon_by_mechanism(the_plan.events, the_plan.delta),
        "events": [e.to_dict() for e in the_plan.events],
        "parameters": _resolved_parameters(spec, len(dataset.labels)),
        "noise": noise_report(
            the_plan.events, dataset.documents if owner else None, len(dataset.labels)
        ),
        "budget_after": {
            "epsilon_cap": amounts.shown(after.epsilon_cap),
            "delta_cap": amounts.shown(after.delta_cap),
            "spent": amounts.shown(after.spent),
            "reserved": amounts.shown(after.reserved),
            "remaining": amounts.shown(after.remaining),
            "accountant": after.accountant,
        },
        "verdict": _verdict(spec, the_plan, dataset, vocabulary) if owner else None,
        "utility": holdout.dry_run_block(
            spec, the_plan, generation, dataset.documents if owner else None, len(dataset.labels)
        ),
    }


def _verdict(spec: AnySpec, the_plan: Plan, dataset: Any, vocabulary: Any) -> dict[str, Any] | None:
    """The owner's verdict on the class signal against the noise (:mod:`app.jobs.verdict`);
    None for a plan without class densities (the LLM methods' releases are votes)."""
    method, params = METHODS[spec.method], spec.params()
    labels = list(dataset.labels)
    size = vocabulary.size if vocabulary is not None else None

    def replan(epsilon: float) -> Sequence[PrivacyEvent]:
        try:
            return method.plan(params.model_copy(update={"epsilon": epsilon}), labels, size)
        except ConfigError:  # an ε this spec's noise cannot be calibrated for
            return ()

    found = verdict(
        the_plan.events,
        documents=dataset.documents,
        classes=len(labels),
        epsilon=params.epsilon,
        # a total ε (not per-mechanism ones, which have no single ε to raise)
        replan=replan if params.epsilon is not None else None,
    )
    return found.to_dict() if found is not None else None


def _resolved_parameters(spec: AnySpec, classes: int) -> dict[str, Any] | None:
    """The spec's parameters as the method resolves them for a label set of ``classes``
    classes (None for a method that resolves none)."""
    return METHODS[spec.method].resolved(spec.params(), classes)


def noise_report(
    events: Sequence[PrivacyEvent], documents: int | None, classes: int
) -> list[dict[str, Any]]:
    """Each planned release's noise per score beside the signal it must carry, so that
    an owner sees before spending whether a budget is too small.

    ``noise_std`` is the standard deviation of the noise on one released score (σ; √2·b
    for Laplace b; for Gumbel selections, π·b/√6). The *signal* is what one privacy unit
    adds to a score, at most ``sensitivity`` in the event's norm, so a score every unit of
    the partition supports is about ``documents`` (all of them for a whole-dataset release,
    an even share per class otherwise) when one unit adds about 1: ``noise_share`` =
    ``noise_std`` ÷ that. A phrase, feature or class held by fewer than about three times
    ``noise_share`` of the partition's units is lost in the noise. ``documents`` is a raw
    count of the upload: it (and the shares) are given to the dataset's owner only."""
    out: list[dict[str, Any]] = []
    for event in events:
        std = noise_std(event)
        row: dict[str, Any] = {
            "mechanism": event.mechanism,
            "partition": event.partition,
            "noise": event.noise,
            "noise_std": std,
            "unit_contribution": event.sensitivity,
            "norm": event.norm,
        }
        if documents:
            share = documents if event.partition is None else max(1, documents // classes)
            row["documents"] = share
            row["noise_share"] = std / share
        out.append(row)
    return out


def submit(
    session: Session,
    principal: Principal,
    dataset_id: uuid.UUID,
    spec: AnySpec,
    settings: Settings,
) -> Job:
    spec = holdout.with_key(spec)  # a holdout's public key, drawn here when not given
    dataset, vocabulary, the_plan, _ = _prepare(session, principal, dataset_id, spec, settings)
    by_mechanism = epsilon_by_mechanism(the_plan.events, the_plan.delta)
    stored_spec = spec.model_dump(mode="json")
    if vocabulary is not None:
        stored_spec["vocabulary_ref"] = {
            "kind": vocabulary.kind,
            "id": vocabulary.id,
            "name": vocabulary.name,
            "size": vocabulary.size,
            "fingerprint": vocabulary.fingerprint,
        }
    job = Job(
        id=uuid.uuid4(),
        dataset_id=dataset.id,
        organisation_id=dataset.organisation_id,
        submitted_by=principal.actor.ref,
        spec=stored_spec,
        state="queued",
        epsilon=float(the_plan.epsilon),
        epsilon_by_mechanism=by_mechanism,
        task_ids=[],  # sent when its organisation's turn comes (app.jobs.admission)
        request_id=current_request_id(),
    )
    ledger.reserve(session, job, principal.actor, the_plan.events)
    limits.check_active_jobs(session, dataset.organisation_id, settings, lock=True)
    audit.record_about(
        session,
        "job.submitted",
        principal.actor,
        job,
        dataset_id=str(dataset.id),
        epsilon=job.epsilon,
        epsilon_by_mechanism=by_mechanism,
        method=spec.method,
        llm=spec.llm,
        **prompt_provenance(spec, principal.actor),
    )
    admission.admit(session, settings.org_dispatched_jobs)
    return job


def get_job(session: Session, principal: Principal, job_id: uuid.UUID) -> Job:
    return policy.visible(principal, repository.get(session, job_id), "job")


def list_jobs(session: Session, principal: Principal, dataset_id: uuid.UUID) -> Sequence[Job]:
    policy.visible(principal, datasets_repo.get(session, dataset_id), "dataset")
    return repository.list_for_dataset(session, dataset_id)


def stop(session: Session, job: Job, actor: Actor) -> Job:
    """Cancel a job: at once when it has not read private data (its reservation is
    released) or when no live worker process holds it (its spend stays committed: a
    job whose worker died), else by request (the worker observes it; the spend stays
    committed).

    Takes the dataset lock first, like every change to the ledger, so that it cannot
    interleave with a worker committing the spend.
    """
    datasets_repo.get(session, job.dataset_id, for_update=True)
    current = repository.get(session, job.id, for_update=True)
    assert current is not None
    if current.state in TERMINAL_STATES:
        raise Conflict(f"the job has ended ({current.state})")
    reserved = ledger.job_budget_state(session, current.id) == "reserved"
    if reserved or not recovery.held(session, current):
        current.state, current.finished_at, current.stage = "cancelled", utcnow(), None
        recovery.release(current)  # a late task of the job finds it ended
        if reserved:
            ledger.release_reservation(session, current.id, actor)
        audit.record_about(
            session,
            "job.cancelled",
            actor,
            current,
            epsilon_released=current.epsilon if reserved else 0.0,
        )
        admission.admit(session)  # the next job, in turn, takes its place
    elif not current.cancel_requested:
        current.cancel_requested = True
        audit.record_about(session, "job.cancel_requested", actor, current)
    session.flush()
    return current


def cancel(session: Session, principal: Principal, job_id: uuid.UUID) -> Job:
    return stop(session, get_job(session, principal, job_id), principal.actor)


def retry(session: Session, principal: Principal, job_id: uuid.UUID) -> Job:
    """Prompt again the sequences of a failed job that have no text yet, run a failed job
    of an LLM method again from its checkpoints, or resume a queued or running job whose
    worker process died.

    For a failed job, only the prompting stage runs again, from the persisted DP
    keyphrase sequences: no private document is read and no budget is reserved or spent
    (LLM calls are post-processing). A job whose worker died is sent the task that
    continues it from what is persisted (:func:`recovery.dispatch`): its reservation or
    spend stands as it is, and nothing saved is drawn again. Takes the dataset lock
    first, like :func:`stop`.
    """
    job = get_job(session, principal, job_id)
    dataset = datasets_repo.get(session, job.dataset_id, for_update=True)
    current = repository.get(session, job.id, for_update=True)
    assert current is not None
    if current.state in repository.ACTIVE_STATES:
        return _resume(session, principal, current)
    if current.state == "failed" and METHODS[method_of(current.spec)].writes_texts:
        return _rerun_from_checkpoints(session, principal, current)
    if current.sequences_total == 0:
        raise Conflict("the job has no saved keyphrase sequences to prompt again; submit a new job")
    if current.state != "failed":
        raise Conflict(f"only a failed job can be retried (this one is {current.state})")
    if dataset is None or dataset.deleted_at is not None:
        raise Conflict("the dataset was deleted; its jobs cannot be retried")
    missing = current.sequences_total - repository.count_sequences(
        session, current.id, with_text_only=True
    )
    if missing == 0 or current.spec.get("llm") == "none":
        raise Conflict("every sequence of the job has a text already")
    return _run_again(
        session, principal, current, "running", "prompts", sequences_without_text=missing
    )


def _rerun_from_checkpoints(session: Session, principal: Principal, job: Job) -> Job:
    """Run a failed job of an LLM method again from its checkpoints (an LLM outage ended
    it, say): what it released before the failure is loaded, not drawn again, and its
    spend stays as committed, once. A job that failed before its first private read
    holds no spend to continue: submit a new one."""
    if ledger.job_budget_state(session, job.id) != "committed":
        raise Conflict("the job failed before it read the private data; submit a new job")
    dataset = datasets_repo.get(session, job.dataset_id)
    if dataset is None or dataset.deleted_at is not None:
        raise Conflict("the dataset was deleted; its jobs cannot be retried")
    job.progress = 0.0
    return _run_again(session, principal, job, "queued", None, from_checkpoints=True)


def _run_again(
    session: Session, principal: Principal, job: Job, state: str, stage: str | None, **why: Any
) -> Job:
    """A failed job sent on again (``job.retried`` in the audit trail, with ``why``)."""
    job.state, job.stage, job.finished_at = state, stage, None
    if stage is None:  # run again from its first stage
        job.stage_number = job.stage_count = job.stage_fraction = None
    job.error_code = job.error_message = None
    job.cancel_requested = False  # asking again supersedes an earlier stop
    audit.record_about(
        session,
        "job.retried",
        principal.actor,
        job,
        **why,
    )
    recovery.dispatch(session, job)
    session.flush()
    return job


def _resume(session: Session, principal: Principal, job: Job) -> Job:
    if not recovery.is_orphan(session, job, unheld=False):
        if recovery.held(session, job):
            raise Conflict("the job is running on a live worker; cancel it to stop it")
        raise Conflict(
            f"the job is {job.state} and waits for a worker; only a failed job with saved "
            "keyphrase sequences, or one whose worker died, can be retried"
        )
    job.cancel_requested = False  # asking again supersedes an earlier stop
    task = recovery.dispatch(session, job)
    audit.record_about(
        session,
        "job.retried",
        principal.actor,
        job,
        resumed_with=task,
    )
    session.flush()
    return job


def stop_jobs_of_dataset(session: Session, dataset_id: uuid.UUID, actor: Actor) -> None:
    for job in repository.active_of_dataset(session, dataset_id):
        stop(session, job, actor)


def sequences_drawn(job: Job) -> int:
    """How many sequences the job's engine drew before the consistency filter kept
    ``sequences_total`` of them (the engine's manifest says; a method without the filter,
    or a job from before it, kept every draw)."""
    return int((job.manifest or {}).get("sequences_drawn", job.sequences_total))


def current_stage(job: Job, *, owner: bool, now: datetime | None = None) -> JobStage | None:
    """The job's running stage (where a failed or cancelled one stopped) as stage k of n,
    with its fraction and, while it runs, the time left where its work is public; None
    before its first stage and after it succeeded. The stage's start is the owner's."""
    if job.stage is None or job.stage_number is None or job.stage_count is None:
        return None
    stages = runner.stages_of(job.spec)
    if not 1 <= job.stage_number <= len(stages):
        return None
    stage = stages[job.stage_number - 1]
    public = stage.public_work and job.stage_fraction is not None
    seconds_left = None
    if public and job.state == "running" and job.stage_started_at is not None:
        elapsed = ((now or utcnow()) - job.stage_started_at).total_seconds()
        seconds_left = time_left(float(job.stage_fraction or 0.0), job.stage_base, elapsed)
    return JobStage(
        name=stage.name,
        title=stage.title,
        number=job.stage_number,
        count=job.stage_count,
        public_work=stage.public_work,
        fraction=job.stage_fraction if public else None,
        seconds_left=None if seconds_left is None else round(seconds_left, 1),
        started_at=job.stage_started_at if owner else None,
    )


def is_owner(principal: Principal, job: Job) -> bool:
    """Whether ``principal`` belongs to the organisation that owns the job's dataset."""
    return principal.organisation_id == job.organisation_id


def shard_view(session: Session, job: Job) -> JobShardsOut | None:
    """The owner's view of a sharded job's shards (:mod:`app.jobs.shards`; None for a
    job that runs whole): per round, each shard's state, attempts and end time. For the
    owner only: when a shard ends depends on its rows."""
    plan = repository.shard_plan(session, job.id)
    if plan is None:
        return None
    by_round: dict[str, list[ShardOut]] = {}
    for row in repository.shards_of_job(session, job.id):
        by_round.setdefault(row.round, []).append(
            ShardOut(
                shard=row.shard,
                state=row.state,  # type: ignore[arg-type]
                attempts=row.attempts,
                finished_at=row.finished_at,
            )
        )
    return JobShardsOut(
        count=plan.shards,
        rounds=[
            ShardRoundOut(
                name=name,
                reduced=repository.shard_round(session, job.id, name) is not None,
                done=sum(1 for shard in by_round.get(name, []) if shard.state == "done"),
                shards=by_round.get(name, []),
            )
            for name in plan.rounds
        ],
    )


def to_out(session: Session, job: Job, viewer: Principal) -> JobOut:
    """The job as ``viewer`` sees it: its owning organisation sees every time stamp,
    others none that could time the private stages (docs/privacy.md)."""
    state, charge = ledger.job_charge(session, job.id)
    owner = is_owner(viewer, job)
    return JobOut(
        id=job.id,
        dataset_id=job.dataset_id,
        organisation_id=job.organisation_id,
        method=method_of(job.spec),
        state=job.state,  # type: ignore[arg-type]
        stage=job.stage,
        progress=job.progress,
        current_stage=current_stage(job, owner=owner),
        cancel_requested=job.cancel_requested,
        shards=shard_view(session, job) if owner else None,
        counts=JobCounts(
            sequences=job.sequences_total,
            sequences_drawn=sequences_drawn(job),
            texts_done=job.texts_done,
            texts_failed=job.texts_failed,
            llm_calls=job.llm_calls,
        ),
        llm_costs=JobLLMCosts(**(job.llm_costs or {})),
        error=JobError(code=job.error_code, message=job.error_message) if job.error_code else None,
        epsilon=JobEpsilon(
            requested=job.epsilon,
            by_mechanism=job.epsilon_by_mechanism,
            budget_state=state,  # type: ignore[arg-type]
            charged=JobCharge(**charge.shown()) if charge is not None else None,
        ),
        spec=job.spec,
        submitted_by=job.submitted_by,
        created_at=job.created_at,
        started_at=job.started_at if owner else None,
        finished_at=job.finished_at if owner else None,
        updated_at=job.updated_at if owner else None,
    )
