"""Privacy units: the unit column an upload names, and each document's (sealed) unit.

``datasets.unit_column`` is the column of the uploaded file that names a row's privacy
unit (a patient id, say), NULL when every row is its own unit. ``documents.unit`` is the
row's unit sealed with the document key (``nonce || ciphertext``), NULL without a unit
column. Both are nullable: existing datasets keep row-level privacy.

Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"


def upgrade() -> None:
    op.add_column("datasets", sa.Column("unit_column", sa.String(200), nullable=True))
    op.add_column("documents", sa.Column("unit", sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    # Plain ALTER TABLE … DROP COLUMN (SQLite 3.35+): no table is copied, nothing else moves.
    op.drop_column("documents", "unit")
    op.drop_column("datasets", "unit_column")
