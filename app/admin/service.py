"""What the dashboard's pages show, assembled from the domain services.

Nothing here computes a budget figure or queries the audit trail itself: figures come
from :mod:`app.ledger.service` (``budget``, ``ledger_of``, ``running_budgets``), events
from :func:`app.ledger.audit.list_events`, and datasets, jobs and keys from their own
services, called with the signed-in person's principal so that the access policy
applies exactly as it does on the API. The pages and the API therefore show the same
numbers.
"""

from __future__ import annotations

import csv
import io
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from pydantic import ValidationError
from sqlalchemy.orm import Session

from app.admin import formatting, repository
from app.admin.chart import Chart, cumulative_chart, organisation_chart
from app.datasets import service as datasets
from app.datasets.schemas import CapChange
from app.db import Database
from app.errors import NotFound, Unprocessable
from app.identity import policy
from app.identity import repository as identity_repo
from app.identity import service as identity
from app.identity.policy import Action, Principal
from app.jobs import service as jobs
from app.ledger import audit
from app.ledger import service as ledger
from app.ledger.audit import EventFilter
from app.models import (
    ApiKey,
    AuditEvent,
    Dataset,
    Download,
    Job,
    LedgerEntry,
    LedgerReport,
    Organisation,
    Release,
)
from app.releases import export
from app.releases import repository as releases_repo

NEAR_CAP_SHARE = 0.10  # a dataset with less than this share of its cap left stands out
AUDIT_PAGE_SIZE = 50
EXPORT_BATCH = 500


# -- budgets ----------------------------------------------------------------------------


@dataclass(frozen=True)
class BudgetView:
    """A dataset's figures (from the ledger service) and how to draw them."""

    figures: ledger.Budget

    def _share(self, value: Decimal) -> float:
        cap = float(self.figures.epsilon_cap)
        return min(max(float(value) / cap, 0.0), 1.0) if cap > 0 else 0.0

    @property
    def spent_share(self) -> float:
        return self._share(self.figures.spent)

    @property
    def reserved_share(self) -> float:
        return min(self._share(self.figures.reserved), 1.0 - self.spent_share)

    @property
    def left_share(self) -> float:
        return self._share(self.figures.remaining)

    @property
    def exhausted(self) -> bool:
        return self.figures.remaining <= 0

    @property
    def near_cap(self) -> bool:
        return float(self.figures.remaining) < NEAR_CAP_SHARE * float(self.figures.epsilon_cap)

    @property
    def warning(self) -> str | None:
        """Why the dataset stands out, in words (None: it does not)."""
        if self.exhausted:
            return "Budget exhausted: no ε is left for a new job."
        if self.near_cap:
            return (
                f"Near its cap: {formatting.percent(self.left_share)} of the ε cap is left "
                f"(under {formatting.percent(NEAR_CAP_SHARE)})."
            )
        return None


# -- names of organisations and actors --------------------------------------------------


def organisation_names(session: Session) -> dict[uuid.UUID, str]:
    return {o.id: o.name for o in identity.list_organisations(session)}


def _ids(refs: Iterable[str], kind: str) -> list[uuid.UUID]:
    found = []
    for ref in refs:
        prefix, _, value = ref.partition(":")
        if prefix == kind:
            try:
                found.append(uuid.UUID(value))
            except ValueError:
                continue
    return found


def actor_labels(session: Session, refs: Iterable[str]) -> dict[str, str]:
    """Readable names of actor references: ``user:<id>`` → the person's name and role,
    ``key:<id>`` → the key's prefix, name, role and organisation."""
    refs = set(refs)
    users = {str(k): u for k, u in identity_repo.users_by_id(session, _ids(refs, "user")).items()}
    keys = {str(k): v for k, v in identity_repo.keys_by_id(session, _ids(refs, "key")).items()}
    organisations = organisation_names(session) if keys else {}
    labels = {}
    for ref in refs:
        prefix, _, value = ref.partition(":")
        label = ref
        user = users.get(value) if prefix == "user" else None
        key = keys.get(value) if prefix == "key" else None
        if user is not None:
            label = f"{user.username} ({user.role})"
        elif key is not None:
            named = f" “{key.name}”" if key.name else ""
            owner = organisations.get(key.organisation_id, "?")
            label = f"{key.role} key {key.prefix}{named} of {owner}"
        elif prefix == "system":
            label = f"system ({value})"
        labels[ref] = label
    return labels


# -- overview ---------------------------------------------------------------------------


@dataclass(frozen=True)
class DatasetRow:
    dataset: Dataset
    organisation: str
    budget: BudgetView


SORTS: dict[str, Callable[[DatasetRow], Any]] = {
    "name": lambda r: (r.dataset.name.casefold(), str(r.dataset.id)),
    "organisation": lambda r: (r.organisation.casefold(), r.dataset.name.casefold()),
    "cap": lambda r: r.budget.figures.epsilon_cap,
    "spent": lambda r: r.budget.figures.spent,
    "reserved": lambda r: r.budget.figures.reserved,
    "remaining": lambda r: r.budget.figures.remaining,
    "left": lambda r: (r.budget.left_share, r.budget.figures.remaining),
}
DEFAULT_SORT = "left"  # the datasets nearest their cap first


def overview(
    session: Session, principal: Principal, *, sort: str, descending: bool
) -> list[DatasetRow]:
    names = organisation_names(session)
    rows = [
        DatasetRow(d, names.get(d.organisation_id, "?"), BudgetView(ledger.budget(session, d)))
        for d in datasets.list_datasets(session, principal)
    ]
    rows.sort(key=SORTS.get(sort, SORTS[DEFAULT_SORT]), reverse=descending)
    return rows


# -- organisations ----------------------------------------------------------------------


@dataclass(frozen=True)
class OrganisationRow:
    organisation: Organisation
    figures: ledger.OrganisationBudget


def organisations(session: Session, principal: Principal) -> list[OrganisationRow]:
    """Every owner organisation with its budget figures (the ledger service's)."""
    policy.authorize(principal, Action.ORGANISATION_LIST)
    owners = identity.list_organisations(session, "owner")
    rows = [OrganisationRow(o, ledger.organisation_budget(session, o)) for o in owners]
    rows.sort(key=lambda r: (r.organisation.name.casefold(), str(r.organisation.id)))
    return rows


@dataclass(frozen=True)
class OrganisationPage:
    """An organisation's budget (ε, δ), each dataset's cap and spend, and its spend over
    time. Only budget figures: no raw count of any upload."""

    organisation: Organisation
    figures: ledger.OrganisationBudget
    datasets: Sequence[DatasetRow]
    chart: Chart | None
    entries: int  # ledger entries the chart follows

    @property
    def accountants(self) -> list[str]:
        names = [self.figures.accountant] if self.entries else []
        return names + [r.budget.figures.accountant for r in self.datasets]


def organisation_page(
    session: Session, principal: Principal, organisation_id: uuid.UUID
) -> OrganisationPage:
    policy.authorize(principal, Action.ORGANISATION_READ_BUDGET)
    policy.ensure_visible(principal, organisation_id, "organisation")
    organisation = identity_repo.get_organisation(session, organisation_id)
    if organisation is None:
        raise NotFound("no such organisation")
    figures = ledger.organisation_budget(session, organisation)
    rows = [
        DatasetRow(d, organisation.name, BudgetView(ledger.budget(session, d)))
        for d in datasets.list_datasets(session, principal)
        if d.organisation_id == organisation.id
    ]
    rows.sort(key=SORTS["name"])
    history = ledger.organisation_history(session, organisation)
    names = {r.dataset.id: r.dataset.name for r in rows}
    return OrganisationPage(
        organisation=organisation,
        figures=figures,
        datasets=rows,
        chart=organisation_chart(ledger.budget_of(organisation), history, names),
        entries=len(history),
    )


# -- one dataset ------------------------------------------------------------------------


@dataclass(frozen=True)
class LedgerJob:
    """One job as the ledger sees it: its mechanisms and ε, and where that ε stands."""

    job_id: uuid.UUID
    epsilon: Decimal
    by_mechanism: Mapping[str, Any]
    budget_state: str
    submitted_by: str
    reserved_at: datetime
    committed_at: datetime | None
    freed_at: datetime | None  # the reservation freed (the job ended before any read)
    job: Job | None
    events: Sequence[Mapping[str, Any]] = ()  # planned: what the job is charged for
    report: LedgerReport | None = None  # the noisy releases the engine reports it made
    differences: Sequence[str] | None = None  # None: no report yet

    @property
    def reconciliation(self) -> str:
        if self.differences is None:
            return "no report yet"
        if not self.differences:
            return "matches the engine’s report"
        return "differs: " + "; ".join(self.differences)


@dataclass(frozen=True)
class EventRow:
    """One noisy release (measurement) of a job, as charged (planned, on its ledger
    entries) or as made (in the engine's report)."""

    job_id: uuid.UUID
    source: str  # "charged" | "made"
    event: Mapping[str, Any]


def event_rows(jobs: Sequence[LedgerJob]) -> list[EventRow]:
    rows: list[EventRow] = []
    for job in jobs:
        rows += [EventRow(job.job_id, "charged", e) for e in job.events]
        if job.report is not None:
            rows += [EventRow(job.job_id, "made", e) for e in job.report.events]
    return rows


@dataclass(frozen=True)
class ReleaseRow:
    release: Release
    grantees: list[str]
    downloads: int


@dataclass(frozen=True)
class DownloadRow:
    download: Download
    release: str
    organisation: str


@dataclass(frozen=True)
class DatasetPage:
    dataset: Dataset
    organisation: str
    budget: BudgetView
    organisation_budget: ledger.OrganisationBudget
    entries: Sequence[LedgerEntry]
    ledger_jobs: Sequence[LedgerJob]
    events: Sequence[EventRow]
    chart: Chart | None
    jobs: Sequence[Job]
    releases: Sequence[ReleaseRow]
    downloads: Sequence[DownloadRow]
    cap_changes: Sequence[AuditEvent]
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def accountants(self) -> list[str]:
        """The accountants behind the page's figures: the budget's and each entry's."""
        return [self.budget.figures.accountant, *(e.accountant for e in self.entries)]

    @property
    def parallel(self) -> dict[str, int]:
        """Mechanisms charged per class, and over how many classes (public inputs: the
        planned events' partitions), for the words on parallel composition."""
        classes: dict[str, set[str]] = {}
        for row in self.events:
            partition = row.event.get("partition")
            if row.source == "charged" and partition:
                classes.setdefault(str(row.event.get("mechanism")), set()).add(str(partition))
        return {name: len(found) for name, found in sorted(classes.items()) if len(found) > 1}


def _shown_time(entry: LedgerEntry | None) -> datetime | None:
    """An entry's time as the dashboard (admins, auditors) shows it: None for one a
    worker wrote (:func:`app.ledger.service.time_shown`)."""
    if entry is None or not ledger.time_shown(entry.actor, owner=False):
        return None
    return entry.created_at


def _ledger_jobs(
    entries: Sequence[LedgerEntry],
    jobs_by_id: Mapping[uuid.UUID, Job],
    reports: Mapping[uuid.UUID, LedgerReport],
) -> list[LedgerJob]:
    by_job: dict[uuid.UUID, dict[str, LedgerEntry]] = {}
    for entry in entries:
        by_job.setdefault(entry.job_id, {})[entry.kind] = entry
    rows: list[LedgerJob] = []
    for job_id, kinds in by_job.items():
        first = kinds.get("reserve") or next(iter(kinds.values()))
        job = jobs_by_id.get(job_id)
        rows.append(
            LedgerJob(
                job_id=job_id,
                epsilon=first.epsilon,
                by_mechanism=first.epsilon_by_mechanism,
                budget_state=ledger.budget_state(kinds.keys()),
                submitted_by=job.submitted_by if job is not None else first.actor,
                reserved_at=first.created_at,
                committed_at=_shown_time(kinds.get("commit")),
                freed_at=_shown_time(kinds.get("release")),
                job=job,
                events=first.events,
                report=reports.get(job_id),
                differences=ledger.reconciliation(kinds, reports.get(job_id)),
            )
        )
    return rows


def dataset_page(session: Session, principal: Principal, dataset_id: uuid.UUID) -> DatasetPage:
    dataset = datasets.get_dataset(session, principal, dataset_id)
    names = organisation_names(session)
    figures, entries = ledger.ledger_of(session, dataset)
    job_list = jobs.list_jobs(session, principal, dataset.id)
    releases = repository.releases_of_dataset(session, dataset.id)
    release_names = {r.id: r.name for r in releases}
    downloads = repository.downloads_of_dataset(session, dataset.id)
    download_counts: dict[uuid.UUID, int] = {}
    for download in downloads:
        download_counts[download.release_id] = download_counts.get(download.release_id, 0) + 1
    cap_changes, _ = audit.list_events(
        session,
        EventFilter(kinds=("dataset.cap_changed",), target_id=str(dataset.id)),
        before_id=None,
        limit=100,
    )
    reports = {r.job_id: r for r in ledger.reports_of(session, dataset)}
    ledger_jobs = _ledger_jobs(entries, {j.id: j for j in job_list}, reports)
    refs = {
        *(e.actor for e in entries),
        *(j.submitted_by for j in ledger_jobs),
        *(j.submitted_by for j in job_list),
        *(r.created_by for r in releases),
        *(d.actor for d in downloads),
        *(e.actor for e in cap_changes),
    }
    return DatasetPage(
        dataset=dataset,
        organisation=names.get(dataset.organisation_id, "?"),
        budget=BudgetView(figures),
        organisation_budget=ledger.get_organisation_budget(session, dataset.organisation_id),
        entries=entries,
        ledger_jobs=ledger_jobs,
        events=event_rows(ledger_jobs),
        chart=cumulative_chart(ledger.cap_of(dataset), entries),
        jobs=job_list,
        releases=[
            ReleaseRow(
                r,
                sorted(
                    (names.get(g, str(g)) for g in releases_repo.grantees(session, r.id)),
                    key=str.casefold,
                ),
                download_counts.get(r.id, 0),
            )
            for r in releases
        ],
        downloads=[
            DownloadRow(d, release_names.get(d.release_id, "?"), names.get(d.organisation_id, "?"))
            for d in downloads
        ],
        cap_changes=cap_changes,
        labels=actor_labels(session, refs),
    )


def change_cap(
    session: Session, principal: Principal, dataset_id: uuid.UUID, cap: str, reason: str
) -> Dataset:
    """Set the cap from the form's text, validated as the API validates it."""
    try:
        change = CapChange.model_validate({"epsilon_cap": cap.strip(), "reason": reason.strip()})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = "reason" if first["loc"] and first["loc"][0] == "reason" else "epsilon_cap"
        message = {
            "reason": "give a reason of 3 to 1000 characters (it goes to the audit log)",
            "epsilon_cap": "the cap is a number above 0 and at most 1000",
        }[where]
        raise Unprocessable(message, field=where) from None
    return datasets.set_cap(session, principal, dataset_id, change.epsilon_cap, change.reason)


# -- audit log --------------------------------------------------------------------------


@dataclass(frozen=True)
class AuditQuery:
    """The audit page's filters as the form sends them (text; blank means any)."""

    organisation: str = ""
    actor: str = ""
    kind: str = ""
    date_from: str = ""
    date_to: str = ""

    def params(self) -> dict[str, str]:
        values = {
            "organisation": self.organisation,
            "actor": self.actor,
            "kind": self.kind,
            "from": self.date_from,
            "to": self.date_to,
        }
        return {k: v for k, v in values.items() if v}

    def to_filter(self) -> tuple[EventFilter, dict[str, str]]:
        """The filter, and the problems with the form by field (empty: none)."""
        problems: dict[str, str] = {}
        organisation_id = None
        if self.organisation:
            try:
                organisation_id = uuid.UUID(self.organisation)
            except ValueError:
                problems["organisation"] = "not an organisation"
        actor = self.actor.strip() or None
        if actor is not None and (len(actor) > 80 or not actor.isprintable()):
            problems["actor"] = "an actor reference has at most 80 printable characters"
        if self.kind and self.kind not in audit.EVENT_KINDS:
            problems["kind"] = "not an event kind"
        since = _day(self.date_from, "from", problems)
        until = _day(self.date_to, "to", problems)
        if since is not None and until is not None and until < since:
            problems["to"] = "the end date is before the start date"
        return (
            EventFilter(
                organisation_id=organisation_id,
                actor=actor,
                kinds=(self.kind,) if self.kind else (),
                since=since,
                until=until + timedelta(days=1) if until is not None else None,
            ),
            problems,
        )


def _day(text: str, name: str, problems: dict[str, str]) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.combine(date.fromisoformat(text), time(0), tzinfo=UTC)
    except ValueError:
        problems[name] = "a date reads YYYY-MM-DD"
        return None


@dataclass(frozen=True)
class AuditPage:
    events: Sequence[AuditEvent]
    next_cursor: int | None
    labels: Mapping[str, str]
    organisations: Mapping[uuid.UUID, str]


def audit_page(
    session: Session, filters: EventFilter, *, cursor: int | None, limit: int = AUDIT_PAGE_SIZE
) -> AuditPage:
    events, next_cursor = audit.list_events(session, filters, before_id=cursor, limit=limit)
    return AuditPage(
        events=events,
        next_cursor=next_cursor,
        labels=actor_labels(session, (e.actor for e in events)),
        organisations=organisation_names(session),
    )


def known_actors(session: Session) -> dict[str, str]:
    """Every person and key, as an actor reference and its label (for the filter form)."""
    refs = [f"user:{u.id}" for u in identity_repo.list_users(session)]
    refs += [f"key:{k.id}" for k in identity_repo.list_keys(session, None)]
    labels = actor_labels(session, refs)
    return {ref: labels[ref] for ref in refs}


CSV_COLUMNS = (
    "id",
    "created_at",
    "kind",
    "actor",
    "actor_label",
    "actor_organisation_id",
    "actor_organisation",
    "organisation_id",
    "organisation",
    "target_type",
    "target_id",
    "details",
    "request_id",
)


def _csv_line(values: Sequence[object]) -> str:
    buffer = io.StringIO()
    cells = ["" if v is None else export.escape_cell(str(v)) for v in values]
    csv.writer(buffer, lineterminator="\r\n").writerow(cells)
    return buffer.getvalue()


def audit_csv(database: Database, filters: EventFilter) -> Iterator[str]:
    """Every event the filters match, newest first, as CSV; each batch is read in its own
    short transaction (no transaction stays open while a slow client reads)."""
    yield _csv_line(CSV_COLUMNS)
    cursor: int | None = None
    while True:
        with database.session() as session:
            page = audit_page(session, filters, cursor=cursor, limit=EXPORT_BATCH)
            names = page.organisations
            lines = [
                _csv_line(
                    (
                        e.id,
                        formatting.iso(e.created_at),
                        e.kind,
                        e.actor,
                        page.labels.get(e.actor, e.actor),
                        e.actor_organisation_id,
                        names.get(e.actor_organisation_id) if e.actor_organisation_id else "",
                        e.organisation_id,
                        names.get(e.organisation_id) if e.organisation_id else "",
                        e.target_type,
                        e.target_id,
                        formatting.details(e.details),
                        e.request_id,
                    )
                )
                for e in page.events
            ]
        yield "".join(lines)
        if page.next_cursor is None:
            return
        cursor = page.next_cursor


# -- API keys ---------------------------------------------------------------------------


@dataclass(frozen=True)
class KeyRow:
    key: ApiKey
    organisation: str


def keys(session: Session, principal: Principal) -> list[KeyRow]:
    names = organisation_names(session)
    listed = identity.list_keys(session, principal)
    rows = [KeyRow(k, names.get(k.organisation_id, "?")) for k in listed]
    rows.sort(key=lambda r: (r.key.revoked_at is not None, r.organisation.casefold()))
    return rows
