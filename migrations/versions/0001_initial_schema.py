"""Initial schema: identity, datasets, vocabularies, jobs, ledger, releases, audit.

Constraint names follow the naming convention of ``app.models.Base.metadata`` (which
env.py hands to Alembic). The ledger and the audit trail are append-only: triggers
refuse UPDATE and DELETE on ``ledger_entries`` and ``audit_events`` (Postgres and
SQLite alike).

Revision ID: 0001
Revises:
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from migrations.append_only import append_only

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
APPEND_ONLY = ("ledger_entries", "audit_events")


def _id() -> sa.Column[object]:
    return sa.Column("id", sa.Uuid(), primary_key=True)


def _serial() -> sa.Column[object]:
    return sa.Column("id", BIG_ID, primary_key=True, autoincrement=True)


def _time(name: str, *, nullable: bool = False) -> sa.Column[object]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def _text(name: str, length: int | None = None, *, nullable: bool = False) -> sa.Column[object]:
    kind = sa.String(length) if length else sa.Text()
    return sa.Column(name, kind, nullable=nullable)


def _int(name: str) -> sa.Column[object]:
    return sa.Column(name, sa.Integer(), nullable=False)


def _json(name: str, *, nullable: bool = False) -> sa.Column[object]:
    return sa.Column(name, sa.JSON(), nullable=nullable)


def _ref(
    name: str, table: str, *, nullable: bool = False, ondelete: str | None = None
) -> sa.Column[object]:
    return sa.Column(
        name, sa.Uuid(), sa.ForeignKey(f"{table}.id", ondelete=ondelete), nullable=nullable
    )


def _one_of(column: str, *values: str) -> sa.CheckConstraint:
    listed = ", ".join(f"'{v}'" for v in values)
    return sa.CheckConstraint(f"{column} IN ({listed})", name=f"{column}_valid")


def _index(table: str, *columns: str, name: str | None = None) -> None:
    op.create_index(name or f"ix_{table}_{columns[0]}", table, list(columns))


def upgrade() -> None:
    op.create_table(
        "organisations",
        _id(),
        _text("name", 200),
        _text("kind", 16),
        _time("created_at"),
        _one_of("kind", "platform", "owner", "client"),
        sa.UniqueConstraint("name"),
    )
    op.create_table(
        "api_keys",
        _id(),
        _text("prefix", 16),
        _text("secret_hash", 64),
        _text("name", 200),
        _text("role", 16),
        _ref("organisation_id", "organisations"),
        _time("created_at"),
        _time("last_used_at", nullable=True),
        _time("revoked_at", nullable=True),
        _one_of("role", "owner", "client", "admin", "auditor"),
        sa.UniqueConstraint("prefix"),
    )
    _index("api_keys", "organisation_id")
    op.create_table(
        "users",
        _id(),
        _text("username", 100),
        _text("email", 320, nullable=True),
        _text("password_hash", 255),
        _text("role", 16),
        _ref("organisation_id", "organisations"),
        _int("failed_sign_ins"),
        _time("locked_until", nullable=True),
        _time("last_sign_in_at", nullable=True),
        _time("password_changed_at"),
        _time("created_at"),
        _time("disabled_at", nullable=True),
        _one_of("role", "admin", "auditor"),
        sa.UniqueConstraint("username"),
    )
    op.create_table(
        "datasets",
        _id(),
        _ref("organisation_id", "organisations"),
        _text("name", 200),
        _text("format", 8),
        _json("text_columns"),
        _text("label_column", 200),
        _json("labels"),
        sa.Column("epsilon_cap", sa.Float(), nullable=False),
        sa.Column("delta_cap", sa.Float(), nullable=False),
        _int("documents"),
        _int("skipped_empty"),
        _int("skipped_duplicate"),
        sa.Column("upload_bytes", sa.BigInteger(), nullable=False),
        _text("created_by", 80),
        _time("created_at"),
        _time("deleted_at", nullable=True),
        _one_of("format", "csv", "jsonl"),
        sa.CheckConstraint("epsilon_cap > 0", name="epsilon_cap_positive"),
    )
    _index("datasets", "organisation_id")
    op.create_table(
        "documents",
        _serial(),
        _ref("dataset_id", "datasets", ondelete="CASCADE"),
        _int("row"),
        _text("key_id", 16),
        sa.Column("nonce", sa.LargeBinary(12), nullable=False),
        sa.Column("ciphertext", sa.LargeBinary(), nullable=False),
        sa.UniqueConstraint("dataset_id", "row"),
    )
    op.create_table(
        "vocabularies",
        _id(),
        _ref("organisation_id", "organisations"),
        _text("name", 200),
        _text("description", 2000),
        _text("licence", 500),
        _text("fingerprint", 64),
        _int("size"),
        _text("phrases", nullable=True),
        _text("created_by", 80),
        _time("created_at"),
        sa.UniqueConstraint("organisation_id", "fingerprint"),
    )
    _index("vocabularies", "organisation_id")
    op.create_table(
        "jobs",
        _id(),
        _ref("dataset_id", "datasets"),
        _ref("organisation_id", "organisations"),
        _text("submitted_by", 80),
        _json("spec"),
        _text("state", 16),
        _text("stage", 32, nullable=True),
        sa.Column("progress", sa.Float(), nullable=False),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("epsilon", sa.Float(), nullable=False),
        _json("epsilon_by_mechanism"),
        _int("sequences_total"),
        _int("texts_done"),
        _int("texts_failed"),
        _int("llm_calls"),
        _text("error_code", 64, nullable=True),
        _text("error_message", 1000, nullable=True),
        _json("manifest", nullable=True),
        _json("private_vocabulary", nullable=True),
        _json("task_ids"),
        _text("request_id", 64, nullable=True),
        _time("created_at"),
        _time("started_at", nullable=True),
        _time("finished_at", nullable=True),
        _time("updated_at"),
        _one_of("state", "queued", "running", "succeeded", "failed", "cancelled"),
    )
    _index("jobs", "dataset_id", "created_at", name="ix_jobs_dataset_created")
    _index("jobs", "organisation_id")
    _index("jobs", "state")
    op.create_table(
        "sequences",
        _serial(),
        _ref("job_id", "jobs", ondelete="CASCADE"),
        _int("position"),
        _text("label", 200),
        _json("keyphrases"),
        _text("text", nullable=True),
        _text("error", 64, nullable=True),
        _int("attempts"),
        _time("generated_at", nullable=True),
        sa.UniqueConstraint("job_id", "position"),
    )
    op.create_table(
        "ledger_entries",
        _serial(),
        _ref("dataset_id", "datasets"),
        _ref("job_id", "jobs"),
        _text("kind", 16),
        sa.Column("epsilon", sa.Float(), nullable=False),
        sa.Column("delta", sa.Float(), nullable=False),
        _json("epsilon_by_mechanism"),
        _text("accountant", 200),
        _text("actor", 80),
        _time("created_at"),
        _one_of("kind", "reserve", "commit", "release"),
        sa.CheckConstraint("epsilon >= 0", name="epsilon_non_negative"),
        sa.UniqueConstraint("job_id", "kind"),
    )
    _index("ledger_entries", "dataset_id", "id", name="ix_ledger_entries_dataset_id_id")
    op.create_table(
        "releases",
        _id(),
        _ref("job_id", "jobs"),
        _ref("dataset_id", "datasets"),
        _ref("organisation_id", "organisations"),
        _text("name", 200),
        _int("documents"),
        _json("manifest"),
        _text("created_by", 80),
        _time("created_at"),
        sa.UniqueConstraint("job_id"),
    )
    _index("releases", "organisation_id")
    op.create_table(
        "release_grants",
        _ref("release_id", "releases", ondelete="CASCADE"),
        _ref("organisation_id", "organisations"),
        _time("created_at"),
        sa.PrimaryKeyConstraint("release_id", "organisation_id"),
    )
    _index("release_grants", "organisation_id")
    op.create_table(
        "downloads",
        _serial(),
        _ref("release_id", "releases"),
        _ref("organisation_id", "organisations"),
        _text("actor", 80),
        _text("format", 8),
        _time("created_at"),
    )
    _index("downloads", "release_id")
    op.create_table(
        "audit_events",
        _serial(),
        _text("kind", 64),
        _text("actor", 80),
        _ref("actor_organisation_id", "organisations", nullable=True),
        _ref("organisation_id", "organisations", nullable=True),
        _text("target_type", 32, nullable=True),
        _text("target_id", 64, nullable=True),
        _json("details"),
        _text("request_id", 64, nullable=True),
        _time("created_at"),
    )
    _index("audit_events", "kind", "id", name="ix_audit_events_kind_id")
    _index("audit_events", "organisation_id", "id", name="ix_audit_events_organisation_id_id")
    _index(
        "audit_events",
        "actor_organisation_id",
        "id",
        name="ix_audit_events_actor_organisation_id_id",
    )
    _index("audit_events", "actor", "id", name="ix_audit_events_actor_id")
    _index("audit_events", "created_at", name="ix_audit_events_created_at")
    _append_only()


def _append_only() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            """
            CREATE FUNCTION keyseed_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                RAISE EXCEPTION '% is append-only', TG_TABLE_NAME
                    USING ERRCODE = 'restrict_violation';
            END $$
            """
        )
    for table in APPEND_ONLY:
        append_only(table)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for table in APPEND_ONLY:
            op.execute(f"DROP TRIGGER {table}_append_only ON {table}")
        op.execute("DROP FUNCTION keyseed_append_only()")
    for table in (
        "audit_events",
        "downloads",
        "release_grants",
        "releases",
        "ledger_entries",
        "sequences",
        "jobs",
        "vocabularies",
        "documents",
        "datasets",
        "users",
        "api_keys",
        "organisations",
    ):
        op.drop_table(table)  # indexes and SQLite triggers go with their table
