"""Where a method keeps the outputs of a run, so a crash resumes without spending again.

A method saves each DP output (a noisy histogram, the population selected from it) under
a key as soon as it exists and before anything derived from it leaves the process, and on
a re-run loads what is there instead of drawing noise again. What may be saved is the
method's business, and only DP outputs and what is computed from them and public inputs
qualify: never a clean count, an embedding of a private document or a private text.

:class:`Checkpoints` is the protocol (``load(key) -> bytes | None``, ``save(key, data)``);
:class:`MemoryCheckpoints` keeps a dict (tests, one-process runs) and
:class:`DirectoryCheckpoints` one file per key, written atomically (temporary file, fsync,
rename), so a reader sees a whole value or none. Keys are short names of letters, digits,
``.``, ``_`` and ``-``: they never become a path outside the folder.

>>> store = MemoryCheckpoints()
>>> store.load("counts") is None
True
>>> store.save("counts", b"[1, 2]")
>>> store.load("counts")
b'[1, 2]'
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Protocol, runtime_checkable

from workers.errors import ConfigError

_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def check_key(key: str) -> str:
    """A key is 1-128 characters of letters, digits, ``.``, ``_``, ``-`` (no leading dot)."""
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise ConfigError(
            "must be 1-128 letters, digits, '.', '_' or '-', not starting with '.'",
            field="checkpoint_key",
        )
    return key


@runtime_checkable
class Checkpoints(Protocol):
    """Bytes by key; ``load`` answers ``None`` for a key never saved."""

    def load(self, key: str) -> bytes | None: ...

    def save(self, key: str, data: bytes) -> None: ...


class MemoryCheckpoints:
    """Checkpoints in a dict (``items``), for tests and runs that need no crash safety."""

    def __init__(self) -> None:
        self.items: dict[str, bytes] = {}

    def load(self, key: str) -> bytes | None:
        return self.items.get(check_key(key))

    def save(self, key: str, data: bytes) -> None:
        self.items[check_key(key)] = bytes(data)


class DirectoryCheckpoints:
    """One file per key in ``root`` (created on first save), replaced atomically."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    def path(self, key: str) -> Path:
        return self.root / check_key(key)

    def load(self, key: str) -> bytes | None:
        try:
            return self.path(key).read_bytes()
        except FileNotFoundError:
            return None

    def save(self, key: str, data: bytes) -> None:
        target = self.path(key)
        self.root.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=self.root, prefix=".tmp-")
        try:
            with os.fdopen(handle, "wb") as file:
                file.write(data)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, target)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        directory = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(directory)  # the rename itself survives a power loss
        finally:
            os.close(directory)
