"""``/v1/vocabularies``: the built-ins and uploaded public phrase lists."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Form, UploadFile, status

from app.deps import SessionDep, SettingsDep, allowed
from app.errors import ContentTooLarge, problems
from app.identity.policy import Action, Principal
from app.identity.schemas import NAME_PATTERN
from app.vocabularies import service
from app.vocabularies.schemas import VocabularyOut

router = APIRouter(
    prefix="/v1/vocabularies", tags=["vocabularies"], responses=problems(401, 403, 422)
)
_TEXT = r"^[^\x00-\x08\x0b-\x1f\x7f]*$"


@router.get("", response_model=list[VocabularyOut])
def list_vocabularies(
    session: SessionDep, principal: Annotated[Principal, allowed(Action.VOCABULARY_READ)]
) -> list[VocabularyOut]:
    """The built-in vocabularies and those uploaded by the caller's organisation (every
    organisation's for admins and auditors)."""
    return [VocabularyOut.model_validate(v) for v in service.list_vocabularies(session, principal)]


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=VocabularyOut,
    responses=problems(400, 409, 413, 415),
)
def upload_vocabulary(
    session: SessionDep,
    settings: SettingsDep,
    principal: Annotated[Principal, allowed(Action.VOCABULARY_CREATE)],
    file: Annotated[UploadFile, File(description="UTF-8 text, one public phrase a line")],
    name: Annotated[
        str,
        Form(
            min_length=1,
            max_length=200,
            pattern=NAME_PATTERN,
            description="The vocabulary's name, shown in listings",
        ),
    ],
    description: Annotated[
        str, Form(max_length=2000, pattern=_TEXT, description="What the phrases are (public)")
    ] = "",
    licence: Annotated[
        str,
        Form(max_length=500, pattern=_TEXT, description="The licence the phrases are under"),
    ] = "",
) -> VocabularyOut:
    """A public vocabulary (never private text: it is readable by the organisation and by
    the platform's admins and auditors)."""
    if (file.size or 0) > settings.max_upload_bytes:
        raise ContentTooLarge(f"the file is larger than {settings.max_upload_bytes} bytes")
    vocabulary = service.upload(
        session,
        principal,
        name=name,
        description=description,
        licence=licence,
        stream=file.file,
    )
    return VocabularyOut.model_validate(service.describe(vocabulary))
