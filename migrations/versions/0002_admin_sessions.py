"""Admin dashboard: server-side sessions of signed-in people, failed sign-ins by address.

``admin_sessions`` holds the SHA-256 of each session cookie (never the cookie) and the
session's CSRF token; signing out sets ``ended_at``. ``sign_in_failures`` is what the
per-address rate limit of the sign-in form counts (the per-account limit uses
``users.failed_sign_ins`` and ``users.locked_until``).

Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from migrations.columns import ref, serial_id, text, timestamp, uuid_id

revision: str = "0002"
down_revision: str | None = "0001"


def upgrade() -> None:
    op.create_table(
        "admin_sessions",
        uuid_id(),
        text("token_hash", 64),
        text("csrf_token", 64),
        ref("user_id", "users", ondelete="CASCADE"),
        text("address", 64),
        timestamp("created_at"),
        timestamp("last_seen_at"),
        timestamp("expires_at"),
        timestamp("ended_at", nullable=True),
        sa.UniqueConstraint("token_hash"),
    )
    op.create_index("ix_admin_sessions_user_id", "admin_sessions", ["user_id"])
    op.create_table(
        "sign_in_failures",
        serial_id(),
        text("address", 64),
        timestamp("created_at"),
    )
    op.create_index(
        "ix_sign_in_failures_address_created_at", "sign_in_failures", ["address", "created_at"]
    )
    op.create_index("ix_sign_in_failures_created_at", "sign_in_failures", ["created_at"])


def downgrade() -> None:
    op.drop_table("sign_in_failures")  # its indexes go with it
    op.drop_table("admin_sessions")
