"""Every table of the service, in one place (the schema is made by migrations only).

Private data lives in ``documents`` alone, AES-GCM encrypted (text and label together:
the label of a private row is private too). Everything else holds metadata, public
schema, DP outputs, or figures of the privacy ledger.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    Uuid,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, deferred, mapped_column

from app.ledger.amounts import DELTA_PLACES, EPSILON_PLACES, exact

# An autoincrementing 64-bit key on Postgres; SQLite wants INTEGER for its rowid alias.
BigId = BigInteger().with_variant(Integer(), "sqlite")

ORGANISATION_KINDS = ("platform", "owner", "client")
ROLES = ("owner", "client", "admin", "auditor")
USER_ROLES = ("admin", "auditor")
DATASET_STATES = ("uploading", "ready")  # chunks are appended until it is sealed
JOB_STATES = ("queued", "running", "succeeded", "failed", "cancelled")
LEDGER_KINDS = ("reserve", "commit", "release")


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes in and out, also on SQLite (which keeps no time zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime: give a time zone")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value


class FixedPoint(TypeDecorator[Decimal]):
    """An exact decimal stored as a 64-bit integer count of ``10**-places`` (a privacy
    amount: see :mod:`app.ledger.amounts`). A float is read through its shortest repr
    (0.1 is one tenth); a value finer than the unit is refused rather than rounded here
    (the ledger rounds, in the safe direction)."""

    impl = BigInteger
    cache_ok = True

    def __init__(self, places: int) -> None:
        super().__init__()
        self.places = places

    def process_bind_param(
        self, value: Decimal | int | float | None, dialect: Dialect
    ) -> int | None:
        if value is None:
            return None
        units = exact(value).scaleb(self.places)
        if units != units.to_integral_value():
            raise ValueError(f"{value} is finer than the stored unit 1e-{self.places}")
        return int(units)

    def process_result_value(self, value: int | None, dialect: Dialect) -> Decimal | None:
        return None if value is None else Decimal(value).scaleb(-self.places)


EpsilonAmount = FixedPoint(EPSILON_PLACES)
DeltaAmount = FixedPoint(DELTA_PLACES)


def _one_of(column: str, values: tuple[str, ...]) -> CheckConstraint:
    listed = ", ".join(f"'{v}'" for v in values)
    return CheckConstraint(f"{column} IN ({listed})", name=f"{column}_valid")


class Base(DeclarativeBase):
    metadata = MetaData(
        naming_convention={
            "ix": "ix_%(column_0_label)s",
            "uq": "uq_%(table_name)s_%(column_0_name)s",
            "ck": "ck_%(table_name)s_%(constraint_name)s",
            "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
            "pk": "pk_%(table_name)s",
        }
    )
    type_annotation_map = {  # noqa: RUF012
        datetime: UTCDateTime,
        dict[str, Any]: JSON,
        list[str]: JSON,
        list[Any]: JSON,
        uuid.UUID: Uuid,
    }


class Organisation(Base):
    __tablename__ = "organisations"
    __table_args__ = (
        _one_of("kind", ORGANISATION_KINDS),
        CheckConstraint("epsilon_budget >= 0", name="epsilon_budget_non_negative"),
        CheckConstraint("delta_budget >= 0", name="delta_budget_non_negative"),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    kind: Mapped[str] = mapped_column(String(16))
    # The privacy budget of an owner organisation, set by admins; its datasets' caps are
    # carved out of it (app.ledger.service). Zero for platform and client organisations.
    epsilon_budget: Mapped[Decimal] = mapped_column(EpsilonAmount, default=Decimal(0))
    delta_budget: Mapped[Decimal] = mapped_column(DeltaAmount, default=Decimal(0))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ApiKey(Base):
    """``ks_<prefix>_<secret>``: looked up by prefix, checked against a SHA-256 hash."""

    __tablename__ = "api_keys"
    __table_args__ = (_one_of("role", ROLES),)

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    prefix: Mapped[str] = mapped_column(String(16), unique=True)
    secret_hash: Mapped[str] = mapped_column(String(64))
    name: Mapped[str] = mapped_column(String(200), default="")
    role: Mapped[str] = mapped_column(String(16))
    organisation_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("organisations.id"), index=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_used_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]


class User(Base):
    """A person signing in to the admin dashboard (argon2 password hash)."""

    __tablename__ = "users"
    __table_args__ = (_one_of("role", USER_ROLES),)

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    username: Mapped[str] = mapped_column(String(100), unique=True)
    email: Mapped[str | None] = mapped_column(String(320))
    password_hash: Mapped[str] = mapped_column(String(255))
    role: Mapped[str] = mapped_column(String(16))
    organisation_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("organisations.id"))
    last_sign_in_at: Mapped[datetime | None]
    password_changed_at: Mapped[datetime] = mapped_column(default=utcnow)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    disabled_at: Mapped[datetime | None]


class AdminSession(Base):
    """A person signed in to the dashboard. The cookie holds a random token of which only
    the SHA-256 is stored; signing out ends the row, and the cookie is worthless from then
    on. ``csrf_token`` must come back with every form the session posts."""

    __tablename__ = "admin_sessions"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    csrf_token: Mapped[str] = mapped_column(String(64))
    user_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("users.id", ondelete="CASCADE"), index=True
    )
    address: Mapped[str] = mapped_column(String(64))  # the client address at sign-in
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_seen_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime]
    ended_at: Mapped[datetime | None]


class SignInFailure(Base):
    """A failed dashboard sign-in from a client address at a name (a keyed digest of the
    name typed, never the name): the throttles count these (in the database, so every
    API process sees them); old rows are pruned."""

    __tablename__ = "sign_in_failures"
    __table_args__ = (Index("ix_sign_in_failures_address_created_at", "address", "created_at"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    address: Mapped[str] = mapped_column(String(64))
    name_digest: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)


class Dataset(Base):
    __tablename__ = "datasets"
    __table_args__ = (
        CheckConstraint("epsilon_cap > 0", name="epsilon_cap_positive"),
        _one_of("format", ("csv", "jsonl")),
        _one_of("state", DATASET_STATES),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    organisation_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("organisations.id"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    format: Mapped[str] = mapped_column(String(8))
    text_columns: Mapped[list[str]]
    label_column: Mapped[str] = mapped_column(String(200))
    labels: Mapped[list[str]]  # declared by the uploader: public schema
    unit_column: Mapped[str | None] = mapped_column(String(200))  # privacy unit (a patient)
    # The cap (ε, δ), exact; carved out of the organisation's budget.
    epsilon_cap: Mapped[Decimal] = mapped_column(EpsilonAmount)
    delta_cap: Mapped[Decimal] = mapped_column(DeltaAmount, default=Decimal(0))
    documents: Mapped[int] = mapped_column(default=0)
    skipped_empty: Mapped[int] = mapped_column(default=0)
    skipped_duplicate: Mapped[int] = mapped_column(default=0)
    upload_bytes: Mapped[int] = mapped_column(BigInteger, default=0)  # committed offset
    # ``uploading`` while chunks are appended (no job may run), ``ready`` once sealed.
    state: Mapped[str] = mapped_column(String(16), default="ready", server_default="ready")
    # What the next chunk needs (an incomplete last row, the CSV header, row and line
    # numbers), sealed under the dataset's key; None once sealed (app.datasets.service).
    upload_tail: Mapped[bytes | None] = deferred(mapped_column(LargeBinary))
    created_by: Mapped[str] = mapped_column(String(80))  # actor reference
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    deleted_at: Mapped[datetime | None]


class Document(Base):
    """One private row: ``{"text", "label"}`` sealed with AES-256-GCM under its dataset's
    own key (``key_id`` names it; the key is in the keyring, never here: see
    :mod:`app.crypto`), destroyed when the dataset is deleted.

    The associated data binds the ciphertext to its dataset and row, so a ciphertext
    copied to another row or dataset does not decrypt.
    """

    __tablename__ = "documents"
    __table_args__ = (UniqueConstraint("dataset_id", "row"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    dataset_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("datasets.id", ondelete="CASCADE"))
    row: Mapped[int]  # 1-based data row of the upload
    key_id: Mapped[str] = mapped_column(String(16))
    nonce: Mapped[bytes] = mapped_column(LargeBinary(12))
    ciphertext: Mapped[bytes] = mapped_column(LargeBinary)
    unit: Mapped[bytes | None] = mapped_column(LargeBinary)  # sealed apart: nonce || ciphertext


class UploadDigest(Base):
    """A keyed digest of one stored document's (text, label, unit) while its dataset is
    uploading: a repeat in a later chunk is found here (app.datasets.upload)."""

    __tablename__ = "upload_digests"

    dataset_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("datasets.id", ondelete="CASCADE"), primary_key=True
    )
    digest: Mapped[bytes] = mapped_column(LargeBinary(16), primary_key=True)
    row: Mapped[int]


class Vocabulary(Base):
    """A public phrase list uploaded by an organisation (built-ins are not stored)."""

    __tablename__ = "vocabularies"
    __table_args__ = (UniqueConstraint("organisation_id", "fingerprint"),)

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    organisation_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("organisations.id"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    description: Mapped[str] = mapped_column(String(2000), default="")
    licence: Mapped[str] = mapped_column(String(500), default="")
    fingerprint: Mapped[str] = mapped_column(String(64))
    size: Mapped[int]
    phrases: Mapped[str] = deferred(mapped_column(Text))  # normalised, one a line
    created_by: Mapped[str] = mapped_column(String(80))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        _one_of("state", JOB_STATES),
        Index("ix_jobs_dataset_created", "dataset_id", "created_at"),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    dataset_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("datasets.id"))
    organisation_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("organisations.id"), index=True)
    submitted_by: Mapped[str] = mapped_column(String(80))  # actor reference
    spec: Mapped[dict[str, Any]]
    state: Mapped[str] = mapped_column(String(16), default="queued", index=True)
    stage: Mapped[str | None] = mapped_column(String(32))
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    # The running stage as "stage k of n" (public: workers.methods.progress), the share
    # done of a public-work stage (None in a stage that reads the private corpus), that
    # share when the stage last (re)started and when that was (never shown to others
    # than the owner: a private stage's start times the private work before it).
    stage_number: Mapped[int | None]
    stage_count: Mapped[int | None]
    stage_fraction: Mapped[float | None] = mapped_column(Float)
    stage_base: Mapped[float] = mapped_column(Float, default=0.0)
    stage_started_at: Mapped[datetime | None]
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    epsilon: Mapped[float] = mapped_column(Float)
    epsilon_by_mechanism: Mapped[dict[str, Any]]
    sequences_total: Mapped[int] = mapped_column(default=0)
    texts_done: Mapped[int] = mapped_column(default=0)
    texts_failed: Mapped[int] = mapped_column(default=0)
    llm_calls: Mapped[int] = mapped_column(default=0)
    # LLM work: calls, prompt_tokens, completion_tokens, wall_seconds (public: the LLM
    # sees public prompts and synthetic texts only); None until a stage adds to it.
    llm_costs: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    error_code: Mapped[str | None] = mapped_column(String(64))
    error_message: Mapped[str | None] = mapped_column(String(1000))  # never private text
    manifest: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # public, from the engine
    private_vocabulary: Mapped[list[str] | None] = deferred(mapped_column(JSON))  # DP output
    task_ids: Mapped[list[str]] = mapped_column(JSON, default=list)
    request_id: Mapped[str | None] = mapped_column(String(64))
    # The worker process running the job's current stage (a ``workers`` id), empty while
    # none does (app.jobs.recovery). Internal bookkeeping: never shown.
    worker_id: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class Worker(Base):
    """A worker process that ran a stage of a job: ``host:pid:start time``, alive until
    ``expires_at`` unless it renews it (app.jobs.recovery)."""

    __tablename__ = "workers"

    id: Mapped[str] = mapped_column(String(200), primary_key=True)
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime]


class JobCheckpoint(Base):
    """A DP output a method saved mid-run under a key (a noisy histogram, a population
    selected from it: ``workers.methods.checkpoints``), so a redelivered or recovered
    task resumes without drawing noise or spending again. Never a clean count, an
    embedding of a private document or a private text (the method's allow-list)."""

    __tablename__ = "job_checkpoints"

    job_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    key: Mapped[str] = mapped_column(String(128), primary_key=True)
    data: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


SHARD_STATES = ("pending", "running", "done")


class JobShardPlan(Base):
    """A sharded job's plan (:mod:`app.jobs.shards`): its shard count and its rounds
    (public), its secret shard key and its canary set, sealed with the dataset's key."""

    __tablename__ = "job_shard_plans"

    job_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    shards: Mapped[int]
    rounds: Mapped[list[str]] = mapped_column(JSON)
    sealed_key: Mapped[bytes] = mapped_column(LargeBinary)
    sealed_canaries: Mapped[bytes | None] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class JobShard(Base):
    """One shard of one round of a sharded job: who runs it, how often it was tried, and
    its RAW additive aggregate (a function of private rows), sealed with the dataset's
    key, never sent or logged; only the reduce reads it."""

    __tablename__ = "job_shards"
    __table_args__ = (_one_of("state", SHARD_STATES),)

    job_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    round: Mapped[str] = mapped_column(String(16), primary_key=True)
    shard: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    state: Mapped[str] = mapped_column(String(16), default="pending")
    attempts: Mapped[int] = mapped_column(default=0)
    worker_id: Mapped[str | None] = mapped_column(String(200))
    sealed: Mapped[bytes | None] = mapped_column(LargeBinary)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]


class JobShardRound(Base):
    """A sharded job's state after one round's DP release, sealed with the dataset's key."""

    __tablename__ = "job_shard_rounds"

    job_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    round: Mapped[str] = mapped_column(String(16), primary_key=True)
    sealed: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class PromptRecord(Base):
    """One prompt a job sent to an LLM, a link of its hash chain (workers.llm.attestation):
    ``record`` the hashed fields as canonical JSON, ``content`` the messages and inputs in
    clear (DP outputs and public inputs only), ``entry`` what names the request (a retry
    that sends it again adds no row). Rows are only ever added, in chain order."""

    __tablename__ = "prompt_log"
    __table_args__ = (UniqueConstraint("job_id", "entry"),)

    job_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    entry: Mapped[str] = mapped_column(String(64))
    hash: Mapped[str] = mapped_column(String(64))
    record: Mapped[str] = mapped_column(Text)
    content: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class KeyphraseSequence(Base):
    """A DP keyphrase sequence, persisted before prompting, and what the LLM made of it."""

    __tablename__ = "sequences"
    __table_args__ = (UniqueConstraint("job_id", "position"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    position: Mapped[int]
    label: Mapped[str] = mapped_column(String(200))
    keyphrases: Mapped[list[str]]
    text: Mapped[str | None] = mapped_column(Text)
    error: Mapped[str | None] = mapped_column(String(64))  # short code, e.g. "http_429"
    attempts: Mapped[int] = mapped_column(default=0)
    generated_at: Mapped[datetime | None]


class LedgerEntry(Base):
    """Append-only: database triggers refuse UPDATE and DELETE (see the migration)."""

    __tablename__ = "ledger_entries"
    __table_args__ = (
        _one_of("kind", LEDGER_KINDS),
        UniqueConstraint("job_id", "kind"),
        CheckConstraint("epsilon >= 0", name="epsilon_non_negative"),
        Index("ix_ledger_entries_dataset_id_id", "dataset_id", "id"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    dataset_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("datasets.id"))
    job_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("jobs.id"))
    kind: Mapped[str] = mapped_column(String(16))
    # The job's releases composed at the dataset's δ cap (δ = 0 when all are pure ε-DP),
    # exact, by ``accountant``.
    epsilon: Mapped[Decimal] = mapped_column(EpsilonAmount)
    delta: Mapped[Decimal] = mapped_column(DeltaAmount, default=Decimal(0))
    epsilon_by_mechanism: Mapped[dict[str, Any]]
    # Every release the entry stands for, as planned (app.ledger.events).
    events: Mapped[list[Any]] = mapped_column(JSON, default=list)
    accountant: Mapped[str] = mapped_column(String(200))
    actor: Mapped[str] = mapped_column(String(80))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class LedgerReport(Base):
    """The releases a job's engine reports it made, as it recorded them (one per job,
    once the mechanisms have run). Append-only like the ledger, and beside it: a report
    moves no budget, it lets an auditor reconcile the job's entries (app.ledger.events)."""

    __tablename__ = "ledger_reports"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    dataset_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("datasets.id"), index=True)
    job_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("jobs.id"), unique=True)
    # The realised releases composed like the job's entries (at their δ), exact.
    epsilon: Mapped[Decimal] = mapped_column(EpsilonAmount)
    delta: Mapped[Decimal] = mapped_column(DeltaAmount, default=Decimal(0))
    events: Mapped[list[Any]] = mapped_column(JSON)
    accountant: Mapped[str] = mapped_column(String(200))
    actor: Mapped[str] = mapped_column(String(80))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Release(Base):
    __tablename__ = "releases"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    job_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("jobs.id"), unique=True)
    dataset_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("datasets.id"))
    organisation_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("organisations.id"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    documents: Mapped[int]
    manifest: Mapped[dict[str, Any]]
    created_by: Mapped[str] = mapped_column(String(80))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ReleaseGrant(Base):
    __tablename__ = "release_grants"

    release_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("releases.id", ondelete="CASCADE"), primary_key=True
    )
    organisation_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("organisations.id"), primary_key=True, index=True
    )
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Download(Base):
    __tablename__ = "downloads"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    release_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("releases.id"), index=True)
    organisation_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("organisations.id"))
    actor: Mapped[str] = mapped_column(String(80))
    format: Mapped[str] = mapped_column(String(8))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class AuditEvent(Base):
    """Who did what to which object. ``details`` holds ids and figures, never text."""

    __tablename__ = "audit_events"
    __table_args__ = (
        Index("ix_audit_events_kind_id", "kind", "id"),
        Index("ix_audit_events_organisation_id_id", "organisation_id", "id"),
        Index("ix_audit_events_actor_organisation_id_id", "actor_organisation_id", "id"),
        Index("ix_audit_events_actor_id", "actor", "id"),
        Index("ix_audit_events_created_at", "created_at"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(64))
    actor: Mapped[str] = mapped_column(String(80))
    actor_organisation_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("organisations.id"))
    organisation_id: Mapped[uuid.UUID | None] = mapped_column(  # whose object it concerns
        ForeignKey("organisations.id")
    )
    target_type: Mapped[str | None] = mapped_column(String(32))
    target_id: Mapped[str | None] = mapped_column(String(64))
    details: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    request_id: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
