"""``/v1/datasets``: upload (multipart), read, delete, change the cap, read the ledger."""

from __future__ import annotations

import uuid
from typing import Annotated, Literal

from fastapi import APIRouter, File, Form, UploadFile, status
from pydantic.json_schema import SkipJsonSchema

from app.datasets import service
from app.datasets.schemas import (
    MAX_EPSILON,
    MIN_EPSILON_CAP,
    CapChange,
    DatasetOut,
    LedgerEntryOut,
    LedgerOut,
)
from app.datasets.upload import UploadSpec, detect_format
from app.deps import CipherDep, SessionDep, SettingsDep, allowed
from app.errors import ContentTooLarge, Unprocessable, problems
from app.identity.policy import Action, Principal
from app.identity.schemas import NAME_PATTERN
from app.ledger import service as ledger

router = APIRouter(prefix="/v1/datasets", tags=["datasets"], responses=problems(401, 403, 413, 422))
_NAME = NAME_PATTERN
MAX_LABELS = 1000
MAX_TEXT_COLUMNS = 20


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
    name: Annotated[
        str,
        Form(
            min_length=1,
            max_length=200,
            pattern=_NAME,
            description="The dataset's name, shown to its organisation and the platform",
        ),
    ],
    text_column: Annotated[list[str], Form(min_length=1, description="Repeat for several columns")],
    label_column: Annotated[
        str,
        Form(
            min_length=1,
            max_length=200,
            pattern=_NAME,
            description="The column (CSV header or JSONL key) holding each row's label",
        ),
    ],
    labels: Annotated[
        list[str],
        Form(
            min_length=1,
            description="The declared label set (public schema); repeat, or "
            "give one comma-separated value",
        ),
    ],
    epsilon_cap: Annotated[
        float,
        Form(
            ge=MIN_EPSILON_CAP,
            le=MAX_EPSILON,
            allow_inf_nan=False,
            description="Carved out of the organisation's privacy budget",
        ),
    ],
    delta_cap: Annotated[
        float,
        Form(
            ge=0,
            lt=1,
            allow_inf_nan=False,
            description="The cap's δ (0, the default: pure ε-DP jobs only; Gaussian "
            "mechanisms need δ > 0); carved out of the organisation's budget",
        ),
    ] = 0.0,
    format: Annotated[
        Literal["csv", "jsonl"] | SkipJsonSchema[None],
        Form(description="Detected from the file name and content when not given"),
    ] = None,
    on_empty: Annotated[
        Literal["skip", "reject"],
        Form(
            description="Rows with an empty text: skip (the default) leaves them out and "
            "counts them; reject refuses the upload, naming the rows"
        ),
    ] = "skip",
    on_duplicate: Annotated[
        Literal["skip", "reject"],
        Form(
            description="Rows repeating an earlier row's text and label: skip (the "
            "default) keeps the first only and counts the rest; reject refuses the upload"
        ),
    ] = "skip",
    unit_column: Annotated[
        str | SkipJsonSchema[None],
        Form(
            min_length=1,
            max_length=200,
            pattern=_NAME,
            # the union with a hidden None drops the pattern from the schema: restate it
            json_schema_extra={"pattern": _NAME},
            description="The column naming each row's privacy unit (a patient id, say); "
            "without it every row is its own unit",
        ),
    ] = None,
) -> DatasetOut:
    """Documents are sealed (AES-256-GCM) before they are stored; the response and any
    error name rows and counts, never a document. Rows whose label is not declared,
    whose label or text column is missing, are refused with their row numbers, and then
    nothing is stored. With ``unit_column``, every row must name a non-empty unit. The cap
    (ε, δ) is carved out of what the organisation's budget has left (409 naming what
    remains when it does not fit)."""
    size = file.size if file.size is not None else 0
    if size > settings.max_upload_bytes:
        raise ContentTooLarge(f"the file is larger than {settings.max_upload_bytes} bytes")
    text_columns = _names(text_column, field="text_column", limit=MAX_TEXT_COLUMNS)
    label_set = _names(labels, field="labels", limit=MAX_LABELS)
    if label_column.strip() in text_columns:
        raise Unprocessable("the label column is also a text column", field="label_column")
    unit = unit_column.strip() if unit_column is not None else None
    if unit is not None and unit in (*text_columns, label_column.strip()):
        raise Unprocessable("the unit column is also a text or label column", field="unit_column")
    head = file.file.read(8192)
    file.file.seek(0)
    spec = UploadSpec(
        format=detect_format(format, file.filename, head),
        text_columns=text_columns,
        label_column=label_column.strip(),
        labels=label_set,
        on_empty=on_empty,
        on_duplicate=on_duplicate,
        unit_column=unit,
    )
    new = service.NewDataset(name=name, epsilon_cap=epsilon_cap, delta_cap=delta_cap, upload=spec)
    dataset = service.create_dataset(session, principal, cipher, new, file.file, size)
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
    principal: Annotated[Principal, allowed(Action.DATASET_DELETE)],
) -> DatasetOut:
    """Purge the documents and destroy the dataset's key, so that no copy of them left
    anywhere (database WAL, backups) can be opened. The dataset's metadata, jobs,
    releases and ledger remain."""
    deleted = service.delete_dataset(session, principal, cipher, dataset_id)
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
    return LedgerOut(
        dataset_id=dataset.id,
        budget=service.budget_out(figures),
        entries=[LedgerEntryOut.model_validate(e) for e in entries],
        reports=ledger.reports_out(session, dataset, entries),
    )
