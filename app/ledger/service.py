"""The privacy-budget ledger (service.md, "Budget ledger").

Each job leaves at most one entry of each kind:

* ``reserve``: written with the job, atomically against the dataset's cap;
* ``commit``: written when a worker first reads the private documents; the job's ε is
  spent from then on, whatever becomes of the job;
* ``release``: written when a job ends before any private read; its reservation is free.

Each entry lists the releases it stands for, as planned (:mod:`app.ledger.events`); once
the engine has run the mechanisms, a report beside the ledger lists them as it recorded
them, so that an auditor can reconcile every job from the ledger alone.

Figures follow from the entries alone: ``spent = Σ commit``, ``reserved = Σ reserve −
Σ commit − Σ release``, ``remaining = cap − spent − reserved``. Composition across jobs
is basic (sums). Sums are taken over decimals of the stored floats' shortest ``repr``,
so ten jobs of ε = 0.1 fit a cap of 1 exactly. Every change to the figures happens with
the dataset row locked (``SELECT … FOR UPDATE``; SQLite transactions are IMMEDIATE).

Organisation budgets (issue 14, item 9): an owner organisation holds a budget (ε, δ) set
by admins, and its datasets' caps are carved out of it. What a dataset carves is its cap
while it lives, and what it has spent or reserved once it is deleted (its unspent rest
returns to the organisation; nothing it spent ever does). So re-uploading a corpus never
yields a fresh budget: the new dataset's cap comes out of what the organisation has
left. Caps compose basically into the organisation's figure (an (ε₁, δ₁) and an (ε₂, δ₂)
guarantee make an (ε₁ + ε₂, δ₁ + δ₂) one, whoever's the patients), so with every
dataset within its cap the organisation stays within its budget. Every change to what
is carved (an upload, a cap change, a budget change) locks the organisation row first.
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from sqlalchemy.orm import Session

from app.config import Settings
from app.datasets import repository as datasets_repo
from app.datasets.schemas import LedgerReportOut
from app.errors import BudgetExceeded, Conflict, NotFound
from app.identity.policy import Actor
from app.jobs import repository as jobs_repo
from app.ledger import amounts, audit, repository
from app.ledger import events as ledger_events
from app.ledger.schemas import AmountOut, OrganisationBudgetOut
from app.models import Dataset, Job, LedgerEntry, LedgerReport, Organisation
from workers.dpkps.accounting import ACCOUNTANT


def as_decimal(value: float) -> Decimal:
    return Decimal(repr(float(value)))


def total(values: Iterable[float]) -> float:
    return float(sum((as_decimal(v) for v in values), Decimal(0)))


@dataclass(frozen=True)
class Budget:
    epsilon_cap: float
    spent: float
    reserved: float
    remaining: float
    delta_cap: float
    accountant: str = ACCOUNTANT


def _figures(cap: float, delta_cap: float, sums: Mapping[str, Decimal]) -> Budget:
    spent = sums["commit"]
    reserved = sums["reserve"] - sums["commit"] - sums["release"]
    remaining = as_decimal(cap) - spent - reserved
    return Budget(
        float(as_decimal(cap)), float(spent), float(reserved), float(remaining), delta_cap
    )


def _no_sums() -> dict[str, Decimal]:
    return {kind: Decimal(0) for kind in ("reserve", "commit", "release")}


def running_budgets(
    cap: float, delta_cap: float, entries: Iterable[LedgerEntry]
) -> Iterator[Budget]:
    """The figures after each entry in turn, against today's cap (the last are
    :func:`budget_from`'s): the history of a dataset's spend, e.g. for a chart."""
    sums = _no_sums()
    for entry in entries:
        sums[entry.kind] += as_decimal(entry.epsilon)
        yield _figures(cap, delta_cap, sums)


def budget_from(cap: float, delta_cap: float, entries: Iterable[LedgerEntry]) -> Budget:
    last = deque(running_budgets(cap, delta_cap, entries), maxlen=1)
    return last[0] if last else _figures(cap, delta_cap, _no_sums())


def ledger_of(session: Session, dataset: Dataset) -> tuple[Budget, Sequence[LedgerEntry]]:
    """The dataset's budget figures and the entries they follow from, oldest first."""
    entries = repository.entries_of_dataset(session, dataset.id)
    return budget_from(dataset.epsilon_cap, dataset.delta_cap, entries), entries


def budget(session: Session, dataset: Dataset) -> Budget:
    """The single source of every budget figure the API and the dashboard show."""
    return ledger_of(session, dataset)[0]


def _entry(job: Job, kind: str, actor: Actor, events: Sequence[ledger_events.Event]) -> LedgerEntry:
    return LedgerEntry(
        dataset_id=job.dataset_id,
        job_id=job.id,
        kind=kind,
        epsilon=job.epsilon,
        delta=0.0,
        epsilon_by_mechanism=dict(job.epsilon_by_mechanism),
        events=[dict(e) for e in events],
        accountant=ACCOUNTANT,
        actor=actor.ref,
    )


def _locked_dataset(session: Session, dataset_id: uuid.UUID) -> Dataset:
    dataset = datasets_repo.get(session, dataset_id, for_update=True)
    if dataset is None:
        raise NotFound("no such dataset")
    return dataset


def reserve(
    session: Session, job: Job, actor: Actor, events: Sequence[ledger_events.Event]
) -> LedgerEntry:
    """Add ``job`` and reserve its whole ε, or raise :class:`BudgetExceeded`. ``events``
    are the releases the job plans (:func:`app.ledger.events.planned`)."""
    dataset = _locked_dataset(session, job.dataset_id)
    if dataset.deleted_at is not None:
        raise Conflict("the dataset was deleted; it takes no new job")
    figures = budget(session, dataset)
    if as_decimal(job.epsilon) > as_decimal(figures.remaining):
        raise BudgetExceeded(
            f"the job asks for ε = {job.epsilon:g} but the dataset has ε = "
            f"{max(figures.remaining, 0.0):g} left (cap {figures.epsilon_cap:g}, spent "
            f"{figures.spent:g}, reserved {figures.reserved:g})",
            requested=job.epsilon,
            requested_by_mechanism=dict(job.epsilon_by_mechanism),
            remaining=max(figures.remaining, 0.0),
            epsilon_cap=figures.epsilon_cap,
            spent=figures.spent,
            reserved=figures.reserved,
        )
    jobs_repo.add(session, job)
    return repository.add_entry(session, _entry(job, "reserve", actor, events))


def _job_entries(session: Session, job_id: uuid.UUID) -> tuple[Job, Mapping[str, LedgerEntry]]:
    job = jobs_repo.get(session, job_id)
    if job is None:
        raise NotFound("no such job")
    _locked_dataset(session, job.dataset_id)
    return job, repository.entries_of_job(session, job_id)


def commit_spend(session: Session, job_id: uuid.UUID, actor: Actor) -> LedgerEntry:
    """Turn the job's reservation into spent budget; idempotent (charged exactly once).

    Call it before the first read of the private documents. Raises :class:`Conflict`
    when the reservation was released (the job was cancelled before any read): the
    caller must then not read the documents.
    """
    job, entries = _job_entries(session, job_id)
    if "commit" in entries:
        return entries["commit"]
    if "release" in entries or "reserve" not in entries:
        raise Conflict("the job holds no reservation to spend")
    return repository.add_entry(session, _entry(job, "commit", actor, entries["reserve"].events))


def release_reservation(session: Session, job_id: uuid.UUID, actor: Actor) -> LedgerEntry:
    """Free the reservation of a job that never read private data; idempotent."""
    job, entries = _job_entries(session, job_id)
    if "release" in entries:
        return entries["release"]
    if "commit" in entries:
        raise Conflict("the job has read the private documents: its budget stays spent")
    return repository.add_entry(session, _entry(job, "release", actor, entries["reserve"].events))


def record_report(
    session: Session, job: Job, privacy: Mapping[str, Any] | None, actor: Actor
) -> LedgerReport:
    """Record the releases the engine reports it made (its manifest's ``privacy`` block)
    once, after the commit; idempotent. It moves no budget, so it takes no dataset lock:
    the caller holds the job's row lock."""
    existing = repository.report_of_job(session, job.id)
    if existing is not None:
        return existing
    if job_budget_state(session, job.id) != "committed":
        raise Conflict("the job has spent nothing: it has no releases to report")
    privacy = privacy or {}
    return repository.add_report(
        session,
        LedgerReport(
            dataset_id=job.dataset_id,
            job_id=job.id,
            epsilon=float(privacy.get("epsilon_total", job.epsilon)),
            events=ledger_events.reported(privacy),
            accountant=str(privacy.get("accountant", ACCOUNTANT)),
            actor=actor.ref,
        ),
    )


def reports_of(session: Session, dataset: Dataset) -> Sequence[LedgerReport]:
    return repository.reports_of_dataset(session, dataset.id)


def reports_out(
    session: Session, dataset: Dataset, entries: Sequence[LedgerEntry]
) -> list[LedgerReportOut]:
    """The dataset's reports, each with its differences from the job's entries."""
    by_job: dict[uuid.UUID, dict[str, LedgerEntry]] = {}
    for entry in entries:
        by_job.setdefault(entry.job_id, {})[entry.kind] = entry
    out = []
    for report in reports_of(session, dataset):
        shown = LedgerReportOut.model_validate(report)
        shown.differences = reconciliation(by_job.get(report.job_id, {}), report) or []
        out.append(shown)
    return out


def reconciliation(
    entries: Mapping[str, LedgerEntry], report: LedgerReport | None
) -> list[str] | None:
    """How a job's reported releases differ from those it was charged for (None: no
    report yet; empty: they match)."""
    if report is None or "reserve" not in entries:
        return None
    return ledger_events.reconcile(entries["reserve"].events, report.events)


def budget_state(kinds: Collection[str]) -> str:
    """``reserved``, ``committed`` or ``released``: where a job's ε stands, given the kinds
    of its ledger entries."""
    if "commit" in kinds:
        return "committed"
    return "released" if "release" in kinds else "reserved"


def job_budget_state(session: Session, job_id: uuid.UUID) -> str:
    """``reserved``, ``committed`` or ``released``: where the job's ε stands."""
    return budget_state(repository.entries_of_job(session, job_id).keys())


def epsilon_spent_total(session: Session) -> float:
    return total(repository.committed_epsilons(session))


# -- organisation budgets ---------------------------------------------------------------


@dataclass(frozen=True)
class Amount:
    """An exact (ε, δ) pair: a budget, a cap, or what is carved or left of a budget."""

    epsilon: Decimal
    delta: Decimal

    @classmethod
    def zero(cls) -> Amount:
        return cls(Decimal(0), Decimal(0))

    @classmethod
    def granted(cls, epsilon: float | Decimal, delta: float | Decimal) -> Amount:
        """A cap or a budget from request figures, rounded down to the stored unit."""
        return cls(amounts.epsilon(epsilon), amounts.delta(delta))

    def __add__(self, other: Amount) -> Amount:
        return Amount(self.epsilon + other.epsilon, self.delta + other.delta)

    def __sub__(self, other: Amount) -> Amount:
        return Amount(self.epsilon - other.epsilon, self.delta - other.delta)

    def within(self, other: Amount) -> bool:
        return self.epsilon <= other.epsilon and self.delta <= other.delta

    def shown(self) -> dict[str, float]:
        return {"epsilon": amounts.shown(self.epsilon), "delta": amounts.shown(self.delta)}

    def text(self) -> str:
        return f"ε = {amounts.shown(self.epsilon):g}, δ = {amounts.shown(self.delta):g}"


def initial_budget(settings: Settings, epsilon: float | None, delta: float | None) -> Amount:
    """A new owner organisation's budget: the figures given, else the server's default."""
    return Amount.granted(
        settings.default_organisation_epsilon if epsilon is None else epsilon,
        settings.default_organisation_delta if delta is None else delta,
    )


def budget_of(organisation: Organisation) -> Amount:
    return Amount(organisation.epsilon_budget, organisation.delta_budget)


def cap_of(dataset: Dataset) -> Amount:
    return Amount.granted(dataset.epsilon_cap, dataset.delta_cap)


@dataclass(frozen=True)
class OrganisationBudget:
    """An organisation's budget, what its datasets carve out of it, and their spend."""

    organisation_id: uuid.UUID
    budget: Amount  # set by admins
    allocated: Amount  # carved: live datasets' caps, deleted datasets' spend
    remaining: Amount  # budget − allocated: what new or raised caps may take
    datasets: int
    spent: float  # composed over the datasets' committed entries
    reserved: float
    accountant: str = ACCOUNTANT


def _carved(dataset: Dataset, entries: Sequence[LedgerEntry]) -> Amount:
    """What one dataset takes out of its organisation's budget: its cap while it lives,
    its spent and reserved ε once deleted (DP-KPS releases are pure ε-DP: δ = 0)."""
    if dataset.deleted_at is None:
        return cap_of(dataset)
    figures = budget_from(dataset.epsilon_cap, dataset.delta_cap, entries)
    used = as_decimal(figures.spent) + as_decimal(figures.reserved)
    return Amount(amounts.epsilon(used, charge=True), Decimal(0))


def organisation_budget(
    session: Session, organisation: Organisation, *, excluding: uuid.UUID | None = None
) -> OrganisationBudget:
    """The single source of an organisation's budget figures (``excluding`` one dataset,
    whose cap is about to change)."""
    by_dataset: dict[uuid.UUID, list[LedgerEntry]] = {}
    for entry in repository.entries_of_organisation(session, organisation.id):
        by_dataset.setdefault(entry.dataset_id, []).append(entry)
    allocated, spent, reserved = Amount.zero(), Decimal(0), Decimal(0)
    datasets = repository.datasets_of_organisation(session, organisation.id)
    for dataset in datasets:
        entries = by_dataset.get(dataset.id, [])
        figures = budget_from(dataset.epsilon_cap, dataset.delta_cap, entries)
        spent += as_decimal(figures.spent)
        reserved += as_decimal(figures.reserved)
        if dataset.id != excluding:
            allocated += _carved(dataset, entries)
    budget = budget_of(organisation)
    return OrganisationBudget(
        organisation.id,
        budget,
        allocated,
        budget - allocated,
        len(datasets),
        float(spent),
        float(reserved),
    )


def _locked_organisation(session: Session, organisation_id: uuid.UUID) -> Organisation:
    organisation = repository.organisation(session, organisation_id, for_update=True)
    if organisation is None:
        raise NotFound("no such organisation")
    return organisation


def _refuse_cap(asked: Amount, figures: OrganisationBudget, action: str) -> BudgetExceeded:
    left = figures.remaining
    left = Amount(max(left.epsilon, Decimal(0)), max(left.delta, Decimal(0)))
    return BudgetExceeded(
        f"{action} asks for {asked.text()} but the organisation has {left.text()} left of "
        f"its budget ({figures.budget.text()}; its datasets hold {figures.allocated.text()}); "
        "an admin can raise the organisation's budget",
        requested=asked.shown(),
        remaining=figures.remaining.shown(),
        organisation_budget=figures.budget.shown(),
        allocated=figures.allocated.shown(),
    )


def carve(session: Session, organisation_id: uuid.UUID, cap: Amount) -> None:
    """Check that a new dataset's cap fits in what its organisation has left, or raise
    :class:`BudgetExceeded`. The organisation row stays locked until the upload commits,
    so two uploads cannot both take the same rest."""
    organisation = _locked_organisation(session, organisation_id)
    figures = organisation_budget(session, organisation)
    if not cap.within(figures.remaining):
        raise _refuse_cap(cap, figures, "the dataset's cap")


def check_cap_change(session: Session, dataset: Dataset, cap: Amount) -> None:
    """Check that ``dataset``'s new cap fits in its organisation's budget beside the
    other datasets' caps, or raise :class:`BudgetExceeded`."""
    organisation = _locked_organisation(session, dataset.organisation_id)
    figures = organisation_budget(session, organisation, excluding=dataset.id)
    if not cap.within(figures.remaining):
        raise _refuse_cap(cap, figures, "the new cap")


def set_organisation_budget(
    session: Session, actor: Actor, organisation_id: uuid.UUID, budget: Amount, reason: str
) -> OrganisationBudget:
    """Set an owner organisation's budget (an admin's act, with a reason, audited). It
    cannot go below what its datasets hold: lower a dataset's cap first."""
    organisation = _locked_organisation(session, organisation_id)
    if organisation.kind != "owner":
        raise Conflict(
            f"only owner organisations hold a privacy budget (this one is {organisation.kind})"
        )
    figures = organisation_budget(session, organisation)
    if not figures.allocated.within(budget):
        raise Conflict(
            f"the organisation's datasets hold {figures.allocated.text()}; its budget cannot "
            "go below it",
            allocated=figures.allocated.shown(),
        )
    previous = budget_of(organisation)
    organisation.epsilon_budget, organisation.delta_budget = budget.epsilon, budget.delta
    session.flush()
    audit.record(
        session,
        "organisation.budget_changed",
        actor,
        organisation_id=organisation.id,
        target=("organisation", organisation.id),
        previous=previous.shown(),
        budget=budget.shown(),
        reason=reason,
    )
    return organisation_budget(session, organisation)


def get_organisation_budget(session: Session, organisation_id: uuid.UUID) -> OrganisationBudget:
    organisation = repository.organisation(session, organisation_id)
    if organisation is None:
        raise NotFound("no such organisation")
    return organisation_budget(session, organisation)


def organisation_budget_out(figures: OrganisationBudget) -> OrganisationBudgetOut:
    return OrganisationBudgetOut(
        organisation_id=figures.organisation_id,
        budget=AmountOut(**figures.budget.shown()),
        allocated=AmountOut(**figures.allocated.shown()),
        remaining=AmountOut(**figures.remaining.shown()),
        datasets=figures.datasets,
        spent=figures.spent,
        reserved=figures.reserved,
        accountant=figures.accountant,
    )
