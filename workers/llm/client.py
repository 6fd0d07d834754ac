"""Calling an OpenAI-compatible chat endpoint: retries, concurrency, a call cap, costs.

Any endpoint that speaks ``POST /v1/chat/completions`` will do: OpenAI, Azure through its
``/openai/v1/`` base URL, vLLM, llama-cpp-python's server, or the packaged SmolLM2 of
:mod:`workers.llm.local`. This module knows nothing of what a method puts in a prompt:
callers hand it the chat messages of each request (built lazily, by position).

Reliability. Endpoints fail in ordinary ways (rate limits, 5xx, timeouts, dropped
connections, a proxy answering HTML, an empty completion), so every call is retried by
tenacity with exponential back-off and full jitter, honouring ``Retry-After``; a client
error that no retry can mend (400, 401, 403, 404, 422 …) is not retried. Outcomes are
handed to ``on_result`` as they finish, so a caller can persist each one at once and,
after a crash, resume with ``indices`` = the positions still missing.

Why not the openai client's own retries (they are switched off): they cannot retry a 200
whose body is empty or not a completion (a small local model or a proxy gives those);
they cannot be stopped by ``max_calls``, the hard cap on what one run may spend at a paid
endpoint, which counts every HTTP call, retries included; a failed request does not say
how many calls it made (``LLMOutcome.attempts``, the job's ``llm_calls``); and their
back-off is fixed (0.5 s to 8 s, or up to 60 s on ``Retry-After``) where the settings'
``llm_backoff_base`` and ``llm_backoff_max`` bound it. So one tenacity policy covers every
fault, and only what no library does stays here: the call cap (:class:`_CallBudget`),
the mapping of faults to codes and reading ``Retry-After`` (:func:`parse_retry_after`).

Costs. :class:`LLMCosts` adds up what a run spent: HTTP calls (retries and failures
included), the prompt and completion tokens the endpoint reported in ``usage`` (an
endpoint that reports none adds none), and the run's wall time.

Errors are short codes (``http_429``, ``timeout``, ``empty_content`` …), and log lines
hold counts and codes only: neither ever quotes a prompt or a completion.
"""

from __future__ import annotations

import asyncio
import email.utils
import functools
import inspect
import logging
import math
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, ParamSpec, TypedDict, TypeVar, Unpack, cast

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    wait_random_exponential,
)

from workers.errors import ConfigError
from workers.llm import attestation

if TYPE_CHECKING:
    from openai import AsyncOpenAI
    from openai.types.chat import ChatCompletionMessageParam

    from workers.settings import CoreSettings

logger = logging.getLogger(__name__)

T = TypeVar("T")
P = ParamSpec("P")
RETRYABLE_STATUS = frozenset({408, 429})  # plus every 5xx
Messages = list[dict[str, str]]
OnResult = Callable[["LLMOutcome"], Awaitable[None] | None]
Progress = Callable[[int, int], None]


def check_number(
    value: object, *, name: str, low: float, high: float, integer: bool = False
) -> None:
    """ConfigError naming ``name`` unless ``value`` is a finite number in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        raise ConfigError("must be an integer" if integer else "must be a number", field=name)
    if not (math.isfinite(value) and low <= value <= high):
        raise ConfigError(f"must be between {low:g} and {high:g} (got {value})", field=name)


# ----------------------------------------------------------------------- endpoint


@dataclass(frozen=True)
class LLMEndpoint:
    """Where and how to call the LLM. The API key never appears in ``repr``."""

    base_url: str
    model: str
    api_key: str = field(default="not-needed", repr=False)
    timeout: float = 120.0  # seconds, per HTTP call
    max_tokens: int = 256
    temperature: float = 0.8

    @classmethod
    def from_settings(cls, settings: CoreSettings) -> LLMEndpoint | None:
        """The configured endpoint, or ``None`` when the packaged local model is meant."""
        base_url = settings.llm_base_url.strip()
        if not base_url:
            return None
        if not settings.llm_model.strip():
            raise ConfigError("name the model served at llm_base_url", field="llm_model")
        key = settings.llm_api_key.get_secret_value().strip() or "not-needed"
        return cls(
            base_url=base_url,
            model=settings.llm_model.strip(),
            api_key=key,
            timeout=settings.llm_timeout,
            max_tokens=settings.llm_max_tokens,
        ).validate()

    def validate(self) -> LLMEndpoint:
        if not isinstance(self.base_url, str) or not self.base_url.startswith(
            ("http://", "https://")
        ):
            raise ConfigError("must be an http:// or https:// URL", field="base_url")
        if not isinstance(self.model, str) or not self.model.strip():
            raise ConfigError("must name a model", field="model")
        if not isinstance(self.api_key, str):
            raise ConfigError("must be a string", field="api_key")
        check_number(self.timeout, name="timeout", low=1e-3, high=3600.0)
        check_number(self.max_tokens, name="max_tokens", low=1, high=32_768, integer=True)
        check_number(self.temperature, name="temperature", low=0.0, high=2.0)
        return self

    def client(self) -> AsyncOpenAI:
        """An async client whose own retries are off: :func:`complete` retries (the
        module's docstring says why)."""
        from openai import AsyncOpenAI

        return AsyncOpenAI(
            base_url=self.base_url,
            api_key=self.api_key,
            timeout=self.timeout,
            max_retries=0,
        )


# ----------------------------------------------------------------------- outcomes, costs


@dataclass(frozen=True)
class LLMOutcome:
    """What became of one request. ``error`` is a short code, never a quote."""

    index: int  # position of the request in the input
    text: str | None  # the generated text, stripped, or None
    error: str | None  # "http_500", "timeout", "empty_content", "call_cap_reached" …
    attempts: int  # HTTP calls made for this request
    elapsed: float = field(default=0.0, compare=False)  # seconds, retries and back-off included
    prompt_tokens: int = field(default=0, compare=False)  # as reported, over every attempt
    completion_tokens: int = field(default=0, compare=False)

    @property
    def ok(self) -> bool:
        return self.text is not None


@dataclass
class LLMCosts:
    """What LLM work cost: HTTP calls, reported tokens, wall time (seconds).

    A run adds to the instance it is given, so one object can total several runs (the
    pages of a job, the iterations of a method). ``calls`` counts every HTTP call,
    retries and failed calls included; tokens are the endpoint's ``usage`` figures of
    the calls that returned a completion.
    """

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    wall_seconds: float = 0.0

    def add(self, other: LLMCosts) -> LLMCosts:
        self.calls += other.calls
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.wall_seconds += other.wall_seconds
        return self

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def as_dict(self) -> dict[str, int | float]:
        """The JSON form of a manifest's ``llm_costs`` block."""
        values: dict[str, int | float] = asdict(self)
        values["wall_seconds"] = round(self.wall_seconds, 3)
        return values


# ----------------------------------------------------------------------- one call


class _CallFailed(Exception):
    """One HTTP call did not yield a usable completion (internal)."""

    def __init__(self, code: str, *, retryable: bool, retry_after: float | None = None) -> None:
        super().__init__(code)
        self.code = code
        self.retryable = retryable
        self.retry_after = retry_after


@dataclass
class _CallBudget:
    """The run's cap on HTTP calls, retries included (one event loop: no lock needed)."""

    limit: int | None
    used: int = 0

    @property
    def exhausted(self) -> bool:
        return self.limit is not None and self.used >= self.limit

    def take(self) -> bool:
        if self.exhausted:
            return False
        self.used += 1
        return True


def parse_retry_after(headers: Any, *, now: float | None = None) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``Retry-After`` (seconds or HTTP date)."""
    try:
        millis = headers.get("retry-after-ms")
        if millis is not None:
            value = float(millis) / 1000.0
            return value if math.isfinite(value) and value >= 0 else None
        raw = headers.get("retry-after")
    except (AttributeError, TypeError, ValueError):
        return None
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(raw).timestamp()
        except (TypeError, ValueError, IndexError):
            return None
        value = when - (time.time() if now is None else now)
        value = max(value, 0.0)
    return value if math.isfinite(value) and value >= 0 else None


@dataclass(frozen=True)
class _Answer:
    text: str
    prompt_tokens: int
    completion_tokens: int


def _usage(completion: Any) -> tuple[int, int]:
    """(prompt, completion) tokens from a completion's ``usage``; 0 where not reported."""
    usage = getattr(completion, "usage", None)

    def count(name: str) -> int:
        value = getattr(usage, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        return 0

    return count("prompt_tokens"), count("completion_tokens")


def _completion_answer(completion: object) -> _Answer:
    from openai.types.chat import ChatCompletion

    if not isinstance(completion, ChatCompletion):  # a non-JSON body comes back as str
        raise _CallFailed("malformed_response", retryable=True)
    try:
        content = completion.choices[0].message.content
    except (AttributeError, IndexError, KeyError, TypeError) as exc:
        raise _CallFailed("malformed_response", retryable=True) from exc
    if content is None or (isinstance(content, str) and not content.strip()):
        raise _CallFailed("empty_content", retryable=True)
    if not isinstance(content, str):
        raise _CallFailed("malformed_response", retryable=True)
    return _Answer(content.strip(), *_usage(completion))


async def _call_once(client: AsyncOpenAI, endpoint: LLMEndpoint, messages: Messages) -> _Answer:
    import openai

    try:
        completion = await client.chat.completions.create(
            model=endpoint.model,
            messages=cast("list[ChatCompletionMessageParam]", messages),
            max_tokens=endpoint.max_tokens,
            temperature=endpoint.temperature,
            n=1,
        )
    except openai.APITimeoutError as exc:
        raise _CallFailed("timeout", retryable=True) from exc
    except openai.APIConnectionError as exc:
        raise _CallFailed("connection_error", retryable=True) from exc
    except openai.APIStatusError as exc:
        status = exc.status_code
        retryable = status in RETRYABLE_STATUS or status >= 500
        wait = parse_retry_after(exc.response.headers) if retryable else None
        raise _CallFailed(f"http_{status}", retryable=retryable, retry_after=wait) from exc
    except openai.APIResponseValidationError as exc:
        raise _CallFailed("malformed_response", retryable=True) from exc
    except ValueError as exc:  # invalid JSON in a 200 answer
        raise _CallFailed("malformed_response", retryable=True) from exc
    except openai.OpenAIError as exc:  # anything else the client raises on purpose
        raise _CallFailed("client_error", retryable=False) from exc
    return _completion_answer(completion)


def retry_wait(backoff_base: float, backoff_max: float) -> Callable[[RetryCallState], float]:
    """The wait before the next try, as a tenacity ``wait``: a server's ``Retry-After``
    (plus up to 10 % jitter, so that requests refused together do not return together),
    else tenacity's exponential back-off with full jitter (uniform in 0 … ``backoff_base``
    · 2^(try − 1)); never more than ``backoff_max``, so that no answer of a server can
    stall a run for long."""
    backoff = wait_random_exponential(multiplier=backoff_base, max=backoff_max)

    def wait(state: RetryCallState) -> float:
        failure = state.outcome.exception() if state.outcome is not None else None
        if isinstance(failure, _CallFailed) and failure.retry_after is not None:
            return min(backoff_max, failure.retry_after * (1.0 + 0.1 * random.random()))
        return backoff(state)

    return wait


@dataclass(frozen=True)
class _Retry:
    max_retries: int
    backoff_base: float
    backoff_max: float


def _log_retry(state: RetryCallState) -> None:
    """A retry's log line: the fault's code, the try's number and the wait, no text."""
    failure = state.outcome.exception() if state.outcome is not None else None
    code = failure.code if isinstance(failure, _CallFailed) else type(failure).__name__
    wait = state.next_action.sleep if state.next_action is not None else 0.0
    logger.debug("llm call failed (%s); retry %d in %.2f s", code, state.attempt_number, wait)


async def _request_one(
    index: int,
    messages: Messages,
    *,
    client: AsyncOpenAI,
    endpoint: LLMEndpoint,
    budget: _CallBudget,
    retry: _Retry,
) -> LLMOutcome:
    started = time.monotonic()
    attempts = 0

    def outcome(answer: _Answer | None, error: str | None) -> LLMOutcome:
        elapsed = time.monotonic() - started
        if answer is None:  # a failed call reports no usage
            return LLMOutcome(index, None, error, attempts, elapsed)
        tokens = answer.prompt_tokens, answer.completion_tokens
        return LLMOutcome(index, answer.text, None, attempts, elapsed, *tokens)

    async def call() -> _Answer:
        nonlocal attempts
        if not budget.take():
            raise _CallFailed("call_cap_reached", retryable=False)
        attempts += 1
        return await _call_once(client, endpoint, messages)

    retrying = AsyncRetrying(
        retry=retry_if_exception(lambda exc: isinstance(exc, _CallFailed) and exc.retryable),
        # after the last retry allowed, or at once when the run's call cap is reached (no
        # back-off is slept for a call that will not be made)
        stop=lambda state: state.attempt_number > retry.max_retries or budget.exhausted,
        wait=retry_wait(retry.backoff_base, retry.backoff_max),
        before_sleep=_log_retry,
        reraise=True,  # the last fault itself, not tenacity's RetryError
    )
    try:
        return outcome(await retrying(call), None)
    except _CallFailed as failure:
        capped = failure.retryable and attempts <= retry.max_retries
        return outcome(None, "call_cap_reached" if capped else failure.code)


# ----------------------------------------------------------------------- a run


class RunOptions(TypedDict, total=False):
    """How a run (:func:`complete`) calls the endpoint; each has a default (:class:`_Run`)."""

    concurrency: int  # calls in flight at most
    max_calls: int | None  # HTTP calls of the whole run, retries included; None: no cap
    max_retries: int  # retries of one request
    backoff_base: float  # seconds, the back-off's first wait
    backoff_max: float  # seconds, its longest
    indices: Sequence[int] | None  # the positions to request (resume); None: every one


@dataclass(frozen=True)
class _Run:
    """:class:`RunOptions` with their defaults."""

    concurrency: int = 8
    max_calls: int | None = None
    max_retries: int = 5
    backoff_base: float = 0.5
    backoff_max: float = 30.0
    indices: Sequence[int] | None = None


def check_run(*, count: int, **options: Unpack[RunOptions]) -> list[int]:
    """The positions a run of ``count`` requests with ``options`` will request,
    ascending; ConfigError for a bad option."""
    run = _Run(**options)
    check_number(run.concurrency, name="concurrency", low=1, high=1024, integer=True)
    if run.max_calls is not None:
        check_number(run.max_calls, name="max_calls", low=1, high=10**9, integer=True)
    check_number(run.max_retries, name="max_retries", low=0, high=100, integer=True)
    check_number(run.backoff_base, name="backoff_base", low=0.0, high=3600.0)
    check_number(run.backoff_max, name="backoff_max", low=0.0, high=3600.0)
    if run.backoff_max < run.backoff_base:
        raise ConfigError("must be >= backoff_base", field="backoff_max")
    if run.indices is None:
        return list(range(count))
    positions = []
    for position in run.indices:
        if isinstance(position, bool) or not isinstance(position, int):
            raise ConfigError("must be integers", field="indices")
        if not 0 <= position < count:
            raise ConfigError(f"{position} is outside 0..{count - 1}", field="indices")
        positions.append(position)
    if len(set(positions)) != len(positions):
        raise ConfigError("repeats a position", field="indices")
    return sorted(positions)


async def complete(
    messages_for: Callable[[int], Messages],
    count: int,
    *,
    endpoint: LLMEndpoint,
    on_result: OnResult | None = None,
    progress: Progress | None = None,
    costs: LLMCosts | None = None,
    describe: Callable[[int, Messages], attestation.Prompt] | None = None,
    **options: Unpack[RunOptions],
) -> list[LLMOutcome]:
    """One chat completion per position ``0 … count-1``; outcomes in position order.

    ``messages_for(position)`` builds the messages of a request when a worker reaches it.
    ``options`` (:class:`RunOptions`): at most ``concurrency`` calls are in flight (a fixed
    pool of that many workers pulls positions from one iterator, so a million requests do
    not become a million pending tasks). ``max_calls`` caps every HTTP call of the run,
    retries included; requests not finished when it is reached end with
    ``"call_cap_reached"``. ``indices`` restricts the run to those positions (resume after
    a crash); the result then holds one outcome per listed position, in ascending order.
    ``on_result`` (sync or async) sees every outcome as soon as it is final; if it raises,
    the run stops and the exception propagates.
    ``costs``, when given, is increased by what the run spent. Bad arguments raise
    ``ConfigError`` before any call is made; endpoint failures never raise, they become
    outcomes.

    While a prompt log is bound (:func:`workers.llm.attestation.recording`), every
    request's messages are built and recorded, in position order, before the first call,
    with what ``describe(position, messages)`` says they were built from, and exactly the
    recorded messages are sent.
    """
    endpoint.validate()
    positions = check_run(count=count, **options)
    run = _Run(**options)
    recorded = attestation.record(positions, messages_for, describe)
    if recorded is not None:
        messages_for = recorded
    retry = _Retry(run.max_retries, run.backoff_base, run.backoff_max)
    total = len(positions)
    results: dict[int, LLMOutcome] = {}
    budget = _CallBudget(run.max_calls)
    pending: Iterator[int] = iter(positions)
    done = 0
    if progress is not None:
        progress(0, total)

    async def worker(client: AsyncOpenAI) -> None:
        nonlocal done
        for position in pending:  # next() is synchronous: no two workers share a position
            outcome = await _request_one(
                position,
                messages_for(position),
                client=client,
                endpoint=endpoint,
                budget=budget,
                retry=retry,
            )
            results[position] = outcome
            if on_result is not None:
                maybe = on_result(outcome)
                if inspect.isawaitable(maybe):
                    await maybe
            done += 1
            if progress is not None:
                progress(done, total)

    started = time.monotonic()
    try:
        if total:
            async with endpoint.client() as client, asyncio.TaskGroup() as group:
                for _ in range(min(run.concurrency, total)):
                    group.create_task(worker(client))
    except BaseExceptionGroup as failed:  # on_result raised: surface its own exception
        raise failed.exceptions[0] from None
    finally:
        if costs is not None:
            finished = results.values()
            costs.add(
                LLMCosts(
                    calls=budget.used,
                    prompt_tokens=sum(o.prompt_tokens for o in finished),
                    completion_tokens=sum(o.completion_tokens for o in finished),
                    wall_seconds=time.monotonic() - started,
                )
            )
    outcomes = [results[position] for position in positions]
    errors = Counter(outcome.error for outcome in outcomes if outcome.error is not None)
    logger.info(
        "llm run: %d requests in %.1f s: %d ok, %d failed %s, %d calls",
        total,
        time.monotonic() - started,
        total - sum(errors.values()),
        sum(errors.values()),
        dict(sorted(errors.items())),
        budget.used,
    )
    return outcomes


def run_sync(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run ``coroutine`` from synchronous code (a Celery task, the CLI)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        coroutine.close()  # never awaited: no "was never awaited" warning
        raise RuntimeError("called inside an event loop; await the coroutine instead")
    return asyncio.run(coroutine)


def synchronous(function: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, T]:
    """``function`` for synchronous callers: the same arguments, run by :func:`run_sync`."""

    @functools.wraps(function)
    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        return run_sync(function(*args, **kwargs))

    return run
