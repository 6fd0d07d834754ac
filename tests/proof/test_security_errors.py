"""Numbers a JSONL upload cannot hold, and exceptions in the logs (issue 14, item 14).

A 5,000-digit integer made Python's ``json`` raise a ``ValueError`` (it converts at most
4,300 digits) that no handler expected: a 500, and the exception's text in the log.
Now such a number is a row error naming the row and the column, and every exception a
log line carries is rendered as its type and frames only, whoever logs it (our
loggers, uvicorn's, Celery's).
"""

from __future__ import annotations

import json
import logging
import uuid

import structlog
from fastapi.testclient import TestClient

from app.datasets.upload import MAX_NUMBER_DIGITS
from app.db import Database
from tests.proof.conftest import assert_problem, nothing_stored
from tests.service import factories

DIGITS = "7" * 5000


def _jsonl(*records: str) -> bytes:
    return "\n".join(records).encode()


def test_a_huge_number_in_a_jsonl_upload_is_a_row_error(
    client: TestClient, world: factories.World, db: Database, log_lines: list[str]
) -> None:
    good = json.dumps({"text": "Chest pain", "label": "cardio"})
    for column, body in (
        ("text", _jsonl(good, f'{{"text": {DIGITS}, "label": "cardio"}}')),
        ("text", _jsonl(good, f'{{"text": -{DIGITS}, "label": "ortho"}}')),
        ("label", _jsonl(good, f'{{"text": "Knee pain", "label": {DIGITS}}}')),
    ):
        with nothing_stored(db):
            response = factories.upload(client, world.owner, body, filename="notes.jsonl")
        problem = assert_problem(response, 422, field="file")
        assert problem["errors"][0]["row"] == 2, problem
        assert problem["errors"][0]["column"] == column, problem
        assert DIGITS[:50] not in response.text
    # the digits named in the message are the limit, not the number
    assert f"more than {MAX_NUMBER_DIGITS} digits" in problem_text(client, world)
    # a field the upload does not read may hold anything JSON allows
    extra = _jsonl(good, f'{{"text": "Knee pain", "label": "ortho", "n": {DIGITS}}}')
    stored = factories.upload(client, world.owner, extra, filename="notes.jsonl")
    assert stored.status_code == 201, stored.text
    assert stored.json()["documents"] == 2
    logs = "\n".join(log_lines)
    assert '"status": 422' in logs and '"status": 500' not in logs
    assert DIGITS[:50] not in logs and "unhandled" not in logs


def problem_text(client: TestClient, world: factories.World) -> str:
    body = _jsonl(f'{{"text": {DIGITS}, "label": "cardio"}}')
    response = factories.upload(client, world.owner, body, filename="notes.jsonl")
    return str(assert_problem(response, 422)["errors"][0]["message"])


def _raise(secret: str) -> None:
    try:
        raise KeyError(secret)
    except KeyError as inner:
        raise ValueError(f"row holds {secret}") from inner


def test_logged_exceptions_carry_their_type_never_their_message(
    log_lines: list[str],
) -> None:
    secret = f"patient-{uuid.uuid4().hex}"
    try:
        _raise(secret)
    except ValueError as error:
        # as uvicorn logs an exception escaping the app
        logging.getLogger("uvicorn.error").error("Exception in ASGI application\n", exc_info=error)
        # as Celery logs a task that raised: the exception is also an argument
        logging.getLogger("celery.app.trace").error(
            "Task %(name)s[%(id)s] raised unexpected: %(exc)s",
            {"name": "keyseed.jobs.run_sequences", "id": "1", "exc": repr(error)},
            exc_info=True,
        )
        # as our own code would with structlog
        structlog.get_logger("keyseed.test").exception("test.failed")
        structlog.get_logger("keyseed.test").error("test.failed_again", exc_info=error)
    lines = [json.loads(line) for line in log_lines]
    assert len(lines) == 4, log_lines
    for line in lines:
        assert line["error"] == "ValueError", line
        assert line["error_causes"] == ["KeyError"], line
        assert any("_raise" in frame for frame in line["frames"]), line
        assert "exc_info" not in line and "exception" not in line
    assert lines[0]["event"] == "Exception in ASGI application\n"
    assert lines[1]["event"].startswith("Task %(name)s")
    assert secret not in "\n".join(log_lines)
