"""``/admin``: the privacy officer's dashboard, server-rendered.

People sign in (admin, auditor); an API key is refused here with a problem+json 401 or
403, whatever its role, and never gets a page. A browser without a session is sent to
the sign-in form. Every POST form carries the session's CSRF token; auditors read every
page and are refused (403) every change.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal
from urllib.parse import urlencode, urlsplit

from fastapi import APIRouter, Depends, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import RedirectResponse, StreamingResponse
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.responses import Response

from app.admin import service, sessions
from app.admin.sessions import SignedIn
from app.admin.templating import error_page, render, root, secured
from app.config import Settings
from app.deps import CipherDep, DatabaseDep, SessionDep, SettingsDep
from app.errors import (
    Forbidden,
    Problem,
    Unauthorized,
    Unprocessable,
    UnsupportedMediaType,
)
from app.identity import policy
from app.identity import service as identity
from app.identity.policy import Action
from app.ledger import audit
from app.releases import report, report_pdf

SESSION_COOKIE = "keyseed_admin"
SIGN_IN_COOKIE = "keyseed_admin_sign_in"
CSRF_FIELD = "csrf_token"


class SignInRequired(Unauthorized):
    def __init__(self) -> None:
        super().__init__("sign in to use the dashboard")


class AdminRoute(APIRoute):
    """Errors of a browser's request become an HTML page (a sign-in redirect for a GET
    without a session); requests with an ``Authorization`` header get problem+json as
    everywhere else. Every response carries the dashboard's security headers."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                response = await handler(request)
            except (Problem, RequestValidationError) as exc:
                if "authorization" in request.headers:
                    raise
                if isinstance(exc, SignInRequired) and request.method in ("GET", "HEAD"):
                    asked = request.url.query
                    target = request.url.path + (f"?{asked}" if asked else "")
                    query = urlencode({"next": target})
                    response = RedirectResponse(f"{root(request)}/admin/sign-in?{query}", 303)
                else:
                    response = error_page(request, exc)
            return secured(response)

        return route


def refuse_api_keys(request: Request, session: SessionDep) -> None:
    """Machines use the API: a request with credentials is answered 401 (not a valid key)
    or 403 (a key, which the dashboard never takes), never with a page."""
    authorization = request.headers.get("authorization")
    if authorization is None:
        return
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("the dashboard takes no credentials but its session cookie")
    policy.authorize_dashboard(identity.authenticate(session, token.strip()))


router = APIRouter(
    prefix="/admin",
    include_in_schema=False,
    route_class=AdminRoute,
    dependencies=[Depends(refuse_api_keys, scope="function")],
)


def signed_in(request: Request, session: SessionDep) -> SignedIn:
    found = sessions.resolve(session, request.cookies.get(SESSION_COOKIE))
    if found is None:
        raise SignInRequired()
    policy.authorize_dashboard(found.principal)
    request.state.admin_badge = found.badge  # for the error page, should one follow
    return found


Me = Annotated[SignedIn, Depends(signed_in, scope="function")]


def may(action: Action) -> Any:
    """``Annotated[SignedIn, may(Action.X)]``: the signed-in person, if their role may X."""

    def dependency(me: Me) -> SignedIn:
        policy.authorize(me.principal, action)
        return me

    dependency.__name__ = f"may_{action.name.lower()}"
    return Depends(dependency, scope="function")


def _same_origin(request: Request) -> None:
    """Browsers name the page a form was posted from; refuse another site's. The host is
    the ``Host`` header (a reverse proxy passes it through); ``X-Forwarded-Host`` would be
    any client's word."""
    if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        raise Forbidden("the form was posted from another site")
    origin = request.headers.get("origin")
    if origin is not None and urlsplit(origin).netloc != request.headers.get("host"):
        raise Forbidden("the form was posted from another site")


async def _form(request: Request) -> FormData:
    """A form as browsers post it (no multipart: nothing here takes a file)."""
    media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media != "application/x-www-form-urlencoded":
        raise UnsupportedMediaType("post the form as application/x-www-form-urlencoded")
    return await request.form()


async def checked_form(request: Request, me: Me) -> FormData:
    """The posted form, once its CSRF token is the session's."""
    form = await _form(request)
    sessions.check_token(me.csrf_token, form.get(CSRF_FIELD))
    _same_origin(request)
    return form


CheckedForm = Annotated[FormData, Depends(checked_form, scope="function")]


def _text(form: FormData, name: str) -> str:
    value = form.get(name)
    return value if isinstance(value, str) else ""


def _secure(request: Request, settings: Settings) -> bool:
    if settings.admin_cookie_secure == "auto":
        return request.url.scheme == "https"
    return settings.admin_cookie_secure == "always"


def _set_cookie(
    response: Response, request: Request, settings: Settings, name: str, value: str
) -> None:
    response.set_cookie(
        name,
        value,
        httponly=True,
        samesite="strict",
        secure=_secure(request, settings),
        path=f"{root(request)}/admin",
    )


def _delete_cookie(response: Response, request: Request, settings: Settings, name: str) -> None:
    response.delete_cookie(
        name,
        httponly=True,
        samesite="strict",
        secure=_secure(request, settings),
        path=f"{root(request)}/admin",
    )


def _page(request: Request, me: SignedIn, template: str, section: str, **context: Any) -> Response:
    status = context.pop("status_code", 200)
    values = {"badge": me.badge, "csrf": me.csrf_token, "section": section, **context}
    values["is_admin"] = me.user.role == "admin"
    return render(request, template, values, status_code=status)


def _safe_next(request: Request, target: str) -> str:
    home = f"{root(request)}/admin"
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or "\\" in target or not parts.path.startswith(home):
        return home
    return target


# -- signing in and out -----------------------------------------------------------------


@router.get("/sign-in")
def sign_in_form(
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    next: Annotated[str, Query(max_length=2000)] = "",
    signed_out: Annotated[bool, Query()] = False,
) -> Response:
    if sessions.resolve(session, request.cookies.get(SESSION_COOKIE)) is not None:
        return RedirectResponse(_safe_next(request, next), 303)
    token = request.cookies.get(SIGN_IN_COOKIE)
    if not sessions.well_formed(token):
        token = sessions.new_token()
    assert token is not None
    response = render(
        request,
        "sign_in.html",
        {"form_token": token, "next": next, "signed_out": signed_out, "error": None},
    )
    _set_cookie(response, request, settings, SIGN_IN_COOKIE, token)
    return response


@router.post("/sign-in")
async def sign_in(
    request: Request, database: DatabaseDep, cipher: CipherDep, settings: SettingsDep
) -> Response:
    form = await _form(request)
    expected = request.cookies.get(SIGN_IN_COOKIE)
    sessions.check_token(expected if sessions.well_formed(expected) else None, form.get(CSRF_FIELD))
    _same_origin(request)
    address = (request.client.host if request.client else "unknown")[:64]
    result = await run_in_threadpool(  # database and argon2: never on the event loop
        sessions.sign_in,
        database,
        cipher,
        username=_text(form, "username").strip(),
        password=_text(form, "password"),
        address=address,
        lifetime=timedelta(hours=settings.admin_session_hours),
    )
    next_page = _text(form, "next")
    if result.token is None:
        retry = result.retry_after
        error = "The name or the password is wrong."
        headers = {}
        if retry is not None:
            minutes = max(1, int(retry.total_seconds() + 59) // 60)
            error = f"Too many failed sign-ins. Try again in {minutes} minute(s)."
            headers["Retry-After"] = str(int(retry.total_seconds()) + 1)
        assert expected is not None
        context = {"form_token": expected, "next": next_page, "signed_out": False, "error": error}
        status = 429 if retry is not None else 401
        return render(request, "sign_in.html", context, status_code=status, headers=headers)
    response = RedirectResponse(_safe_next(request, next_page), 303)
    _set_cookie(response, request, settings, SESSION_COOKIE, result.token)
    _delete_cookie(response, request, settings, SIGN_IN_COOKIE)
    return response


@router.post("/sign-out")
def sign_out(
    request: Request, session: SessionDep, settings: SettingsDep, form: CheckedForm, me: Me
) -> Response:
    sessions.sign_out(session, me)
    response = RedirectResponse(f"{root(request)}/admin/sign-in?signed_out=true", 303)
    _delete_cookie(response, request, settings, SESSION_COOKIE)
    return response


# -- pages ------------------------------------------------------------------------------


@router.get("")
def overview(
    request: Request,
    session: SessionDep,
    me: Annotated[SignedIn, may(Action.LEDGER_READ)],
    sort: Annotated[str, Query(max_length=20)] = service.DEFAULT_SORT,
    order: Annotated[str, Query(max_length=4)] = "asc",
) -> Response:
    sort = sort if sort in service.SORTS else service.DEFAULT_SORT
    descending = order == "desc"
    policy.authorize(me.principal, Action.DATASET_READ)
    rows = service.overview(session, me.principal, sort=sort, descending=descending)
    return _page(
        request,
        me,
        "overview.html",
        "overview",
        rows=rows,
        sort=sort,
        descending=descending,
        near_cap_share=service.NEAR_CAP_SHARE,
        accountants=[r.budget.figures.accountant for r in rows],
    )


@router.get("/organisations")
def organisations(
    request: Request,
    session: SessionDep,
    me: Annotated[SignedIn, may(Action.ORGANISATION_LIST)],
) -> Response:
    rows = service.organisations(session, me.principal)
    return _page(
        request,
        me,
        "organisations.html",
        "organisations",
        rows=rows,
        accountants=[r.figures.accountant for r in rows if r.figures.datasets],
    )


@router.get("/organisations/{organisation_id}")
def organisation(
    request: Request,
    organisation_id: uuid.UUID,
    session: SessionDep,
    me: Annotated[SignedIn, may(Action.ORGANISATION_READ_BUDGET)],
) -> Response:
    policy.authorize(me.principal, Action.DATASET_READ)
    page = service.organisation_page(session, me.principal, organisation_id)
    return _page(
        request,
        me,
        "organisation.html",
        "organisations",
        page=page,
        accountants=page.accountants,
    )


@router.get("/datasets/{dataset_id}")
def dataset(
    request: Request,
    dataset_id: uuid.UUID,
    session: SessionDep,
    me: Annotated[SignedIn, may(Action.LEDGER_READ)],
    changed: Annotated[bool, Query()] = False,
) -> Response:
    policy.authorize(me.principal, Action.JOB_READ)
    page = service.dataset_page(session, me.principal, dataset_id)
    return _page(
        request,
        me,
        "dataset.html",
        "overview",
        page=page,
        changed=changed,
        accountants=page.accountants,
    )


def _cap_form(
    request: Request,
    session: SessionDep,
    me: SignedIn,
    dataset_id: uuid.UUID,
    *,
    error: Problem | None = None,
    cap: str = "",
    reason: str = "",
) -> Response:
    page = service.dataset_page(session, me.principal, dataset_id)
    return _page(
        request,
        me,
        "cap.html",
        "overview",
        page=page,
        error=error,
        cap=cap,
        reason=reason,
        accountants=page.accountants,
        status_code=error.status if error is not None else 200,
    )


@router.get("/datasets/{dataset_id}/cap")
def cap_form(
    request: Request,
    dataset_id: uuid.UUID,
    session: SessionDep,
    me: Annotated[SignedIn, may(Action.DATASET_SET_CAP)],
) -> Response:
    return _cap_form(request, session, me, dataset_id)


@router.post("/datasets/{dataset_id}/cap")
def change_cap(
    request: Request,
    dataset_id: uuid.UUID,
    session: SessionDep,
    form: CheckedForm,
    me: Annotated[SignedIn, may(Action.DATASET_SET_CAP)],
) -> Response:
    cap, reason = _text(form, "epsilon_cap"), _text(form, "reason")
    try:
        with session.begin_nested():
            service.change_cap(session, me.principal, dataset_id, cap, reason)
    except Problem as exc:
        if exc.status not in (409, 422):
            raise
        return _cap_form(request, session, me, dataset_id, error=exc, cap=cap, reason=reason)
    return RedirectResponse(f"{root(request)}/admin/datasets/{dataset_id}?changed=true", 303)


@router.get("/releases/{release_id}/report")
def release_report(
    request: Request,
    release_id: uuid.UUID,
    session: SessionDep,
    me: Annotated[SignedIn, may(Action.RELEASE_READ)],
    format: Annotated[Literal["html", "pdf", "json"], Query()] = "html",
) -> Response:
    """The release report (app/releases/report.py) in the platform roles' view: the page
    the API serves at ``/v1/releases/{id}/report?format=html``, with the dashboard's
    navigation, and its PDF and JSON."""
    built = report.build(session, me.principal, release_id)
    if format == "pdf":
        return Response(report_pdf.render(built), media_type="application/pdf")
    if format == "json":
        return Response(built.model_dump_json(), media_type="application/json")
    base = request.url.path
    links = {"json_link": f"{base}?format=json", "pdf_link": f"{base}?format=pdf"}
    return _page(request, me, "report.html", "overview", report=built, **links)


def audit_query(
    organisation: Annotated[str, Query(max_length=64)] = "",
    actor: Annotated[str, Query(max_length=200)] = "",
    kind: Annotated[str, Query(max_length=64)] = "",
    date_from: Annotated[str, Query(alias="from", max_length=32)] = "",
    date_to: Annotated[str, Query(alias="to", max_length=32)] = "",
) -> service.AuditQuery:
    """The audit filters of the query string (the audit page's and its CSV export's)."""
    return service.AuditQuery(organisation, actor, kind, date_from, date_to)


AuditQueryDep = Annotated[service.AuditQuery, Depends(audit_query)]


@router.get("/audit")
def audit_log(
    request: Request,
    session: SessionDep,
    me: Annotated[SignedIn, may(Action.AUDIT_READ)],
    query: AuditQueryDep,
    cursor: Annotated[int | None, Query(ge=1, le=2**63 - 1)] = None,
) -> Response:
    filters, problems = query.to_filter()
    page = None if problems else service.audit_page(session, filters, cursor=cursor)
    return _page(
        request,
        me,
        "audit.html",
        "audit",
        query=query,
        problems=problems,
        audit=page,
        cursor=cursor,
        kinds=audit.EVENT_KINDS,
        organisations=service.organisation_names(session),
        actors=service.known_actors(session),
        params=urlencode(query.params()),
        status_code=422 if problems else 200,
    )


@router.get("/audit.csv")
def audit_export(
    request: Request,
    database: DatabaseDep,
    me: Annotated[SignedIn, may(Action.AUDIT_READ)],
    query: AuditQueryDep,
) -> Response:
    filters, problems = query.to_filter()
    if problems:
        detail = "; ".join(f"{name}: {text}" for name, text in problems.items())
        raise Unprocessable(detail)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return StreamingResponse(
        service.audit_csv(database, filters),
        media_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="keyseed-audit-{stamp}.csv"'},
    )


@router.get("/keys")
def keys(
    request: Request,
    session: SessionDep,
    me: Annotated[SignedIn, may(Action.KEY_LIST)],
    revoked: Annotated[str, Query(max_length=16)] = "",
) -> Response:
    rows = service.keys(session, me.principal)
    return _page(request, me, "keys.html", "keys", rows=rows, revoked=revoked)


@router.post("/keys/{key_id}/revoke")
def revoke_key(
    request: Request,
    key_id: uuid.UUID,
    session: SessionDep,
    form: CheckedForm,
    me: Annotated[SignedIn, may(Action.KEY_REVOKE)],
) -> Response:
    key = identity.revoke_key(session, me.principal.actor, key_id)
    query = urlencode({"revoked": key.prefix})
    return RedirectResponse(f"{root(request)}/admin/keys?{query}", 303)
