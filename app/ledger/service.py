"""The privacy-budget ledger (service.md, "Budget ledger"; issue 15, item 3).

Each job leaves at most one entry of each kind:

* ``reserve``: written with the job, atomically against the dataset's cap;
* ``commit``: written when a worker first reads the private documents; the job's ε is
  spent from then on, whatever becomes of the job;
* ``release``: written when a job ends before any private read; its reservation is free.

Each entry lists the releases the job is charged for (its planned
:class:`~workers.privacy.events.PrivacyEvent` list, :mod:`app.ledger.events`); once the
engine has run them, a report beside the ledger lists them as it made them, so that an
auditor can reconcile every job from the ledger alone.

The figures compose, they do not add: a dataset's cap is (ε, δ), and its ``spent`` is
the shared accountant's ε at the cap's δ over the releases of its committed jobs; its
``spent + reserved`` the same over the committed and reserved jobs (one composition: the
per-class releases of every job compose in parallel across classes,
:func:`workers.privacy.accountant.compose_jobs`), and ``remaining`` is the cap's ε minus
that. A job is reserved only if the composition of everything committed, reserved and
its own releases stays within the cap; each figure names the accountant that made it
(``exact-sum`` for pure-ε releases, whose composition is their exact sum; a PLD once a
Gaussian release is in). Amounts are exact decimals of fixed units
(:mod:`app.ledger.amounts`): ten jobs of ε = 0.1 fit a cap of 1 exactly. Every change to
the figures happens with the dataset row locked (``SELECT … FOR UPDATE``; SQLite
transactions are IMMEDIATE).

Organisation budgets (issue 14, item 9): an owner organisation holds a budget (ε, δ) set
by admins, and its datasets' caps are carved out of it. What a dataset carves is its cap
while it lives, and what it has spent or reserved once it is deleted (its unspent rest
returns to the organisation; nothing it spent ever does). So re-uploading a corpus never
yields a fresh budget: the new dataset's cap comes out of what the organisation has
left. Caps compose basically into the organisation's figure (an (ε₁, δ₁) and an (ε₂, δ₂)
guarantee make an (ε₁ + ε₂, δ₁ + δ₂) one, whoever's the patients), so with every
dataset within its cap the organisation stays within its budget; its ``spent`` is the
accountant's composition of every release of all its datasets, sequentially (one
patient may be in several of them). Every change to what is carved (an upload, a cap
change, a budget change) locks the organisation row first.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal
from fractions import Fraction
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
from workers.privacy.accountant import EXACT_SUM, compose
from workers.privacy.events import PrivacyEvent

INFINITY = Decimal("Infinity")


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

    def at_least_zero(self) -> Amount:
        return Amount(max(self.epsilon, Decimal(0)), max(self.delta, Decimal(0)))

    def shown(self) -> dict[str, float]:
        return {"epsilon": amounts.shown(self.epsilon), "delta": amounts.shown(self.delta)}

    def text(self) -> str:
        return f"ε = {amounts.shown(self.epsilon):g}, δ = {amounts.shown(self.delta):g}"


def cap_of(dataset: Dataset) -> Amount:
    return Amount(dataset.epsilon_cap, dataset.delta_cap)


# -- composition ---------------------------------------------------------------------


def events_of(entry: LedgerEntry | LedgerReport) -> list[PrivacyEvent]:
    return [PrivacyEvent.from_dict(e) for e in entry.events]


@dataclass(frozen=True)
class Composed:
    """What a set of releases costs at one δ: ε (exact, rounded up to the stored unit;
    infinite when no finite ε holds, as for Gaussian releases at δ = 0 or releases that
    spend more δ outright than the δ asked), the δ it is stated at (0 when every release
    is pure ε-DP; the δ a release spends outright is part of it), and the accountant that
    said so."""

    epsilon: Decimal
    delta: Decimal
    accountant: str

    def text(self) -> str:
        eps = "∞" if self.epsilon.is_infinite() else f"{amounts.shown(self.epsilon):g}"
        return f"ε = {eps} at δ = {amounts.shown(self.delta):g}"

    def shown(self) -> dict[str, Any]:
        return {
            "epsilon": _shown(self.epsilon),
            "delta": amounts.shown(self.delta),
            "accountant": self.accountant,
        }


def composed(events: Iterable[PrivacyEvent], delta: Decimal) -> Composed:
    """The accountant's figure for ``events`` at ``delta`` (every figure of the ledger)."""
    composition = compose(events)
    if not composition.events:
        return Composed(Decimal(0), Decimal(0), EXACT_SUM)
    epsilon = composition.epsilon(delta)
    exact = epsilon if epsilon.is_infinite() else amounts.epsilon(epsilon, charge=True)
    return Composed(exact, Decimal(0) if composition.is_pure else delta, composition.name)


@dataclass(frozen=True)
class Budget:
    """A dataset's figures, all ε at the cap's δ (``delta_cap``)."""

    epsilon_cap: Decimal
    delta_cap: Decimal
    spent: Decimal  # the committed jobs' releases, composed
    reserved: Decimal  # the committed and reserved jobs' releases, composed, minus spent
    remaining: Decimal  # the cap minus spent and reserved (negative: a cap lowered below)
    accountant: str
    spent_delta: Decimal = Decimal(0)  # the δ spent is stated at (0: every release pure)


def _by_job(entries: Iterable[LedgerEntry]) -> dict[uuid.UUID, dict[str, LedgerEntry]]:
    jobs: dict[uuid.UUID, dict[str, LedgerEntry]] = {}
    for entry in entries:
        jobs.setdefault(entry.job_id, {})[entry.kind] = entry
    return jobs


def _held(jobs: Mapping[uuid.UUID, Mapping[str, LedgerEntry]]) -> list[PrivacyEvent]:
    """The releases of every job whose ε is reserved or spent (not released)."""
    return [
        event
        for kinds in jobs.values()
        if "release" not in kinds and "reserve" in kinds
        for event in events_of(kinds["reserve"])
    ]


def _spent(jobs: Mapping[uuid.UUID, Mapping[str, LedgerEntry]]) -> list[PrivacyEvent]:
    return [e for kinds in jobs.values() if "commit" in kinds for e in events_of(kinds["commit"])]


def _figures(cap: Amount, jobs: Mapping[uuid.UUID, Mapping[str, LedgerEntry]]) -> Budget:
    spent = composed(_spent(jobs), cap.delta)
    held = composed(_held(jobs), cap.delta)
    return Budget(
        epsilon_cap=cap.epsilon,
        delta_cap=cap.delta,
        spent=spent.epsilon,
        reserved=held.epsilon - spent.epsilon,
        remaining=cap.epsilon - held.epsilon,
        accountant=held.accountant,
        spent_delta=spent.delta,
    )


def running_budgets(cap: Amount, entries: Iterable[LedgerEntry]) -> Iterator[Budget]:
    """The figures after each entry in turn, against today's cap (the last are
    :func:`budget_from`'s): the history of a dataset's spend, e.g. for a chart."""
    jobs: dict[uuid.UUID, dict[str, LedgerEntry]] = {}
    for entry in entries:
        jobs.setdefault(entry.job_id, {})[entry.kind] = entry
        yield _figures(cap, jobs)


def budget_from(cap: Amount, entries: Iterable[LedgerEntry]) -> Budget:
    return _figures(cap, _by_job(entries))


def ledger_of(session: Session, dataset: Dataset) -> tuple[Budget, Sequence[LedgerEntry]]:
    """The dataset's budget figures and the entries they follow from, oldest first."""
    entries = repository.entries_of_dataset(session, dataset.id)
    return budget_from(cap_of(dataset), entries), entries


def budget(session: Session, dataset: Dataset) -> Budget:
    """The single source of every budget figure the API and the dashboard show."""
    return ledger_of(session, dataset)[0]


def _entry(
    job: Job, kind: str, actor: Actor, events: Sequence[dict[str, Any]], cost: Composed
) -> LedgerEntry:
    return LedgerEntry(
        dataset_id=job.dataset_id,
        job_id=job.id,
        kind=kind,
        epsilon=cost.epsilon,
        delta=cost.delta,
        epsilon_by_mechanism=dict(job.epsilon_by_mechanism),
        events=[dict(e) for e in events],
        accountant=cost.accountant,
        actor=actor.ref,
    )


def _again(reservation: LedgerEntry, job: Job, kind: str, actor: Actor) -> LedgerEntry:
    """A commit or a release of ``reservation``: the same releases and figures."""
    cost = Composed(reservation.epsilon, reservation.delta, reservation.accountant)
    return _entry(job, kind, actor, reservation.events, cost)


def _locked_dataset(session: Session, dataset_id: uuid.UUID) -> Dataset:
    dataset = datasets_repo.get(session, dataset_id, for_update=True)
    if dataset is None:
        raise NotFound("no such dataset")
    return dataset


def reserve(
    session: Session, job: Job, actor: Actor, events: Sequence[PrivacyEvent]
) -> LedgerEntry:
    """Add ``job`` and reserve its releases (``events``, planned before any private
    read), or raise :class:`BudgetExceeded`: the accountant's ε at the cap's δ over
    every committed, reserved and new release must stay within the cap's ε."""
    dataset = _locked_dataset(session, job.dataset_id)
    _check_fits(session, dataset, events)
    asked = composed(events, cap_of(dataset).delta)
    jobs_repo.add(session, job)
    return repository.add_entry(
        session, _entry(job, "reserve", actor, [e.to_dict() for e in events], asked)
    )


def _check_fits(session: Session, dataset: Dataset, events: Sequence[PrivacyEvent]) -> Composed:
    """The dataset's composed figure with ``events`` added (ε at the cap's δ), or the
    :class:`BudgetExceeded` that a submission of them gets: the accountant's ε over every
    committed, reserved and new release must stay within the cap's ε. Since a dataset's cap
    is carved out of its organisation's budget, a job within the cap is within the
    organisation's budget too."""
    if dataset.deleted_at is not None:
        raise Conflict("the dataset was deleted; it takes no new job")
    cap = cap_of(dataset)
    jobs = _by_job(repository.entries_of_dataset(session, dataset.id))
    asked = composed(events, cap.delta)
    after = composed([*_held(jobs), *events], cap.delta)
    if after.epsilon > cap.epsilon:
        raise _refuse_job(asked, after, _figures(cap, jobs), events)
    return after


def check_fits(session: Session, dataset: Dataset, events: Sequence[PrivacyEvent]) -> Budget:
    """What a dry run answers (issue 66, item 5): the same refusal as :func:`reserve`
    (409, naming what was asked and what remains) when ``events`` would not fit the
    dataset's cap, else the dataset's figures as they would stand with them reserved.
    Nothing is locked or written."""
    after = _check_fits(session, dataset, events)
    now = budget(session, dataset)
    return replace(
        now,
        reserved=after.epsilon - now.spent,
        remaining=now.epsilon_cap - after.epsilon,
        accountant=after.accountant,
    )


def _refuse_job(
    asked: Composed, after: Composed, figures: Budget, events: Sequence[PrivacyEvent]
) -> BudgetExceeded:
    cap = Amount(figures.epsilon_cap, figures.delta_cap)
    left = max(figures.remaining, Decimal(0))
    at = f"δ = {amounts.shown(cap.delta):g}"
    if asked.epsilon.is_infinite():
        outright = compose(events).spends_delta
        why = f"the job's releases have no finite ε at the dataset's {at}" + (
            f" (they spend δ = {float(outright):g} outright)"
            if outright > Fraction(cap.delta)
            else " (Gaussian releases need δ > 0)"
        )
    else:
        why = (
            f"the job asks for {asked.text()} ({asked.accountant}) but the dataset has "
            f"ε = {amounts.shown(left):g} left at {at}"
        )
    return BudgetExceeded(
        f"{why} (cap {cap.text()}; spent ε = {amounts.shown(figures.spent):g}, reserved "
        f"ε = {amounts.shown(figures.reserved):g}; with this job: {after.text()})",
        requested={"epsilon": _shown(asked.epsilon), "delta": amounts.shown(cap.delta)},
        remaining={"epsilon": amounts.shown(left), "delta": amounts.shown(cap.delta)},
        cap=cap.shown(),
        spent=amounts.shown(figures.spent),
        reserved=amounts.shown(figures.reserved),
        composed={"epsilon": _shown(after.epsilon), "delta": amounts.shown(cap.delta)},
        accountant=after.accountant,
        events=[e.to_dict() for e in events],
    )


def _shown(epsilon: Decimal) -> float | None:
    """ε as a JSON number; None for an infinite one (JSON has no infinity)."""
    return None if epsilon.is_infinite() else amounts.shown(epsilon)


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
    return repository.add_entry(session, _again(entries["reserve"], job, "commit", actor))


def release_reservation(session: Session, job_id: uuid.UUID, actor: Actor) -> LedgerEntry:
    """Free the reservation of a job that never read private data; idempotent."""
    job, entries = _job_entries(session, job_id)
    if "release" in entries:
        return entries["release"]
    if "commit" in entries:
        raise Conflict("the job has read the private documents: its budget stays spent")
    return repository.add_entry(session, _again(entries["reserve"], job, "release", actor))


def record_report(
    session: Session, job: Job, privacy: Mapping[str, Any] | None, actor: Actor
) -> LedgerReport:
    """Record the releases the engine reports it made (its manifest's ``privacy`` block)
    once, after the commit; idempotent. It moves no budget, so it takes no dataset lock:
    the caller holds the job's row lock. Its figure is the accountant's, at the δ the
    job's entries are stated at."""
    existing = repository.report_of_job(session, job.id)
    if existing is not None:
        return existing
    entries = repository.entries_of_job(session, job.id)
    if budget_state(entries.keys()) != "committed":
        raise Conflict("the job has spent nothing: it has no releases to report")
    realised = ledger_events.reported(privacy)
    cost = composed([PrivacyEvent.from_dict(e) for e in realised], entries["commit"].delta)
    return repository.add_report(
        session,
        LedgerReport(
            dataset_id=job.dataset_id,
            job_id=job.id,
            epsilon=cost.epsilon,
            delta=cost.delta,
            events=realised,
            accountant=cost.accountant,
            actor=actor.ref,
        ),
    )


def reports_of(session: Session, dataset: Dataset) -> Sequence[LedgerReport]:
    return repository.reports_of_dataset(session, dataset.id)


def time_shown(actor: str, *, owner: bool) -> bool:
    """Whether the time of a ledger entry or report that ``actor`` wrote may be shown: to
    the dataset's owner always; to others (admins, auditors) only when a request wrote
    it (a submission's reservation, a cancel's release). A worker writes at a time that
    depends on private corpora: a commit at the job's start, which follows the jobs
    before it on the worker, a report at the end of the job's private stages."""
    return owner or not actor.startswith("system:")


def reports_out(
    session: Session, dataset: Dataset, entries: Sequence[LedgerEntry], *, owner: bool = True
) -> list[LedgerReportOut]:
    """The dataset's reports, each with its differences from the job's entries (their
    times the owner's only: :func:`time_shown`)."""
    jobs = _by_job(entries)
    out = []
    for report in reports_of(session, dataset):
        shown = LedgerReportOut.model_validate(report)
        shown.differences = reconciliation(jobs.get(report.job_id, {}), report) or []
        if not time_shown(report.actor, owner=owner):
            shown.created_at = None
        out.append(shown)
    return out


def reconciliation(
    entries: Mapping[str, LedgerEntry], report: LedgerReport | None
) -> list[str] | None:
    """How a job's reported releases differ from those it was charged for (None: no
    report yet; empty: they match)."""
    if report is None or "reserve" not in entries:
        return None
    return ledger_events.reconcile(events_of(entries["reserve"]), events_of(report))


def budget_state(kinds: Collection[str]) -> str:
    """``reserved``, ``committed`` or ``released``: where a job's ε stands, given the kinds
    of its ledger entries."""
    if "commit" in kinds:
        return "committed"
    return "released" if "release" in kinds else "reserved"


def job_budget_state(session: Session, job_id: uuid.UUID) -> str:
    """``reserved``, ``committed`` or ``released``: where the job's ε stands."""
    return budget_state(repository.entries_of_job(session, job_id).keys())


def job_charge(session: Session, job_id: uuid.UUID) -> tuple[str, Composed | None]:
    """Where the job's ε stands, and what the ledger charges it (its releases composed
    at the dataset's δ cap when reserved; None without a reservation)."""
    entries = repository.entries_of_job(session, job_id)
    reservation = entries.get("reserve")
    charge = None
    if reservation is not None:
        charge = Composed(reservation.epsilon, reservation.delta, reservation.accountant)
    return budget_state(entries.keys()), charge


def epsilon_spent_total(session: Session) -> float:
    """The committed jobs' ε, added up over every dataset (basic composition: a bound
    for a metric, not a dataset's figure)."""
    return amounts.shown(sum(repository.committed_epsilons(session), Decimal(0)))


def set_cap(session: Session, found: Dataset, cap: Amount) -> Amount:
    """Set a dataset's cap (ε, δ), returning the previous one. It must fit in the
    organisation's budget beside the other datasets' caps (:class:`BudgetExceeded`
    otherwise: an admin raises the budget first) and hold what the dataset has spent
    and reserved, composed at the new δ (:class:`Conflict` otherwise)."""
    check_cap_change(session, found, cap)
    dataset = _locked_dataset(session, found.id)
    held = composed(_held(_by_job(repository.entries_of_dataset(session, dataset.id))), cap.delta)
    if held.epsilon > cap.epsilon:
        raise Conflict(
            f"the dataset has {held.text()} spent or reserved ({held.accountant}); the cap "
            "cannot go below it",
            held={"epsilon": _shown(held.epsilon), "delta": amounts.shown(held.delta)},
        )
    previous = cap_of(dataset)
    dataset.epsilon_cap, dataset.delta_cap = cap.epsilon, cap.delta
    return previous


# -- organisation budgets ---------------------------------------------------------------


def initial_budget(settings: Settings, epsilon: float | None, delta: float | None) -> Amount:
    """A new owner organisation's budget: the figures given, else the server's default."""
    return Amount.granted(
        settings.default_organisation_epsilon if epsilon is None else epsilon,
        settings.default_organisation_delta if delta is None else delta,
    )


def budget_of(organisation: Organisation) -> Amount:
    return Amount(organisation.epsilon_budget, organisation.delta_budget)


@dataclass(frozen=True)
class OrganisationBudget:
    """An organisation's budget, what its datasets carve out of it, and their spend."""

    organisation_id: uuid.UUID
    budget: Amount  # set by admins
    allocated: Amount  # carved: live datasets' caps, deleted datasets' spend
    remaining: Amount  # budget − allocated: what new or raised caps may take
    datasets: int
    spent: Decimal  # every committed release of its datasets composed, at the budget's δ
    reserved: Decimal  # the same with the reserved ones, minus spent
    accountant: str


def _carved(dataset: Dataset, jobs: Mapping[uuid.UUID, Mapping[str, LedgerEntry]]) -> Amount:
    """What one dataset takes out of its organisation's budget: its cap while it lives,
    what it spent and reserved (composed at its δ cap) once deleted."""
    if dataset.deleted_at is None:
        return cap_of(dataset)
    used = composed(_held(jobs), dataset.delta_cap)
    return Amount(used.epsilon, used.delta)


def organisation_budget(
    session: Session, organisation: Organisation, *, excluding: uuid.UUID | None = None
) -> OrganisationBudget:
    """The single source of an organisation's budget figures (``excluding`` one dataset,
    whose cap is about to change)."""
    by_dataset: dict[uuid.UUID, list[LedgerEntry]] = {}
    for entry in repository.entries_of_organisation(session, organisation.id):
        by_dataset.setdefault(entry.dataset_id, []).append(entry)
    allocated = Amount.zero()
    spent: list[PrivacyEvent] = []
    held: list[PrivacyEvent] = []
    datasets = repository.datasets_of_organisation(session, organisation.id)
    for dataset in datasets:
        jobs = _by_job(by_dataset.get(dataset.id, []))
        spent += _of_dataset(_spent(jobs), dataset.id)
        held += _of_dataset(_held(jobs), dataset.id)
        if dataset.id != excluding:
            allocated += _carved(dataset, jobs)
    budget = budget_of(organisation)
    spent_figure = composed(spent, budget.delta)
    held_figure = composed(held, budget.delta)
    return OrganisationBudget(
        organisation.id,
        budget,
        allocated,
        budget - allocated,
        len(datasets),
        spent_figure.epsilon,
        held_figure.epsilon - spent_figure.epsilon,
        held_figure.accountant,
    )


@dataclass(frozen=True)
class OrganisationMoment:
    """An organisation's figures right after one ledger entry of its datasets (its spend
    over time, e.g. for a chart): ε at the budget's δ, as :func:`organisation_budget`
    composes them."""

    entry: LedgerEntry
    spent: Decimal
    held: Decimal  # spent + reserved
    spent_delta: Decimal  # the δ spent is stated at (0: every release pure)
    accountant: str


def organisation_history(session: Session, organisation: Organisation) -> list[OrganisationMoment]:
    """The organisation's figures after each ledger entry of its datasets, oldest first;
    the last are :func:`organisation_budget`'s ``spent`` and ``spent + reserved``."""
    budget = budget_of(organisation)
    jobs: dict[uuid.UUID, dict[uuid.UUID, dict[str, LedgerEntry]]] = {}
    moments = []
    for entry in repository.entries_of_organisation(session, organisation.id):
        jobs.setdefault(entry.dataset_id, {}).setdefault(entry.job_id, {})[entry.kind] = entry
        spent = [e for d, by_job in jobs.items() for e in _of_dataset(_spent(by_job), d)]
        held = [e for d, by_job in jobs.items() for e in _of_dataset(_held(by_job), d)]
        spent_figure = composed(spent, budget.delta)
        held_figure = composed(held, budget.delta)
        moments.append(
            OrganisationMoment(
                entry,
                spent_figure.epsilon,
                held_figure.epsilon,
                spent_figure.delta,
                held_figure.accountant,
            )
        )
    return moments


def _of_dataset(events: Iterable[PrivacyEvent], dataset_id: uuid.UUID) -> list[PrivacyEvent]:
    """``events`` named as the releases of one dataset, so that composed with another
    dataset's they compose sequentially: one patient may be in several datasets of a
    hospital, and the classes of two datasets are not disjoint (only one dataset's
    classes are). Composing the datasets' events as they are would put class ``a`` of one
    dataset and class ``b`` of another in one parallel group."""
    return [replace(e, mechanism=f"{e.mechanism}@{dataset_id}") for e in events]


def _locked_organisation(session: Session, organisation_id: uuid.UUID) -> Organisation:
    organisation = repository.organisation(session, organisation_id, for_update=True)
    if organisation is None:
        raise NotFound("no such organisation")
    return organisation


def _refuse_cap(asked: Amount, figures: OrganisationBudget, action: str) -> BudgetExceeded:
    left = figures.remaining.at_least_zero()
    return BudgetExceeded(
        f"{action} asks for {asked.text()} but the organisation has {left.text()} left of "
        f"its budget ({figures.budget.text()}; its datasets hold {figures.allocated.text()}); "
        "an admin can raise the organisation's budget",
        requested=asked.shown(),
        remaining=left.shown(),
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
    audit.record_about(
        session,
        "organisation.budget_changed",
        actor,
        organisation,
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
        spent=_shown(figures.spent),
        reserved=_shown(figures.reserved),
        accountant=figures.accountant,
    )
