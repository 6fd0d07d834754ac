"""The two stages of a job as a worker runs them (service.md, "Job life cycle").

:func:`run_sequences` (stages 1-6, the only code that reads private documents):

1. :func:`app.jobs.runner.start_sequences` commits the job's ε before anything private
   is read, or says the job must not run;
2. the documents are decrypted into memory, the job's method runs (one path for every
   method: its registry entry says what the run takes, :func:`_sequences`) with a
   progress callback that writes the stage that runs as stage k of n, with a fraction
   only in the stages whose work is public (:class:`StageTracker`), and stops the run
   when the job was cancelled;
3. the ε the run reports, by mechanism, must be the ε the ledger holds for the job;
   otherwise the job fails and nothing is saved (a bug, logged as such);
4. the released sequences are saved: with their texts for a method that writes them
   within the run (the job is done); else the prompting stage is queued once that
   commits, and a job without LLM takes its keyphrases, joined by spaces, as its texts.

:func:`run_prompts` (step 7) reads the persisted sequences that have no text yet, calls
the LLM for them and saves each outcome as it arrives, so a crash, an outage or a
retry (``POST /v1/jobs/{id}/retry``) resumes where it stopped, with no private read
and no budget spent.

Every prompt either stage sends (DP-KPS's here, an LLM method's in its run) is first
recorded in the job's hash-chained prompt log (:class:`JobPromptLog`,
:mod:`workers.llm.attestation`, docs/attestation.md); a retried prompt adds nothing.

Both run on a job their process holds (:mod:`app.jobs.recovery`): a task that finds the
job held by another live process returns ``held`` at once, and one whose job was taken
over meanwhile (its process was thought dead) stops at its next write, writing nothing
(``lost``).

What reaches logs, job errors and metrics: ids, stages, ε, DP counts, short error codes
and the duration of the prompting stage (the private stages' durations depend on the
data: they are not measured). Never a document, a raw count of documents (the engine's owner
diagnostics are not even read), or the text of an exception (it may quote data).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import secrets
import time
import traceback
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog
from celery.exceptions import SoftTimeLimitExceeded

from app.config import Settings
from app.crypto import DocumentCipher
from app.db import Database
from app.errors import Conflict, NotFound
from app.jobs import holdout, llm, runner
from app.jobs import repository as jobs_repo
from app.jobs.recovery import LeaseLost
from app.jobs.schemas import JOB_SPEC, AnySpec, HoldoutSpec
from app.metrics import EPSILON_COMMITTED, JOBS_ENDED, LLM_CALLS, observe_stage
from app.models import Dataset
from app.vocabularies import service as vocabularies
from workers.errors import InputDataError, KeyseedError, LLMError
from workers.evaluation import holdout as holdout_maths
from workers.llm import attestation
from workers.llm.attestation import Prompt
from workers.llm.client import LLMCosts
from workers.methods.checkpoints import check_key
from workers.methods.dpkps import prompting
from workers.methods.dpkps.prompting import DEFAULT_TEMPLATE, PromptOutcome, PromptSpec
from workers.methods.outcome import RunOutcome
from workers.methods.progress import Stage, stage_number
from workers.methods.registry import METHODS, Method
from workers.privacy.audit import CanarySet, make_canaries

if TYPE_CHECKING:
    from workers.text.embeddings import SentenceEmbedder
    from workers.text.vocabulary import Vocabulary

log = structlog.get_logger("keyseed.jobs")

StageHook = Callable[[uuid.UUID, str, float], None]  # job, stage, fraction
PROMPT_BATCH = 500  # sequences read and prompted at a time
# The engine's ε is OpenDP's privacy map at the calibrated noise scale: never above what
# was asked, and below it by float rounding only (0.49999999999999944 for 0.5).
ACCOUNTING_TOLERANCE = 1e-9


class JobCancelled(Exception):
    """The job was asked to stop; it is marked cancelled already."""


class AccountingMismatch(Exception):
    """The engine spent other ε than the ledger holds for the job (a bug)."""


@dataclass
class WorkerContext:
    """What a worker process needs to run stages: settings, database, document key.

    ``stage_hooks`` are called after each progress write (outside any transaction).
    """

    settings: Settings
    database: Database
    cipher: DocumentCipher
    stage_hooks: list[StageHook] = field(default_factory=list)

    @classmethod
    def from_settings(cls, settings: Settings, *, celery: Any = None) -> WorkerContext:
        database = Database.from_settings(settings, celery=celery)
        return cls(settings, database, DocumentCipher.from_settings(settings))


# ------------------------------------------------------------------ shared helpers


def _error_code(exc: KeyseedError) -> str:
    if isinstance(exc, LLMError):
        return "llm_unavailable"
    return "input_data_error" if isinstance(exc, InputDataError) else "config_error"


def _end(state: str) -> str:
    JOBS_ENDED.labels(state).inc()
    return state


def _held(job_id: uuid.UUID, stage: str) -> str:
    log.info(f"job.{stage}.held", job_id=str(job_id))  # by a live process: a duplicate
    return "held"


def _lost(job_id: uuid.UUID, stage: str) -> str:
    log.warning(f"job.{stage}.lost", job_id=str(job_id))  # taken over: nothing written
    return "lost"


def _fail(ctx: WorkerContext, job_id: uuid.UUID, code: str, message: str) -> str:
    with ctx.database.transaction() as session:
        runner.fail(session, job_id, code, message)
    log.warning("job.failed", job_id=str(job_id), code=code)
    return _end("failed")


def _crashed(ctx: WorkerContext, job_id: uuid.UUID, stage: str, exc: BaseException) -> str:
    # The message of an arbitrary exception may quote data: log its type and frames.
    log.error(
        f"job.{stage}.crashed",
        job_id=str(job_id),
        error=type(exc).__name__,
        frames=traceback.format_tb(exc.__traceback__)[-8:],
    )
    return _fail(
        ctx,
        job_id,
        "internal_error",
        f"the {stage} stage stopped on an unexpected error; the worker log has the details",
    )


def check_accounting(reported: Mapping[str, float], reserved: Mapping[str, float]) -> None:
    """The engine's ε by mechanism must be the ledger's, up to float rounding."""
    if set(reported) != set(reserved):
        raise AccountingMismatch(
            f"mechanisms {sorted(reported)} were run but {sorted(reserved)} were reserved"
        )
    for name, epsilon in reported.items():
        expected = float(reserved[name])
        if abs(float(epsilon) - expected) > ACCOUNTING_TOLERANCE * max(1.0, expected):
            raise AccountingMismatch(f"{name}: ε = {epsilon!r} spent, ε = {expected!r} reserved")


# ------------------------------------------------------------------ stages 1-6


class StageTracker:
    """The engine's progress callback: the job shows the stage that runs, as stage k of
    n of its method's stages (:func:`workers.methods.progress.run_stages`, public).

    Every stage the engine reports runs after the first private read, so what others
    see of it must not depend on the data (docs/privacy.md). A stage that reads the
    private corpus shows its start (progress 0) and its end (1), never a fraction within
    it (extraction's i/n would give the number of documents). A stage whose amount of
    work is public (``public_work``: embedding Ṽ's public phrases, sampling from the
    releases) shows the fraction the engine reports, written at most every
    ``progress_interval`` seconds and at its end. The reports are the engine's; which of
    them change what is written depends only on the configuration, the declared labels
    and DP outputs. A report of an earlier stage than the one shown (iterative DP-KPS
    goes back and forth between a class's density and its sampling) is not shown: k
    never goes down. No stage's duration is measured. Cancellation is checked at each
    write and otherwise at most every ``progress_interval`` seconds, at the engine's
    reports and at its ticks (:meth:`tick`) between them.
    """

    def __init__(
        self, ctx: WorkerContext, job_id: uuid.UUID, stages: tuple[Stage, ...] = ()
    ) -> None:
        self.ctx = ctx
        self.job_id = job_id
        self.stages = stages
        self.stage: str | None = None
        self.number: int | None = None
        self.shown: float | None = None
        self.last_check = float("-inf")

    def __call__(self, stage: str, fraction: float) -> None:
        number = stage_number(self.stages, stage)
        due = time.monotonic() - self.last_check >= self.ctx.settings.progress_interval
        if number is None or (self.number is not None and number < self.number):
            if due:  # not one of the run's stages, or an earlier one: nothing shown
                self.check_cancelled()
            return
        public = self.stages[number - 1].public_work
        shown = min(max(float(fraction), 0.0), 1.0) if public else float(fraction >= 1.0)
        if number != self.number or (shown != self.shown and (due or shown >= 1.0 or not public)):
            self.stage, self.number, self.shown = stage, number, shown
            self.write(stage, shown)
        elif due:
            self.check_cancelled()

    def tick(self) -> None:
        """Called by the run between its progress reports (after each LLM call, every
        few hundred documents read or embedded: :func:`workers.methods.progress.ticker`):
        checks, at most every ``progress_interval`` seconds, whether the job was
        cancelled (a cancel, its dataset deleted), and stops the run if so. Shows and
        writes nothing else."""
        if time.monotonic() - self.last_check >= self.ctx.settings.progress_interval:
            self.check_cancelled()

    def check_cancelled(self) -> None:
        with self.ctx.database.transaction() as session:
            cancelled = runner.cancel_requested(session, self.job_id)
        self.last_check = time.monotonic()
        if cancelled:
            raise JobCancelled

    def write(self, stage: str, fraction: float) -> None:
        with self.ctx.database.transaction() as session:
            cancelled = runner.cancel_requested(session, self.job_id)
            if not cancelled:
                runner.report_progress(session, self.job_id, stage, fraction)
        self.last_check = time.monotonic()
        if cancelled:
            raise JobCancelled
        for hook in self.ctx.stage_hooks:
            hook(self.job_id, stage, fraction)


@functools.cache
def _embedder(model: str, device: str) -> SentenceEmbedder:
    """One embedding model per worker process (loading it takes seconds)."""
    from workers.text.embeddings import SentenceEmbedder

    return SentenceEmbedder(model, device=device)


@functools.cache
def _builtin_vocabulary(name: str) -> Vocabulary:
    from workers.text.vocabulary import load_vocabulary

    return load_vocabulary(name)


def _vocabulary(ctx: WorkerContext, spec: Mapping[str, Any]) -> Vocabulary:
    ref = vocabularies.VocabularyRef(**spec["vocabulary_ref"])
    if ref.kind == "builtin":
        vocabulary = _builtin_vocabulary(ref.id)
    else:
        with ctx.database.session() as session:
            vocabulary = vocabularies.engine_vocabulary_for(session, ref)
    if vocabulary.fingerprint != ref.fingerprint:
        raise InputDataError(
            f"vocabulary {ref.name!r} has changed since the job was submitted",
            field="vocabulary",
        )
    return vocabulary


def job_spec(stored: Mapping[str, Any]) -> AnySpec:
    """The spec as submitted (the stored copy also records the vocabulary it resolved)."""
    return JOB_SPEC.validate_python({k: v for k, v in stored.items() if k != "vocabulary_ref"})


class JobCheckpoints:
    """A method's checkpoints (:mod:`workers.methods.checkpoints`) in ``job_checkpoints``,
    one short transaction per load or save; a save by a process that lost the job raises
    :class:`LeaseLost` and writes nothing."""

    def __init__(self, database: Database, job_id: uuid.UUID) -> None:
        self.database = database
        self.job_id = job_id

    def load(self, key: str) -> bytes | None:
        with self.database.session() as session:
            return runner.load_checkpoint(session, self.job_id, check_key(key))

    def save(self, key: str, data: bytes) -> None:
        with self.database.transaction() as session:
            runner.save_checkpoint(session, self.job_id, check_key(key), bytes(data))


class JobPromptLog:
    """The job's prompt log (:mod:`workers.llm.attestation`) in ``prompt_log``: a batch of
    prompts is appended in one transaction under the job's row lock, before any of them
    is sent; a process that lost the job records nothing (:class:`LeaseLost`), and so
    sends nothing."""

    def __init__(self, database: Database, job_id: uuid.UUID) -> None:
        self.database = database
        self.job_id = job_id

    def append(self, prompts: Sequence[Prompt]) -> None:
        with self.database.transaction() as session:
            runner.append_prompts(session, self.job_id, prompts)


@dataclass
class PrivateCorpus:
    """A job's documents in the worker's memory, in row order. ``units`` names each
    document's privacy unit when the upload named a unit column (else None: each row is
    its own unit); the engine does not pool by unit yet."""

    texts: list[str]
    labels: list[str]
    units: list[str] | None


def _canaries(
    method: Method,
    params: Any,
    spec: AnySpec,
    vocabulary: Vocabulary | None,
    started: runner.StartedJob,
) -> CanarySet | None:
    """The run's canaries (:mod:`workers.privacy.audit`), drawn by a fresh secret seed
    before any private read, or None for a method that takes none or a spec that turned
    the audit off. Their words come from the phrases the run can emit (the method's
    :attr:`~workers.methods.registry.Method.canary_phrases` of its vocabulary, or of the
    built-in one its entry names for a run that reads none: an LLM method's)."""
    count = getattr(spec, "audit_canaries", 0)
    if method.canary_phrases is None or not count:
        return None
    if vocabulary is None:
        vocabulary = _builtin_vocabulary(method.canary_words_from)
    return make_canaries(
        phrases=vocabulary.phrases,
        labels=started.labels,
        count=count,
        seed=secrets.randbits(62),
        document_type=spec.document_type,
        stop=method.canary_phrases(params, len(vocabulary)),
    )


def with_canaries(corpus: PrivateCorpus, canaries: CanarySet | None) -> PrivateCorpus:
    """The generation input: the private documents, then the canaries whose coin came up
    heads (public documents, each its own unit). Nothing here is stored: the dataset's
    rows stay as uploaded."""
    if canaries is None:
        return corpus
    added = canaries.included_canaries
    units = corpus.units
    if units is not None:
        taken = set(units)
        fresh = (f"canary-{canaries.seed}-{i}" for i in range(len(added) + len(taken) + 1))
        units = [*units, *[u for u in fresh if u not in taken][: len(added)]]
    return PrivateCorpus(
        [*corpus.texts, *(c.text for c in added)],
        [*corpus.labels, *(c.label for c in added)],
        units,
    )


def with_audit(manifest: dict[str, Any], canaries: CanarySet | None) -> dict[str, Any]:
    """The engine's manifest with the canary set (seed, canaries, coins) under ``audit``:
    stored with the job, shown to no one before the release (the job's manifest is not
    served; the release's audit block is built from it, :mod:`app.releases.service`)."""
    if canaries is None:
        return manifest
    return {**manifest, "audit": canaries.to_dict()}


def load_corpus(ctx: WorkerContext, job_id: uuid.UUID) -> PrivateCorpus:
    """Decrypt the job's documents (its spend must be committed: see ``runner``)."""
    texts: list[str] = []
    labels: list[str] = []
    units: list[str | None] = []
    with ctx.database.session() as session:
        for text, label, unit in runner.private_documents(session, ctx.cipher, job_id):
            texts.append(text)
            labels.append(label)
            units.append(unit)
    named = [unit for unit in units if unit is not None]  # all or none: a dataset's rule
    return PrivateCorpus(texts, labels, named if named and len(named) == len(units) else None)


def run_sequences(ctx: WorkerContext, job_id: uuid.UUID) -> str:
    """Stages 1-6 of a job; returns what became of it (for logs and tests)."""
    try:
        with ctx.database.transaction() as session:
            started = runner.start_sequences(
                session, job_id, lease_seconds=ctx.settings.job_lease_seconds
            )
    except NotFound:
        log.warning("job.sequences.no_such_job", job_id=str(job_id))
        return "missing"
    except LeaseLost:
        return _held(job_id, "sequences")
    if started is None:
        log.info("job.sequences.skipped", job_id=str(job_id))
        return "skipped"
    if not started.restarted:
        for mechanism, epsilon in started.epsilon_by_mechanism.items():
            EPSILON_COMMITTED.labels(mechanism).inc(epsilon)
    log.info(
        "job.sequences.started",
        job_id=str(job_id),
        epsilon_by_mechanism=started.epsilon_by_mechanism,
        restarted=started.restarted,
    )
    tracker = StageTracker(ctx, job_id, runner.stages_of(started.spec))
    return guarded(ctx, job_id, tracker, lambda: _sequences(ctx, started, tracker))


def guarded(
    ctx: WorkerContext, job_id: uuid.UUID, tracker: StageTracker, body: Callable[[], str]
) -> str:
    """Run ``body`` (a part of the private stages, its progress reported to ``tracker``)
    and turn what stops it into the job's end: cancelled, lost, failed (logged without
    the text of an exception)."""
    try:
        return body()
    except JobCancelled:
        log.info("job.cancelled", job_id=str(job_id), stage=tracker.stage)
        return _end("cancelled")
    except LeaseLost:
        return _lost(job_id, "sequences")
    except SoftTimeLimitExceeded:
        return _fail(
            ctx,
            job_id,
            "time_limit",
            f"the job ran longer than its time limit ({ctx.settings.job_soft_time_limit} s)",
        )
    except AccountingMismatch as exc:
        # The figures are configuration (public); this is a bug, and nothing was saved.
        log.critical("job.sequences.accounting_mismatch", job_id=str(job_id), detail=str(exc))
        return _fail(
            ctx,
            job_id,
            "accounting_mismatch",
            "the ε the engine spent differs from the ε reserved for the job; nothing was "
            "saved and the ε committed stays spent. This is a bug: please report it.",
        )
    except KeyseedError as exc:
        return _fail(ctx, job_id, _error_code(exc), exc.message)
    except Exception as exc:
        return _crashed(ctx, job_id, "sequences", exc)


def _sequences(ctx: WorkerContext, started: runner.StartedJob, tracker: StageTracker) -> str:
    """The job's private stages: a run of its method, as its registry entry describes it
    (:mod:`workers.methods.registry`), its releases saved.

    A method that writes its texts with an LLM runs with the job's endpoint (capped at
    the server's LLM concurrency), from its checkpoints (a redelivered or recovered task
    draws no noise that was drawn and saved already), every prompt logged before it is
    sent; its texts are the job's outputs. Otherwise the run releases keyphrase
    sequences, which the prompting stage writes out (or, without an LLM, each sequence's
    keyphrases are its text). Where the entry supports them, the audit's canaries join
    the generation input and a holdout's slice is kept out of it. The run's LLM calls
    carry public prompts and synthetic texts only; its progress reports are stage
    boundaries, iteration numbers and public fractions."""
    spec = job_spec(started.spec)
    method = METHODS[spec.method]
    settings, job_id = ctx.settings, started.job_id
    params: Any = spec.params()
    from app.jobs import shards  # it builds on this module

    if shards.runs_sharded(ctx, spec, params, started.labels):
        return shards.coordinate(ctx, started, tracker)
    if method.writes_texts:
        concurrency = min(params.concurrency, llm.concurrency(settings, spec.llm))
        params = params.model_copy(update={"concurrency": concurrency})
    inputs: dict[str, Any] = {}
    vocabulary = None
    if method.vocabulary(params) is not None:  # its phrases' embeddings are cached
        from workers.text.embeddings import EmbeddingCache

        vocabulary = _vocabulary(ctx, started.spec)
        inputs["vocabulary"] = vocabulary
        inputs["cache"] = EmbeddingCache(settings.embedding_cache_dir)
    embedder = _embedder(settings.embedding_model, settings.device)
    canaries = _canaries(method, params, spec, vocabulary, started)
    kept_out = getattr(spec, "holdout", None) if method.supports_holdout else None
    unit_name = _unit_column(ctx, started)
    if method.takes_unit_and_device:
        inputs["unit_name"] = unit_name
        inputs["device"] = settings.device
    with contextlib.ExitStack() as stack:
        if method.writes_texts:
            inputs["llm"] = stack.enter_context(llm.endpoint(settings, spec.llm))
            inputs["checkpoints"] = JobCheckpoints(ctx.database, job_id)
            stack.enter_context(attestation.recording(JobPromptLog(ctx.database, job_id)))
        # a cancel that came while the models loaded stops us here
        tracker(tracker.stages[0].name, 0.0)
        corpus = load_corpus(ctx, job_id)
        # the canaries join the generation side only: never the holdout's slice
        generation = with_canaries(_generation_side(corpus, kept_out, started.labels), canaries)
        if kept_out is None:
            del corpus
        result = method.run(
            generation.texts,
            generation.labels,
            label_set=started.labels,
            units=generation.units,
            params=params,
            embedder=embedder,
            progress=tracker,
            **inputs,
        )
        del generation
    outcome = method.outcome(result, params, started.labels, unit_name)
    del result
    if not outcome.as_planned:
        raise AccountingMismatch("the run's releases are not the ones its reservation holds")
    check_accounting(
        outcome.epsilon_by_mechanism, holdout.generation_only(started.epsilon_by_mechanism)
    )
    # nothing left to prompt: the run wrote its texts, or each text is its keyphrases
    done = outcome.texts is not None or spec.llm == "none"
    manifest = with_audit(outcome.manifest, canaries)
    if kept_out is not None:
        # once the released corpus is known the slice is scored at once and saved with
        # the sequences; else once the prompts are done (_conclude)
        manifest = _with_holdout(
            manifest, started, corpus if done else None, outcome.released(), params.seed
        )
        del corpus
    return save_outcome(ctx, job_id, spec, outcome, manifest, done=done)


def save_outcome(
    ctx: WorkerContext,
    job_id: uuid.UUID,
    spec: AnySpec,
    outcome: RunOutcome,
    manifest: dict[str, Any],
    *,
    done: bool,
) -> str:
    """Save a run's releases (DP outputs) with its public manifest, unless the job was
    cancelled meanwhile; the job is done, or its prompting stage is queued."""
    try:
        with ctx.database.transaction() as session:
            if runner.cancel_requested(session, job_id):
                cancelled = True
            else:
                cancelled = False
                runner.save_sequences(
                    session,
                    job_id,
                    outcome.sequences,
                    private_vocabulary=outcome.private_vocabulary,
                    manifest=manifest,
                    texts_from_keyphrases=outcome.texts is None and done,
                    texts=outcome.texts,
                )
                if outcome.llm_costs is not None:
                    runner.set_llm_costs(session, job_id, outcome.llm_costs)
                if done:
                    runner.finish(session, job_id)
    except Conflict:  # another delivery of the task saved them first
        log.warning("job.sequences.saved_already", job_id=str(job_id))
        return "duplicate"
    if cancelled:
        raise JobCancelled
    if outcome.texts is None:
        log.info(
            "job.sequences.saved",
            job_id=str(job_id),
            sequences=len(outcome.sequences),
            epsilon=outcome.epsilon,
            next="done" if done else "prompts",
        )
    else:
        log.info(
            "job.method.saved",
            method=spec.method,
            job_id=str(job_id),
            documents=len(outcome.texts),
            llm_calls=outcome.llm_costs.calls if outcome.llm_costs is not None else 0,
        )
    return _end("succeeded") if done else "prompting"


def _generation_side(
    corpus: PrivateCorpus, kept_out: HoldoutSpec | None, label_set: list[str]
) -> PrivateCorpus:
    """The documents generation may read: all of them, or those outside a holdout's
    slice (whole units; :func:`workers.evaluation.holdout.select`)."""
    if kept_out is None:
        return corpus
    assert kept_out.key is not None  # drawn at submission
    rest = holdout_maths.select(
        corpus.texts,
        corpus.labels,
        corpus.units,
        key=kept_out.key,
        fraction=kept_out.fraction,
        label_set=label_set,
    ).rest
    return PrivateCorpus(
        [corpus.texts[i] for i in rest],
        [corpus.labels[i] for i in rest],
        None if corpus.units is None else [corpus.units[i] for i in rest],
    )


def _with_holdout(
    manifest: dict[str, Any],
    started: runner.StartedJob,
    corpus: PrivateCorpus | None,
    released: list[tuple[str, str]],
    seed: int,
) -> dict[str, Any]:
    """The manifest with the evaluation's event on the slice side beside the generation's
    on the rest side, and with its figure when ``corpus`` is given (else the event as
    planned, and the figure comes once the released texts exist)."""
    spec = started.spec["holdout"]
    split = holdout_maths.split_name(str(spec["key"]), float(spec["fraction"]))
    epsilon = float(started.epsilon_by_mechanism[holdout.MECHANISM])
    out = dict(manifest)
    if corpus is None:
        event = holdout_maths.planned_event(
            epsilon=epsilon, classes=len(started.labels), split=split
        )
    else:
        out["utility"], event = holdout.evaluate(
            texts=corpus.texts,
            labels=corpus.labels,
            units=corpus.units,
            label_set=started.labels,
            synthetic=released,
            holdout=spec,
            epsilon=epsilon,
            seed=seed,
        )
    delta = float(manifest["privacy"].get("delta") or 0.0)
    out["privacy"] = holdout.privacy_block(manifest["privacy"], split, event, delta)
    out["holdout"] = {"key": spec["key"], "fraction": spec["fraction"], "split": split}
    return out


def _score_holdout(ctx: WorkerContext, job_id: uuid.UUID) -> dict[str, Any] | None:
    """After the prompts: the holdout's figure for a job that asked for one and has none
    yet (reads the private slice again; the spend was committed when the job started)."""
    with ctx.database.session() as session:
        job = jobs_repo.get(session, job_id)
        if job is None or not job.spec.get("holdout") or "utility" in (job.manifest or {}):
            return None
        dataset = session.get(Dataset, job.dataset_id)
        if dataset is None or dataset.deleted_at is not None:  # its documents are gone
            return None
        started = runner.StartedJob(
            job.id,
            job.dataset_id,
            list(dataset.labels),
            dict(job.spec),
            {name: float(value) for name, value in job.epsilon_by_mechanism.items()},
        )
        released = runner.released_texts(session, job_id)
        manifest = dict(job.manifest or {})
    corpus = load_corpus(ctx, job_id)
    found = _with_holdout(manifest, started, corpus, released, int(started.spec.get("seed", 0)))
    del corpus
    return found


def _unit_column(ctx: WorkerContext, started: runner.StartedJob) -> str | None:
    """The name of the dataset's unit column (public schema), if it has one."""
    with ctx.database.session() as session:
        dataset = session.get(Dataset, started.dataset_id)
        return dataset.unit_column if dataset is not None else None


# ------------------------------------------------------------------ step 7


def _count_calls(endpoint: str, outcome: PromptOutcome) -> None:
    if outcome.attempts > 1:
        LLM_CALLS.labels(endpoint, "retried_error").inc(outcome.attempts - 1)
    if outcome.attempts >= 1:
        LLM_CALLS.labels(endpoint, "ok" if outcome.ok else outcome.error or "error").inc()


def _save_outcome(
    ctx: WorkerContext, job_id: uuid.UUID, position: int, outcome: PromptOutcome
) -> bool:
    """Persist one outcome; whether the job was asked to stop meanwhile."""
    with ctx.database.transaction() as session:
        runner.save_outcome(
            session,
            job_id,
            position,
            text=outcome.text,
            error=outcome.error,
            attempts=outcome.attempts,
        )
        return runner.cancel_requested(session, job_id)


def run_prompts(ctx: WorkerContext, job_id: uuid.UUID) -> str:
    """Step 7 for the job's sequences that have no text yet; returns what became of it."""
    with ctx.database.transaction() as session:
        job = jobs_repo.get(session, job_id)
        if job is None:
            log.warning("job.prompts.no_such_job", job_id=str(job_id))
            return "missing"
        if job.state != "running" or job.sequences_total == 0:
            log.info("job.prompts.skipped", job_id=str(job_id), state=job.state)
            return "skipped"
        try:
            runner.claim(session, job_id, ctx.settings.job_lease_seconds)
        except LeaseLost:
            return _held(job_id, "prompts")
        cancelled = runner.cancel_requested(session, job_id)
        spec, total = dict(job.spec), job.sequences_total
    if cancelled:
        return _end("cancelled")
    started = time.monotonic()
    try:
        calls = _prompt_pending(ctx, job_id, spec)
    except JobCancelled:
        log.info("job.cancelled", job_id=str(job_id), stage="prompts")
        return _end("cancelled")
    except LeaseLost:
        return _lost(job_id, "prompts")
    except SoftTimeLimitExceeded:
        return _fail(
            ctx,
            job_id,
            "time_limit",
            f"the job ran longer than its time limit ({ctx.settings.job_soft_time_limit} s); "
            f"the texts generated are kept: POST /v1/jobs/{job_id}/retry prompts the rest",
        )
    except LLMError:
        return _fail(
            ctx,
            job_id,
            "llm_unavailable",
            f"the LLM endpoint {spec.get('llm')!r} could not be used; "
            f"POST /v1/jobs/{job_id}/retry tries again",
        )
    except KeyseedError as exc:
        return _fail(ctx, job_id, _error_code(exc), exc.message)
    except Exception as exc:
        return _crashed(ctx, job_id, "prompts", exc)
    finally:
        observe_stage("prompts", time.monotonic() - started)
    try:
        return _conclude(ctx, job_id, total, calls)
    except LeaseLost:
        return _lost(job_id, "prompts")


def _prompt_pending(ctx: WorkerContext, job_id: uuid.UUID, spec: Mapping[str, Any]) -> int:
    """Prompt every sequence without a text, a page at a time; the HTTP calls made."""
    settings = ctx.settings
    name = str(spec["llm"])
    prompt = PromptSpec(
        str(spec["document_type"]),
        tuple(spec.get("few_shot") or ()),
        spec.get("template") or DEFAULT_TEMPLATE,
    ).validate()
    max_calls = int(spec.get("max_llm_calls") or settings.llm_max_calls)
    used = 0
    with ctx.database.session() as session:
        batch = runner.pending_prompts(session, job_id, limit=PROMPT_BATCH)
    if not batch:  # nothing to prompt (a late redelivery): no LLM to start
        return used
    with (
        llm.endpoint(settings, name) as endpoint,
        attestation.recording(JobPromptLog(ctx.database, job_id)),
    ):
        while batch and used < max_calls:
            positions = [position for position, _ in batch]

            async def on_result(outcome: PromptOutcome, positions: list[int] = positions) -> None:
                nonlocal used
                used += outcome.attempts
                _count_calls(name, outcome)
                position = positions[outcome.index]
                if await asyncio.to_thread(_save_outcome, ctx, job_id, position, outcome):
                    raise JobCancelled

            costs = LLMCosts()
            try:
                prompting.run_prompts(
                    [keyphrases for _, keyphrases in batch],
                    endpoint=endpoint,
                    spec=prompt,
                    concurrency=llm.concurrency(settings, name),
                    max_calls=max_calls - used,
                    max_retries=settings.llm_max_retries,
                    backoff_base=settings.llm_backoff_base,
                    backoff_max=max(settings.llm_backoff_max, settings.llm_backoff_base),
                    on_result=on_result,
                    costs=costs,
                    ids=positions,
                )
            finally:  # what was spent on the LLM is recorded, whatever stopped the batch
                with ctx.database.transaction() as session:
                    runner.add_llm_costs(session, job_id, costs)
            with ctx.database.session() as session:
                batch = runner.pending_prompts(
                    session, job_id, after=positions[-1], limit=PROMPT_BATCH
                )
    return used


def _conclude(ctx: WorkerContext, job_id: uuid.UUID, total: int, calls: int) -> str:
    with ctx.database.session() as session:
        complete = not runner.missing_texts(session, job_id)
    try:
        scored = _score_holdout(ctx, job_id) if complete else None
    except LeaseLost:
        raise
    except Exception as exc:  # logged without its text, the job failed (as any stage)
        return _crashed(ctx, job_id, "holdout", exc)
    with ctx.database.transaction() as session:
        job = jobs_repo.get(session, job_id, for_update=True)
        if job is None or job.state != "running":
            return job.state if job is not None else "missing"
        missing = runner.missing_texts(session, job_id)
        if not missing:
            if scored is not None:
                runner.save_utility(session, job_id, scored)
            runner.finish(session, job_id)
        else:
            failed = sum(missing.values())
            codes = ", ".join(f"{code}: {n}" for code, n in sorted(missing.items()))
            runner.fail(
                session,
                job_id,
                "prompts_failed",
                f"{failed} of {total} prompts failed after retries ({codes}); the texts "
                f"generated are kept: POST /v1/jobs/{job_id}/retry prompts the rest",
            )
    if not missing:
        log.info("job.prompts.completed", job_id=str(job_id), sequences=total, llm_calls=calls)
        return _end("succeeded")
    log.warning(
        "job.prompts.failed", job_id=str(job_id), failed=sum(missing.values()), codes=missing
    )
    return _end("failed")
