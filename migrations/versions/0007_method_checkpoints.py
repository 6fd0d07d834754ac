"""Methods: checkpoints of a run's DP outputs, and the LLM costs of every job.

``job_checkpoints`` holds what a method saves under a key as a run goes (Aug-PE: its
noisy class counts, per iteration its noisy histograms and selection, every population),
so a redelivered or recovered task resumes without new noise or new spend; it goes with
its job. ``jobs.llm_costs`` records LLM calls, prompt and completion tokens and wall time
(existing jobs have none recorded). A job's method lives in its spec (absent: DP-KPS).

Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from migrations.columns import job_table, timestamp

revision: str = "0007"
down_revision: str | None = "0006"


def upgrade() -> None:
    job_table(
        "job_checkpoints",
        sa.Column("key", sa.String(128), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        timestamp("created_at"),
        sa.PrimaryKeyConstraint("job_id", "key"),
    )
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("llm_costs", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("llm_costs")
    op.drop_table("job_checkpoints")
