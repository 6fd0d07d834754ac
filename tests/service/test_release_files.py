"""Release downloads served from files rendered once (issue 65, "In and out"): a strong
ETag (the sha256 of the file's bytes) and 304, byte ranges (206, If-Range, 416 as
problem+json), gzip and zstd, one render however many requests ask at once, the files
private on disk, removed with their dataset, and the access rules unchanged."""

from __future__ import annotations

import gzip
import hashlib
import json
import stat
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from app.config import Settings
from app.db import Database
from app.models import Download
from app.releases import export, files
from tests.service import factories


def _downloads(db: Database) -> int:
    with db.session() as session:
        return int(session.scalar(select(func.count()).select_from(Download)) or 0)


def _files(settings: Settings, release_id: str) -> list[Path]:
    folder = files.folder(settings.data_path, uuid.UUID(release_id))
    return sorted(p for p in folder.iterdir() if not p.name.startswith("."))


@pytest.fixture
def renders(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every render of a release's file, by format (the real renderers, counted)."""
    seen: list[str] = []
    lock = threading.Lock()
    for fmt, renderer in list(export.CHUNKS.items()):

        def counted(*args: Any, _fmt: str = fmt, _r: Any = renderer, **kwargs: Any) -> Any:
            with lock:
                seen.append(_fmt)
            return _r(*args, **kwargs)

        monkeypatch.setitem(export.CHUNKS, fmt, counted)
    yield seen


@pytest.fixture
def release_id(client: TestClient, world: factories.World, db: Database) -> str:
    """A job run to success and released to the client: the release id."""
    return factories.released(client, world, db)[1]


def test_a_download_carries_a_strong_etag_and_answers_304(
    client: TestClient, world: factories.World, db: Database, release_id: str
) -> None:
    path = f"/v1/releases/{release_id}/download"
    first = client.get(path, headers=world.client.headers)
    assert first.status_code == 200
    etag = first.headers["etag"]
    assert etag == f'"{hashlib.sha256(first.content).hexdigest()}"'
    assert first.headers["content-length"] == str(len(first.content))
    assert first.headers["accept-ranges"] == "bytes"
    assert first.headers["cache-control"] == "private, no-cache"
    assert 'filename="release-' in first.headers["content-disposition"]
    # Last-Modified is the release's time, not when someone first downloaded it
    created = client.get(f"/v1/releases/{release_id}", headers=world.client.headers).json()
    modified = parsedate_to_datetime(first.headers["last-modified"])
    released = datetime.fromisoformat(created["created_at"])
    released = released if released.tzinfo else released.replace(tzinfo=UTC)
    assert abs((modified - released).total_seconds()) < 1.0
    assert _downloads(db) == 1

    for sent in (etag, f"W/{etag}", f'"0000", {etag}', "*"):
        again = client.get(path, headers={**world.client.headers, "If-None-Match": sent})
        assert again.status_code == 304, sent
        assert again.content == b"" and again.headers["etag"] == etag
    assert _downloads(db) == 1  # a 304 sends nothing: not a download
    changed = client.get(path, headers={**world.client.headers, "If-None-Match": '"0000"'})
    assert changed.status_code == 200 and changed.content == first.content
    assert _downloads(db) == 2
    # the same bytes from the owner, the same ETag
    assert client.get(path, headers=world.owner.headers).headers["etag"] == etag


def test_byte_ranges_206_if_range_and_416(
    client: TestClient, world: factories.World, db: Database, release_id: str
) -> None:
    path = f"/v1/releases/{release_id}/download?format=csv"
    whole = client.get(path, headers=world.client.headers)
    body, etag, size = whole.content, whole.headers["etag"], len(whole.content)
    assert size > 20

    def ranged(value: str, **extra: str) -> Any:
        return client.get(path, headers={**world.client.headers, "Range": value, **extra})

    part = ranged("bytes=0-9")
    assert part.status_code == 206 and part.content == body[:10]
    assert part.headers["content-range"] == f"bytes 0-9/{size}"
    assert part.headers["etag"] == etag
    tail = ranged("bytes=-5")
    assert tail.status_code == 206 and tail.content == body[-5:]
    rest = ranged("bytes=10-")
    assert rest.status_code == 206 and rest.content == body[10:]
    assert ranged("bytes=3-7", **{"If-Range": etag}).content == body[3:8]
    stale = ranged("bytes=3-7", **{"If-Range": '"an-older-file"'})
    assert stale.status_code == 200 and stale.content == body  # changed since: all of it
    before = _downloads(db)
    for bad in (f"bytes={size}-", f"bytes={size + 100}-{size + 200}", "bytes=9-2", "items=0-1"):
        refused = ranged(bad)
        assert refused.status_code == 416, bad
        assert refused.headers["content-type"] == "application/problem+json"
        assert refused.json()["type"] == "/problems/range-not-satisfiable"
        assert refused.headers["content-range"] == f"bytes */{size}"
    assert _downloads(db) == before  # a refused range is no download


def test_each_format_is_rendered_once(
    client: TestClient,
    world: factories.World,
    db: Database,
    settings: Settings,
    renders: list[str],
) -> None:
    _, release_id = factories.released(client, world, db)
    # rendered once the release is made (after its answer), each format once
    assert sorted(renders) == ["csv", "jsonl", "parquet"]
    names = [p.name for p in _files(settings, release_id)]
    assert sorted(n.split(".", 1)[1] for n in names) == ["csv", "jsonl", "parquet"]
    files.remove(settings.data_path, [uuid.UUID(release_id)])  # as a deletion leaves it
    renders.clear()
    path = f"/v1/releases/{release_id}/download"
    bodies = [client.get(path, headers=world.client.headers).content for _ in range(2)]
    assert bodies[0] == bodies[1] and renders == ["jsonl"]  # two downloads, one render
    client.get(path + "?format=parquet", headers=world.owner.headers)
    client.get(path + "?format=parquet", headers=world.client.headers)
    assert renders == ["jsonl", "parquet"]
    names = [p.name for p in _files(settings, release_id)]
    assert len(names) == 2 and {n.split(".", 1)[1] for n in names} == {"jsonl", "parquet"}
    digest = hashlib.sha256(bodies[0]).hexdigest()
    assert f"{digest}.jsonl" in names  # content-addressed


def test_concurrent_first_requests_render_once(
    world: factories.World,
    client: TestClient,
    db: Database,
    settings: Settings,
    renders: list[str],
) -> None:
    _, released = factories.released(client, world, db)
    release_id = uuid.UUID(released)
    renders.clear()  # those made with the release (uncompressed)
    with db.session() as session:
        from app.releases import service

        release = service.repository.get(session, release_id)
        assert release is not None
        job_id, texts_only = service.download_source(session, release)
        created = release.created_at

    def render(_: int) -> files.Rendered:
        return files.rendered(
            db,
            settings.data_path,
            release_id,
            job_id,
            texts_only=texts_only,
            fmt="csv",
            compression="gzip",
            modified=created,
        )

    with ThreadPoolExecutor(max_workers=8) as pool:
        found = list(pool.map(render, range(16)))
    assert renders == ["csv"]
    assert len({(f.path, f.etag) for f in found}) == 1
    assert [p.name for p in _files(settings, str(release_id))].count(found[0].path.name) == 1
    assert len([p for p in _files(settings, str(release_id)) if p.name.endswith(".csv.gz")]) == 1


def test_gzip_and_zstd_files(
    client: TestClient, world: factories.World, settings: Settings, release_id: str
) -> None:
    path = f"/v1/releases/{release_id}/download"
    plain = client.get(path, headers=world.client.headers).content
    packed = client.get(path + "?compression=gzip", headers=world.client.headers)
    assert packed.status_code == 200
    assert packed.headers["content-type"] == "application/gzip"
    assert "content-encoding" not in packed.headers  # the file itself, decoded by no one
    assert packed.headers["content-disposition"].endswith('.jsonl.gz"')
    assert gzip.decompress(packed.content) == plain
    assert packed.headers["etag"] == f'"{hashlib.sha256(packed.content).hexdigest()}"'
    squeezed = client.get(path + "?compression=zstd", headers=world.client.headers)
    assert squeezed.headers["content-type"] == "application/zstd"
    assert squeezed.content[:4] == b"\x28\xb5\x2f\xfd"  # a zstd frame
    stream = pa.CompressedInputStream(pa.BufferReader(squeezed.content), "zstd")
    assert stream.read() == plain
    csv_gz = client.get(path + "?format=csv&compression=gzip", headers=world.client.headers)
    assert csv_gz.status_code == 200 and gzip.decompress(csv_gz.content).startswith(b"label,")
    refused = client.get(path + "?format=parquet&compression=gzip", headers=world.client.headers)
    assert refused.status_code == 422 and refused.json()["field"] == "compression"
    assert client.get(path + "?compression=brotli", headers=world.client.headers).status_code == 422
    # rendered again (its files removed), the same bytes: gzip has no time or name in it
    files.remove(settings.data_path, [uuid.UUID(release_id)])
    again = client.get(path + "?compression=gzip", headers=world.client.headers)
    assert again.headers["etag"] == packed.headers["etag"]
    events = client.get(
        f"/v1/audit/events?kind=release.downloaded&target_id={release_id}",
        headers=world.auditor.headers,
    ).json()["events"]
    assert {(e["details"]["format"], e["details"]["compression"]) for e in events} == {
        ("jsonl", "none"),
        ("jsonl", "gzip"),
        ("jsonl", "zstd"),
        ("csv", "gzip"),
    }


def test_files_are_private_on_disk(
    client: TestClient, world: factories.World, settings: Settings, release_id: str
) -> None:
    client.get(f"/v1/releases/{release_id}/download", headers=world.client.headers)
    folder = files.folder(settings.data_path, uuid.UUID(release_id))
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(folder.parent.stat().st_mode) == 0o700
    for path in _files(settings, release_id):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]  # no leftovers
    # what a render cut short by a crash left is removed by the next render
    stale = folder / ".abc.jsonl.gz.tmp"
    stale.write_bytes(b"half a file")
    packed = client.get(
        f"/v1/releases/{release_id}/download?compression=gzip", headers=world.client.headers
    )
    assert packed.status_code == 200 and not stale.exists()


def test_access_to_the_files_is_the_releases(
    client: TestClient, world: factories.World, release_id: str
) -> None:
    """Once the file exists, neither its ETag nor a range opens it to anyone else."""
    path = f"/v1/releases/{release_id}/download"
    etag = client.get(path, headers=world.client.headers).headers["etag"]
    probes = [{}, {"If-None-Match": etag}, {"Range": "bytes=0-0"}]
    for name, status in (("admin", 403), ("auditor", 403), ("other_owner", 404)):
        for extra in probes:
            answer = client.get(path, headers={**getattr(world, name).headers, **extra})
            assert answer.status_code == status, (name, extra)
            assert "etag" not in answer.headers
    for extra in probes:
        answer = client.get(path, headers={**world.other_client.headers, **extra})
        assert answer.status_code == 404 and "etag" not in answer.headers
        assert client.get(path, headers=extra).status_code == 401


def test_deleting_the_dataset_removes_its_release_files(
    client: TestClient, world: factories.World, settings: Settings, release_id: str
) -> None:
    path = f"/v1/releases/{release_id}/download"
    first = client.get(path, headers=world.client.headers)
    client.get(path + "?format=csv&compression=zstd", headers=world.client.headers)
    assert len(_files(settings, release_id)) == 4  # the three made with it, and the .csv.zst
    dataset_id = client.get(f"/v1/releases/{release_id}", headers=world.owner.headers).json()[
        "dataset_id"
    ]
    deleted = client.delete(f"/v1/datasets/{dataset_id}", headers=world.owner.headers)
    assert deleted.status_code == 200, deleted.text
    assert not files.folder(settings.data_path, uuid.UUID(release_id)).exists()
    # the release stays (a DP output): a later download renders the same bytes again
    again = client.get(path, headers=world.client.headers)
    assert again.status_code == 200 and again.headers["etag"] == first.headers["etag"]
    assert [json.loads(line) for line in again.text.splitlines()] == [
        json.loads(line) for line in first.text.splitlines()
    ]
