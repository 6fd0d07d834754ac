"""Public vocabularies: the built-ins shipped with the engine and the ones organisations
upload (phrase-per-line UTF-8 text, stored normalised in the database so that every
worker reads the same list; their embeddings are cached by fingerprint in the shared
cache directory, ``KEYSEED_CACHE_DIR``)."""

from __future__ import annotations

import functools
import uuid
from dataclasses import dataclass
from typing import IO, Any

from sqlalchemy.orm import Session

from app.datasets.upload import check_content
from app.errors import Conflict, NotFound, Unprocessable, UnsupportedMediaType
from app.identity import policy
from app.identity.policy import Principal
from app.ledger import audit
from app.models import Vocabulary
from app.vocabularies import repository
from workers.text import vocabulary as engine_vocabulary
from workers.text.vocabulary import BUILTIN_VOCABULARIES, normalise

MAX_PHRASES = 2_000_000


@dataclass(frozen=True)
class VocabularyRef:
    """What a job records of its vocabulary."""

    kind: str  # "builtin" | "uploaded"
    id: str  # the built-in's name, or the uploaded vocabulary's id
    name: str
    size: int
    fingerprint: str


@functools.cache
def builtin_vocabularies() -> tuple[dict[str, Any], ...]:
    """Descriptions of the built-ins; loading them takes a while, so once per process."""
    return tuple(engine_vocabulary.describe_builtin())


def list_vocabularies(session: Session, principal: Principal) -> list[dict[str, Any]]:
    builtins = [
        {"id": d["name"], "kind": "builtin", "organisation_id": None, "created_at": None, **d}
        for d in builtin_vocabularies()
    ]
    uploaded = repository.list_vocabularies(session, policy.organisation_scope(principal))
    return builtins + [describe(v) for v in uploaded]


def describe(vocabulary: Vocabulary) -> dict[str, Any]:
    return {
        "id": str(vocabulary.id),
        "kind": "uploaded",
        "name": vocabulary.name,
        "size": vocabulary.size,
        "fingerprint": vocabulary.fingerprint,
        "description": vocabulary.description,
        "source": "uploaded",
        "licence": vocabulary.licence,
        "organisation_id": vocabulary.organisation_id,
        "created_at": vocabulary.created_at,
    }


def upload(
    session: Session,
    principal: Principal,
    *,
    name: str,
    description: str,
    licence: str,
    stream: IO[bytes],
) -> Vocabulary:
    data = stream.read()
    check_content(data[:8192])
    if b"\x00" in data:
        raise UnsupportedMediaType("the file holds binary data; upload UTF-8 text")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise Unprocessable(
            f"the file is not valid UTF-8 at line {line}", field="file", line=line
        ) from None
    lines = text.split("\n")
    if len(lines) > MAX_PHRASES:
        raise Unprocessable(f"a vocabulary holds at most {MAX_PHRASES} phrases", field="file")
    phrases = [p for p in (normalise(line) for line in lines) if p]
    if not phrases:
        raise Unprocessable("the file holds no phrase", field="file")
    built = engine_vocabulary.Vocabulary.from_phrases(name, phrases)
    existing = repository.by_fingerprint(session, principal.organisation_id, built.fingerprint)
    if existing is not None:
        raise Conflict(
            "this organisation has uploaded the same phrase list already", existing=str(existing.id)
        )
    vocabulary = repository.add(
        session,
        Vocabulary(
            organisation_id=principal.organisation_id,
            name=name,
            description=description,
            licence=licence,
            fingerprint=built.fingerprint,
            size=len(built),
            phrases="\n".join(built.phrases),
            created_by=principal.actor.ref,
        ),
    )
    audit.record_about(
        session,
        "vocabulary.uploaded",
        principal.actor,
        vocabulary,
        size=vocabulary.size,
        fingerprint=vocabulary.fingerprint,
    )
    return vocabulary


def resolve(session: Session, principal: Principal, ref: str) -> VocabularyRef:
    """The vocabulary a job spec names, as the submitter may use it (422 otherwise)."""
    if ref in BUILTIN_VOCABULARIES:
        found = next(d for d in builtin_vocabularies() if d["name"] == ref)
        return VocabularyRef("builtin", ref, ref, found["size"], found["fingerprint"])
    try:
        vocabulary_id = uuid.UUID(ref)
    except ValueError:
        vocabulary_id = None
    vocabulary = repository.get(session, vocabulary_id) if vocabulary_id else None
    if vocabulary is None or not policy.can_reach(principal, vocabulary.organisation_id):
        raise Unprocessable(
            f"name a built-in vocabulary ({', '.join(BUILTIN_VOCABULARIES)}) or the id of "
            "a vocabulary your organisation uploaded",
            field="vocabulary",
        )
    return VocabularyRef(
        "uploaded", str(vocabulary.id), vocabulary.name, vocabulary.size, vocabulary.fingerprint
    )


def engine_vocabulary_for(session: Session, ref: VocabularyRef) -> engine_vocabulary.Vocabulary:
    """The engine's :class:`Vocabulary` for a job (for workers)."""
    if ref.kind == "builtin":
        return engine_vocabulary.load_vocabulary(ref.id)
    stored = repository.get(session, uuid.UUID(ref.id))
    if stored is None:
        raise NotFound("no such vocabulary")
    return engine_vocabulary.Vocabulary(stored.name, tuple(stored.phrases.split("\n")))
