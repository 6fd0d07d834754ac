"""Objects of two organisations for the proof tests to act on: "own" ones belong to
``world.owner`` and are released to ``world.client``; "other" ones belong to
``world.other_owner`` and are released to ``world.other_client``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi.testclient import TestClient

from app.db import Database
from app.identity import repository as identity_repo
from app.identity import service as identity
from tests.service import factories
from tests.service.factories import Caller, World


@dataclass(frozen=True)
class Call:
    """What one request sends besides its method and the caller."""

    ids: dict[str, str] = field(default_factory=dict)
    json: Any = None
    params: dict[str, str] | None = None
    form: dict[str, Any] | None = None


@dataclass
class Scene:
    """Made on first use and kept (``fresh=True``: a new object for a call that changes
    it). ``scope`` is "own" or "other"."""

    client: TestClient
    db: Database
    world: World
    cache: dict[tuple[str, str], str] = field(default_factory=dict)

    def owner(self, scope: str) -> Caller:
        return self.world.owner if scope == "own" else self.world.other_owner

    def grantee(self, scope: str) -> Caller:
        return self.world.client if scope == "own" else self.world.other_client

    def _cached(self, kind: str, scope: str, make: Callable[[], str], fresh: bool) -> str:
        if fresh:
            return make()
        if (kind, scope) not in self.cache:
            self.cache[kind, scope] = make()
        return self.cache[kind, scope]

    def dataset(self, scope: str, *, fresh: bool = False) -> str:
        def make() -> str:
            return factories.dataset(self.client, self.owner(scope), cap=1000)

        return self._cached("dataset", scope, make, fresh)

    def job(self, scope: str, *, fresh: bool = False) -> str:
        def make() -> str:
            return factories.job(self.client, self.owner(scope), self.dataset(scope))

        return self._cached("job", scope, make, fresh)

    def succeeded_job(self, scope: str, *, fresh: bool = False) -> str:
        def make() -> str:
            job_id = self.job(scope, fresh=True)
            factories.run_job(self.db, job_id, texts=["one", "two", "three"])
            return job_id

        return self._cached("succeeded_job", scope, make, fresh)

    def failed_job(self, scope: str) -> str:
        """A new job that prompts an LLM, whose sequences were saved and one prompt failed."""
        job_id = factories.job(self.client, self.owner(scope), self.dataset(scope), llm="local")
        factories.run_job(
            self.db, job_id, texts=["one", None, "three"], failure="1 of 3 prompts failed"
        )
        return job_id

    def release(self, scope: str) -> str:
        def make() -> str:
            response = self.client.post(
                f"/v1/jobs/{self.succeeded_job(scope)}/release",
                headers=self.owner(scope).headers,
                json={"client_organisations": [str(self.grantee(scope).organisation_id)]},
            )
            assert response.status_code == 201, response.text
            return str(response.json()["id"])

        return self._cached("release", scope, make, False)

    def spare_key(self, scope: str) -> str:
        """The id of a key of the scope's owner organisation that no caller uses."""

        def make() -> str:
            organisation = self.owner(scope).organisation_id
            with self.db.transaction() as session:
                key, _ = identity.create_key(
                    session, factories.SYSTEM, organisation_id=organisation, role="owner"
                )
                return str(key.id)

        return self._cached("key", scope, make, False)


def revoked_caller(db: Database, role: str) -> Caller:
    """A caller whose key of ``role`` has been revoked."""
    organisation = None
    if role in ("owner", "client"):
        organisation = factories.organisation(db, f"Closed {role}", role)
    caller = factories.api_key(db, role, organisation)
    with db.transaction() as session:
        key = identity_repo.key_by_prefix(session, caller.key.split("_")[1])
        assert key is not None
        identity.revoke_key(session, factories.SYSTEM, key.id)
    return caller
