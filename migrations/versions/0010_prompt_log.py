"""The prompt log: every prompt a job sent to an LLM, hash-chained (issue 66, item 4).

``prompt_log`` holds, per job, one row per prompt in chain order (``seq`` from 0): the
record's hashed fields as canonical JSON, its chain hash, the messages and inputs in
clear, and ``entry``, which names the request so that a retry sending the same prompt
again adds nothing (unique per job). It goes with its job. Existing jobs have no log.

Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from migrations.columns import job_table, text, timestamp

revision: str = "0010_prompt_log"
down_revision: str | None = "0009"


def upgrade() -> None:
    job_table(
        "prompt_log",
        sa.Column("seq", sa.Integer(), nullable=False, autoincrement=False),
        text("entry", 64),
        text("hash", 64),
        text("record"),
        text("content"),
        timestamp("created_at"),
        sa.PrimaryKeyConstraint("job_id", "seq"),
        sa.UniqueConstraint("job_id", "entry"),
    )


def downgrade() -> None:
    op.drop_table("prompt_log")
