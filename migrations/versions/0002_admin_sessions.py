"""Admin dashboard: server-side sessions of signed-in people, failed sign-ins by address.

``admin_sessions`` holds the SHA-256 of each session cookie (never the cookie) and the
session's CSRF token; signing out sets ``ended_at``. ``sign_in_failures`` is what the
per-address rate limit of the sign-in form counts (the per-account limit uses
``users.failed_sign_ins`` and ``users.locked_until``).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _time(name: str, *, nullable: bool = False) -> sa.Column[object]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "admin_sessions",
        sa.Column("id", sa.Uuid(), primary_key=True),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("csrf_token", sa.String(64), nullable=False),
        sa.Column(
            "user_id", sa.Uuid(), sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("address", sa.String(64), nullable=False),
        _time("created_at"),
        _time("last_seen_at"),
        _time("expires_at"),
        _time("ended_at", nullable=True),
        sa.UniqueConstraint("token_hash"),
    )
    op.create_index("ix_admin_sessions_user_id", "admin_sessions", ["user_id"])
    op.create_table(
        "sign_in_failures",
        sa.Column("id", BIG_ID, primary_key=True, autoincrement=True),
        sa.Column("address", sa.String(64), nullable=False),
        _time("created_at"),
    )
    op.create_index(
        "ix_sign_in_failures_address_created_at", "sign_in_failures", ["address", "created_at"]
    )
    op.create_index("ix_sign_in_failures_created_at", "sign_in_failures", ["created_at"])


def downgrade() -> None:
    op.drop_table("sign_in_failures")  # its indexes go with it
    op.drop_table("admin_sessions")
