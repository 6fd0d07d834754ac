"""Sharded DP-KPS jobs (issue 65): one job's private rows split across Celery workers by
privacy unit, the noise added once.

A job runs sharded when its method is DP-KPS, its configuration is one the engine can
shard (:func:`workers.methods.dpkps.shards.shardable`), the broker can run a chord
(Redis: :func:`app.worker.chords_available`) and it keeps no holdout (the holdout's slice
is drawn over the whole corpus: such a job runs whole). Its life:

1. the sequences task starts the job as any job (:func:`app.jobs.runner.start_sequences`
   commits its ε once, before any private read), then :func:`coordinate` makes the
   job's plan once: a secret shard key (32 random bytes: the keyed hash that puts every
   unit in one shard, and the run's sampling) and the audit's canary set, both sealed
   with the dataset's key (``job_shard_plans``);
2. for each of the engine's rounds (public: ``("sums",)`` or ``("counts", "sums")``), a
   chord: a group of :data:`~app.worker.MAP_SHARD` tasks, one per shard, then one
   :data:`~app.worker.REDUCE_ROUND`. A map task (:func:`map_shard`) streams the dataset,
   decrypts only the rows of its shard (:func:`app.jobs.runner.private_documents` with a
   filter: the corpus is never held in memory) and stores its RAW additive aggregate
   sealed with the dataset's key in ``job_shards``; the reduce (:func:`reduce_round`)
   adds the parts and draws the round's noise once (the engine's
   :meth:`~workers.methods.dpkps.shards.ShardedRun.reduce`), stores the state after the
   release sealed in ``job_shard_rounds`` and deletes the parts;
3. after the last round the reduce runs the post-processing
   (:meth:`~workers.methods.dpkps.shards.ShardedRun.finish`) and saves the sequences as
   the whole path does (:func:`app.jobs.stages.save_outcome`).

Messages carry ids only (job, round, shard); a chord's results are the map tasks'
status words. An aggregate or a key is never in a message, a result, a log or an error.

Who may write: the sequences task and the reduce hold the job (its lease,
:mod:`app.jobs.recovery`) and release it once a round's chord is sent, so a cancel ends
the job at once (:func:`app.jobs.service.stop`). A map task does not hold the job: it
claims its shard's row (``worker_id``: this process, alive by its heartbeat) and stores
its aggregate only if the row is still its own and the job still running, not asked to
stop, its spend committed. A map checks about every second whether the job was
cancelled or ended (its engine's ticks), and stops: a cancel is honoured within seconds.

Retries: tasks acknowledge late, so a map whose process was killed is delivered again
and takes its row over from the dead process (``attempts`` counts the tries); a map
whose aggregate is stored, or a reduce whose round is stored, does nothing again. A job
whose shard's process died (the whole worker, not just its pool process) is an orphan
for the sweeper (:func:`app.jobs.recovery.is_orphan`), which sends its sequences task
again: the spend is committed once (``restarted``), and :func:`coordinate` sends again
the chord of the round's unfinished shards. Nothing is ever charged twice.

What others see: the job's stage (k of n, its start and end only, as for any private
stage). The owner's job view lists each shard's state, attempts and end time
(:func:`app.jobs.service.shard_view`); no one else sees anything of the shards.
"""

from __future__ import annotations

import functools
import json
import secrets
import time
import uuid
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import structlog
from celery.exceptions import SoftTimeLimitExceeded
from sqlalchemy.orm import Session

from app.db import send_canvas_after_commit
from app.jobs import recovery, runner
from app.jobs import repository as jobs_repo
from app.jobs.schemas import AnySpec
from app.jobs.stages import (
    AccountingMismatch,
    StageTracker,
    WorkerContext,
    _canaries,
    _embedder,
    _held,
    _lost,
    _unit_column,
    _vocabulary,
    check_accounting,
    guarded,
    job_spec,
    save_outcome,
    with_audit,
)
from app.models import Dataset, Job, JobShardPlan, utcnow
from app.worker import MAP_SHARD, REDUCE_ROUND, chords_available
from workers.methods.progress import ROUND_STAGES, stage_number
from workers.methods.registry import METHODS
from workers.privacy.audit import CanarySet

if TYPE_CHECKING:
    from workers.methods.dpkps.shards import ShardedRun

log = structlog.get_logger("keyseed.jobs")

DPKPS = "dpkps"
KEY_BYTES = 32
CHECK_EVERY = 1.0  # seconds between a map's checks that its job may go on
# documents a map embeds at a time: the engine checks for a cancel before each batch, so
# a batch must take well under 5 s (256 short notes: ~0.3 s on one idle CPU core)
MAP_BATCH = 256


class ShardStopped(Exception):
    """The job was cancelled or ended, or another process took the shard over: the map
    stops and writes nothing."""


# ------------------------------------------------------------------ which jobs


def runs_sharded(ctx: WorkerContext, spec: AnySpec, params: Any, labels: Sequence[str]) -> bool:
    """Whether the job runs sharded (module docstring; public inputs only)."""
    if spec.method != DPKPS or getattr(spec, "holdout", None) is not None:
        return False
    if not chords_available(ctx.settings):
        return False
    from workers.methods.dpkps.shards import shardable

    config = params.generation_config(ctx.settings.device).for_classes(len(labels))
    return bool(shardable(config))


# ------------------------------------------------------------------ the plan


def _sealed_name(job_id: uuid.UUID, what: str) -> str:
    return f"job/{job_id}/{what}"


class JobShards:
    """A sharded job as its tasks read it: the plan, the engine's run, the canaries."""

    def __init__(
        self,
        ctx: WorkerContext,
        job_id: uuid.UUID,
        dataset_id: uuid.UUID,
        labels: list[str],
        spec: dict[str, Any],
        plan: JobShardPlan,
    ) -> None:
        self.ctx = ctx
        self.job_id = job_id
        self.dataset_id = dataset_id
        self.labels = labels
        self.stored_spec = spec
        self.spec = job_spec(spec)
        self.params: Any = self.spec.params()
        self.count = plan.shards
        self.rounds: tuple[str, ...] = tuple(plan.rounds)
        self._key = self.open(_sealed_name(job_id, "key"), plan.sealed_key)
        self.canaries = (
            None
            if plan.sealed_canaries is None
            else CanarySet.from_dict(
                json.loads(self.open(_sealed_name(job_id, "canaries"), plan.sealed_canaries))
            )
        )
        self.unit_name: str | None = None
        self._run: ShardedRun | None = None

    @classmethod
    def load(cls, ctx: WorkerContext, session: Session, job: Job) -> JobShards | None:
        plan = jobs_repo.shard_plan(session, job.id)
        dataset = session.get(Dataset, job.dataset_id)
        if plan is None or dataset is None:
            return None
        found = cls(ctx, job.id, job.dataset_id, list(dataset.labels), dict(job.spec), plan)
        found.unit_name = dataset.unit_column
        return found

    # sealing: with the dataset's key, bound to the job and to what it is
    def seal(self, name: str, data: bytes) -> bytes:
        return self.ctx.cipher.dataset_key(self.dataset_id).seal_blob(self.dataset_id, name, data)

    def open(self, name: str, sealed: bytes) -> bytes:
        return self.ctx.cipher.dataset_key(self.dataset_id).open_blob(self.dataset_id, name, sealed)

    def part_name(self, round_name: str, shard: int) -> str:
        return _sealed_name(self.job_id, f"{round_name}/{shard}")

    def round_name(self, round_name: str) -> str:
        return _sealed_name(self.job_id, f"{round_name}/state")

    @property
    def run(self) -> ShardedRun:
        """The engine's sharded run of the job, built from the same pieces as the whole
        run (:func:`app.jobs.stages._sequences`): its configuration, vocabulary, embedder
        and cache, the plan the ledger reserved, the shard key."""
        if self._run is None:
            self._run = build_run(
                self.ctx, self.params, self.stored_spec, self.labels, self._key, self.unit_name
            )
        return self._run

    def shard_of(self, unit: str | None, row: int) -> int:
        from workers.methods.dpkps.shards import shard_of

        return int(shard_of(unit, row, key=self._key, shards=self.count))

    def canary_rows(self, shard: int) -> Iterator[tuple[str, str, str | None]]:
        """The audit's canaries whose coin came up heads and that fall in ``shard``
        (public documents, each its own unit; the whole path appends them to the corpus
        the same way, :func:`app.jobs.stages.with_canaries`)."""
        if self.canaries is None:
            return
        for i, canary in enumerate(self.canaries.included_canaries):
            unit = f"canary-{self.canaries.seed}-{i}"
            if self.shard_of(unit, 0) == shard:
                yield canary.text, canary.label, unit if self.unit_name is not None else None

    def rows(self, session: Session, shard: int) -> Iterator[tuple[str, str, str | None]]:
        """PRIVATE ROWS: the documents of ``shard``, streamed (decrypted one at a time,
        the others skipped before their text is decrypted), then its canaries."""
        yield from runner.private_documents(
            session,
            self.ctx.cipher,
            self.job_id,
            keep=lambda row, unit: self.shard_of(unit, row) == shard,
        )
        yield from self.canary_rows(shard)


def build_run(
    ctx: WorkerContext,
    params: Any,
    spec: dict[str, Any],
    labels: list[str],
    key: bytes,
    unit_name: str | None,
) -> ShardedRun:
    from workers.methods.dpkps.run import plan_of
    from workers.methods.dpkps.shards import ShardedRun
    from workers.text.embeddings import EmbeddingCache

    settings = ctx.settings
    vocabulary = _vocabulary(ctx, spec)
    return ShardedRun(
        config=params.generation_config(settings.device),
        label_set=labels,
        vocabulary=vocabulary,
        embedder=_embedder(settings.embedding_model, settings.device),
        cache=EmbeddingCache(settings.embedding_cache_dir),
        planned=plan_of(params, labels, len(vocabulary)),
        key=key,
        unit_name=unit_name,
        device=settings.device,
        batch=MAP_BATCH,
    )


# ------------------------------------------------------------------ the coordinator


def coordinate(ctx: WorkerContext, started: runner.StartedJob, tracker: StageTracker) -> str:
    """The sequences task of a sharded job (it holds the job, its spend committed): the
    plan made once (key and canaries drawn before any private read), then the job goes
    on from what is stored (:func:`_advance`): the first round's chord is sent, or, for
    a restarted job, the chord of the current round's unfinished shards, or its reduce."""
    job_id = started.job_id
    with ctx.database.session() as session:
        planned = jobs_repo.shard_plan(session, job_id) is not None
    if not planned:
        spec = job_spec(started.spec)
        params: Any = spec.params()
        vocabulary = _vocabulary(ctx, started.spec)
        canaries = _canaries(METHODS[spec.method], params, spec, vocabulary, started)
        key = secrets.token_bytes(KEY_BYTES)
        unit_name = _unit_column(ctx, started)
        rounds = tuple(build_run(ctx, params, started.spec, started.labels, key, unit_name).rounds)
        dataset_key = ctx.cipher.dataset_key(started.dataset_id)
        plan = JobShardPlan(
            job_id=job_id,
            shards=ctx.settings.job_shards,
            rounds=list(rounds),
            sealed_key=dataset_key.seal_blob(started.dataset_id, _sealed_name(job_id, "key"), key),
            sealed_canaries=None
            if canaries is None
            else dataset_key.seal_blob(
                started.dataset_id,
                _sealed_name(job_id, "canaries"),
                json.dumps(canaries.to_dict()).encode("utf-8"),
            ),
        )
        with ctx.database.transaction() as session:
            runner.held_job(session, job_id)  # its row lock: one plan per job
            jobs_repo.add_shard_plan(session, plan)
        log.info("job.shards.planned", job_id=str(job_id), shards=plan.shards, rounds=rounds)
    return _advance(ctx, job_id, tracker, resend=True)


def _advance(ctx: WorkerContext, job_id: uuid.UUID, tracker: StageTracker, *, resend: bool) -> str:
    """Take the held job on from what is stored: reduce every round whose shards are all
    stored, send the chord of the first round that has unfinished shards (``resend``: the
    sequences task, after a restart; the reduce of a chord waits instead, since the shard
    that is not stored yet belongs to a chord that will reduce it), and once every round
    is reduced, finish the run and save its releases. Returns what became of the job."""
    with ctx.database.transaction() as session:
        job = runner.held_job(session, job_id)
        shards = JobShards.load(ctx, session, job)
    if shards is None:
        raise LookupError("a sharded job without its plan")
    state: bytes | None = None
    for round_name in shards.rounds:
        with ctx.database.transaction() as session:
            runner.held_job(session, job_id)
            reduced = jobs_repo.shard_round(session, job_id, round_name)
            if reduced is not None:
                state = shards.open(shards.round_name(round_name), reduced.sealed)
                continue
            rows = jobs_repo.shards_of_round(session, job_id, round_name)
            if not rows:
                jobs_repo.add_shards(session, job_id, round_name, shards.count)
                _send_round(ctx, session, job_id, round_name, list(range(shards.count)))
                return "mapping"
            unfinished = [row.shard for row in rows if row.state != "done"]
            if unfinished:
                if resend:
                    _send_round(ctx, session, job_id, round_name, unfinished)
                    return "mapping"
                _release(session, job_id)
                return "waiting"
            parts = [
                shards.open(shards.part_name(round_name, r.shard), r.sealed or b"") for r in rows
            ]
        # the round's release: the noise is drawn here, once
        state = shards.run.reduce(round_name, parts, state)
        del parts
        with ctx.database.transaction() as session:
            runner.held_job(session, job_id)
            jobs_repo.add_shard_round(
                session, job_id, round_name, shards.seal(shards.round_name(round_name), state)
            )
            for row in jobs_repo.shards_of_round(session, job_id, round_name):
                row.sealed = None  # the raw parts are not kept once released
        tracker(ROUND_STAGES.get(round_name, "dp_kde"), 1.0)
        log.info("job.shards.reduced", job_id=str(job_id), round=round_name)
    assert state is not None
    return _finish(ctx, job_id, shards, state, tracker)


def _send_round(
    ctx: WorkerContext, session: Session, job_id: uuid.UUID, round_name: str, shards: list[int]
) -> None:
    """Once ``session`` commits, the round's chord: a map per shard of ``shards``, then
    the reduce; the job is released (its maps do not hold it) and shows the round's
    stage."""
    stage = ROUND_STAGES.get(round_name, "dp_kde")
    runner.report_progress(session, job_id, stage, 0.0)
    _release(session, job_id)
    send_canvas_after_commit(
        session,
        MAP_SHARD,
        functools.partial(round_chord, job_id=job_id, round_name=round_name, shards=shards),
        job_id=str(job_id),
        round=round_name,
        shards=len(shards),
    )


def round_chord(celery: Any, *, job_id: uuid.UUID, round_name: str, shards: Sequence[int]) -> Any:
    """The chord of one round: its arguments are the job's id, the round's name and the
    shard's number, nothing else."""
    from celery import chord, group

    maps = group(
        celery.signature(MAP_SHARD, args=(str(job_id), round_name, shard), immutable=True)
        for shard in shards
    )
    reduce = celery.signature(REDUCE_ROUND, args=(str(job_id), round_name), immutable=True)
    return chord(maps, reduce)


def _release(session: Session, job_id: uuid.UUID) -> None:
    job = runner.held_job(session, job_id)
    recovery.release(job)


def _finish(
    ctx: WorkerContext, job_id: uuid.UUID, shards: JobShards, state: bytes, tracker: StageTracker
) -> str:
    """After the last release: the engine's post-processing (DP outputs only), then the
    releases saved as the whole path saves them."""
    spec, params = shards.spec, shards.params
    method = METHODS[spec.method]
    with ctx.database.transaction() as session:
        job = runner.held_job(session, job_id)
        reserved = {name: float(value) for name, value in job.epsilon_by_mechanism.items()}
    result = shards.run.finish(state, progress=tracker)
    outcome = method.outcome(result, params, shards.labels, shards.unit_name)
    del result
    if not outcome.as_planned:
        raise AccountingMismatch("the run's releases are not the ones its reservation holds")
    check_accounting(outcome.epsilon_by_mechanism, reserved)
    done = outcome.texts is not None or spec.llm == "none"
    manifest = with_audit(outcome.manifest, shards.canaries)
    manifest["shards"] = shards.count  # configuration: public
    return save_outcome(ctx, job_id, spec, outcome, manifest, done=done)


# ------------------------------------------------------------------ the reduce task


def reduce_round(ctx: WorkerContext, job_id: uuid.UUID, round_name: str) -> str:
    """The chord's body: the job held again, the round reduced if all its shards are
    stored (else a later reduce does it), the next round sent or the run finished. A
    delivery whose round is reduced already takes the job on from there (nothing is
    drawn again). Returns what became of the job."""
    with ctx.database.transaction() as session:
        job = jobs_repo.get(session, job_id, for_update=True)
        if job is None:
            return "missing"
        if job.state != "running" or job.sequences_total > 0:
            log.info("job.shards.reduce_skipped", job_id=str(job_id), round=round_name)
            return "skipped"
        try:
            runner.claim(session, job_id, ctx.settings.job_lease_seconds)
        except recovery.LeaseLost:
            return _held(job_id, "shards")
        cancelled = runner.cancel_requested(session, job_id)
        spec = dict(job.spec)
    if cancelled:
        log.info("job.cancelled", job_id=str(job_id), stage="shards")
        return "cancelled"
    tracker = StageTracker(ctx, job_id, runner.stages_of(spec))
    tracker.number = stage_number(tracker.stages, ROUND_STAGES.get(round_name, "dp_kde"))
    return guarded(ctx, job_id, tracker, lambda: _advance(ctx, job_id, tracker, resend=False))


# ------------------------------------------------------------------ the map task


def _claim_shard(ctx: WorkerContext, job_id: uuid.UUID, round_name: str, shard: int) -> str | None:
    """Claim the shard's row for this process; None when claimed, else why not."""
    with ctx.database.transaction() as session:
        job = jobs_repo.get(session, job_id)
        row = jobs_repo.get_shard(session, job_id, round_name, shard, for_update=True)
        if job is None or row is None:
            return "missing"
        stop = runner.shard_stop_reason(session, job)
        if stop is not None:
            return stop
        if row.state == "done":
            return "done"
        me = recovery.this_process()
        if row.worker_id not in (None, me) and recovery.alive(session, row.worker_id):
            return "held"
        jobs_repo.renew_worker(session, me, utcnow() + _lease(ctx))
        row.state, row.worker_id = "running", me
        row.attempts += 1
        row.started_at = utcnow()
    return None


def _lease(ctx: WorkerContext) -> timedelta:
    return timedelta(seconds=ctx.settings.job_lease_seconds)


class _Ticker:
    """The map's engine tick: about every second, whether the job may go on (running,
    not asked to stop, the shard still this process's); raises :class:`ShardStopped`."""

    def __init__(self, ctx: WorkerContext, job_id: uuid.UUID, round_name: str, shard: int) -> None:
        self.ctx, self.job_id, self.round_name, self.shard = ctx, job_id, round_name, shard
        self.last = time.monotonic()

    def __call__(self) -> None:
        if time.monotonic() - self.last >= CHECK_EVERY:
            self.check()

    def check(self) -> None:
        with self.ctx.database.transaction() as session:
            reason = _may_go_on(session, self.job_id, self.round_name, self.shard)
        self.last = time.monotonic()
        if reason is not None:
            raise ShardStopped(reason)


def _may_go_on(session: Session, job_id: uuid.UUID, round_name: str, shard: int) -> str | None:
    job = jobs_repo.get(session, job_id)
    if job is None:
        return "missing"
    stop = runner.shard_stop_reason(session, job)
    if stop is not None:
        return stop
    row = jobs_repo.get_shard(session, job_id, round_name, shard)
    if row is None or row.worker_id != recovery.this_process():
        return "lost"
    return None


def map_shard(ctx: WorkerContext, job_id: uuid.UUID, round_name: str, shard: int) -> str:
    """One shard of one round: its PRIVATE ROWS streamed through the engine's map, the
    raw aggregate sealed and stored. Returns a status word (the chord's result): never
    anything of the aggregate."""
    bound = {"job_id": str(job_id), "round": round_name, "shard": shard}
    refused = _claim_shard(ctx, job_id, round_name, shard)
    if refused is not None:
        log.info("job.shard.skipped", reason=refused, **bound)
        return refused
    ticker = _Ticker(ctx, job_id, round_name, shard)
    try:
        with ctx.database.session() as session:
            job = jobs_repo.get(session, job_id)
            assert job is not None
            shards = JobShards.load(ctx, session, job)
            if shards is None:
                raise LookupError("a sharded job without its plan")
            index = shards.rounds.index(round_name)
            previous = None
            if index > 0:
                stored = jobs_repo.shard_round(session, job_id, shards.rounds[index - 1])
                if stored is None:
                    raise LookupError("a round mapped before the previous one was reduced")
                previous = shards.open(shards.round_name(shards.rounds[index - 1]), stored.sealed)
        run = shards.run  # loads the models: a cancel meanwhile is seen just after
        ticker.check()
        with ctx.database.session() as session:
            aggregate = run.map(round_name, shards.rows(session, shard), previous, tick=ticker)
        sealed = shards.seal(shards.part_name(round_name, shard), aggregate)
        del aggregate
        with ctx.database.transaction() as session:
            reason = _may_go_on(session, job_id, round_name, shard)
            row = jobs_repo.get_shard(session, job_id, round_name, shard, for_update=True)
            if reason is not None or row is None:
                raise ShardStopped(reason or "missing")
            row.sealed, row.state, row.worker_id = sealed, "done", None
            row.finished_at = utcnow()
    except ShardStopped as stopped:
        _unclaim(ctx, job_id, round_name, shard)
        log.info("job.shard.stopped", reason=str(stopped), **bound)
        return str(stopped)
    except Exception as exc:
        return _shard_failed(ctx, job_id, exc, bound)
    log.info("job.shard.stored", **bound)
    return "stored"


def _unclaim(ctx: WorkerContext, job_id: uuid.UUID, round_name: str, shard: int) -> None:
    """The shard's row back to pending, if this process still claims it (it stopped)."""
    with ctx.database.transaction() as session:
        row = jobs_repo.get_shard(session, job_id, round_name, shard, for_update=True)
        if row is not None and row.worker_id == recovery.this_process():
            row.state, row.worker_id = "pending", None


def _shard_failed(
    ctx: WorkerContext, job_id: uuid.UUID, exc: Exception, bound: dict[str, Any]
) -> str:
    """A map that failed fails its job (logged by the exception's type and frames, never
    its text); its spend stays committed."""
    import traceback

    from app.jobs.stages import _error_code
    from workers.errors import KeyseedError

    if isinstance(exc, SoftTimeLimitExceeded):
        code, message = (
            "time_limit",
            (f"the job ran longer than its time limit ({ctx.settings.job_soft_time_limit} s)"),
        )
    elif isinstance(exc, KeyseedError):
        code, message = _error_code(exc), exc.message
    else:
        log.error(
            "job.shard.crashed",
            error=type(exc).__name__,
            frames=traceback.format_tb(exc.__traceback__)[-8:],
            **bound,
        )
        code = "internal_error"
        message = (
            "a shard of the job stopped on an unexpected error; the worker log has the details"
        )
    try:
        with ctx.database.transaction() as session:
            runner.fail(session, job_id, code, message)
    except recovery.LeaseLost:
        return _lost(job_id, "shards")
    log.warning("job.failed", job_id=str(job_id), code=code)
    return "failed"


__all__ = [
    "ShardStopped",
    "coordinate",
    "map_shard",
    "reduce_round",
    "round_chord",
    "runs_sharded",
]
