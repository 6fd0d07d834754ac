"""Documents at rest: AES-256-GCM under a key of their own dataset, bound to dataset and row.

Every dataset has a data key (32 random bytes) of its own. Its documents are sealed
with it: the plaintext is ``{"t": text, "l": label}`` as compact JSON, the associated
data names the dataset and the row (a ciphertext moved elsewhere does not open), and
``key_id`` (a digest of the key, not the key) says which key sealed a row. A row's unit
(a patient id, when the upload names a unit column) is sealed apart under the same key,
its own nonce and associated data, as ``nonce || ciphertext``.

The data keys are not in the database. Each lives in the keyring, a directory
(``KEYSEED_KEYRING_DIR``), as one file wrapped (AES-256-GCM) by the master key
(``KEYSEED_DATA_KEY``). Deleting a dataset destroys its key file (overwritten, then
removed): from then on no copy of its documents anywhere (the SQLite WAL and free
pages, Postgres' dead rows and WAL, any database backup) can be opened, by anyone,
with the master key or without. A copy of the keyring taken before the deletion still
opens them: keep keyring backups apart from database backups, and short-lived.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from app.storage import sync_directory

if TYPE_CHECKING:
    from app.config import Settings

_WRAP_AAD = b"keyseed/dataset-key/v1|"


class DecryptionError(Exception):
    """A document does not open with its dataset's key (message names ids only)."""


class KeyDestroyed(DecryptionError):
    """The dataset's key is not in the keyring: the dataset was deleted (or the keyring
    is not the one its key was written to)."""


def key_id(key: bytes) -> str:
    return hashlib.sha256(b"keyseed/key-id/v1|" + key).hexdigest()[:16]


class DocumentKey:
    """One AES-256 key sealing documents: a dataset's data key (or, for documents sealed
    before dataset keys existed, the master key itself)."""

    def __init__(self, key: bytes) -> None:
        if len(key) != 32:
            raise ValueError("a document key must be 32 bytes")
        self._aead = AESGCM(key)
        self.key_id = key_id(key)

    @staticmethod
    def _aad(dataset_id: uuid.UUID, row: int, what: bytes = b"document") -> bytes:
        return b"keyseed/" + what + b"/v1|" + dataset_id.bytes + row.to_bytes(8, "big")

    def seal_unit(self, dataset_id: uuid.UUID, row: int, unit: str) -> bytes:
        """``nonce || ciphertext`` of one row's unit."""
        nonce = os.urandom(12)
        aad = self._aad(dataset_id, row, b"unit")
        return nonce + self._aead.encrypt(nonce, unit.encode("utf-8"), aad)

    def open_unit(self, dataset_id: uuid.UUID, row: int, key_id: str, sealed: bytes) -> str:
        """The unit of one row (sealed with the row's key, ``key_id``)."""
        if key_id != self.key_id:
            raise DecryptionError(
                f"the unit of row {row} of dataset {dataset_id} was sealed with key {key_id}, "
                f"not with key {self.key_id}"
            )
        try:
            aad = self._aad(dataset_id, row, b"unit")
            return self._aead.decrypt(sealed[:12], sealed[12:], aad).decode("utf-8")
        except InvalidTag:
            raise DecryptionError(
                f"the unit of row {row} of dataset {dataset_id} fails authentication"
            ) from None

    def seal_blob(self, dataset_id: uuid.UUID, name: str, data: bytes) -> bytes:
        """``nonce || ciphertext`` of ``data`` the dataset's job keeps apart from its rows
        (a shard's raw aggregate, a sharded job's secret key), bound to the dataset and to
        ``name`` (which says what it is and whose: job, round, shard)."""
        nonce = os.urandom(12)
        aad = b"keyseed/blob/v1|" + dataset_id.bytes + name.encode("utf-8")
        return nonce + self._aead.encrypt(nonce, bytes(data), aad)

    def open_blob(self, dataset_id: uuid.UUID, name: str, sealed: bytes) -> bytes:
        """What :meth:`seal_blob` sealed under ``name``."""
        try:
            aad = b"keyseed/blob/v1|" + dataset_id.bytes + name.encode("utf-8")
            return self._aead.decrypt(sealed[:12], sealed[12:], aad)
        except InvalidTag:
            raise DecryptionError(
                f"sealed data {name!r} of dataset {dataset_id} fails authentication"
            ) from None

    def seal(self, dataset_id: uuid.UUID, row: int, text: str, label: str) -> tuple[bytes, bytes]:
        """``(nonce, ciphertext)`` of one document."""
        nonce = os.urandom(12)
        plaintext = json.dumps({"t": text, "l": label}, ensure_ascii=False, separators=(",", ":"))
        sealed = self._aead.encrypt(nonce, plaintext.encode("utf-8"), self._aad(dataset_id, row))
        return nonce, sealed

    def open(
        self, dataset_id: uuid.UUID, row: int, key_id: str, nonce: bytes, ciphertext: bytes
    ) -> tuple[str, str]:
        """``(text, label)`` of one document."""
        if key_id != self.key_id:
            raise DecryptionError(
                f"row {row} of dataset {dataset_id} was sealed with key {key_id}, "
                f"not with key {self.key_id}"
            )
        try:
            plaintext = self._aead.decrypt(nonce, ciphertext, self._aad(dataset_id, row))
        except InvalidTag:
            raise DecryptionError(
                f"row {row} of dataset {dataset_id} fails authentication"
            ) from None
        record = json.loads(plaintext)
        return record["t"], record["l"]


@dataclass(frozen=True)
class WrappedKey:
    """A data key as the keyring file holds it."""

    master_key_id: str
    nonce: bytes
    wrapped: bytes

    def dumps(self) -> bytes:
        return json.dumps(
            {
                "version": 1,
                "master_key_id": self.master_key_id,
                "nonce": base64.b64encode(self.nonce).decode(),
                "wrapped": base64.b64encode(self.wrapped).decode(),
            }
        ).encode()

    @classmethod
    def loads(cls, data: bytes) -> WrappedKey:
        record = json.loads(data)
        return cls(
            record["master_key_id"],
            base64.b64decode(record["nonce"]),
            base64.b64decode(record["wrapped"]),
        )


class DocumentCipher:
    """The master key and the keyring of dataset keys it wraps."""

    def __init__(self, master_key: bytes, keyring: Path) -> None:
        if len(master_key) != 32:
            raise ValueError("the document key must be 32 bytes")
        self._master = AESGCM(master_key)
        self.key_id = key_id(master_key)  # the master key's
        self.master = DocumentKey(master_key)  # documents sealed before dataset keys
        self.keyring = keyring
        self._digest_key = hashlib.sha256(b"keyseed/digest-key/v1|" + master_key).digest()

    @classmethod
    def from_settings(cls, settings: Settings) -> DocumentCipher:
        return cls(settings.document_key(), settings.keyring_path)

    def digest(self, purpose: str, value: str) -> str:
        """A keyed digest (HMAC-SHA-256) of ``value``: equal values match, and a stolen
        database alone cannot test guesses of them (a password typed as a name, say)."""
        message = purpose.encode() + b"|" + value.encode("utf-8", "surrogatepass")
        return hmac.new(self._digest_key, message, hashlib.sha256).hexdigest()

    def _path(self, dataset_id: uuid.UUID) -> Path:
        return self.keyring / f"{dataset_id}.key"

    def create_key(self, dataset_id: uuid.UUID) -> DocumentKey:
        """A new random data key for the dataset, written to the keyring (mode 0600,
        synced to disk before it is used)."""
        key = os.urandom(32)
        nonce = os.urandom(12)
        wrapped = self._master.encrypt(nonce, key, _WRAP_AAD + dataset_id.bytes)
        data = WrappedKey(self.key_id, nonce, wrapped).dumps()
        self.keyring.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self._path(dataset_id), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        sync_directory(self.keyring)
        return DocumentKey(key)

    def dataset_key(self, dataset_id: uuid.UUID) -> DocumentKey:
        """The dataset's data key, unwrapped from the keyring."""
        try:
            stored = WrappedKey.loads(self._path(dataset_id).read_bytes())
        except FileNotFoundError:
            raise KeyDestroyed(
                f"the key of dataset {dataset_id} is not in the keyring {self.keyring}"
            ) from None
        if stored.master_key_id != self.key_id:
            raise DecryptionError(
                f"the key of dataset {dataset_id} was wrapped by master key "
                f"{stored.master_key_id}, the configured one is {self.key_id}"
            )
        try:
            key = self._master.decrypt(stored.nonce, stored.wrapped, _WRAP_AAD + dataset_id.bytes)
        except InvalidTag:
            raise DecryptionError(f"the key of dataset {dataset_id} fails authentication") from None
        return DocumentKey(key)

    def has_key(self, dataset_id: uuid.UUID) -> bool:
        return self._path(dataset_id).exists()

    def destroy_key(self, dataset_id: uuid.UUID) -> bool:
        """Overwrite the dataset's key file, sync it, remove it; whether there was one."""
        path = self._path(dataset_id)
        try:
            fd = os.open(path, os.O_WRONLY)
        except FileNotFoundError:
            return False
        try:
            size = os.fstat(fd).st_size
            os.write(fd, os.urandom(size))
            os.fsync(fd)
        finally:
            os.close(fd)
        path.unlink()
        sync_directory(self.keyring)
        return True

    def open(
        self, dataset_id: uuid.UUID, row: int, key_id: str, nonce: bytes, ciphertext: bytes
    ) -> tuple[str, str]:
        """``(text, label)`` of one document, with its dataset's key (read from the
        keyring for this one document: to read many, use :meth:`dataset_key` once)."""
        return self.dataset_key(dataset_id).open(dataset_id, row, key_id, nonce, ciphertext)
