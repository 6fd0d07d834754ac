"""Files the server keeps on disk (the keyring, rendered releases): what makes a write in
a directory durable."""

from __future__ import annotations

import os
from pathlib import Path


def sync_directory(directory: Path) -> None:
    """Sync the directory's entries to disk, so that a file created, renamed or removed in
    it stays so after a power loss."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
