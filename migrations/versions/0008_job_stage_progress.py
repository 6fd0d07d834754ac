"""Jobs: the running stage as "stage k of n", its fraction and when it started.

``stage_number`` and ``stage_count`` place the running stage in the run's stages (a
function of the method and its public parameters, ``workers.methods.progress``);
``stage_fraction`` is the share done of a stage whose amount of work is public (null for
a stage that reads the private corpus); ``stage_base`` is that share when the stage last
(re)started, and ``stage_started_at`` when it did (a time estimate is the rate since).
Existing jobs have none recorded.

Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("stage_number", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("stage_count", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("stage_fraction", sa.Float(), nullable=True))
        batch.add_column(sa.Column("stage_base", sa.Float(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("stage_started_at", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("jobs") as batch:
        batch.alter_column("stage_base", server_default=None)


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        for name in ("stage_started_at", "stage_base", "stage_fraction", "stage_count"):
            batch.drop_column(name)
        batch.drop_column("stage_number")
