"""Documents at rest: AES-256-GCM, bound to their dataset and row.

The plaintext is ``{"t": text, "l": label}`` as compact JSON. The associated data names
the dataset and the row, so a ciphertext moved to another place does not decrypt, and
``key_id`` (a digest of the key, not the key) says which key sealed a row. A row's unit
(a patient id, when the upload names a unit column) is sealed apart, under its own nonce
and associated data, as ``nonce || ciphertext``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import uuid

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM


class DecryptionError(Exception):
    """A document does not open with the configured key (message names ids only)."""


class DocumentCipher:
    def __init__(self, key: bytes) -> None:
        if len(key) != 32:
            raise ValueError("the document key must be 32 bytes")
        self._aead = AESGCM(key)
        self.key_id = hashlib.sha256(b"keyseed/key-id/v1|" + key).hexdigest()[:16]
        self._digest_key = hashlib.sha256(b"keyseed/digest-key/v1|" + key).digest()

    def digest(self, purpose: str, value: str) -> str:
        """A keyed digest (HMAC-SHA-256) of ``value``: equal values match, and a stolen
        database alone cannot test guesses of them (a password typed as a name, say)."""
        message = purpose.encode() + b"|" + value.encode("utf-8", "surrogatepass")
        return hmac.new(self._digest_key, message, hashlib.sha256).hexdigest()

    @staticmethod
    def _aad(dataset_id: uuid.UUID, row: int, what: bytes = b"document") -> bytes:
        return b"keyseed/" + what + b"/v1|" + dataset_id.bytes + row.to_bytes(8, "big")

    def _check_key(self, key_id: str, what: str) -> None:
        if key_id != self.key_id:
            raise DecryptionError(
                f"{what} was sealed with key {key_id}, the configured key is {self.key_id}"
            )

    def seal(self, dataset_id: uuid.UUID, row: int, text: str, label: str) -> tuple[bytes, bytes]:
        """``(nonce, ciphertext)`` of one document."""
        nonce = os.urandom(12)
        plaintext = json.dumps({"t": text, "l": label}, ensure_ascii=False, separators=(",", ":"))
        sealed = self._aead.encrypt(nonce, plaintext.encode("utf-8"), self._aad(dataset_id, row))
        return nonce, sealed

    def seal_unit(self, dataset_id: uuid.UUID, row: int, unit: str) -> bytes:
        """``nonce || ciphertext`` of one row's unit."""
        nonce = os.urandom(12)
        aad = self._aad(dataset_id, row, b"unit")
        return nonce + self._aead.encrypt(nonce, unit.encode("utf-8"), aad)

    def open_unit(self, dataset_id: uuid.UUID, row: int, key_id: str, sealed: bytes) -> str:
        """The unit of one row (sealed with the row's key, ``key_id``)."""
        self._check_key(key_id, f"the unit of row {row} of dataset {dataset_id}")
        aad = self._aad(dataset_id, row, b"unit")
        try:
            return self._aead.decrypt(sealed[:12], sealed[12:], aad).decode("utf-8")
        except InvalidTag:
            raise DecryptionError(
                f"the unit of row {row} of dataset {dataset_id} fails authentication"
            ) from None

    def open(
        self, dataset_id: uuid.UUID, row: int, key_id: str, nonce: bytes, ciphertext: bytes
    ) -> tuple[str, str]:
        """``(text, label)`` of one document."""
        self._check_key(key_id, f"row {row} of dataset {dataset_id}")
        try:
            plaintext = self._aead.decrypt(nonce, ciphertext, self._aad(dataset_id, row))
        except InvalidTag:
            raise DecryptionError(
                f"row {row} of dataset {dataset_id} fails authentication"
            ) from None
        record = json.loads(plaintext)
        return record["t"], record["l"]
