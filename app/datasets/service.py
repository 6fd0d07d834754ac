"""Uploading, reading, deleting datasets and changing their cap.

An upload is one transaction: the dataset row, every sealed document and the audit
event commit together, or (on any row error, a body too large, a broken file) nothing
is stored at all.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO, Any

import structlog
from sqlalchemy.orm import Session

from app.crypto import DocumentCipher
from app.datasets import repository
from app.datasets.schemas import BudgetOut, DatasetOut
from app.datasets.upload import UploadReport, UploadSpec, check_content, read_documents
from app.db import Database, after_commit, after_rollback
from app.errors import Conflict, Unprocessable
from app.identity import policy
from app.identity.policy import Principal
from app.jobs import service as jobs
from app.ledger import audit
from app.ledger import service as ledger
from app.logging import exception_fields
from app.models import Dataset, utcnow

_BATCH = 500
log = structlog.get_logger("keyseed.datasets")


@dataclass(frozen=True)
class NewDataset:
    name: str
    epsilon_cap: float
    upload: UploadSpec


def create_dataset(
    session: Session,
    principal: Principal,
    cipher: DocumentCipher,
    new: NewDataset,
    stream: IO[bytes],
    size: int,
) -> Dataset:
    check_content(stream.read(8192))
    stream.seek(0)
    spec = new.upload
    dataset = repository.add(
        session,
        Dataset(
            organisation_id=principal.organisation_id,
            name=new.name,
            format=spec.format,
            text_columns=list(spec.text_columns),
            label_column=spec.label_column,
            labels=list(spec.labels),
            epsilon_cap=new.epsilon_cap,
            upload_bytes=size,
            created_by=principal.actor.ref,
        ),
    )
    key = cipher.create_key(dataset.id)  # the dataset's own, destroyed with it
    after_rollback(session, lambda: cipher.destroy_key(dataset.id))
    report = UploadReport()
    batch: list[dict[str, Any]] = []
    for row, text, label in read_documents(stream, spec, report):
        nonce, sealed = key.seal(dataset.id, row, text, label)
        batch.append(
            {
                "dataset_id": dataset.id,
                "row": row,
                "key_id": key.key_id,
                "nonce": nonce,
                "ciphertext": sealed,
            }
        )
        if len(batch) >= _BATCH:
            repository.insert_documents(session, batch)
            batch.clear()
    if report.error_count:
        raise Unprocessable(
            f"{report.error_count} row(s) cannot be used; nothing was stored",
            field="file",
            error_count=report.error_count,
            errors=report.errors,
        )
    repository.insert_documents(session, batch)
    if report.documents == 0:
        raise Unprocessable(
            "the file holds no document to store",
            field="file",
            skipped_empty=report.skipped_empty,
            skipped_duplicate=report.skipped_duplicate,
        )
    dataset.documents = report.documents
    dataset.skipped_empty = report.skipped_empty
    dataset.skipped_duplicate = report.skipped_duplicate
    audit.record(
        session,
        "dataset.uploaded",
        principal.actor,
        organisation_id=dataset.organisation_id,
        target=("dataset", dataset.id),
        name=dataset.name,
        documents=dataset.documents,
        bytes=size,
        epsilon_cap=dataset.epsilon_cap,
    )
    return dataset


def get_dataset(session: Session, principal: Principal, dataset_id: uuid.UUID) -> Dataset:
    return policy.visible(principal, repository.get(session, dataset_id), "dataset")


def list_datasets(session: Session, principal: Principal) -> Sequence[Dataset]:
    return repository.list_datasets(session, policy.organisation_scope(principal))


def delete_dataset(
    session: Session, principal: Principal, cipher: DocumentCipher, dataset_id: uuid.UUID
) -> Dataset:
    """Purge the documents and, once that commits, destroy the dataset's key (no copy of
    a document left anywhere opens after that); keep the dataset row, its jobs' outputs
    and its ledger.

    Queued jobs are cancelled (their reservations released); running ones are asked to
    stop (their spend stays committed).
    """
    get_dataset(session, principal, dataset_id)
    dataset = repository.get(session, dataset_id, for_update=True)  # no job slips in now
    assert dataset is not None
    if dataset.deleted_at is not None:
        return dataset
    jobs.stop_jobs_of_dataset(session, dataset.id, principal.actor)
    purged = repository.purge_documents(session, dataset.id)
    dataset.deleted_at = utcnow()
    after_commit(session, lambda: cipher.destroy_key(dataset.id))
    audit.record(
        session,
        "dataset.deleted",
        principal.actor,
        organisation_id=dataset.organisation_id,
        target=("dataset", dataset.id),
        documents_purged=purged,
    )
    return dataset


def destroy_deleted_keys(database: Database, cipher: DocumentCipher) -> None:
    """Destroy the keys of deleted datasets that are still in the keyring (a process that
    stopped between a deletion's commit and the key's destruction left them)."""
    try:
        with database.transaction(write=False) as session:
            deleted = repository.deleted_ids(session)
        destroyed = sum(cipher.destroy_key(dataset_id) for dataset_id in deleted)
    except Exception as exc:  # the service starts all the same; /readyz tells what is wrong
        log.error("dataset.key_sweep_failed", **exception_fields(exc))
        return
    if destroyed:
        log.warning("dataset.keys_destroyed", count=destroyed)


def set_cap(
    session: Session, principal: Principal, dataset_id: uuid.UUID, epsilon_cap: float, reason: str
) -> Dataset:
    get_dataset(session, principal, dataset_id)
    dataset = repository.get(session, dataset_id, for_update=True)
    assert dataset is not None
    figures = ledger.budget(session, dataset)
    committed = ledger.as_decimal(figures.spent) + ledger.as_decimal(figures.reserved)
    if ledger.as_decimal(epsilon_cap) < committed:
        raise Conflict(
            f"the dataset has ε = {float(committed):g} spent or reserved; the cap cannot "
            "go below it",
            spent=figures.spent,
            reserved=figures.reserved,
        )
    previous = dataset.epsilon_cap
    dataset.epsilon_cap = epsilon_cap
    audit.record(
        session,
        "dataset.cap_changed",
        principal.actor,
        organisation_id=dataset.organisation_id,
        target=("dataset", dataset.id),
        previous=previous,
        epsilon_cap=epsilon_cap,
        reason=reason,
    )
    return dataset


def budget_out(figures: ledger.Budget) -> BudgetOut:
    return BudgetOut(
        epsilon_cap=figures.epsilon_cap,
        delta_cap=figures.delta_cap,
        spent=figures.spent,
        reserved=figures.reserved,
        remaining=figures.remaining,
        accountant=figures.accountant,
    )


def to_out(session: Session, dataset: Dataset) -> DatasetOut:
    figures = budget_out(ledger.budget(session, dataset))
    fields = {name: getattr(dataset, name) for name in DatasetOut.model_fields if name != "budget"}
    return DatasetOut(**fields, budget=figures)
