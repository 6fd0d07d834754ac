"""Job leases: which worker process runs a job's stage, and whether that process lives.

``jobs.worker_id`` names the process running the job's current stage (host, process id
and process start time), empty while no process runs it. ``workers`` has a row per
worker process that ran a stage, with the time until which it counts as alive; the
process renews it while it runs. A queued or running job whose process is not alive is
sent to a worker again (``app.jobs.recovery``). Existing jobs are held by nobody.

Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from migrations.columns import timestamp

revision: str = "0006"
down_revision: str | None = "0005"


def upgrade() -> None:
    op.create_table(
        "workers",
        sa.Column("id", sa.String(200), primary_key=True),
        timestamp("started_at"),
        timestamp("expires_at"),
    )
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("worker_id", sa.String(200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("worker_id")
    op.drop_table("workers")
