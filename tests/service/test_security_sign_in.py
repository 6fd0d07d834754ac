"""Dashboard sign-in throttling (issue 14, item 11).

Five wrong passwords used to lock an account for everyone, the right password included
(anyone could lock an admin out), and the lockout answer (429) came for account names
only (an unknown name got 401 forever), so it told which names exist. Now failures are
counted per (name, address), for every name alike, and no account is ever locked.
"""

from __future__ import annotations

import re

from fastapi import FastAPI
from fastapi.testclient import TestClient
from httpx import Response
from sqlalchemy import select

from app.admin import sessions
from app.db import Database
from app.models import SignInFailure
from tests.dashboard import factories as dash

WRONG = "not-the-password"


def _browser(app: FastAPI, address: str) -> TestClient:
    return TestClient(app, client=(address, 50000))


def _answer(response: Response) -> tuple[int, str | None, str]:
    """What a client learns from a refusal: status, Retry-After, the page's message."""
    message = re.search(r'role="alert"[^>]*>(.*?)<', response.text, flags=re.S)
    text = message.group(1).strip() if message else response.text
    return response.status_code, response.headers.get("retry-after"), text


def test_failures_throttle_a_name_from_an_address_and_lock_nobody_out(
    app: FastAPI, db: Database
) -> None:
    dash.person(db, "ada", "admin")
    attacker = _browser(app, "203.0.113.9")
    for _ in range(sessions.NAME_LIMIT):
        assert dash.sign_in(attacker, "ada", WRONG).status_code == 401
    # the attacker's address is throttled at that name, even with the right password
    assert dash.sign_in(attacker, "ada").status_code == 429
    # ada, from her own machine, signs in: nothing was locked
    assert dash.sign_in(_browser(app, "198.51.100.20"), "ada").status_code == 303
    # another name from the attacker's address is not throttled yet
    assert dash.sign_in(attacker, "someone-else", WRONG).status_code == 401


def test_an_unknown_name_gets_the_same_answers_as_an_account(app: FastAPI, db: Database) -> None:
    dash.person(db, "ada", "admin")
    answers: dict[str, list[tuple[int, str | None, str]]] = {}
    for name, address in (("ada", "203.0.113.1"), ("nobody", "203.0.113.2")):
        browser = _browser(app, address)
        answers[name] = [
            _answer(dash.sign_in(browser, name, WRONG)) for _ in range(sessions.NAME_LIMIT + 2)
        ]
    assert answers["ada"] == answers["nobody"]
    statuses = [status for status, _, _ in answers["ada"]]
    assert statuses == [401] * sessions.NAME_LIMIT + [429, 429]
    with db.session() as session:
        stored = session.scalars(select(SignInFailure)).all()
    assert len(stored) == 2 * (sessions.NAME_LIMIT + 2)
    digests = {row.name_digest for row in stored}
    assert len(digests) == 2 and not digests & {"ada", "nobody", None}


def test_the_address_throttle_holds_across_names(app: FastAPI, db: Database) -> None:
    dash.person(db, "ada", "admin")
    spraying = _browser(app, "203.0.113.50")
    for i in range(sessions.ADDRESS_LIMIT):
        assert dash.sign_in(spraying, f"guess-{i}", WRONG).status_code == 401
    assert dash.sign_in(spraying, "ada").status_code == 429
    assert dash.sign_in(_browser(app, "203.0.113.51"), "ada").status_code == 303
