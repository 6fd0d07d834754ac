"""The privacy-budget ledger (service.md, "Budget ledger").

Each job leaves at most one entry of each kind:

* ``reserve``: written with the job, atomically against the dataset's cap;
* ``commit``: written when a worker first reads the private documents; the job's ε is
  spent from then on, whatever becomes of the job;
* ``release``: written when a job ends before any private read; its reservation is free.

Figures follow from the entries alone: ``spent = Σ commit``, ``reserved = Σ reserve −
Σ commit − Σ release``, ``remaining = cap − spent − reserved``. Composition across jobs
is basic (sums). Sums are taken over decimals of the stored floats' shortest ``repr``,
so ten jobs of ε = 0.1 fit a cap of 1 exactly. Every change to the figures happens with
the dataset row locked (``SELECT … FOR UPDATE``; SQLite transactions are IMMEDIATE).
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal

from sqlalchemy.orm import Session

from app.datasets import repository as datasets_repo
from app.errors import BudgetExceeded, Conflict, NotFound
from app.identity.policy import Actor
from app.jobs import repository as jobs_repo
from app.ledger import repository
from app.models import Dataset, Job, LedgerEntry
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


def _entry(job: Job, kind: str, actor: Actor) -> LedgerEntry:
    return LedgerEntry(
        dataset_id=job.dataset_id,
        job_id=job.id,
        kind=kind,
        epsilon=job.epsilon,
        delta=0.0,
        epsilon_by_mechanism=dict(job.epsilon_by_mechanism),
        accountant=ACCOUNTANT,
        actor=actor.ref,
    )


def _locked_dataset(session: Session, dataset_id: uuid.UUID) -> Dataset:
    dataset = datasets_repo.get(session, dataset_id, for_update=True)
    if dataset is None:
        raise NotFound("no such dataset")
    return dataset


def reserve(session: Session, job: Job, actor: Actor) -> LedgerEntry:
    """Add ``job`` and reserve its whole ε, or raise :class:`BudgetExceeded`."""
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
    return repository.add_entry(session, _entry(job, "reserve", actor))


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
    return repository.add_entry(session, _entry(job, "commit", actor))


def release_reservation(session: Session, job_id: uuid.UUID, actor: Actor) -> LedgerEntry:
    """Free the reservation of a job that never read private data; idempotent."""
    job, entries = _job_entries(session, job_id)
    if "release" in entries:
        return entries["release"]
    if "commit" in entries:
        raise Conflict("the job has read the private documents: its budget stays spent")
    return repository.add_entry(session, _entry(job, "release", actor))


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
