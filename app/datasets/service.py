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
from app.datasets.schemas import RAW_COUNTS, BudgetOut, DatasetOut
from app.datasets.upload import UploadReport, UploadSpec, check_content, read_documents
from app.db import Database, after_commit, after_rollback
from app.errors import Unprocessable
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
    delta_cap: float = 0.0


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
    cap = ledger.Amount.granted(new.epsilon_cap, new.delta_cap)
    ledger.carve(session, principal.organisation_id, cap)
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
            unit_column=spec.unit_column,
            epsilon_cap=cap.epsilon,
            delta_cap=cap.delta,
            upload_bytes=size,
            created_by=principal.actor.ref,
        ),
    )
    key = cipher.create_key(dataset.id)  # the dataset's own, destroyed with it
    after_rollback(session, lambda: cipher.destroy_key(dataset.id))
    report = UploadReport()
    batch: list[dict[str, Any]] = []
    for document in read_documents(stream, spec, report):
        nonce, sealed = key.seal(dataset.id, document.row, document.text, document.label)
        unit = document.unit
        batch.append(
            {
                "dataset_id": dataset.id,
                "row": document.row,
                "key_id": key.key_id,
                "nonce": nonce,
                "ciphertext": sealed,
                "unit": None if unit is None else key.seal_unit(dataset.id, document.row, unit),
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
        target=("dataset", dataset.id),  # no count of rows or bytes: raw facts (docs/privacy.md)
        name=dataset.name,
        epsilon_cap=float(dataset.epsilon_cap),
        delta_cap=float(dataset.delta_cap),
        unit_column=dataset.unit_column,
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
    repository.purge_documents(session, dataset.id)
    dataset.deleted_at = utcnow()
    after_commit(session, lambda: cipher.destroy_key(dataset.id))
    audit.record(  # no count of the documents purged: a raw count (docs/privacy.md)
        session,
        "dataset.deleted",
        principal.actor,
        organisation_id=dataset.organisation_id,
        target=("dataset", dataset.id),
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
    session: Session,
    principal: Principal,
    dataset_id: uuid.UUID,
    epsilon_cap: float,
    reason: str,
    delta_cap: float | None = None,
) -> Dataset:
    """Set the cap (ε, and δ when given) within the organisation's budget and above what
    the dataset has spent and reserved (:func:`app.ledger.service.set_cap`)."""
    found = get_dataset(session, principal, dataset_id)
    delta = found.delta_cap if delta_cap is None else delta_cap
    previous = ledger.set_cap(session, found, ledger.Amount.granted(epsilon_cap, delta))
    dataset = repository.get(session, dataset_id)
    assert dataset is not None
    changed_delta = {"previous_delta": float(previous.delta), "delta_cap": float(delta)}
    audit.record(
        session,
        "dataset.cap_changed",
        principal.actor,
        organisation_id=dataset.organisation_id,
        target=("dataset", dataset.id),
        previous=float(previous.epsilon),
        epsilon_cap=float(dataset.epsilon_cap),
        reason=reason,
        **(changed_delta if previous.delta != dataset.delta_cap else {}),
    )
    return dataset


def budget_out(figures: ledger.Budget) -> BudgetOut:
    return BudgetOut(
        epsilon_cap=float(figures.epsilon_cap),
        delta_cap=float(figures.delta_cap),
        spent=float(figures.spent),
        reserved=float(figures.reserved),
        remaining=float(figures.remaining),
        accountant=figures.accountant,
    )


def to_out(session: Session, dataset: Dataset, principal: Principal) -> DatasetOut:
    """The dataset as ``principal`` may see it: raw counts for its owner only."""
    figures = budget_out(ledger.budget(session, dataset))
    fields: dict[str, Any] = {
        name: getattr(dataset, name) for name in DatasetOut.model_fields if name != "budget"
    }
    if principal.organisation_id != dataset.organisation_id:
        fields.update(dict.fromkeys(RAW_COUNTS))
    return DatasetOut(**fields, budget=figures)
