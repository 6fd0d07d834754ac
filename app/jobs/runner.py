"""The job life cycle as the workers drive it: state transitions and the budget rules.

What is here is the bookkeeping around the engine, not the engine call itself:

* :func:`start_sequences` moves a queued job to ``running`` and commits its spend with
  :func:`app.ledger.service.commit_spend` BEFORE anything private is read; it returns
  ``None`` when the job must not touch private data (cancelled, ended, dataset deleted,
  or its sequences persisted already, so a redelivered task does not run the DP
  mechanisms a second time, and queues the prompting stage again instead, in case the
  worker that saved them died before queueing it);
* :func:`private_documents` is the only way to decrypt a dataset's documents, and it
  refuses unless the job's spend is committed;
* :func:`save_sequences` persists the DP keyphrase sequences before any prompt;
* :func:`pending_prompts` / :func:`save_outcome` let the prompting stage resume;
* :func:`report_progress`, :func:`cancel_requested`, :func:`finish` and :func:`fail`
  record the rest of the life cycle;
* :func:`start_sequences` and :func:`claim` (for prompting) make the calling process
  the job's holder (:mod:`app.jobs.recovery`), or raise
  :class:`~app.jobs.recovery.LeaseLost` when another live process holds it; every write
  above raises it too, so a process that lost the job stops. The job is released when
  it ends and when its sequences are saved (the prompting task claims it anew).

Each function takes a session and leaves committing to its caller (one transaction per
step), except that :func:`start_sequences` must be committed before the first document
is decrypted.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from app.config import LEASE_SECONDS
from app.crypto import DocumentCipher
from app.datasets import repository as datasets_repo
from app.errors import Conflict, NotFound
from app.identity.policy import Actor
from app.jobs import admission, recovery, repository
from app.ledger import service as ledger
from app.models import Dataset, Job, utcnow
from workers.llm import attestation
from workers.llm.attestation import Prompt
from workers.llm.client import LLMCosts
from workers.methods.progress import Stage, run_stages, stage_number

WORKER = Actor.system("worker")
TERMINAL_STATES = ("succeeded", "failed", "cancelled")


@dataclass(frozen=True)
class StartedJob:
    """What the sequences stage needs: ids, the declared labels and the spec."""

    job_id: uuid.UUID
    dataset_id: uuid.UUID
    labels: list[str]
    spec: dict[str, Any]
    epsilon_by_mechanism: dict[str, float] = field(default_factory=dict)  # as reserved
    restarted: bool = False  # a redelivered task: the spend was committed already


def stages_of(spec: Mapping[str, Any]) -> tuple[Stage, ...]:
    """The stages a job of ``spec`` runs, in order (public: its method and parameters;
    a spec stored before there were methods is DP-KPS's)."""
    return run_stages(
        str(spec.get("method", "dpkps")),
        mode=str(spec.get("mode") or "independent"),
        llm=str(spec.get("llm") or "local"),
    )


def _enter(job: Job, number: int, count: int, *, public_work: bool, fraction: float) -> None:
    """The job now runs stage ``number`` of ``count`` (its start time is the owner's)."""
    job.stage_number, job.stage_count = number, count
    job.stage_fraction = fraction if public_work else None
    job.stage_base = fraction if public_work else 0.0
    job.stage_started_at = utcnow()


def _job(session: Session, job_id: uuid.UUID, *, lock: bool = False) -> Job:
    job = repository.get(session, job_id, for_update=lock)
    if job is None:
        raise NotFound("no such job")
    return job


def _held_job(session: Session, job_id: uuid.UUID) -> Job:
    """The job, locked, unless another live process holds it (:class:`LeaseLost`)."""
    job = _job(session, job_id, lock=True)
    _check_holder(session, job)
    return job


def held_job(session: Session, job_id: uuid.UUID) -> Job:
    """The job, locked, unless another live process holds it (:class:`LeaseLost`): for
    the sharded stages (:mod:`app.jobs.shards`), which write as the job's holder."""
    return _held_job(session, job_id)


def shard_stop_reason(session: Session, job: Job) -> str | None:
    """Why a shard of ``job`` must not read or write (None: it may go on): the job is not
    running, was asked to stop, has its sequences saved, or its spend is not committed.
    A shard does not hold the job: this, and its claim on its own row, is what lets it
    write (:mod:`app.jobs.shards`)."""
    if job.state != "running":
        return job.state
    if job.cancel_requested:
        return "cancelled"
    if job.sequences_total > 0:
        return "saved"
    if ledger.job_budget_state(session, job.id) != "committed":
        return "uncharged"
    return None


def _check_holder(session: Session, job: Job) -> None:
    if recovery.held_by_another(session, job):
        raise recovery.LeaseLost("another worker process holds the job")


def _claim(session: Session, job: Job, seconds: float) -> None:
    if not recovery.take(session, job, seconds):
        raise recovery.LeaseLost("another worker process holds the job")


def claim(session: Session, job_id: uuid.UUID, seconds: float = LEASE_SECONDS) -> Job:
    """The job, locked and held by this process (alive for ``seconds`` at least), before
    it prompts; :class:`LeaseLost` when another live process holds it."""
    job = _job(session, job_id, lock=True)
    _claim(session, job, seconds)
    if job.stage == "prompts" and job.stage_number is not None:
        # the rate of this run's prompting: from now and what is done already
        job.stage_started_at, job.stage_base = utcnow(), job.progress
    return job


def _lock(session: Session, job_id: uuid.UUID) -> tuple[Job, Dataset | None]:
    """Lock the job's dataset, then the job (the order every ledger change uses)."""
    dataset = datasets_repo.get(session, _job(session, job_id).dataset_id, for_update=True)
    return _job(session, job_id, lock=True), dataset


def start_sequences(
    session: Session,
    job_id: uuid.UUID,
    actor: Actor = WORKER,
    *,
    lease_seconds: float = LEASE_SECONDS,
) -> StartedJob | None:
    """queued → running with the job's ε committed and the job held by this process
    (alive for ``lease_seconds`` at least), or None if it must not run;
    :class:`LeaseLost` when another live process holds it."""
    job, dataset = _lock(session, job_id)
    if job.state in TERMINAL_STATES:
        return None
    _claim(session, job, lease_seconds)
    if job.sequences_total > 0:
        # A redelivery after the sequences were saved. The prompting task is sent once
        # that save commits, so the worker may have died before sending it: send it
        # again (it prompts only the sequences that have no text yet).
        if job.state == "running" and job.spec.get("llm") != "none":
            recovery.dispatch(session, job)
        return None
    if dataset is None or dataset.deleted_at is not None:
        _end(session, job, "failed", "dataset_deleted", "the dataset was deleted")
        if ledger.job_budget_state(session, job.id) == "reserved":
            ledger.release_reservation(session, job.id, actor)
        return None
    if job.cancel_requested:
        _end(session, job, "cancelled")
        if ledger.job_budget_state(session, job.id) == "reserved":
            ledger.release_reservation(session, job.id, actor)
        return None
    # running: a redelivery or a recovery; committed while queued: a failed job retried
    # from its checkpoints. Either way its spend was committed once, already.
    restarted = job.state == "running" or ledger.job_budget_state(session, job.id) == "committed"
    ledger.commit_spend(session, job.id, actor)
    stages = stages_of(job.spec)
    job.state, job.stage, job.progress = "running", stages[0].name, 0.0
    _enter(job, 1, len(stages), public_work=stages[0].public_work, fraction=0.0)
    job.started_at = job.started_at or utcnow()
    return StartedJob(
        job.id,
        dataset.id,
        list(dataset.labels),
        dict(job.spec),
        {name: float(value) for name, value in job.epsilon_by_mechanism.items()},
        restarted,
    )


def private_documents(
    session: Session,
    cipher: DocumentCipher,
    job_id: uuid.UUID,
    *,
    keep: Callable[[int, str | None], bool] | None = None,
) -> Iterator[tuple[str, str, str | None]]:
    """``(text, label, unit)`` of the job's dataset, in row order, decrypted one at a
    time (``unit`` is None unless the upload named a unit column). With ``keep``, only
    the rows for which ``keep(row, unit)`` holds (``row``: the upload's 1-based data row),
    the others skipped before their text is decrypted (a shard's rows).

    Refuses (:class:`Conflict`) unless the job's spend is committed: no private read is
    ever uncharged. The text must stay in the worker's memory: never log, persist or
    send it anywhere.
    """
    job = _job(session, job_id)
    if ledger.job_budget_state(session, job.id) != "committed":
        raise Conflict("the job's budget is not committed: it may not read private data")
    key = cipher.dataset_key(job.dataset_id)
    for document in datasets_repo.iter_documents(session, job.dataset_id):
        sealed_unit = document.unit
        unit = (
            None
            if sealed_unit is None
            else key.open_unit(document.dataset_id, document.row, document.key_id, sealed_unit)
        )
        if keep is not None and not keep(document.row, unit):
            continue
        text, label = key.open(
            document.dataset_id,
            document.row,
            document.key_id,
            document.nonce,
            document.ciphertext,
        )
        yield text, label, unit


def report_progress(session: Session, job_id: uuid.UUID, stage: str, fraction: float) -> None:
    """The job is in ``stage``, ``fraction`` of it done: stage k of n of its method's
    stages (:func:`stages_of`; none for a name that is not one of them). A share within a
    stage is kept only where the stage's work is public; any other stage records its
    start (0) and its end (1) only, whatever is passed (a share of it would depend on
    the private corpus)."""
    job = _held_job(session, job_id)
    stages = stages_of(job.spec)
    number = stage_number(stages, stage)
    public = number is not None and stages[number - 1].public_work
    fraction = min(max(float(fraction), 0.0), 1.0) if public else float(fraction >= 1.0)
    entered = stage != job.stage or number != job.stage_number
    job.stage, job.progress = stage, fraction
    if number is None:
        job.stage_number = job.stage_count = job.stage_fraction = None
    elif entered:
        _enter(job, number, len(stages), public_work=public, fraction=fraction)
    elif public:
        job.stage_fraction = fraction


def save_sequences(
    session: Session,
    job_id: uuid.UUID,
    sequences: Iterable[tuple[str, Sequence[str]]],
    *,
    private_vocabulary: Sequence[str] | None,
    manifest: dict[str, Any],
    texts_from_keyphrases: bool = False,
    texts: Sequence[str] | None = None,
) -> int:
    """Persist the DP outputs of stages 1-6 (label, keyphrases) and the public manifest,
    and queue the prompting stage for when this commits (unless the job has no LLM).

    ``manifest`` is the engine's ``GenerationResult.manifest()``; the owner diagnostics
    of a run are raw facts about private data and must not be passed here. With
    ``texts_from_keyphrases`` (a job without LLM) each text is its keyphrases joined by
    spaces. ``texts`` (a method that releases texts itself, Aug-PE) are the released
    texts, one per sequence (whose keyphrases are then empty): nothing is left to prompt.
    """
    job = _held_job(session, job_id)
    if job.sequences_total > 0:
        raise Conflict("the job's sequences are persisted already")
    rows = [
        {
            "job_id": job.id,
            "position": i,
            "label": label,
            "keyphrases": list(phrases),
            "text": " ".join(phrases) if texts_from_keyphrases else None,
            "attempts": 0,
        }
        for i, (label, phrases) in enumerate(sequences)
    ]
    if texts is not None:
        if len(texts) != len(rows):
            raise ValueError("give one text per sequence")
        for row, text in zip(rows, texts, strict=True):
            row["text"] = text
    repository.insert_sequences(session, rows)
    done = texts_from_keyphrases or texts is not None
    job.sequences_total = len(rows)
    job.texts_done = len(rows) if done else 0
    job.private_vocabulary = None if private_vocabulary is None else list(private_vocabulary)
    job.manifest = manifest
    ledger.record_report(session, job, manifest.get("privacy"), WORKER)
    job.stage, job.progress = "prompts", 0.0
    if not done and job.spec.get("llm") != "none":
        stages = stages_of(job.spec)
        _enter(job, len(stages), len(stages), public_work=stages[-1].public_work, fraction=0.0)
        recovery.dispatch(session, job)  # frees the lease for the prompting task
    return len(rows)


def released_texts(session: Session, job_id: uuid.UUID) -> list[tuple[str, str]]:
    """``(label, text)`` of the job's sequences that have a text: its released corpus."""
    out: list[tuple[str, str]] = []
    after = -1
    while True:
        page = repository.sequences_page(
            session, job_id, after=after, limit=1000, with_text_only=True
        )
        if not page:
            return out
        out.extend((s.label, s.text or "") for s in page)
        after = page[-1].position


def save_utility(session: Session, job_id: uuid.UUID, manifest: dict[str, Any]) -> None:
    """Store the manifest with the holdout's figure (DP outputs and public inputs only),
    once: a job that has one keeps it."""
    job = _held_job(session, job_id)
    if "utility" in (job.manifest or {}):
        return
    job.manifest = manifest


def load_checkpoint(session: Session, job_id: uuid.UUID, key: str) -> bytes | None:
    found = repository.get_checkpoint(session, job_id, key)
    return None if found is None else bytes(found.data)


def save_checkpoint(session: Session, job_id: uuid.UUID, key: str, data: bytes) -> None:
    """Save a DP output of the running method under ``key`` (held jobs only)."""
    _held_job(session, job_id)
    repository.put_checkpoint(session, job_id, key, data)


def append_prompts(session: Session, job_id: uuid.UUID, prompts: Sequence[Prompt]) -> int:
    """Record prompts about to be sent in the job's hash-chained log (held jobs only:
    a process that lost the job records nothing, :class:`LeaseLost`). A prompt whose
    request the log holds already (a retry) adds nothing; returns the records added."""
    _held_job(session, job_id)  # its row lock: one appender at a time, no fork
    entries = [prompt.entry() for prompt in prompts]
    known = repository.prompt_entries_among(session, job_id, entries)
    count, head = repository.prompt_log_head(session, job_id)
    lines = attestation.extend(prompts, known, seq=count, head=head or attestation.GENESIS)
    repository.add_prompt_records(
        session,
        job_id,
        [
            {
                "seq": line["seq"],
                "entry": attestation.entry_of(line),
                "hash": line["hash"],
                "record": attestation.canonical(attestation.record_of(line)).decode(),
                "content": attestation.canonical(line["content"]).decode(),
            }
            for line in lines
        ],
    )
    return len(lines)


def add_llm_costs(session: Session, job_id: uuid.UUID, costs: LLMCosts) -> None:
    """Add ``costs`` to the job's recorded LLM work."""
    job = _held_job(session, job_id)
    total = LLMCosts(**(job.llm_costs or {})).add(costs)
    job.llm_costs = total.as_dict()


def set_llm_costs(session: Session, job_id: uuid.UUID, costs: LLMCosts) -> None:
    """Record the job's LLM work as ``costs`` (a method that totals its own runs)."""
    _held_job(session, job_id).llm_costs = costs.as_dict()


def pending_prompts(
    session: Session, job_id: uuid.UUID, *, after: int = -1, limit: int = 1000
) -> list[tuple[int, list[str]]]:
    """``(position, keyphrases)`` of sequences without a text yet, by position after
    ``after`` (to resume prompting a page at a time)."""
    page = repository.sequences_page(
        session, job_id, after=after, limit=limit, without_text_only=True
    )
    return [(s.position, list(s.keyphrases)) for s in page]


def missing_texts(session: Session, job_id: uuid.UUID) -> dict[str, int]:
    """How many sequences have no text, by error code (``not_attempted`` without one)."""
    return repository.missing_texts_by_error(session, job_id)


def save_outcome(
    session: Session,
    job_id: uuid.UUID,
    position: int,
    *,
    text: str | None,
    error: str | None,
    attempts: int,
) -> None:
    """Record what the LLM made of one sequence (``error`` is a short code).

    The job row is locked first: outcomes are saved concurrently, and each one updates
    the job's counters.
    """
    job = _held_job(session, job_id)
    sequence = repository.get_sequence(session, job_id, position)
    if sequence is None:
        raise NotFound("no such sequence")
    was_done = sequence.text is not None
    was_failed = sequence.error is not None and not was_done
    sequence.text, sequence.error = text, error
    sequence.attempts += attempts
    sequence.generated_at = utcnow()
    job.llm_calls += attempts
    job.texts_done += int(text is not None) - int(was_done)
    job.texts_failed += int(text is None and error is not None) - int(was_failed)
    if job.sequences_total:
        job.progress = min(1.0, (job.texts_done + job.texts_failed) / job.sequences_total)
        if job.stage == "prompts" and job.stage_number is not None:
            job.stage_fraction = job.progress  # of the DP number of sequences: public work


def cancel_requested(session: Session, job_id: uuid.UUID) -> bool:
    """Whether the job was asked to stop; if so it is marked cancelled (spend stays)."""
    job = _held_job(session, job_id)
    if job.cancel_requested and job.state not in TERMINAL_STATES:
        _end(session, job, "cancelled")
    return job.cancel_requested


def _end(
    session: Session, job: Job, state: str, code: str | None = None, message: str | None = None
) -> None:
    """The job ends in ``state``; its organisation's next waiting job (or another's, in
    turn) is sent in its place (:mod:`app.jobs.admission`)."""
    job.state, job.finished_at = state, utcnow()
    job.error_code, job.error_message = code, message
    recovery.release(job)
    if state == "succeeded":
        job.progress, job.stage = 1.0, None
        job.stage_number = job.stage_count = job.stage_fraction = None
    admission.admit(session)


def finish(session: Session, job_id: uuid.UUID) -> None:
    job = _held_job(session, job_id)
    if job.state != "running":
        raise Conflict(f"only a running job can succeed (this one is {job.state})")
    _end(session, job, "succeeded")


def fail(session: Session, job_id: uuid.UUID, code: str, message: str) -> None:
    """Mark the job failed. ``message`` is shown to users: ids, counts, codes only.

    A job that failed before its spend was committed has its reservation released;
    otherwise the spend stays, as for any job that read private data.
    """
    job, _ = _lock(session, job_id)
    if job.state in TERMINAL_STATES:
        return
    _check_holder(session, job)
    _end(session, job, "failed", code[:64], message[:1000])
    if ledger.job_budget_state(session, job.id) == "reserved":
        ledger.release_reservation(session, job.id, WORKER)
