"""Uploading, reading, deleting datasets and changing their cap.

A one-shot upload is one transaction: the dataset row, every sealed document and the
audit event commit together, or (on any row error, a body too large, a broken file)
nothing is stored at all.

A resumable upload opens the dataset (state ``uploading``, its cap carved), then appends
the file in chunks, each one transaction: the rows a chunk completes are stored and the
committed byte offset (``upload_bytes``) moves on, or (a row error, a dropped
connection, a broken chunk) nothing of that chunk is, and what earlier chunks stored
stays. Sealing it reads the last row and makes it ``ready``: a job runs on a ready
dataset only, and nothing is appended to one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import structlog
from sqlalchemy.orm import Session

from app.crypto import DocumentCipher, DocumentKey
from app.datasets import repository
from app.datasets.schemas import RAW_COUNTS, BudgetOut, DatasetOut
from app.datasets.upload import (
    ParseState,
    Row,
    UploadReport,
    UploadSpec,
    check_content,
    read_documents,
)
from app.db import Database, after_commit, after_rollback
from app.errors import Conflict, ContentTooLarge, Unprocessable
from app.identity import policy
from app.identity.policy import Principal
from app.jobs import service as jobs
from app.ledger import audit
from app.ledger import service as ledger
from app.logging import exception_fields
from app.models import Dataset, utcnow
from app.releases import files as release_files
from app.releases import repository as releases_repo

_BATCH = 2000
MAX_TAIL_BYTES = 16 * 2**20  # an incomplete row carried to the next chunk
log = structlog.get_logger("keyseed.datasets")


@dataclass(frozen=True)
class NewDataset:
    name: str
    epsilon_cap: float
    upload: UploadSpec
    delta_cap: float = 0.0


def _new_dataset(
    session: Session, principal: Principal, cipher: DocumentCipher, new: NewDataset, state: str
) -> tuple[Dataset, DocumentKey]:
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
            upload_bytes=0,
            state=state,
            created_by=principal.actor.ref,
        ),
    )
    key = cipher.create_key(dataset.id)  # the dataset's own, destroyed with it
    after_rollback(session, lambda: cipher.destroy_key(dataset.id))
    return dataset, key


def _spec(dataset: Dataset) -> UploadSpec:
    """The upload spec of a dataset still uploading (its policies are in its tail)."""
    return UploadSpec(
        format=dataset.format,
        text_columns=tuple(dataset.text_columns),
        label_column=dataset.label_column,
        labels=tuple(dataset.labels),
        unit_column=dataset.unit_column,
    )


class _Writer:
    """Seals documents and stores them a batch at a time (one COPY on Postgres).

    With ``keep_digests`` (a dataset uploaded in chunks) a batch is first checked
    against the digests stored by earlier batches and chunks: a repeat found there is
    counted (or refused) like one found within the batch, and the digests of the
    documents stored are kept for the chunks to come. ``seen`` then only spans a batch.
    """

    def __init__(
        self,
        session: Session,
        dataset: Dataset,
        key: DocumentKey,
        spec: UploadSpec,
        report: UploadReport,
        seen: dict[bytes, int],
        *,
        keep_digests: bool,
    ) -> None:
        self.session = session
        self.dataset_id = dataset.id
        self.key = key
        self.spec = spec
        self.report = report
        self.seen = seen
        self.keep_digests = keep_digests
        self.batch: list[Row] = []

    def add(self, document: Row) -> None:
        self.batch.append(document)
        if len(self.batch) >= _BATCH:
            self.flush()

    def flush(self) -> None:
        batch, self.batch = self.batch, []
        if self.keep_digests:
            self.seen.clear()
        if not batch or self.report.error_count:
            return
        if self.keep_digests:
            batch = self._drop_stored_repeats(batch)
            if self.report.error_count:
                return
            repository.add_digests(
                self.session, self.dataset_id, [(d.digest, d.row) for d in batch]
            )
        dataset_id, key, key_id = self.dataset_id, self.key, self.key.key_id
        rows = []
        for document in batch:
            row, unit = document.row, document.unit
            nonce, sealed = key.seal(dataset_id, row, document.text, document.label)
            rows.append(
                (
                    dataset_id,
                    row,
                    key_id,
                    nonce,
                    sealed,
                    None if unit is None else key.seal_unit(dataset_id, row, unit),
                )
            )
        repository.copy_documents(self.session, rows)

    def _drop_stored_repeats(self, batch: list[Row]) -> list[Row]:
        stored = repository.known_digests(self.session, self.dataset_id, [d.digest for d in batch])
        if not stored:
            return batch
        kept = []
        for document in batch:
            first = stored.get(document.digest)
            if first is None:
                kept.append(document)
                continue
            self.report.documents -= 1
            if self.spec.on_duplicate == "reject":
                self.report.error(document.row, f"the document repeats row {first}")
            else:
                self.report.skipped_duplicate += 1
        return kept


def _refuse_errors(report: UploadReport, what: str) -> None:
    if report.error_count:
        raise Unprocessable(
            f"{report.error_count} row(s) cannot be used; {what}",
            field="file",
            error_count=report.error_count,
            errors=report.errors,
        )


def create_dataset(
    session: Session,
    principal: Principal,
    cipher: DocumentCipher,
    new: NewDataset,
    stream: IO[bytes],
    size: int,
) -> Dataset:
    """A dataset from one whole file, sealed at once (one transaction)."""
    check_content(stream.read(8192))
    stream.seek(0)
    dataset, key = _new_dataset(session, principal, cipher, new, "ready")
    dataset.upload_bytes = size
    spec = new.upload
    report = UploadReport()
    seen: dict[bytes, int] = {}
    writer = _Writer(session, dataset, key, spec, report, seen, keep_digests=False)
    for document in read_documents(stream, spec, report, seen=seen):
        writer.add(document)
    writer.flush()
    _refuse_errors(report, "nothing was stored")
    _finish(session, principal, dataset, report)
    return dataset


def _finish(session: Session, principal: Principal, dataset: Dataset, report: UploadReport) -> None:
    """Refuse a dataset of no document; record the upload in the audit trail."""
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
    audit.record_about(
        session,
        "dataset.uploaded",
        principal.actor,
        dataset,  # no count of rows or bytes: raw facts (docs/privacy.md)
        name=dataset.name,
        epsilon_cap=float(dataset.epsilon_cap),
        delta_cap=float(dataset.delta_cap),
        unit_column=dataset.unit_column,
    )


# -- resumable uploads ---------------------------------------------------------------
# The tail (ParseState plus the policies) is sealed as the "unit" of row 0, the row
# number of a CSV header: no document has it.
_TAIL_ROW = 0


def _dump_tail(dataset: Dataset, key: DocumentKey, spec: UploadSpec, state: ParseState) -> None:
    record = {"state": state.dumps(), "on_empty": spec.on_empty, "on_duplicate": spec.on_duplicate}
    dataset.upload_tail = key.seal_unit(dataset.id, _TAIL_ROW, json.dumps(record))


def _load_tail(dataset: Dataset, key: DocumentKey) -> tuple[UploadSpec, ParseState]:
    assert dataset.upload_tail is not None
    record = json.loads(key.open_unit(dataset.id, _TAIL_ROW, key.key_id, dataset.upload_tail))
    spec = dataclasses.replace(
        _spec(dataset), on_empty=record["on_empty"], on_duplicate=record["on_duplicate"]
    )
    return spec, ParseState.loads(record["state"])


def open_upload(
    session: Session, principal: Principal, cipher: DocumentCipher, new: NewDataset
) -> Dataset:
    """A dataset in state ``uploading``: its cap is carved now, its file comes in chunks."""
    dataset, key = _new_dataset(session, principal, cipher, new, "uploading")
    _dump_tail(dataset, key, new.upload, ParseState())
    return dataset


def _uploading(session: Session, principal: Principal, dataset_id: uuid.UUID) -> Dataset:
    """The dataset, locked (one chunk at a time; no job slips in), if still uploading."""
    get_dataset(session, principal, dataset_id)
    dataset = repository.get(session, dataset_id, for_update=True)
    assert dataset is not None
    if dataset.deleted_at is not None:
        raise Conflict("the dataset was deleted")
    if dataset.state != "uploading":
        raise Conflict("the dataset is sealed: nothing more can be appended")
    return dataset


def append_chunk(
    session: Session,
    principal: Principal,
    cipher: DocumentCipher,
    dataset_id: uuid.UUID,
    start: int,
    stream: IO[bytes],
    length: int,
    max_upload_bytes: int,
) -> Dataset:
    """Append bytes ``start`` to ``start + length`` of the file: the rows they complete
    are stored, an incomplete last row waits (sealed) for the next chunk, and the
    committed offset moves on, all in this transaction. Bytes already committed are
    skipped (a chunk sent again after a lost response changes nothing); a chunk that
    starts past the offset is refused (409 naming the offset)."""
    dataset = _uploading(session, principal, dataset_id)
    offset = dataset.upload_bytes
    if start > offset:
        raise Conflict(
            f"the chunk starts at byte {start} but {offset} bytes are committed: "
            f"send the file from byte {offset}",
            offset=offset,
        )
    skip = offset - start
    if skip >= length:
        return dataset
    end = start + length
    if end > max_upload_bytes:
        raise ContentTooLarge(
            f"the file would be larger than KEYSEED_MAX_UPLOAD_BYTES ({max_upload_bytes} bytes)"
        )
    stream.seek(skip)
    if offset == 0:
        check_content(stream.read(8192))
        stream.seek(skip)
    key = cipher.dataset_key(dataset.id)
    spec, state = _load_tail(dataset, key)
    digest = _row_digest(cipher, dataset.id)
    _ingest(session, dataset, key, spec, state, stream, final=False, digest=digest)
    if len(state.tail) > MAX_TAIL_BYTES:
        raise Unprocessable(
            f"row {state.rows + 1} goes on for more than {MAX_TAIL_BYTES} bytes",
            field="file",
            row=state.rows + 1,
        )
    _dump_tail(dataset, key, spec, state)
    dataset.upload_bytes = end
    return dataset


def _row_digest(cipher: DocumentCipher, dataset_id: uuid.UUID) -> Callable[[bytes], bytes]:
    """A digest keyed for this dataset: the stored digests of an upload cannot be tested
    against guessed documents without the master key."""
    secret = bytes.fromhex(cipher.digest("upload-row", str(dataset_id)))

    def digest(value: bytes) -> bytes:
        return hashlib.blake2b(value, key=secret, digest_size=16).digest()

    return digest


def _ingest(
    session: Session,
    dataset: Dataset,
    key: DocumentKey,
    spec: UploadSpec,
    state: ParseState,
    stream: IO[bytes],
    *,
    final: bool,
    digest: Callable[[bytes], bytes],
) -> UploadReport:
    report = UploadReport()
    seen: dict[bytes, int] = {}
    writer = _Writer(session, dataset, key, spec, report, seen, keep_digests=True)
    for document in read_documents(
        stream, spec, report, state=state, final=final, seen=seen, digest=digest
    ):
        writer.add(document)
    writer.flush()
    _refuse_errors(report, "nothing of this chunk was stored")
    dataset.documents += report.documents
    dataset.skipped_empty += report.skipped_empty
    dataset.skipped_duplicate += report.skipped_duplicate
    return report


def seal_upload(
    session: Session, principal: Principal, cipher: DocumentCipher, dataset_id: uuid.UUID
) -> Dataset:
    """The file is complete: read its last row, refuse a dataset of no document, and
    make it usable (jobs may run; nothing more is appended)."""
    dataset = _uploading(session, principal, dataset_id)
    key = cipher.dataset_key(dataset.id)
    spec, state = _load_tail(dataset, key)
    if state.header is None and not state.tail.strip() and spec.format == "csv":
        raise Unprocessable("the file is empty", field="file")
    digest = _row_digest(cipher, dataset.id)
    _ingest(session, dataset, key, spec, state, io.BytesIO(), final=True, digest=digest)
    report = UploadReport(
        documents=dataset.documents,
        skipped_empty=dataset.skipped_empty,
        skipped_duplicate=dataset.skipped_duplicate,
    )
    _finish(session, principal, dataset, report)
    dataset.state = "ready"
    dataset.upload_tail = None
    repository.purge_digests(session, dataset.id)
    return dataset


def get_dataset(session: Session, principal: Principal, dataset_id: uuid.UUID) -> Dataset:
    return policy.visible(principal, repository.get(session, dataset_id), "dataset")


def list_datasets(session: Session, principal: Principal) -> Sequence[Dataset]:
    return repository.list_datasets(session, policy.organisation_scope(principal))


def delete_dataset(
    session: Session,
    principal: Principal,
    cipher: DocumentCipher,
    dataset_id: uuid.UUID,
    data_dir: Path | None = None,
) -> Dataset:
    """Purge the documents and, once that commits, destroy the dataset's key (no copy of
    a document left anywhere opens after that); keep the dataset row, its jobs' outputs
    and its ledger. The files its releases were rendered to under ``data_dir`` are
    removed too (a later download of a release renders them again from the database).

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
    if data_dir is not None:
        released = releases_repo.ids_of_dataset(session, dataset.id)
        after_commit(session, lambda: release_files.remove(data_dir, released))
    audit.record_about(  # no count of the documents purged: a raw count (docs/privacy.md)
        session,
        "dataset.deleted",
        principal.actor,
        dataset,
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
    audit.record_about(
        session,
        "dataset.cap_changed",
        principal.actor,
        dataset,
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
