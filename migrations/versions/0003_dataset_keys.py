"""Dataset keys, and sign-in throttling per name and address instead of account locks.

Documents were sealed with the master key (``KEYSEED_DATA_KEY``); from now on each
dataset's documents are sealed with a data key of its own, kept in the keyring
(``KEYSEED_KEYRING_DIR``) wrapped by the master key, and destroyed when the dataset is
deleted (:mod:`app.crypto`). The upgrade makes a key for every dataset that has
documents and seals them again with it; the downgrade seals them with the master key
again and destroys the keys. Both need the master key and the keyring when there are
documents (the settings, as the service reads them); with none, neither is read.

``sign_in_failures.name_digest`` (a keyed digest of the name typed) lets the throttle
count failures per name and address; ``users.failed_sign_ins`` and ``users.locked_until``
go, as no account is locked any more.

Create Date: 2026-11-24
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import sqlalchemy as sa
from alembic import op

from app.crypto import DocumentCipher, DocumentKey

revision: str = "0003"
down_revision: str | None = "0002"

BATCH = 500
documents = sa.table(
    "documents",
    sa.column("id", sa.BigInteger()),
    sa.column("dataset_id", sa.Uuid()),
    sa.column("row", sa.Integer()),
    sa.column("key_id", sa.String(16)),
    sa.column("nonce", sa.LargeBinary()),
    sa.column("ciphertext", sa.LargeBinary()),
)


def _cipher() -> DocumentCipher:
    from app.config import Settings

    return DocumentCipher.from_settings(Settings())


def _reseal(
    source: Callable[[DocumentCipher, uuid.UUID], DocumentKey],
    target: Callable[[DocumentCipher, uuid.UUID], DocumentKey],
) -> list[uuid.UUID]:
    """Open every document with ``source``'s key of its dataset and seal it again with
    ``target``'s (rows already sealed with the target key are left as they are, so an
    interrupted run can be run again); the datasets that had documents."""
    connection = op.get_bind()
    datasets = list(connection.scalars(sa.select(documents.c.dataset_id).distinct()))
    if not datasets:
        return []
    cipher = _cipher()
    for dataset_id in datasets:
        old, new = source(cipher, dataset_id), target(cipher, dataset_id)
        last = 0
        while True:
            rows = connection.execute(
                sa.select(documents)
                .where(documents.c.dataset_id == dataset_id, documents.c.id > last)
                .order_by(documents.c.id)
                .limit(BATCH)
            ).all()
            if not rows:
                break
            for row in rows:
                if row.key_id == new.key_id:
                    continue
                text, label = old.open(dataset_id, row.row, row.key_id, row.nonce, row.ciphertext)
                nonce, sealed = new.seal(dataset_id, row.row, text, label)
                connection.execute(
                    documents.update()
                    .where(documents.c.id == row.id)
                    .values(key_id=new.key_id, nonce=nonce, ciphertext=sealed)
                )
            last = rows[-1].id
    return datasets


def _dataset_key(cipher: DocumentCipher, dataset_id: uuid.UUID) -> DocumentKey:
    if cipher.has_key(dataset_id):
        return cipher.dataset_key(dataset_id)
    return cipher.create_key(dataset_id)


def _master_key(cipher: DocumentCipher, _: uuid.UUID) -> DocumentKey:
    return cipher.master


def upgrade() -> None:
    with op.batch_alter_table("sign_in_failures") as table:
        table.add_column(sa.Column("name_digest", sa.String(64), nullable=True))
    with op.batch_alter_table("users") as table:
        table.drop_column("failed_sign_ins")
        table.drop_column("locked_until")
    _reseal(_master_key, _dataset_key)


def downgrade() -> None:
    datasets = _reseal(_dataset_key, _master_key)
    if datasets:
        cipher = _cipher()
        for dataset_id in datasets:
            cipher.destroy_key(dataset_id)
    with op.batch_alter_table("users") as table:
        table.add_column(
            sa.Column("failed_sign_ins", sa.Integer(), nullable=False, server_default="0")
        )
        table.add_column(sa.Column("locked_until", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("users") as table:
        table.alter_column("failed_sign_ins", server_default=None)
    with op.batch_alter_table("sign_in_failures") as table:
        table.drop_column("name_digest")
