"""Sign-in throttling per name and address instead of account locks.

``sign_in_failures.name_digest`` (a keyed digest of the name typed) lets the throttle
count failures per name and address; ``users.failed_sign_ins`` and ``users.locked_until``
go, as no account is locked any more.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("sign_in_failures") as table:
        table.add_column(sa.Column("name_digest", sa.String(64), nullable=True))
    with op.batch_alter_table("users") as table:
        table.drop_column("failed_sign_ins")
        table.drop_column("locked_until")


def downgrade() -> None:
    with op.batch_alter_table("users") as table:
        table.add_column(
            sa.Column("failed_sign_ins", sa.Integer(), nullable=False, server_default="0")
        )
        table.add_column(sa.Column("locked_until", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("users") as table:
        table.alter_column("failed_sign_ins", server_default=None)
    with op.batch_alter_table("sign_in_failures") as table:
        table.drop_column("name_digest")
