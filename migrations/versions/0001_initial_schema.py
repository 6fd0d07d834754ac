"""Initial schema: identity, datasets, vocabularies, jobs, ledger, releases, audit.

Constraint names follow the naming convention of ``app.models.Base.metadata`` (which
env.py hands to Alembic). The ledger and the audit trail are append-only: triggers
refuse UPDATE and DELETE on ``ledger_entries`` and ``audit_events`` (Postgres and
SQLite alike).

Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from migrations.append_only import append_only
from migrations.columns import (
    index,
    integer,
    json,
    one_of,
    ref,
    serial_id,
    text,
    timestamp,
    uuid_id,
)

revision: str = "0001"
down_revision: str | None = None

APPEND_ONLY = ("ledger_entries", "audit_events")


def upgrade() -> None:
    op.create_table(
        "organisations",
        uuid_id(),
        text("name", 200),
        text("kind", 16),
        timestamp("created_at"),
        one_of("kind", "platform", "owner", "client"),
        sa.UniqueConstraint("name"),
    )
    op.create_table(
        "api_keys",
        uuid_id(),
        text("prefix", 16),
        text("secret_hash", 64),
        text("name", 200),
        text("role", 16),
        ref("organisation_id", "organisations"),
        timestamp("created_at"),
        timestamp("last_used_at", nullable=True),
        timestamp("revoked_at", nullable=True),
        one_of("role", "owner", "client", "admin", "auditor"),
        sa.UniqueConstraint("prefix"),
    )
    index("api_keys", "organisation_id")
    op.create_table(
        "users",
        uuid_id(),
        text("username", 100),
        text("email", 320, nullable=True),
        text("password_hash", 255),
        text("role", 16),
        ref("organisation_id", "organisations"),
        integer("failed_sign_ins"),
        timestamp("locked_until", nullable=True),
        timestamp("last_sign_in_at", nullable=True),
        timestamp("password_changed_at"),
        timestamp("created_at"),
        timestamp("disabled_at", nullable=True),
        one_of("role", "admin", "auditor"),
        sa.UniqueConstraint("username"),
    )
    op.create_table(
        "datasets",
        uuid_id(),
        ref("organisation_id", "organisations"),
        text("name", 200),
        text("format", 8),
        json("text_columns"),
        text("label_column", 200),
        json("labels"),
        sa.Column("epsilon_cap", sa.Float(), nullable=False),
        sa.Column("delta_cap", sa.Float(), nullable=False),
        integer("documents"),
        integer("skipped_empty"),
        integer("skipped_duplicate"),
        sa.Column("upload_bytes", sa.BigInteger(), nullable=False),
        text("created_by", 80),
        timestamp("created_at"),
        timestamp("deleted_at", nullable=True),
        one_of("format", "csv", "jsonl"),
        sa.CheckConstraint("epsilon_cap > 0", name="epsilon_cap_positive"),
    )
    index("datasets", "organisation_id")
    op.create_table(
        "documents",
        serial_id(),
        ref("dataset_id", "datasets", ondelete="CASCADE"),
        integer("row"),
        text("key_id", 16),
        sa.Column("nonce", sa.LargeBinary(12), nullable=False),
        sa.Column("ciphertext", sa.LargeBinary(), nullable=False),
        sa.UniqueConstraint("dataset_id", "row"),
    )
    op.create_table(
        "vocabularies",
        uuid_id(),
        ref("organisation_id", "organisations"),
        text("name", 200),
        text("description", 2000),
        text("licence", 500),
        text("fingerprint", 64),
        integer("size"),
        text("phrases", nullable=True),
        text("created_by", 80),
        timestamp("created_at"),
        sa.UniqueConstraint("organisation_id", "fingerprint"),
    )
    index("vocabularies", "organisation_id")
    op.create_table(
        "jobs",
        uuid_id(),
        ref("dataset_id", "datasets"),
        ref("organisation_id", "organisations"),
        text("submitted_by", 80),
        json("spec"),
        text("state", 16),
        text("stage", 32, nullable=True),
        sa.Column("progress", sa.Float(), nullable=False),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("epsilon", sa.Float(), nullable=False),
        json("epsilon_by_mechanism"),
        integer("sequences_total"),
        integer("texts_done"),
        integer("texts_failed"),
        integer("llm_calls"),
        text("error_code", 64, nullable=True),
        text("error_message", 1000, nullable=True),
        json("manifest", nullable=True),
        json("private_vocabulary", nullable=True),
        json("task_ids"),
        text("request_id", 64, nullable=True),
        timestamp("created_at"),
        timestamp("started_at", nullable=True),
        timestamp("finished_at", nullable=True),
        timestamp("updated_at"),
        one_of("state", "queued", "running", "succeeded", "failed", "cancelled"),
    )
    index("jobs", "dataset_id", "created_at", name="ix_jobs_dataset_created")
    index("jobs", "organisation_id")
    index("jobs", "state")
    op.create_table(
        "sequences",
        serial_id(),
        ref("job_id", "jobs", ondelete="CASCADE"),
        integer("position"),
        text("label", 200),
        json("keyphrases"),
        text("text", nullable=True),
        text("error", 64, nullable=True),
        integer("attempts"),
        timestamp("generated_at", nullable=True),
        sa.UniqueConstraint("job_id", "position"),
    )
    op.create_table(
        "ledger_entries",
        serial_id(),
        ref("dataset_id", "datasets"),
        ref("job_id", "jobs"),
        text("kind", 16),
        sa.Column("epsilon", sa.Float(), nullable=False),
        sa.Column("delta", sa.Float(), nullable=False),
        json("epsilon_by_mechanism"),
        text("accountant", 200),
        text("actor", 80),
        timestamp("created_at"),
        one_of("kind", "reserve", "commit", "release"),
        sa.CheckConstraint("epsilon >= 0", name="epsilon_non_negative"),
        sa.UniqueConstraint("job_id", "kind"),
    )
    index("ledger_entries", "dataset_id", "id", name="ix_ledger_entries_dataset_id_id")
    op.create_table(
        "releases",
        uuid_id(),
        ref("job_id", "jobs"),
        ref("dataset_id", "datasets"),
        ref("organisation_id", "organisations"),
        text("name", 200),
        integer("documents"),
        json("manifest"),
        text("created_by", 80),
        timestamp("created_at"),
        sa.UniqueConstraint("job_id"),
    )
    index("releases", "organisation_id")
    op.create_table(
        "release_grants",
        ref("release_id", "releases", ondelete="CASCADE"),
        ref("organisation_id", "organisations"),
        timestamp("created_at"),
        sa.PrimaryKeyConstraint("release_id", "organisation_id"),
    )
    index("release_grants", "organisation_id")
    op.create_table(
        "downloads",
        serial_id(),
        ref("release_id", "releases"),
        ref("organisation_id", "organisations"),
        text("actor", 80),
        text("format", 8),
        timestamp("created_at"),
    )
    index("downloads", "release_id")
    op.create_table(
        "audit_events",
        serial_id(),
        text("kind", 64),
        text("actor", 80),
        ref("actor_organisation_id", "organisations", nullable=True),
        ref("organisation_id", "organisations", nullable=True),
        text("target_type", 32, nullable=True),
        text("target_id", 64, nullable=True),
        json("details"),
        text("request_id", 64, nullable=True),
        timestamp("created_at"),
    )
    index("audit_events", "kind", "id", name="ix_audit_events_kind_id")
    index("audit_events", "organisation_id", "id", name="ix_audit_events_organisation_id_id")
    index(
        "audit_events",
        "actor_organisation_id",
        "id",
        name="ix_audit_events_actor_organisation_id_id",
    )
    index("audit_events", "actor", "id", name="ix_audit_events_actor_id")
    index("audit_events", "created_at", name="ix_audit_events_created_at")
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
