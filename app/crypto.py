"""Documents at rest: AES-256-GCM, bound to their dataset and row.

The plaintext is ``{"t": text, "l": label}`` as compact JSON. The associated data names
the dataset and the row, so a ciphertext moved to another place does not decrypt, and
``key_id`` (a digest of the key, not the key) says which key sealed a row.
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
    def _aad(dataset_id: uuid.UUID, row: int) -> bytes:
        return b"keyseed/document/v1|" + dataset_id.bytes + row.to_bytes(8, "big")

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
                f"the configured key is {self.key_id}"
            )
        try:
            plaintext = self._aead.decrypt(nonce, ciphertext, self._aad(dataset_id, row))
        except InvalidTag:
            raise DecryptionError(
                f"row {row} of dataset {dataset_id} fails authentication"
            ) from None
        record = json.loads(plaintext)
        return record["t"], record["l"]
