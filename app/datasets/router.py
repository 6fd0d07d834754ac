"""``/v1/datasets``: upload (multipart), read, delete, change the cap, read the ledger."""

from __future__ import annotations

import re
import tempfile
import uuid
from typing import Annotated, Any, Literal

from fastapi import APIRouter, File, Form, Header, Query, Request, UploadFile, status
from fastapi.concurrency import run_in_threadpool
from pydantic.json_schema import SkipJsonSchema

from app.config import Settings
from app.datasets import service
from app.datasets.schemas import (
    MAX_EPSILON,
    MIN_EPSILON_CAP,
    CapChange,
    DatasetOut,
    LedgerEntryOut,
    LedgerOut,
    UploadOut,
)
from app.datasets.upload import UploadSpec, detect_format
from app.deps import CipherDep, SessionDep, SettingsDep, allowed
from app.errors import BadRequest, ContentTooLarge, Unprocessable, problems
from app.identity.policy import Action, Principal
from app.identity.schemas import NAME_PATTERN
from app.ledger import service as ledger
from app.models import Dataset

router = APIRouter(prefix="/v1/datasets", tags=["datasets"], responses=problems(401, 403, 413, 422))
_NAME = NAME_PATTERN
MAX_LABELS = 1000
MAX_TEXT_COLUMNS = 20


# The form fields of an upload, one-shot (POST /v1/datasets) or resumable (POST …/uploads).
NameForm = Annotated[
    str,
    Form(
        min_length=1,
        max_length=200,
        pattern=_NAME,
        description="The dataset's name, shown to its organisation and the platform",
    ),
]
TextColumnForm = Annotated[list[str], Form(min_length=1, description="Repeat for several columns")]
LabelColumnForm = Annotated[
    str,
    Form(
        min_length=1,
        max_length=200,
        pattern=_NAME,
        description="The column (CSV header or JSONL key) holding each row's label",
    ),
]
LabelsForm = Annotated[
    list[str],
    Form(
        min_length=1,
        description="The declared label set (public schema); repeat, or "
        "give one comma-separated value",
    ),
]
EpsilonCapForm = Annotated[
    float,
    Form(
        ge=MIN_EPSILON_CAP,
        le=MAX_EPSILON,
        allow_inf_nan=False,
        description="Carved out of the organisation's privacy budget",
    ),
]
DeltaCapForm = Annotated[
    float,
    Form(
        ge=0,
        lt=1,
        allow_inf_nan=False,
        description="The cap's δ (0, the default: pure ε-DP jobs only; Gaussian "
        "mechanisms need δ > 0); carved out of the organisation's budget",
    ),
]
OnEmptyForm = Annotated[
    Literal["skip", "reject"],
    Form(
        description="Rows with an empty text: skip (the default) leaves them out and "
        "counts them; reject refuses the upload, naming the rows"
    ),
]
OnDuplicateForm = Annotated[
    Literal["skip", "reject"],
    Form(
        description="Rows repeating an earlier row's text and label: skip (the "
        "default) keeps the first only and counts the rest; reject refuses the upload"
    ),
]

_UNIT_COLUMN = "The column naming each row's privacy unit (a patient id, say)"


def _unit_column_form(description: str) -> Any:
    """The optional ``unit_column`` field; the union with a hidden None drops the pattern
    from the schema, so it is restated there."""
    return Form(
        min_length=1,
        max_length=200,
        pattern=_NAME,
        json_schema_extra={"pattern": _NAME},
        description=description,
    )


def _names(values: list[str], *, field: str, limit: int) -> tuple[str, ...]:
    """Declared names, stripped; one value with commas is a comma-separated list."""
    if len(values) == 1 and "," in values[0]:
        values = values[0].split(",")
    names = tuple(v.strip() for v in values)
    if not names or len(names) > limit:
        raise Unprocessable(f"declare between 1 and {limit}", field=field)
    if any(not n or len(n) > 200 or not n.isprintable() for n in names):
        raise Unprocessable(
            "a declared name is empty, longer than 200 characters or not printable", field=field
        )
    if len(set(names)) != len(names):
        raise Unprocessable("a name is declared twice", field=field)
    return names


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=DatasetOut,
    responses=problems(400, 409, 413, 415),
    summary="Upload a labelled corpus (CSV or JSONL)",
)
def upload_dataset(
    session: SessionDep,
    cipher: CipherDep,
    settings: SettingsDep,
    principal: Annotated[Principal, allowed(Action.DATASET_CREATE)],
    file: Annotated[UploadFile, File(description="UTF-8 CSV with a header row, or JSONL")],
    name: NameForm,
    text_column: TextColumnForm,
    label_column: LabelColumnForm,
    labels: LabelsForm,
    epsilon_cap: EpsilonCapForm,
    delta_cap: DeltaCapForm = 0.0,
    format: Annotated[
        Literal["csv", "jsonl"] | SkipJsonSchema[None],
        Form(description="Detected from the file name and content when not given"),
    ] = None,
    on_empty: OnEmptyForm = "skip",
    on_duplicate: OnDuplicateForm = "skip",
    unit_column: Annotated[
        str | SkipJsonSchema[None],
        _unit_column_form(f"{_UNIT_COLUMN}; without it every row is its own unit"),
    ] = None,
) -> DatasetOut:
    """Documents are sealed (AES-256-GCM) before they are stored; the response and any
    error name rows and counts, never a document. Rows whose label is not declared,
    whose label or text column is missing, are refused with their row numbers, and then
    nothing is stored. With ``unit_column``, every row must name a non-empty unit. The cap
    (ε, δ) is carved out of what the organisation's budget has left (409 naming what
    remains when it does not fit)."""
    size = file.size if file.size is not None else 0
    _check_request_size(size, settings)
    spec = _spec(
        text_column, label_column, labels, format, on_empty, on_duplicate, unit_column, file=file
    )
    new = service.NewDataset(name=name, epsilon_cap=epsilon_cap, delta_cap=delta_cap, upload=spec)
    dataset = service.create_dataset(session, principal, cipher, new, file.file, size)
    return service.to_out(session, dataset, principal)


def _check_request_size(size: int, settings: Settings) -> None:
    if size > settings.max_upload_bytes:
        raise ContentTooLarge(
            f"the file is larger than KEYSEED_MAX_UPLOAD_BYTES ({settings.max_upload_bytes} bytes)"
        )
    if size > settings.max_upload_request_bytes:
        raise ContentTooLarge(
            "the file is larger than KEYSEED_MAX_UPLOAD_REQUEST_BYTES "
            f"({settings.max_upload_request_bytes} bytes), the most one request carries: "
            "send it in chunks (POST /v1/datasets/uploads)"
        )


@router.post(
    "/uploads",
    status_code=status.HTTP_201_CREATED,
    response_model=DatasetOut,
    responses=problems(400, 409),
    summary="Open a resumable upload (the file follows in chunks)",
)
def open_upload(
    session: SessionDep,
    cipher: CipherDep,
    principal: Annotated[Principal, allowed(Action.DATASET_CREATE)],
    name: NameForm,
    text_column: TextColumnForm,
    label_column: LabelColumnForm,
    labels: LabelsForm,
    epsilon_cap: EpsilonCapForm,
    format: Annotated[Literal["csv", "jsonl"], Form(description="The file's format")],
    delta_cap: DeltaCapForm = 0.0,
    on_empty: OnEmptyForm = "skip",
    on_duplicate: OnDuplicateForm = "skip",
    unit_column: Annotated[str | SkipJsonSchema[None], _unit_column_form(_UNIT_COLUMN)] = None,
) -> DatasetOut:
    """The dataset, in state ``uploading``, with the form fields of a one-shot upload
    (``format`` required) and no file; its cap is carved now. Send the file with
    ``PUT /v1/datasets/{id}/upload`` (``Content-Range: bytes START-END/TOTAL``, body
    ``application/octet-stream``) in order, from the offset ``GET …/upload`` gives, then
    ``POST …/seal``. Rows are checked as their chunk arrives: a chunk with a row error
    (named by its row number, never its value) is refused whole, and what earlier
    chunks stored stays. A repeat is found across chunks."""
    spec = _spec(text_column, label_column, labels, format, on_empty, on_duplicate, unit_column)
    new = service.NewDataset(name=name, epsilon_cap=epsilon_cap, delta_cap=delta_cap, upload=spec)
    return service.to_out(session, service.open_upload(session, principal, cipher, new), principal)


def _spec(
    text_column: list[str],
    label_column: str,
    labels: list[str],
    format: str | None,
    on_empty: str,
    on_duplicate: str,
    unit_column: str | None,
    *,
    file: UploadFile | None = None,
) -> UploadSpec:
    """An upload's form fields, checked (errors name the field); the format, when not
    given, detected from ``file``'s name and first bytes once the columns are checked."""
    text_columns = _names(text_column, field="text_column", limit=MAX_TEXT_COLUMNS)
    label_set = _names(labels, field="labels", limit=MAX_LABELS)
    if label_column.strip() in text_columns:
        raise Unprocessable("the label column is also a text column", field="label_column")
    unit = unit_column.strip() if unit_column is not None else None
    if unit is not None and unit in (*text_columns, label_column.strip()):
        raise Unprocessable("the unit column is also a text or label column", field="unit_column")
    if file is not None:
        head = file.file.read(8192)
        file.file.seek(0)
        format = detect_format(format, file.filename, head)
    assert format is not None  # a resumable upload names it
    return UploadSpec(
        format=format,
        text_columns=text_columns,
        label_column=label_column.strip(),
        labels=label_set,
        on_empty=on_empty,
        on_duplicate=on_duplicate,
        unit_column=unit,
    )


def _upload_out(dataset: Dataset, settings: Settings) -> UploadOut:
    return UploadOut(
        dataset_id=dataset.id,
        state=dataset.state,  # type: ignore[arg-type]
        offset=dataset.upload_bytes,
        max_upload_bytes=settings.max_upload_bytes,
        max_upload_request_bytes=settings.upload_request_limit,
    )


@router.get("/{dataset_id}/upload", response_model=UploadOut, responses=problems(404))
def get_upload(
    dataset_id: uuid.UUID,
    session: SessionDep,
    settings: SettingsDep,
    principal: Annotated[Principal, allowed(Action.DATASET_CREATE)],
) -> UploadOut:
    """The committed offset of a resumable upload: after a dropped connection, send the
    file on from there."""
    return _upload_out(service.get_dataset(session, principal, dataset_id), settings)


_RANGE = re.compile(r"bytes (\d{1,19})-(\d{1,19})/(\d{1,19}|\*)")
_SPOOL = 2**20  # a chunk's body goes to a temporary file above this


def _content_range(header: str | None) -> tuple[int, int]:
    """``(start, length)`` of ``Content-Range: bytes START-END/TOTAL`` (or ``/*``)."""
    found = _RANGE.fullmatch((header or "").strip())
    if found is None:
        raise BadRequest(
            "send Content-Range: bytes START-END/TOTAL (or /*) with each chunk",
            field="Content-Range",
        )
    start, end = int(found[1]), int(found[2])
    if end < start or (found[3] != "*" and end >= int(found[3])):
        raise BadRequest("the Content-Range is not a range of the file", field="Content-Range")
    return start, end - start + 1


@router.put(
    "/{dataset_id}/upload",
    response_model=UploadOut,
    responses=problems(400, 404, 409, 413, 415),
    summary="Append a chunk of the file to a resumable upload",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/octet-stream": {"schema": {"type": "string"}}},
        }
    },
)
async def put_chunk(
    dataset_id: uuid.UUID,
    request: Request,
    session: SessionDep,
    cipher: CipherDep,
    settings: SettingsDep,
    principal: Annotated[Principal, allowed(Action.DATASET_CREATE)],
    content_range: Annotated[str | None, Header(description="bytes START-END/TOTAL")] = None,
    offset: Annotated[
        int | None,
        Query(
            ge=0,
            description="Where the chunk starts, when no Content-Range is sent "
            "(its length is then the body's)",
        ),
    ] = None,
) -> UploadOut:
    """Bytes START to END of the file (``Content-Range: bytes START-END/TOTAL``, or
    ``?offset=START`` and the body's length), in order; resend from ``GET …/upload``'s
    offset after a failure. The rows they complete are stored and the offset moves on, in one
    transaction; bytes already committed are skipped, so a chunk sent twice changes
    nothing. A chunk cut short (a dropped connection) stores nothing."""
    if content_range is None and offset is not None:
        start, length = offset, None
    else:
        start, length = _content_range(content_range)
    if length is not None and length > settings.upload_request_limit:
        raise ContentTooLarge(
            "the chunk is larger than KEYSEED_MAX_UPLOAD_REQUEST_BYTES "
            f"({settings.upload_request_limit} bytes)"
        )
    with tempfile.SpooledTemporaryFile(max_size=_SPOOL) as body:
        received = 0
        async for part in request.stream():
            received += len(part)
            if length is not None and received > length:
                raise BadRequest(
                    f"the body is longer than the {length} bytes of its Content-Range",
                    field="Content-Range",
                )
            body.write(part)
        if length is None:
            length = received
        if received < length:
            raise BadRequest(
                f"the chunk ended after {received} of its {length} bytes; nothing of it was "
                "stored: send it again from the upload's offset",
                field="body",
            )
        if length == 0:
            raise BadRequest("the chunk is empty", field="body")
        body.seek(0)
        dataset = await run_in_threadpool(
            service.append_chunk,
            session,
            principal,
            cipher,
            dataset_id,
            start,
            body,
            length,
            settings.max_upload_bytes,
        )
    return _upload_out(dataset, settings)


@router.post(
    "/{dataset_id}/seal",
    response_model=DatasetOut,
    responses=problems(404, 409),
    summary="Complete a resumable upload",
)
def seal_upload(
    dataset_id: uuid.UUID,
    session: SessionDep,
    cipher: CipherDep,
    principal: Annotated[Principal, allowed(Action.DATASET_CREATE)],
) -> DatasetOut:
    """The file is complete: its last row is read, the counts are final and the dataset
    is ``ready`` (jobs may run; nothing more is appended). A file of no document to
    store is refused (422), and the upload stays open."""
    dataset = service.seal_upload(session, principal, cipher, dataset_id)
    return service.to_out(session, dataset, principal)


@router.get("", response_model=list[DatasetOut])
def list_datasets(
    session: SessionDep, principal: Annotated[Principal, allowed(Action.DATASET_READ)]
) -> list[DatasetOut]:
    return [
        service.to_out(session, d, principal) for d in service.list_datasets(session, principal)
    ]


@router.get("/{dataset_id}", response_model=DatasetOut, responses=problems(404))
def get_dataset(
    dataset_id: uuid.UUID,
    session: SessionDep,
    principal: Annotated[Principal, allowed(Action.DATASET_READ)],
) -> DatasetOut:
    return service.to_out(session, service.get_dataset(session, principal, dataset_id), principal)


@router.delete("/{dataset_id}", response_model=DatasetOut, responses=problems(404, 409))
def delete_dataset(
    dataset_id: uuid.UUID,
    session: SessionDep,
    cipher: CipherDep,
    settings: SettingsDep,
    principal: Annotated[Principal, allowed(Action.DATASET_DELETE)],
) -> DatasetOut:
    """Purge the documents and destroy the dataset's key, so that no copy of them left
    anywhere (database WAL, backups) can be opened. The dataset's metadata, jobs,
    releases and ledger remain; the files its releases were rendered to for download are
    removed (rendered again from the database on a later download)."""
    deleted = service.delete_dataset(session, principal, cipher, dataset_id, settings.data_path)
    return service.to_out(session, deleted, principal)


@router.patch("/{dataset_id}", response_model=DatasetOut, responses=problems(400, 404, 409))
def change_cap(
    dataset_id: uuid.UUID,
    body: CapChange,
    session: SessionDep,
    principal: Annotated[Principal, allowed(Action.DATASET_SET_CAP)],
) -> DatasetOut:
    """Set the dataset's ε cap (admin only; the reason goes to the audit trail)."""
    dataset = service.set_cap(
        session, principal, dataset_id, body.epsilon_cap, body.reason, body.delta_cap
    )
    return service.to_out(session, dataset, principal)


@router.get("/{dataset_id}/ledger", response_model=LedgerOut, responses=problems(404))
def get_ledger(
    dataset_id: uuid.UUID,
    session: SessionDep,
    principal: Annotated[Principal, allowed(Action.LEDGER_READ)],
) -> LedgerOut:
    dataset = service.get_dataset(session, principal, dataset_id)
    figures, entries = ledger.ledger_of(session, dataset)
    owner = principal.organisation_id == dataset.organisation_id
    shown = [LedgerEntryOut.model_validate(e) for e in entries]
    for entry in shown:
        if not ledger.time_shown(entry.actor, owner=owner):
            entry.created_at = None
    return LedgerOut(
        dataset_id=dataset.id,
        budget=service.budget_out(figures),
        entries=shown,
        reports=ledger.reports_out(session, dataset, entries, owner=owner),
    )
