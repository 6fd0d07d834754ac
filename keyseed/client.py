"""A typed Python client for the keyseed service's HTTP API.

One :class:`Client` per API key. Every call returns a typed object (pydantic models
that keep any member a newer server adds) and every refusal raises a
:class:`KeyseedError` built from the service's ``application/problem+json`` body, of a
subclass chosen by its status (:class:`NotFound`, :class:`Conflict` and its
:class:`BudgetExceeded`, :class:`ValidationFailed` …). Network failures raise httpx's
own exceptions (:class:`httpx.TransportError`).

Uploads stream the file from disk and downloads stream to disk: neither holds the
whole corpus in memory.

Platform admin: organisations, keys and budgets::

    from keyseed.client import Client

    with Client("https://keyseed.example.org", admin_key) as admin:
        hospital = admin.create_organisation(
            "St Mary's", "owner", epsilon_budget=20, delta_budget=1e-6
        )
        lab = admin.create_organisation("Acme Research", "client")
        owner_key = admin.create_key("owner", hospital.id).key  # shown once
        client_key = admin.create_key("client", lab.id).key
        admin.set_organisation_budget(hospital.id, 30, 1e-6, reason="board 2026-11")

Hospital IT (an ``owner`` key): upload, dry run, submit, follow, release::

    with Client(url, owner_key) as owner:
        dataset = owner.upload_dataset(
            "notes.csv", name="notes-2026", text_columns=["title", "body"],
            label_column="ward", labels=["cardiology", "oncology"], epsilon_cap=10, delta_cap=1e-7,
        )
        spec = {"vocabulary": "medical", "llm": "local", "document_type": "discharge summary",
                "epsilon": 1, "delta": 1e-6, "per_class": 200}
        plan = owner.dry_run(dataset, spec)      # nothing read, nothing spent
        job = owner.submit_job(dataset, spec)    # reserves plan.epsilon, or BudgetExceeded
        for seen in owner.follow(job):           # or: job = owner.wait(job, timeout=3600)
            print(seen.state, seen.stage, f"{seen.progress:.0%}")
        release = owner.release(job, [lab_id], name="cardio v1")

Client organisation (a ``client`` key): list and download::

    with Client(url, client_key) as lab:
        for release in lab.list_releases():
            lab.download(release, f"{release.id}.parquet", format="parquet")

Privacy officer (an ``auditor`` or ``admin`` key)::

    with Client(url, auditor_key) as officer:
        ledger = officer.ledger(dataset_id)
        print(ledger.budget.spent, ledger.budget.remaining, [e.kind for e in ledger.entries])
        for event in officer.iter_audit_events(kind="release.downloaded"):
            print(event.created_at, event.actor, event.target_id)
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from http import HTTPStatus
from pathlib import Path
from types import TracebackType
from typing import IO, Any, ClassVar, Literal, Protocol, TypeVar

import httpx
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

__all__ = [
    "Amount",
    "ApiKey",
    "AuditEvent",
    "AuditPage",
    "BadRequest",
    "Budget",
    "BudgetExceeded",
    "Client",
    "Conflict",
    "CreatedKey",
    "Dataset",
    "Forbidden",
    "Job",
    "JobFailed",
    "JobPlan",
    "JobTimeout",
    "KeyseedError",
    "Ledger",
    "LedgerEntry",
    "LedgerReport",
    "NotFound",
    "Organisation",
    "OrganisationBudget",
    "PayloadTooLarge",
    "Release",
    "ServerError",
    "ServiceUnavailable",
    "Unauthorized",
    "UnsupportedMediaType",
    "ValidationFailed",
    "Vocabulary",
]

DownloadFormat = Literal["jsonl", "csv", "parquet"]
DownloadCompression = Literal["none", "gzip", "zstd"]
TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled"})
PROBLEM_JSON = "application/problem+json"
CHUNK_SIZE = 64 * 1024

# ---------------------------------------------------------------------------- models


class _Model(BaseModel):
    """What the API returned; members a newer server adds are kept, not refused."""

    model_config = ConfigDict(extra="allow", frozen=True)


class Organisation(_Model):
    id: uuid.UUID
    name: str
    kind: str  # "platform", "owner" or "client"
    epsilon_budget: float
    delta_budget: float
    created_at: datetime


class ApiKey(_Model):
    id: uuid.UUID
    prefix: str
    name: str
    role: str  # "owner", "client", "admin" or "auditor"
    organisation_id: uuid.UUID
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None


class CreatedKey(ApiKey):
    key: str = Field(description="The API key itself: shown once, never again")


class Amount(_Model):
    epsilon: float
    delta: float


class OrganisationBudget(_Model):
    organisation_id: uuid.UUID
    budget: Amount
    allocated: Amount
    remaining: Amount
    datasets: int
    spent: float | None
    reserved: float | None
    accountant: str


class Budget(_Model):
    """A dataset's cap and what its jobs spent and reserved, composed at the cap's δ."""

    epsilon_cap: float
    delta_cap: float
    spent: float
    reserved: float
    remaining: float
    accountant: str


class Dataset(_Model):
    id: uuid.UUID
    organisation_id: uuid.UUID
    name: str
    format: str
    text_columns: list[str]
    label_column: str
    labels: list[str]
    unit_column: str | None
    # raw counts of the upload: the owning organisation's keys only, else None
    documents: int | None
    skipped_empty: int | None
    skipped_duplicate: int | None
    upload_bytes: int | None
    created_at: datetime
    deleted_at: datetime | None
    budget: Budget


class Vocabulary(_Model):
    id: str  # a built-in's name, or an uploaded vocabulary's id
    kind: str
    name: str
    size: int
    fingerprint: str
    description: str
    source: str
    licence: str
    organisation_id: uuid.UUID | None
    created_at: datetime | None


class JobPlan(_Model):
    """A dry run: what a job would release and spend; nothing was read or reserved."""

    dry_run: bool
    dataset_id: uuid.UUID
    method: str
    epsilon: float
    delta: float
    accountant: str
    by_mechanism: dict[str, float]
    events: list[dict[str, Any]]
    parameters: dict[str, Any] | None = None
    noise: list[dict[str, Any]] = Field(default_factory=list)
    budget_after: dict[str, Any] | None = None
    verdict: dict[str, Any] | None = None


class JobCounts(_Model):
    sequences: int
    sequences_drawn: int
    texts_done: int
    texts_failed: int
    llm_calls: int


class JobError(_Model):
    code: str
    message: str | None


class JobCharge(_Model):
    epsilon: float
    delta: float
    accountant: str


class JobEpsilon(_Model):
    requested: float
    by_mechanism: dict[str, float]
    budget_state: str  # "reserved", "committed" or "released"
    charged: JobCharge | None = None


class LLMCosts(_Model):
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    wall_seconds: float = 0.0


class Job(_Model):
    id: uuid.UUID
    dataset_id: uuid.UUID
    organisation_id: uuid.UUID
    method: str
    state: str  # "queued", "running", "succeeded", "failed" or "cancelled"
    stage: str | None
    progress: float
    cancel_requested: bool
    counts: JobCounts
    llm_costs: LLMCosts
    error: JobError | None
    epsilon: JobEpsilon
    spec: dict[str, Any]
    submitted_by: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None  # the owning organisation's only (None for others)
    updated_at: datetime | None  # the owning organisation's only (None for others)
    # the running stage: name, title, number and count (stage k of n), public_work,
    # fraction and seconds_left (public-work stages only), started_at (owner only)
    current_stage: dict[str, Any] | None = None

    @property
    def finished(self) -> bool:
        """Whether the job reached a state it does not leave by itself."""
        return self.state in TERMINAL_STATES


class Release(_Model):
    id: uuid.UUID
    job_id: uuid.UUID
    dataset_id: uuid.UUID
    organisation_id: uuid.UUID
    name: str
    documents: int
    grantees: list[uuid.UUID]
    manifest: dict[str, Any]
    created_by: str
    created_at: datetime


class LedgerEntry(_Model):
    id: int
    job_id: uuid.UUID
    kind: str
    epsilon: float
    delta: float
    epsilon_by_mechanism: dict[str, Any]
    events: list[dict[str, Any]]
    accountant: str
    actor: str
    created_at: datetime | None  # None: written by a worker, shown to the owner only


class LedgerReport(_Model):
    id: int
    job_id: uuid.UUID
    epsilon: float
    delta: float
    events: list[dict[str, Any]]
    accountant: str
    actor: str
    created_at: datetime | None  # None: written by a worker, shown to the owner only
    differences: list[str] = Field(default_factory=list)


class Ledger(_Model):
    dataset_id: uuid.UUID
    budget: Budget
    entries: list[LedgerEntry]
    reports: list[LedgerReport]


class AuditEvent(_Model):
    id: int
    kind: str
    actor: str
    actor_organisation_id: uuid.UUID | None
    organisation_id: uuid.UUID | None
    target_type: str | None
    target_id: str | None
    details: dict[str, Any]
    request_id: str | None
    created_at: datetime


class AuditPage(_Model):
    events: list[AuditEvent]
    next_cursor: int | None


# ---------------------------------------------------------------------------- errors


class KeyseedError(Exception):
    """The service refused a request: its RFC 9457 problem, as the body gave it.

    ``type``, ``title``, ``status``, ``detail`` and ``instance`` are the standard
    members; every other member (``field``, ``errors``, ``requested``, ``remaining`` …)
    is in :attr:`extra`. The subclass says which kind of refusal it was::

        try:
            owner.submit_job(dataset, spec)
        except BudgetExceeded as refused:
            print(refused.detail, refused.remaining)
        except ValidationFailed as refused:
            print("fix", refused.field)
    """

    status_code: ClassVar[int | None] = None  # the status a subclass stands for

    def __init__(
        self,
        status: int,
        title: str,
        detail: str | None = None,
        *,
        type: str = "about:blank",
        instance: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        self.status = status
        self.title = title
        self.detail = detail
        self.type = type
        self.instance = instance
        self.extra: dict[str, Any] = dict(extra or {})
        super().__init__(f"{status} {title}" + (f": {detail}" if detail else ""))

    @property
    def problem(self) -> dict[str, Any]:
        """The problem as the service sent it (standard members and extensions)."""
        standard = {"type": self.type, "title": self.title, "status": self.status}
        optional = {"detail": self.detail, "instance": self.instance}
        return {**standard, **{k: v for k, v in optional.items() if v is not None}, **self.extra}

    @classmethod
    def from_response(cls, response: httpx.Response) -> KeyseedError:
        """The error of a refused response (its body must have been read)."""
        body: dict[str, Any] = {}
        with contextlib.suppress(ValueError):
            parsed = response.json()
            if isinstance(parsed, dict):
                body = parsed
        status = body.get("status") if isinstance(body.get("status"), int) else None
        status = status or response.status_code
        title = body.get("title") if isinstance(body.get("title"), str) else None
        if title is None:
            try:
                title = HTTPStatus(status).phrase
            except ValueError:
                title = "Error"
        detail = body.get("detail") if isinstance(body.get("detail"), str) else None
        if not body and response.headers.get("content-type", "").startswith("text/plain"):
            detail = response.text.strip()[:500] or None  # the server's own words (a 408)
        known = {"type", "title", "status", "detail", "instance"}
        extra = {k: v for k, v in body.items() if k not in known}
        error_class = _error_class(status, title, extra)
        return error_class(
            status,
            title,
            detail,
            type=str(body.get("type") or "about:blank"),
            instance=body.get("instance") if isinstance(body.get("instance"), str) else None,
            extra=extra,
        )


class BadRequest(KeyseedError):
    status_code = 400


class Unauthorized(KeyseedError):
    """No key, an unknown key or a revoked one."""

    status_code = 401


class Forbidden(KeyseedError):
    """The key's role may not do this (e.g. a platform key downloading a corpus)."""

    status_code = 403


class NotFound(KeyseedError):
    """No such object, or one the key may not see (another organisation's)."""

    status_code = 404


class Conflict(KeyseedError):
    """The object's state forbids it (a job released twice, a name taken …)."""

    status_code = 409


class BudgetExceeded(Conflict):
    """A job, an upload's cap or a budget change does not fit what is left.

    :attr:`detail` names what was asked and what remains; :attr:`requested` and
    :attr:`remaining` give them as ``{"epsilon": …, "delta": …}``.
    """

    @property
    def requested(self) -> dict[str, Any] | None:
        value = self.extra.get("requested")
        return value if isinstance(value, dict) else None

    @property
    def remaining(self) -> dict[str, Any] | None:
        value = self.extra.get("remaining")
        return value if isinstance(value, dict) else None


class PayloadTooLarge(KeyseedError):
    status_code = 413


class UnsupportedMediaType(KeyseedError):
    """The upload is not CSV or JSONL text (an archive, a PDF, UTF-16 …)."""

    status_code = 415


class ValidationFailed(KeyseedError):
    """The request breaks the schema or a rule; :attr:`field` names the field."""

    status_code = 422

    @property
    def field(self) -> str | None:
        value = self.extra.get("field")
        return value if isinstance(value, str) else None

    @property
    def errors(self) -> list[dict[str, Any]]:
        value = self.extra.get("errors")
        return list(value) if isinstance(value, list) else []


class ServerError(KeyseedError):
    """A 5xx answer."""

    status_code = 500


class ServiceUnavailable(ServerError):
    status_code = 503


_BY_STATUS: dict[int, type[KeyseedError]] = {
    c.status_code: c
    for c in (
        BadRequest,
        Unauthorized,
        Forbidden,
        NotFound,
        Conflict,
        PayloadTooLarge,
        UnsupportedMediaType,
        ValidationFailed,
        ServerError,
        ServiceUnavailable,
    )
    if c.status_code is not None
}
_BUDGET_TITLE = "Privacy budget exceeded"


def _error_class(status: int, title: str, extra: Mapping[str, Any]) -> type[KeyseedError]:
    if status == 409 and (title == _BUDGET_TITLE or {"requested", "remaining"} <= set(extra)):
        return BudgetExceeded
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    return ServerError if status >= 500 else KeyseedError


class JobFailed(Exception):
    """:meth:`Client.wait` saw the job end failed or cancelled; :attr:`job` is the last
    state read (its ``error`` says why, in the service's words)."""

    def __init__(self, job: Job) -> None:
        self.job = job
        why = f" ({job.error.code}: {job.error.message})" if job.error else ""
        super().__init__(f"job {job.id} ended {job.state}{why}")


class JobTimeout(TimeoutError):
    """The job did not finish in the time given; :attr:`job` is the last state read
    (the job itself goes on)."""

    def __init__(self, job: Job, timeout: float) -> None:
        self.job = job
        super().__init__(
            f"job {job.id} is still {job.state} ({job.stage or 'no stage'}, "
            f"{job.progress:.0%}) after {timeout:g} s"
        )


# ---------------------------------------------------------------------------- the client


class _HasId(Protocol):
    @property
    def id(self) -> uuid.UUID: ...


Ref = str | uuid.UUID | _HasId
"""An object's id, as a string or UUID, or the object itself (a :class:`Dataset` …)."""

FileInput = str | os.PathLike[str] | IO[bytes]
M = TypeVar("M", bound=BaseModel)


def _ref(value: Ref) -> str:
    return str(value) if isinstance(value, str | uuid.UUID) else str(value.id)


def _names(value: str | Iterable[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def _number(value: float) -> str:
    return repr(float(value))


class Client:
    """One API key's view of a keyseed service.

    ``base_url`` is the service's root (``https://keyseed.example.org``); ``api_key``
    the key a platform admin created (``Authorization: Bearer``). ``timeout`` bounds
    each request's connection and each read (a download's reads, not its whole
    length). Use it as a context manager, or call :meth:`close`::

        with Client("http://127.0.0.1:8000", key) as keyseed:
            print([d.name for d in keyseed.list_datasets()])

    :meth:`from_env` reads ``KEYSEED_URL`` and ``KEYSEED_API_KEY``.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers={**(headers or {}), "Authorization": f"Bearer {api_key}"},
            timeout=httpx.Timeout(timeout),
            transport=transport,
        )

    @classmethod
    def from_env(cls, **kwargs: Any) -> Client:
        """A client for ``KEYSEED_URL`` (default ``http://127.0.0.1:8000``) with the key
        in ``KEYSEED_API_KEY``."""
        url = os.environ.get("KEYSEED_URL", "http://127.0.0.1:8000")
        try:
            key = os.environ["KEYSEED_API_KEY"]
        except KeyError:
            raise RuntimeError("KEYSEED_API_KEY is not set") from None
        return cls(url, key, **kwargs)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ plumbing

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        response = self._http.request(method, path, **kwargs)
        if response.is_error:
            raise KeyseedError.from_response(response)
        return response

    def _one(self, model: type[M], method: str, path: str, **kwargs: Any) -> M:
        return model.model_validate(self._request(method, path, **kwargs).json())

    def _many(self, model: type[M], path: str, **kwargs: Any) -> list[M]:
        adapter = TypeAdapter(list[model])  # type: ignore[valid-type]
        found: list[M] = adapter.validate_python(self._request("GET", path, **kwargs).json())
        return found

    # ------------------------------------------------------------------ operations

    def ready(self) -> bool:
        """Whether the service answers and reaches its database and broker (``/readyz``);
        False as well when it cannot be reached at all."""
        try:
            response = self._http.get("/readyz")
        except httpx.TransportError:
            return False
        return response.status_code == 200

    # ------------------------------------------------------------------ platform admin

    def create_organisation(
        self,
        name: str,
        kind: Literal["owner", "client"],
        *,
        epsilon_budget: float | None = None,
        delta_budget: float | None = None,
    ) -> Organisation:
        """Create an organisation (admin). An owner organisation gets the privacy budget
        given, else the server's default::

            hospital = admin.create_organisation("St Mary's", "owner", epsilon_budget=20,
                                                 delta_budget=1e-6)
        """
        body: dict[str, Any] = {"name": name, "kind": kind}
        if epsilon_budget is not None:
            body["epsilon_budget"] = epsilon_budget
        if delta_budget is not None:
            body["delta_budget"] = delta_budget
        return self._one(Organisation, "POST", "/v1/organisations", json=body)

    def list_organisations(
        self, kind: Literal["platform", "owner", "client"] | None = None
    ) -> list[Organisation]:
        params = {"kind": kind} if kind else None
        return self._many(Organisation, "/v1/organisations", params=params)

    def organisation_budget(self, organisation: Ref) -> OrganisationBudget:
        """An organisation's budget, what its datasets' caps carve out, and their spend."""
        return self._one(
            OrganisationBudget, "GET", f"/v1/organisations/{_ref(organisation)}/budget"
        )

    def set_organisation_budget(
        self, organisation: Ref, epsilon: float, delta: float, *, reason: str
    ) -> OrganisationBudget:
        """Set an owner organisation's budget (admin; the reason goes to the audit
        trail). It cannot go below its datasets' caps (:class:`BudgetExceeded`)."""
        body = {"epsilon": epsilon, "delta": delta, "reason": reason}
        return self._one(
            OrganisationBudget,
            "PATCH",
            f"/v1/organisations/{_ref(organisation)}/budget",
            json=body,
        )

    def create_key(
        self,
        role: Literal["owner", "client", "admin", "auditor"],
        organisation: Ref | None = None,
        *,
        name: str = "",
    ) -> CreatedKey:
        """Create an API key (admin); ``owner`` and ``client`` keys name their
        organisation. The secret is in ``.key``, this once::

            owner_key = admin.create_key("owner", hospital).key
        """
        body: dict[str, Any] = {"role": role, "name": name}
        if organisation is not None:
            body["organisation_id"] = _ref(organisation)
        return self._one(CreatedKey, "POST", "/v1/keys", json=body)

    def list_keys(self, organisation: Ref | None = None) -> list[ApiKey]:
        params = {"organisation_id": _ref(organisation)} if organisation is not None else None
        return self._many(ApiKey, "/v1/keys", params=params)

    def revoke_key(self, key: Ref) -> ApiKey:
        return self._one(ApiKey, "POST", f"/v1/keys/{_ref(key)}/revoke")

    def set_dataset_cap(
        self,
        dataset: Ref,
        epsilon_cap: float,
        *,
        reason: str,
        delta_cap: float | None = None,
    ) -> Dataset:
        """Change a dataset's cap (admin; the reason goes to the audit trail)."""
        body: dict[str, Any] = {"epsilon_cap": epsilon_cap, "reason": reason}
        if delta_cap is not None:
            body["delta_cap"] = delta_cap
        return self._one(Dataset, "PATCH", f"/v1/datasets/{_ref(dataset)}", json=body)

    # ------------------------------------------------------------------ hospital IT

    def upload_dataset(
        self,
        file: FileInput,
        *,
        name: str,
        text_columns: str | Sequence[str],
        label_column: str,
        labels: Sequence[str],
        epsilon_cap: float,
        delta_cap: float = 0.0,
        unit_column: str | None = None,
        format: Literal["csv", "jsonl"] | None = None,
        on_empty: Literal["skip", "reject"] = "skip",
        on_duplicate: Literal["skip", "reject"] = "skip",
        filename: str | None = None,
    ) -> Dataset:
        """Upload a labelled corpus (CSV with a header row, or JSONL) from a path or a
        binary file object, streamed in chunks (a file object that cannot tell its size
        is sent chunked). Its cap (ε, δ) is carved out of the organisation's budget
        (:class:`BudgetExceeded` naming what remains when it does not fit); rows the
        service refuses come back as :class:`ValidationFailed` naming the rows::

            dataset = owner.upload_dataset(
                "notes.csv", name="notes-2026", text_columns=["title", "body"],
                label_column="ward", labels=["cardiology", "oncology"], epsilon_cap=10,
                delta_cap=1e-7, unit_column="patient_id",
            )
        """
        data: dict[str, Any] = {
            "name": name,
            "text_column": _names(text_columns),
            "label_column": label_column,
            "labels": list(labels),
            "epsilon_cap": _number(epsilon_cap),
            "delta_cap": _number(delta_cap),
            "on_empty": on_empty,
            "on_duplicate": on_duplicate,
        }
        if unit_column is not None:
            data["unit_column"] = unit_column
        if format is not None:
            data["format"] = format
        with self._opened(file) as (stream, found_name):
            files = {"file": (filename or found_name, stream, "application/octet-stream")}
            return self._one(Dataset, "POST", "/v1/datasets", data=data, files=files)

    @contextlib.contextmanager
    def _opened(self, file: FileInput) -> Iterator[tuple[IO[bytes], str]]:
        if isinstance(file, str | os.PathLike):
            path = Path(file)
            with path.open("rb") as stream:
                yield stream, path.name
        else:
            yield file, Path(str(getattr(file, "name", "") or "upload")).name

    def list_datasets(self) -> list[Dataset]:
        return self._many(Dataset, "/v1/datasets")

    def get_dataset(self, dataset: Ref) -> Dataset:
        return self._one(Dataset, "GET", f"/v1/datasets/{_ref(dataset)}")

    def delete_dataset(self, dataset: Ref) -> Dataset:
        """Purge the documents and destroy the dataset's key; metadata, jobs, releases
        and the ledger remain."""
        return self._one(Dataset, "DELETE", f"/v1/datasets/{_ref(dataset)}")

    def upload_vocabulary(
        self, file: FileInput, *, name: str, description: str = "", licence: str = ""
    ) -> Vocabulary:
        """Upload a PUBLIC vocabulary (UTF-8, one phrase a line); a job names it by
        ``vocabulary=<its id>``."""
        data = {"name": name, "description": description, "licence": licence}
        with self._opened(file) as (stream, found_name):
            files = {"file": (found_name, stream, "text/plain")}
            return self._one(Vocabulary, "POST", "/v1/vocabularies", data=data, files=files)

    def list_vocabularies(self) -> list[Vocabulary]:
        return self._many(Vocabulary, "/v1/vocabularies")

    def dry_run(
        self, dataset: Ref, spec: Mapping[str, Any] | None = None, **fields: Any
    ) -> JobPlan:
        """Plan a job: its releases, their noise and the composed (ε, δ), before any
        private read and without touching the budget. A job that would not fit the
        dataset's cap raises the :class:`BudgetExceeded` its submission would, with the
        figures; the plan of one that fits carries ``budget_after`` and, for the owner,
        a ``verdict`` on the class signal against the noise. The spec is the JSON a job
        takes (README, "The API"); keyword arguments add to it::

            plan = owner.dry_run(dataset, vocabulary="medical", llm="local",
                                 document_type="discharge summary", epsilon=1, delta=1e-6)
            print(plan.epsilon, plan.by_mechanism, plan.noise)
        """
        body = {**(spec or {}), **fields}
        return self._one(
            JobPlan,
            "POST",
            f"/v1/datasets/{_ref(dataset)}/jobs",
            params={"dry_run": "true"},
            json=body,
        )

    def submit_job(self, dataset: Ref, spec: Mapping[str, Any] | None = None, **fields: Any) -> Job:
        """Submit a job: its whole (ε, δ) is reserved against the dataset's cap
        (:class:`BudgetExceeded` naming what was asked and what remains) and it is
        queued. Same spec as :meth:`dry_run`."""
        body = {**(spec or {}), **fields}
        return self._one(Job, "POST", f"/v1/datasets/{_ref(dataset)}/jobs", json=body)

    def list_jobs(self, dataset: Ref) -> list[Job]:
        return self._many(Job, f"/v1/datasets/{_ref(dataset)}/jobs")

    def get_job(self, job: Ref) -> Job:
        return self._one(Job, "GET", f"/v1/jobs/{_ref(job)}")

    def cancel_job(self, job: Ref) -> Job:
        """Cancel a job: one that has not read private data gets its reservation back;
        a running one is asked to stop (what it committed stays spent)."""
        return self._one(Job, "POST", f"/v1/jobs/{_ref(job)}/cancel")

    def retry_job(self, job: Ref) -> Job:
        """Prompt again for a failed job's sequences that have no text, or resume a job
        whose worker died; no budget is reserved or spent again."""
        return self._one(Job, "POST", f"/v1/jobs/{_ref(job)}/retry")

    def follow(
        self,
        job: Ref,
        *,
        interval: float = 1.0,
        max_interval: float = 10.0,
        timeout: float | None = None,
    ) -> Iterator[Job]:
        """Poll a job and yield it each time its state, stage, progress or counts
        change (first as it is now), ending after it reaches ``succeeded``, ``failed``
        or ``cancelled``. Polls start every ``interval`` seconds and slow down, while
        nothing changes, to ``max_interval``. Past ``timeout`` seconds (None: no
        limit) raises :class:`JobTimeout`::

            for seen in owner.follow(job, timeout=3600):
                print(seen.state, seen.stage, f"{seen.progress:.0%}")
        """
        started = time.monotonic()
        pause = interval
        last: tuple[Any, ...] | None = None
        while True:
            current = self.get_job(job)
            seen = (current.state, current.stage, current.progress, current.counts)
            if seen != last:
                last, pause = seen, interval
                yield current
            else:
                pause = min(pause * 1.5, max(max_interval, interval))
            if current.finished:
                return
            if timeout is not None:
                left = timeout - (time.monotonic() - started)
                if left <= 0:
                    raise JobTimeout(current, timeout)
                time.sleep(min(pause, left))
            else:
                time.sleep(pause)

    def wait(
        self,
        job: Ref,
        *,
        timeout: float | None = 3600.0,
        interval: float = 1.0,
        max_interval: float = 10.0,
        check: bool = True,
    ) -> Job:
        """Poll until the job finishes and return it. With ``check`` (default) a job
        that ended ``failed`` or ``cancelled`` raises :class:`JobFailed`; past
        ``timeout`` seconds, :class:`JobTimeout` (the job goes on)::

            job = owner.wait(owner.submit_job(dataset, spec), timeout=7200)
            assert job.state == "succeeded"
        """
        last: Job | None = None
        for seen in self.follow(job, interval=interval, max_interval=max_interval, timeout=timeout):
            last = seen
        assert last is not None  # follow yields at least once
        if check and last.state != "succeeded":
            raise JobFailed(last)
        return last

    def release(
        self, job: Ref, client_organisations: Sequence[Ref], *, name: str | None = None
    ) -> Release:
        """Release a succeeded job's corpus to the named client organisations (their
        ids, or the :class:`Organisation` objects)::

            release = owner.release(job, [lab_id], name="cardio v1")
        """
        body: dict[str, Any] = {"client_organisations": [_ref(c) for c in client_organisations]}
        if name is not None:
            body["name"] = name
        return self._one(Release, "POST", f"/v1/jobs/{_ref(job)}/release", json=body)

    # ------------------------------------------------------------------ client organisation

    def list_releases(self) -> list[Release]:
        """Owners see their releases, clients those granted to them (newest first)."""
        return self._many(Release, "/v1/releases")

    def get_release(self, release: Ref) -> Release:
        return self._one(Release, "GET", f"/v1/releases/{_ref(release)}")

    def download(
        self,
        release: Ref,
        destination: str | os.PathLike[str] | IO[bytes],
        *,
        format: DownloadFormat = "jsonl",
        chunk_size: int = CHUNK_SIZE,
        compression: DownloadCompression = "none",
    ) -> int:
        """Stream a release's corpus to a file, ``chunk_size`` bytes at a time; returns
        the bytes written. A path is written under a ``.part`` name and renamed when
        complete, so a broken download never passes for a whole one. Formats: ``jsonl``
        (``{"label", "text", "keyphrases"}`` a line), ``csv`` (``label, text,
        keyphrases``, phrases joined by ``"; "``, formula-like cells escaped with ``'``),
        ``parquet`` (the JSONL's columns and types). ``compression`` (``gzip``,
        ``zstd``; not for Parquet) gets the file compressed, written as it comes (a
        ``.gz`` or ``.zst`` file). Each download is an audit event::

            lab.download(release, "corpus.parquet", format="parquet")
            # datasets.load_dataset("parquet", data_files="corpus.parquet")
        """
        path = f"/v1/releases/{_ref(release)}/download"
        params = {"format": format, "compression": compression}
        with self._http.stream("GET", path, params=params) as response:
            if response.is_error:
                response.read()
                raise KeyseedError.from_response(response)
            if not isinstance(destination, str | os.PathLike):
                return self._copy(response, destination, chunk_size)
            target = Path(destination)
            partial = target.with_name(target.name + ".part")
            try:
                with partial.open("wb") as out:
                    written = self._copy(response, out, chunk_size)
                partial.replace(target)
            finally:
                partial.unlink(missing_ok=True)
            return written

    @staticmethod
    def _copy(response: httpx.Response, out: IO[bytes], chunk_size: int) -> int:
        written = 0
        for chunk in response.iter_bytes(chunk_size):
            out.write(chunk)
            written += len(chunk)
        return written

    def iter_release(self, release: Ref) -> Iterator[dict[str, Any]]:
        """The release's documents one at a time, read from the JSONL stream as they
        arrive (``{"label": …, "text": …, "keyphrases": [...]}``). Each call is a
        download, audited as one."""
        path = f"/v1/releases/{_ref(release)}/download"
        with self._http.stream("GET", path, params={"format": "jsonl"}) as response:
            if response.is_error:
                response.read()
                raise KeyseedError.from_response(response)
            for line in response.iter_lines():
                if line:
                    record: dict[str, Any] = json.loads(line)
                    yield record

    # ------------------------------------------------------------------ privacy officer

    def ledger(self, dataset: Ref) -> Ledger:
        """A dataset's ledger: its budget, every entry (reserve, commit, release …) with
        its releases, and each job's report of what its engine released."""
        return self._one(Ledger, "GET", f"/v1/datasets/{_ref(dataset)}/ledger")

    def audit_events(
        self,
        *,
        kind: str | Sequence[str] | None = None,
        organisation: Ref | None = None,
        actor: str | None = None,
        target_id: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        cursor: int | None = None,
        limit: int = 100,
    ) -> AuditPage:
        """One page of audit events, newest first (admin, auditor); pass the page's
        ``next_cursor`` as ``cursor`` for the next. ``since`` and ``until`` must carry
        a time zone."""
        params: list[tuple[str, str]] = [("limit", str(limit))]
        if kind is not None:
            params += [("kind", k) for k in _names(kind)]
        optional: dict[str, Any] = {
            "organisation_id": _ref(organisation) if organisation is not None else None,
            "actor": actor,
            "target_id": target_id,
            "since": since.isoformat() if since else None,
            "until": until.isoformat() if until else None,
            "cursor": cursor,
        }
        params += [(k, str(v)) for k, v in optional.items() if v is not None]
        return self._one(AuditPage, "GET", "/v1/audit/events", params=params)

    def iter_audit_events(self, **filters: Any) -> Iterator[AuditEvent]:
        """Every audit event matching the filters of :meth:`audit_events`, newest first,
        fetched a page at a time."""
        filters.pop("cursor", None)
        cursor: int | None = None
        while True:
            page = self.audit_events(cursor=cursor, **filters)
            yield from page.events
            if page.next_cursor is None:
                return
            cursor = page.next_cursor
