"""The prompt log: every prompt a job sent to an LLM, hash-chained (issue 66, item 4).

``prompt_log`` holds, per job, one row per prompt in chain order (``seq`` from 0): the
record's hashed fields as canonical JSON, its chain hash, the messages and inputs in
clear, and ``entry``, which names the request so that a retry sending the same prompt
again adds nothing (unique per job). It goes with its job. Existing jobs have no log.

Revision ID: 0010_prompt_log
Revises: 0009
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010_prompt_log"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "prompt_log",
        sa.Column(
            "job_id",
            sa.Uuid(),
            sa.ForeignKey("jobs.id", ondelete="CASCADE", name="fk_prompt_log_job_id_jobs"),
            nullable=False,
        ),
        sa.Column("seq", sa.Integer(), nullable=False, autoincrement=False),
        sa.Column("entry", sa.String(64), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Column("record", sa.Text(), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "seq", name="pk_prompt_log"),
        sa.UniqueConstraint("job_id", "entry", name="uq_prompt_log_job_id"),
    )


def downgrade() -> None:
    op.drop_table("prompt_log")
