"""Resumable uploads: a dataset is ``uploading`` (chunks are appended) until it is sealed
(``ready``: jobs may run, nothing more is appended).

``datasets.state`` says which (existing datasets are ``ready``); ``datasets.upload_bytes``
is then the committed byte offset of the file. ``datasets.upload_tail`` holds, sealed
under the dataset's key, what the next chunk needs (the bytes of an incomplete last
row, the CSV header, row and line numbers); it is emptied when the dataset is sealed.
``upload_digests`` holds a keyed digest (text, label, unit) of every document stored
while the dataset is uploading, so that a repeat is found across chunks without
holding the keys in memory; its rows go when the dataset is sealed or deleted.

Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from migrations.columns import integer, ref

revision: str = "0009"
down_revision: str | None = "0008"


def upgrade() -> None:
    with op.batch_alter_table("datasets") as batch:
        batch.add_column(sa.Column("state", sa.String(16), nullable=False, server_default="ready"))
        batch.add_column(sa.Column("upload_tail", sa.LargeBinary(), nullable=True))
        batch.create_check_constraint("state_valid", "state IN ('uploading', 'ready')")
    op.create_table(
        "upload_digests",
        ref("dataset_id", "datasets", ondelete="CASCADE"),
        sa.Column("digest", sa.LargeBinary(16), nullable=False),
        integer("row"),
        sa.PrimaryKeyConstraint("dataset_id", "digest"),
    )


def downgrade() -> None:
    op.drop_table("upload_digests")
    with op.batch_alter_table("datasets") as batch:
        batch.drop_constraint("state_valid", type_="check")
        batch.drop_column("upload_tail")
        batch.drop_column("state")
