"""Each organisation's limits on jobs, so that none can hold the workers for everyone.

Checked alike by the dry run and the submission, from public inputs only (the spec, the
declared labels, the settings), before anything is reserved or sent; a job over one is
refused with :class:`~app.errors.LimitExceeded` (409, ``/problems/limit-exceeded``),
naming the limit (``limit``, the setting's name), its value (``value``), what the job
would take (``asked``) and the spec field to change (``field``), where one is to blame:

* ``org_max_active_jobs``: the organisation's jobs queued or running at once;
* ``org_max_llm_calls_per_job``: the LLM requests the job plans (the method's planned
  calls, retries excluded, :mod:`workers.methods.registry`; none without an LLM);
* ``org_max_llm_tokens_per_job``: those calls × the most tokens each may generate
  (the method's ``max_tokens``, or the server's ``llm_max_tokens`` where it has none);
* ``org_max_llm_concurrency``: the LLM requests in flight a method's spec asks for
  (``concurrency``, where it has one; the server's own LLM concurrency caps it further
  when it runs).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from app.config import Settings
from app.errors import LimitExceeded, NotFound
from app.jobs import repository
from app.jobs.schemas import AnySpec
from app.ledger import repository as ledger_repo
from workers.methods.registry import METHODS


@dataclass(frozen=True)
class LLMUse:
    """The LLM work a job plans: calls, the most tokens a call generates, in flight."""

    calls: int
    max_tokens: int
    concurrency: int | None  # None: the spec has no say (the server's)
    calls_field: str
    tokens_field: str  # the spec field that bounds the tokens of a call

    @property
    def tokens(self) -> int:
        return self.calls * self.max_tokens


def llm_use(spec: AnySpec, classes: int, settings: Settings) -> LLMUse:
    """What ``spec`` plans to ask of the LLM over ``classes`` declared labels."""
    method = METHODS[spec.method]
    params = spec.params()
    calls_field = method.calls_field(params)
    return LLMUse(
        calls=0 if spec.llm == "none" else method.planned_calls(params, classes),
        max_tokens=int(getattr(params, "max_tokens", settings.llm_max_tokens)),
        concurrency=getattr(params, "concurrency", None),
        calls_field=calls_field,
        tokens_field="max_tokens" if "max_tokens" in type(params).model_fields else calls_field,
    )


def _refuse(what: str, limit: str, value: int, asked: int, field: str | None) -> LimitExceeded:
    extra: dict[str, Any] = {"field": field} if field is not None else {}
    return LimitExceeded(
        f"{what} {asked:,}, over this organisation's limit of {value:,} ({limit}); "
        "an administrator sets the limits",
        limit=limit,
        value=value,
        asked=asked,
        **extra,
    )


def check_spec(spec: AnySpec, classes: int, settings: Settings) -> None:
    """Refuse a spec over a per-job limit (:class:`LimitExceeded`)."""
    use = llm_use(spec, classes, settings)
    if use.concurrency is not None and use.concurrency > settings.org_max_llm_concurrency:
        raise _refuse(
            "the job asks for LLM requests in flight at once:",
            "org_max_llm_concurrency",
            settings.org_max_llm_concurrency,
            use.concurrency,
            "concurrency",
        )
    if use.calls > settings.org_max_llm_calls_per_job:
        raise _refuse(
            "the job plans LLM calls:",
            "org_max_llm_calls_per_job",
            settings.org_max_llm_calls_per_job,
            use.calls,
            use.calls_field,
        )
    if use.tokens > settings.org_max_llm_tokens_per_job:
        raise _refuse(
            f"the job plans {use.calls:,} LLM calls of up to {use.max_tokens:,} tokens, in tokens:",
            "org_max_llm_tokens_per_job",
            settings.org_max_llm_tokens_per_job,
            use.tokens,
            use.tokens_field,
        )


def check_active_jobs(
    session: Session, organisation_id: uuid.UUID, settings: Settings, *, lock: bool = False
) -> None:
    """Refuse a job of an organisation that has ``org_max_active_jobs`` queued or
    running already; a submission counts its own job, under the organisation's row lock
    (``lock``: two submissions cannot both take the last place)."""
    if lock and ledger_repo.organisation(session, organisation_id, for_update=True) is None:
        raise NotFound("no such organisation")
    active = len(repository.active_of_organisation(session, organisation_id))
    asked = active if lock else active + 1  # a submission's own job is among them
    if asked > settings.org_max_active_jobs:
        raise _refuse(
            "the organisation would have jobs queued or running:",
            "org_max_active_jobs",
            settings.org_max_active_jobs,
            asked,
            None,
        )
