"""A release's corpus rendered once to a file per format and compression, then served
from disk.

Scheme: ``<data dir>/releases/<release id>/<sha256>.<format>[.gz|.zst]``. The
uncompressed files are rendered once the release's creation is answered
(:func:`render_formats`), a compressed one on its first download; whoever comes first
renders (:func:`rendered`), under a lock (a ``flock`` on a lock
file beside it, so concurrent first requests, in one process or several, render once),
written to a temporary file, fsynced and renamed into place; its name carries the
sha256 of its bytes, which is the download's strong ETag. A released corpus never
changes (the job succeeded, its sequences are final), so a file once rendered stands
until the release's files are removed (:func:`remove`, when its dataset is deleted: a
later download renders them again from the database, which keeps the release).

Compression is chosen by the ``compression`` query parameter (``none``, ``gzip``,
``zstd``), never by ``Accept-Encoding``: the compressed file is the representation
itself (``application/gzip`` or ``application/zstd``, a ``.gz``/``.zst`` file name, no
``Content-Encoding``), so the ETag and byte ranges speak of the bytes on disk and no
client decompresses behind its caller's back. gzip is written with no name and a zero
time, so the same corpus always gives the same bytes (and the same ETag). Parquet is
compressed inside (zstd column chunks), so it is served as it is.

At rest: a release is a DP output, and the database holds it in the clear (only the
uploaded documents are encrypted, :mod:`app.crypto`). The files follow the same rule:
in the clear, behind the data directory's boundary, the folder ``0700`` and each file
``0600`` (the API process's user alone, like the keyring).
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import hashlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import formatdate
from pathlib import Path
from typing import IO, Literal

import pyarrow as pa
import structlog
from starlette.datastructures import Headers
from starlette.responses import FileResponse, MalformedRangeHeader
from starlette.responses import RangeNotSatisfiable as Unsatisfiable

from app.db import Database
from app.errors import RangeNotSatisfiable
from app.logging import exception_fields
from app.releases import export
from app.storage import sync_directory

Compression = Literal["none", "gzip", "zstd"]
SUFFIXES: dict[str, str] = {"none": "", "gzip": ".gz", "zstd": ".zst"}
MEDIA_TYPES = {"gzip": "application/gzip", "zstd": "application/zstd"}
FOLDER = "releases"
_BUFFER = 1 << 20  # bytes handed to the compressor and the file at a time
log = structlog.get_logger("keyseed.releases")


@dataclass(frozen=True)
class Rendered:
    """A release's file: where it is, its strong ETag (the sha256 of its bytes) and its
    size and time (``stat``; the time is the release's, set when it is rendered, so that
    it tells nothing of when anyone first downloaded it)."""

    path: Path
    etag: str
    stat: os.stat_result

    @property
    def size(self) -> int:
        return self.stat.st_size


def folder(data_dir: Path, release_id: uuid.UUID) -> Path:
    return data_dir / FOLDER / str(release_id)


def suffix(fmt: str, compression: Compression) -> str:
    """The file name's ending: ``.jsonl``, ``.csv.gz``, ``.parquet`` …"""
    return f".{fmt}{SUFFIXES[compression]}"


def media_type(fmt: str, compression: Compression) -> str:
    return MEDIA_TYPES.get(compression) or export.FORMATS[fmt]


def _find(directory: Path, ending: str) -> Rendered | None:
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return None
    for entry in entries:
        name = entry.name
        if name.startswith(".") or not name.endswith(ending):
            continue
        digest = name[: -len(ending)]
        if len(digest) != 64:  # ".csv.gz" also ends a "….csv.gz" only: exact names
            continue
        try:
            stat = entry.stat()
        except FileNotFoundError:
            continue
        return Rendered(Path(entry.path), f'"{digest}"', stat)
    return None


@contextlib.contextmanager
def _locked(directory: Path, ending: str) -> Iterator[None]:
    with open(directory / f".{ending.lstrip('.')}.lock", "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


class _Hashing:
    """The file being written, hashing every byte on its way to disk."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.sha256 = hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.sha256.update(data)
        return self.raw.write(data)

    def flush(self) -> None:
        self.raw.flush()

    def close(self) -> None:  # the file is closed by its owner, not by a compressor
        self.raw.flush()

    @property
    def closed(self) -> bool:
        return self.raw.closed


def _write(chunks: Iterator[bytes], out: _Hashing, compression: Compression) -> None:
    if compression == "gzip":
        with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0) as packed:
            for chunk in chunks:
                packed.write(chunk)
    elif compression == "zstd":
        sink = pa.PythonFile(out, mode="w")
        with pa.CompressedOutputStream(sink, "zstd") as packed:
            for chunk in chunks:
                packed.write(chunk)
    else:
        for chunk in chunks:
            out.write(chunk)


def rendered(
    database: Database,
    data_dir: Path,
    release_id: uuid.UUID,
    job_id: uuid.UUID,
    *,
    texts_only: bool,
    fmt: str,
    compression: Compression,
    modified: datetime,
) -> Rendered:
    """The release's file in ``fmt`` and ``compression``, rendered now if it is not yet
    (once, however many requests ask at the same time)."""
    directory = folder(data_dir, release_id)
    ending = suffix(fmt, compression)
    found = _find(directory, ending)
    if found is not None:
        return found
    directory.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    directory.mkdir(mode=0o700, exist_ok=True)
    with _locked(directory, ending):
        found = _find(directory, ending)  # rendered while this request waited
        if found is not None:
            return found
        for stale in directory.glob(f".*{ending}.tmp"):  # a render a crash cut short
            stale.unlink(missing_ok=True)
        chunks = export.CHUNKS[fmt](database, job_id, texts_only=texts_only)
        return _render(directory, ending, chunks, compression, modified)


def render_formats(
    database: Database,
    data_dir: Path,
    release_id: uuid.UUID,
    job_id: uuid.UUID,
    *,
    texts_only: bool,
    modified: datetime,
) -> None:
    """Render a new release's uncompressed files (after its creation is answered): a
    failure is logged by type and left to the first download to meet again."""
    for fmt in export.FORMATS:
        try:
            rendered(
                database,
                data_dir,
                release_id,
                job_id,
                texts_only=texts_only,
                fmt=fmt,
                compression="none",
                modified=modified,
            )
        except Exception as exc:  # the release stands; its download renders on demand
            log.warning("release.render_failed", format=fmt, **exception_fields(exc))


def _render(
    directory: Path,
    ending: str,
    chunks: Iterator[bytes],
    compression: Compression,
    modified: datetime,
) -> Rendered:
    fd, temporary = tempfile.mkstemp(dir=directory, prefix=".", suffix=ending + ".tmp")
    try:  # mkstemp's file is 0600
        with os.fdopen(fd, "wb", buffering=_BUFFER) as raw:
            out = _Hashing(raw)
            _write(chunks, out, compression)
            raw.flush()
            os.fsync(raw.fileno())
        when = (modified if modified.tzinfo else modified.replace(tzinfo=UTC)).timestamp()
        os.utime(temporary, (when, when))
        target = directory / f"{out.sha256.hexdigest()}{ending}"
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    sync_directory(directory)
    found = _find(directory, ending)
    assert found is not None and found.path == target
    return found


def remove(data_dir: Path, release_ids: list[uuid.UUID]) -> None:
    """Remove the releases' files (a later download renders them again)."""
    for release_id in release_ids:
        shutil.rmtree(folder(data_dir, release_id), ignore_errors=True)


class ReleaseFile(FileResponse):
    """Starlette's ``FileResponse`` reading a MiB at a time (not 64 KiB) where the server
    cannot send the file itself (``http.response.pathsend``, :mod:`app.server`): a byte
    range, or another ASGI server."""

    chunk_size = _BUFFER


def not_modified(if_none_match: str | None, etag: str) -> bool:
    """Whether ``If-None-Match`` names ``etag`` (or is ``*``): weak comparison, as RFC
    9110 §13.1.2 asks for a GET."""
    if not if_none_match:
        return False
    tags = [tag.strip().removeprefix("W/") for tag in if_none_match.split(",")]
    return "*" in tags or etag in tags


def check_range(headers: Headers, found: Rendered) -> None:
    """Raise 416 (problem+json, ``Content-Range: bytes */size``) for a ``Range`` that
    would be used (no ``If-Range``, or one naming this file) and that the file cannot
    serve: malformed, backwards, or starting past its end. Starlette's own parser decides
    (it then serves the same ranges), so the two never disagree."""
    asked = headers.get("range")
    if asked is None:
        return
    condition = headers.get("if-range")
    if condition is not None and condition not in (found.etag, _http_date(found)):
        return  # the file changed since: the whole file is sent (200)
    try:
        FileResponse._parse_range_header(asked, found.size)
    except (MalformedRangeHeader, Unsatisfiable) as exc:
        raise RangeNotSatisfiable(found.size) from exc


def _http_date(found: Rendered) -> str:
    return formatdate(found.stat.st_mtime, usegmt=True)
