"""Sharded jobs (issue 65): a DP-KPS job's private rows split across map tasks.

``job_shard_plans`` holds, per sharded job, the number of shards, the public names of its
rounds, and its secret shard key (32 random bytes: the keyed hash that assigns units to
shards, and the run's sampling) and its canary set, both sealed with the dataset's key.
``job_shards`` holds one row per (round, shard): its state, attempts, the process that
claims it, and its raw additive aggregate sealed with the dataset's key (never sent in a
message, never logged). ``job_shard_rounds`` holds each round's state after its DP
release, sealed too. All go with their job; deleting the dataset destroys their key.

Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from migrations.columns import integer, job_table, json, one_of, text, timestamp

revision: str = "0011_job_shards"
down_revision: str | None = "0010_prompt_log"


def upgrade() -> None:
    job_table(
        "job_shard_plans",
        integer("shards"),
        json("rounds"),
        sa.Column("sealed_key", sa.LargeBinary(), nullable=False),
        sa.Column("sealed_canaries", sa.LargeBinary(), nullable=True),
        timestamp("created_at"),
        sa.PrimaryKeyConstraint("job_id"),
    )
    job_table(
        "job_shards",
        text("round", 16),
        integer("shard"),
        text("state", 16),
        integer("attempts"),
        text("worker_id", 200, nullable=True),
        sa.Column("sealed", sa.LargeBinary(), nullable=True),
        timestamp("started_at", nullable=True),
        timestamp("finished_at", nullable=True),
        sa.PrimaryKeyConstraint("job_id", "round", "shard"),
        one_of("state", "pending", "running", "done"),
    )
    job_table(
        "job_shard_rounds",
        text("round", 16),
        sa.Column("sealed", sa.LargeBinary(), nullable=False),
        timestamp("created_at"),
        sa.PrimaryKeyConstraint("job_id", "round"),
    )


def downgrade() -> None:
    op.drop_table("job_shard_rounds")
    op.drop_table("job_shards")
    op.drop_table("job_shard_plans")
