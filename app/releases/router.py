"""Releases: created by the data owner, listed and downloaded by grantees."""

from __future__ import annotations

import uuid
from typing import Annotated, Literal

from fastapi import APIRouter, BackgroundTasks, Query, Request, status
from fastapi.responses import FileResponse, Response, StreamingResponse

from app.admin.templating import render
from app.deps import DatabaseDep, SessionDep, SettingsDep, allowed, writing
from app.errors import Unprocessable, problems
from app.identity.policy import Action, Principal
from app.releases import export, files, prompts, report, report_pdf, service
from app.releases.schemas import ReleaseIn, ReleaseOut

router = APIRouter(prefix="/v1", tags=["releases"], responses=problems(401, 403, 404, 413, 422))


@router.post(
    "/jobs/{job_id}/release",
    status_code=status.HTTP_201_CREATED,
    response_model=ReleaseOut,
    responses=problems(400, 409),
)
def create_release(
    job_id: uuid.UUID,
    body: ReleaseIn,
    session: SessionDep,
    database: DatabaseDep,
    settings: SettingsDep,
    background: BackgroundTasks,
    principal: Annotated[Principal, allowed(Action.RELEASE_CREATE)],
) -> ReleaseOut:
    """Release a succeeded job's synthetic corpus to the named client organisations.

    Once the release is stored, its files (JSONL, CSV, Parquet) are rendered after the
    answer is sent, so the first download finds them ready (compressed ones are
    rendered on their first download)."""
    release = service.create_release(session, principal, job_id, body, settings)
    source, texts_only = service.download_source(session, release)
    background.add_task(
        files.render_formats,
        database,
        settings.data_path,
        release.id,
        source,
        texts_only=texts_only,
        modified=release.created_at,
    )
    return service.to_out(release, list(body.client_organisations), principal)


@router.get("/releases", response_model=list[ReleaseOut])
def list_releases(
    session: SessionDep, principal: Annotated[Principal, allowed(Action.RELEASE_READ)]
) -> list[ReleaseOut]:
    """Owners see their releases, clients the releases granted to them."""
    releases = service.list_releases(session, principal)
    return [
        service.to_out(*service.get_release(session, principal, r.id), principal) for r in releases
    ]


@router.get("/releases/{release_id}", response_model=ReleaseOut)
def get_release(
    release_id: uuid.UUID,
    session: SessionDep,
    principal: Annotated[Principal, allowed(Action.RELEASE_READ)],
) -> ReleaseOut:
    return service.to_out(*service.get_release(session, principal, release_id), principal)


_DOWNLOAD_MEDIA = sorted({*export.FORMATS.values(), *files.MEDIA_TYPES.values()})


@router.get(
    "/releases/{release_id}/download",
    response_class=FileResponse,
    responses={
        200: {
            "description": "The corpus, one synthetic document a line (JSONL) or row (CSV, "
            "Parquet: columns label, text, keyphrases), gzip or zstd compressed when asked. "
            "`ETag` is the sha256 of the file's bytes (strong); `Last-Modified` the release's "
            "time",
            "content": {media: {"schema": {"type": "string"}} for media in _DOWNLOAD_MEDIA},
        },
        206: {"description": "The bytes of the `Range` asked for (`Content-Range` says which)"},
        304: {"description": "`If-None-Match` names the file's ETag: not sent again"},
        **problems(416),
    },
)
@writing
def download_release(
    release_id: uuid.UUID,
    request: Request,
    session: SessionDep,
    database: DatabaseDep,
    settings: SettingsDep,
    principal: Annotated[Principal, allowed(Action.RELEASE_DOWNLOAD)],
    format: Annotated[Literal["jsonl", "csv", "parquet"], Query()] = "jsonl",
    compression: Annotated[
        files.Compression,
        Query(
            description="The file compressed with gzip or zstd (`.gz`, `.zst`; served as "
            "`application/gzip` or `application/zstd`, not as a `Content-Encoding`: "
            "`Accept-Encoding` is not read). Parquet is compressed inside and takes none.",
        ),
    ] = "none",
) -> Response:
    """Only the owner organisation and the grantees download; every download that sends
    bytes (200, 206) is an audit event, recorded before the first byte is sent.

    Each format and compression is rendered to a file once, on its first download, and
    served from it: `If-None-Match` with its `ETag` answers 304, `Range` (and `If-Range`)
    206 with `Content-Range`, a range outside the file 416."""
    release, grantees = service.get_release(session, principal, release_id)
    service.ensure_downloadable(principal, release, grantees)
    if format == "parquet" and compression != "none":
        raise Unprocessable(
            "Parquet is compressed inside (zstd): download it with compression=none",
            field="compression",
        )
    job_id, texts_only = service.download_source(session, release)
    found = files.rendered(
        database,
        settings.data_path,
        release.id,
        job_id,
        texts_only=texts_only,
        fmt=format,
        compression=compression,
        modified=release.created_at,
    )
    headers = {"ETag": found.etag, "Cache-Control": "private, no-cache"}
    if files.not_modified(request.headers.get("if-none-match"), found.etag):
        return Response(status_code=304, headers=headers)
    files.check_range(request.headers, found)  # 416 before anything is recorded
    service.record_download(session, principal, release, format, compression)
    return files.ReleaseFile(
        found.path,
        headers=headers,
        media_type=files.media_type(format, compression),
        filename=f"release-{release.id}{files.suffix(format, compression)}",
        stat_result=found.stat,
    )


@router.get(
    "/releases/{release_id}/prompts",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "The job's prompt log, one record a line (JSONL), in chain order",
            "content": {prompts.MEDIA_TYPE: {"schema": {"type": "string"}}},
        },
    },
)
def release_prompts(
    release_id: uuid.UUID,
    session: SessionDep,
    database: DatabaseDep,
    principal: Annotated[Principal, allowed(Action.RELEASE_READ)],
) -> StreamingResponse:
    """Every prompt the job sent to an LLM, hash-chained: each record names what it was
    built from (DP outputs and public inputs) and the hash of the record before it; the
    release report gives the head hash. Read by whoever reads the report: the owner and
    the grantees with the prompts in clear, platform roles without them (the chain and
    the digests only). Check it with ``keyseed verify-prompts``."""
    release, grantees = service.get_release(session, principal, release_id)
    shown = not principal.platform and principal.organisation_id in (
        release.organisation_id,
        *grantees,
    )
    return StreamingResponse(
        prompts.jsonl_chunks(database, release.job_id, content=shown),
        media_type=prompts.MEDIA_TYPE,
        headers={"Content-Disposition": f'inline; filename="prompts-{release.id}.jsonl"'},
    )


@router.get(
    "/releases/{release_id}/report",
    response_model=report.ReleaseReport,
    responses={
        200: {
            "description": "The release report: JSON (default), an HTML page or a PDF",
            "content": {
                "text/html": {"schema": {"type": "string"}},
                "application/pdf": {"schema": {"type": "string", "format": "binary"}},
            },
        },
    },
)
def release_report(
    release_id: uuid.UUID,
    request: Request,
    session: SessionDep,
    principal: Annotated[Principal, allowed(Action.RELEASE_READ)],
    format: Annotated[Literal["json", "html", "pdf"], Query()] = "json",
) -> Response | report.ReleaseReport:
    """What a privacy officer signs: what is protected and the guarantee in words, the
    spend, what was released to whom and when (per class, classes without documents
    flagged), provenance and sample documents. The owner organisation, the grantees and
    the platform roles read it, each in its own view (the JSON's ``view``)."""
    built = report.build(session, principal, release_id)
    if format == "pdf":
        return Response(
            report_pdf.render(built),
            media_type="application/pdf",
            headers={"Content-Disposition": f'inline; filename="report-{release_id}.pdf"'},
        )
    if format == "html":
        base = request.url.path
        return render(
            request,
            "report.html",
            {"report": built, "json_link": base, "pdf_link": f"{base}?format=pdf"},
        )
    return built
