"""Prompting an LLM with the DP keyphrase sequences (method.md, step 7).

One chat-completion call per sequence, against any OpenAI-compatible endpoint (OpenAI,
Azure through its ``/openai/v1/`` base URL, vLLM, llama-cpp-python's server, the packaged
SmolLM2 of :mod:`workers.dpkps.local_llm`).

Privacy. A prompt holds exactly three things: the document type (public, from the job
spec), one DP keyphrase sequence, and optionally few-shot example texts that the data
recipient supplied (public). No label, no private text, no count. :func:`build_messages`
takes nothing else, so nothing else can reach the LLM by accident. Everything the LLM
returns is post-processing of ε-DP releases, which is why a failed call can be retried
as often as the endpoint needs without spending budget.

Reliability. Endpoints fail in ordinary ways (rate limits, 5xx, timeouts, dropped
connections, a proxy answering HTML, an empty completion), so every call is retried with
exponential back-off and jitter, honouring ``Retry-After``; a client error that no retry
can mend (400, 401, 403, 404, 422 …) is not retried. The openai client's own retries are
switched off, so every HTTP call is one of ours: counted in ``PromptOutcome.attempts`` and
against ``max_calls``, the hard cap on what one run may spend at a paid endpoint.
Outcomes are handed to ``on_result`` as they finish, so a caller can persist each one
at once and, after a crash, resume with ``indices`` = the positions still missing.

Errors are short codes (``http_429``, ``timeout``, ``empty_content`` …), and log lines
hold counts and codes only: neither ever quotes a prompt or a completion.
"""

from __future__ import annotations

import asyncio
import email.utils
import inspect
import logging
import math
import random
import string
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from workers.dpkps.errors import ConfigError

if TYPE_CHECKING:
    from openai import AsyncOpenAI
    from openai.types.chat import ChatCompletionMessageParam

    from workers.settings import CoreSettings

logger = logging.getLogger(__name__)

SYSTEM_MESSAGE = (
    "You write realistic documents. Reply with the document text only: "
    "no title, no preamble, no notes."
)
DEFAULT_TEMPLATE = (
    "{examples}Write one {document_type} that naturally uses all of these keyphrases: {keyphrases}."
)
EXAMPLES_HEADER = "Examples of the style to follow:\n\n"
PLACEHOLDERS = ("document_type", "keyphrases", "examples")

# Bounds that keep one prompt within a small model's context; far above useful values.
LIMITS = {
    "document_type_chars": 200,
    "template_chars": 4_000,
    "few_shot": 8,
    "example_chars": 4_000,
    "keyphrases": 256,
    "keyphrase_chars": 200,
}

RETRYABLE_STATUS = frozenset({408, 429})  # plus every 5xx
OnResult = Callable[["PromptOutcome"], Awaitable[None] | None]
Progress = Callable[[int, int], None]


def _check_number(
    value: object, *, name: str, low: float, high: float, integer: bool = False
) -> None:
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
        _check_number(self.timeout, name="timeout", low=1e-3, high=3600.0)
        _check_number(self.max_tokens, name="max_tokens", low=1, high=32_768, integer=True)
        _check_number(self.temperature, name="temperature", low=0.0, high=2.0)
        return self

    def client(self) -> AsyncOpenAI:
        """An async client whose own retries are off: :func:`prompt_sequences` retries."""
        from openai import AsyncOpenAI

        return AsyncOpenAI(
            base_url=self.base_url,
            api_key=self.api_key,
            timeout=self.timeout,
            max_retries=0,
        )


# ----------------------------------------------------------------------- prompt


@dataclass(frozen=True)
class PromptSpec:
    """The public part of every prompt: document type, template, few-shot examples."""

    document_type: str
    few_shot: tuple[str, ...] = ()  # PUBLIC example texts supplied by the data recipient
    template: str = DEFAULT_TEMPLATE  # placeholders {document_type} {keyphrases} {examples}

    def __post_init__(self) -> None:
        if isinstance(self.few_shot, list):  # accept a list from JSON; keep the spec hashable
            object.__setattr__(self, "few_shot", tuple(self.few_shot))

    def validate(self) -> PromptSpec:
        if not isinstance(self.document_type, str) or not self.document_type.strip():
            raise ConfigError("must be a non-empty string", field="document_type")
        if len(self.document_type) > LIMITS["document_type_chars"]:
            raise ConfigError(
                f"must be at most {LIMITS['document_type_chars']} characters",
                field="document_type",
            )
        used = _template_placeholders(self.template)
        if "keyphrases" not in used:
            raise ConfigError("must contain the {keyphrases} placeholder", field="template")
        if not isinstance(self.few_shot, tuple):
            raise ConfigError("must be a list of example texts", field="few_shot")
        if len(self.few_shot) > LIMITS["few_shot"]:
            raise ConfigError(f"at most {LIMITS['few_shot']} examples", field="few_shot")
        for number, example in enumerate(self.few_shot, start=1):
            if not isinstance(example, str) or not example.strip():
                raise ConfigError(f"example {number} is not a non-empty string", field="few_shot")
            if len(example) > LIMITS["example_chars"]:
                raise ConfigError(
                    f"example {number} is longer than {LIMITS['example_chars']} characters",
                    field="few_shot",
                )
        if self.few_shot and "examples" not in used:
            raise ConfigError(
                "few-shot examples are given but the template has no {examples} placeholder",
                field="template",
            )
        return self


def _template_placeholders(template: object) -> set[str]:
    """The named fields of ``template``; ConfigError for anything but the three names."""
    if not isinstance(template, str) or not template.strip():
        raise ConfigError("must be a non-empty string", field="template")
    if len(template) > LIMITS["template_chars"]:
        raise ConfigError(
            f"must be at most {LIMITS['template_chars']} characters", field="template"
        )
    allowed = ", ".join("{" + name + "}" for name in PLACEHOLDERS)
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:  # a lone "{" or "}"
        raise ConfigError(
            f"is not a valid format string ({exc}); write {{{{ and }}}} for literal braces",
            field="template",
        ) from exc
    used: set[str] = set()
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if name not in PLACEHOLDERS or spec or conversion:
            shown = "{" + name + (f"!{conversion}" if conversion else "")
            shown += (f":{spec}" if spec else "") + "}"
            raise ConfigError(f"unknown placeholder {shown}; allowed: {allowed}", field="template")
        used.add(name)
    return used


def _clean(text: str) -> str:
    return " ".join(text.split())


def _check_keyphrases(keyphrases: object, *, name: str = "keyphrases") -> list[str]:
    if isinstance(keyphrases, str) or not isinstance(keyphrases, Sequence):
        raise ConfigError("must be a sequence of keyphrases", field=name)
    if not keyphrases:
        raise ConfigError("holds no keyphrase", field=name)
    if len(keyphrases) > LIMITS["keyphrases"]:
        raise ConfigError(f"holds more than {LIMITS['keyphrases']} keyphrases", field=name)
    cleaned = []
    for phrase in keyphrases:
        if not isinstance(phrase, str) or not phrase.strip():
            raise ConfigError("holds an empty or non-string keyphrase", field=name)
        if len(phrase) > LIMITS["keyphrase_chars"]:
            raise ConfigError(
                f"holds a keyphrase longer than {LIMITS['keyphrase_chars']} characters",
                field=name,
            )
        cleaned.append(_clean(phrase))
    return cleaned


def _render_examples(few_shot: Sequence[str]) -> str:
    if not few_shot:
        return ""
    blocks = [f"Example {i}:\n{text.strip()}" for i, text in enumerate(few_shot, start=1)]
    return EXAMPLES_HEADER + "\n\n".join(blocks) + "\n\n"


def build_messages(keyphrases: Sequence[str], spec: PromptSpec) -> list[dict[str, str]]:
    """The chat messages for one sequence: a fixed system message and one user message.

    The user message names the document type, the keyphrases (in sequence order, comma
    separated, whitespace collapsed) and the few-shot examples, and nothing else: there
    is no parameter through which a label or a private text could enter.
    """
    spec.validate()
    phrases = _check_keyphrases(keyphrases)
    user = spec.template.format(
        document_type=_clean(spec.document_type),
        keyphrases=", ".join(phrases),
        examples=_render_examples(spec.few_shot),
    ).strip()
    return [
        {"role": "system", "content": SYSTEM_MESSAGE},
        {"role": "user", "content": user},
    ]


# ----------------------------------------------------------------------- calls


@dataclass(frozen=True)
class PromptOutcome:
    """What became of one sequence. ``error`` is a short code, never a quote."""

    index: int  # position of the sequence in the input
    text: str | None  # the generated text, stripped, or None
    error: str | None  # "http_500", "timeout", "empty_content", "call_cap_reached" …
    attempts: int  # HTTP calls made for this sequence
    elapsed: float = field(default=0.0, compare=False)  # seconds, retries and back-off included

    @property
    def ok(self) -> bool:
        return self.text is not None


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


def backoff_delay(
    attempt: int,
    *,
    base: float,
    cap: float,
    retry_after: float | None = None,
    rng: random.Random | None = None,
) -> float:
    """Seconds to sleep before retry number ``attempt`` (1-based).

    Exponential with "equal jitter" (half fixed, half uniform) so that many sequences
    failing together do not retry together; a server's ``Retry-After`` wins, plus up to
    10 % jitter, and everything is capped at ``cap``.
    """
    draw = (rng or random).random()
    if retry_after is not None:
        return min(cap, retry_after * (1.0 + 0.1 * draw))
    exponential = min(cap, base * 2.0 ** (attempt - 1))
    return exponential / 2.0 + exponential / 2.0 * draw


def _completion_text(completion: object) -> str:
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
    return content.strip()


async def _call_once(
    client: AsyncOpenAI, endpoint: LLMEndpoint, messages: list[dict[str, str]]
) -> str:
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
    return _completion_text(completion)


async def _prompt_one(
    index: int,
    keyphrases: Sequence[str],
    *,
    client: AsyncOpenAI,
    endpoint: LLMEndpoint,
    spec: PromptSpec,
    budget: _CallBudget,
    max_retries: int,
    backoff_base: float,
    backoff_max: float,
) -> PromptOutcome:
    messages = build_messages(keyphrases, spec)
    started = time.monotonic()
    attempts = 0

    def outcome(text: str | None, error: str | None) -> PromptOutcome:
        return PromptOutcome(index, text, error, attempts, time.monotonic() - started)

    while True:
        if not budget.take():
            return outcome(None, "call_cap_reached")
        attempts += 1
        try:
            text = await _call_once(client, endpoint, messages)
        except _CallFailed as failure:
            if not failure.retryable or attempts > max_retries:
                return outcome(None, failure.code)
            if budget.exhausted:
                return outcome(None, "call_cap_reached")
            delay = backoff_delay(
                attempts, base=backoff_base, cap=backoff_max, retry_after=failure.retry_after
            )
            logger.debug("llm call failed (%s); retry %d in %.2f s", failure.code, attempts, delay)
            await asyncio.sleep(delay)
        else:
            return outcome(text, None)


def _check_run(
    sequences: Sequence[Sequence[str]],
    *,
    concurrency: int,
    max_calls: int | None,
    max_retries: int,
    backoff_base: float,
    backoff_max: float,
    indices: Sequence[int] | None,
) -> list[int]:
    _check_number(concurrency, name="concurrency", low=1, high=1024, integer=True)
    if max_calls is not None:
        _check_number(max_calls, name="max_calls", low=1, high=10**9, integer=True)
    _check_number(max_retries, name="max_retries", low=0, high=100, integer=True)
    _check_number(backoff_base, name="backoff_base", low=0.0, high=3600.0)
    _check_number(backoff_max, name="backoff_max", low=0.0, high=3600.0)
    if backoff_max < backoff_base:
        raise ConfigError("must be >= backoff_base", field="backoff_max")
    if indices is None:
        positions = list(range(len(sequences)))
    else:
        positions = []
        for position in indices:
            if isinstance(position, bool) or not isinstance(position, int):
                raise ConfigError("must be integers", field="indices")
            if not 0 <= position < len(sequences):
                raise ConfigError(f"{position} is outside 0..{len(sequences) - 1}", field="indices")
            positions.append(position)
        if len(set(positions)) != len(positions):
            raise ConfigError("repeats a position", field="indices")
        positions.sort()
    for position in positions:
        _check_keyphrases(sequences[position], name=f"sequences[{position}]")
    return positions


async def prompt_sequences(
    sequences: Sequence[Sequence[str]],
    *,
    endpoint: LLMEndpoint,
    spec: PromptSpec,
    concurrency: int = 8,
    max_calls: int | None = None,
    max_retries: int = 5,
    backoff_base: float = 0.5,
    backoff_max: float = 30.0,
    indices: Sequence[int] | None = None,
    on_result: OnResult | None = None,
    progress: Progress | None = None,
) -> list[PromptOutcome]:
    """One completion per keyphrase sequence; outcomes in input order.

    At most ``concurrency`` calls are in flight (a fixed pool of that many workers pulls
    positions from one iterator, so a million sequences do not become a million
    pending tasks). ``max_calls`` caps every HTTP call of the run, retries included;
    sequences not finished when it is reached end with ``"call_cap_reached"``.
    ``indices`` restricts the run to those positions (resume after a crash); the result
    then holds one outcome per listed position, in ascending position order.
    ``on_result`` (sync or async) sees every outcome as soon as it is final; if it raises,
    the run stops and the exception propagates. Bad arguments raise ``ConfigError``
    before any call is made; endpoint failures never raise, they become outcomes.
    """
    endpoint.validate()
    spec.validate()
    positions = _check_run(
        sequences,
        concurrency=concurrency,
        max_calls=max_calls,
        max_retries=max_retries,
        backoff_base=backoff_base,
        backoff_max=backoff_max,
        indices=indices,
    )
    total = len(positions)
    results: dict[int, PromptOutcome] = {}
    budget = _CallBudget(max_calls)
    pending: Iterator[int] = iter(positions)
    done = 0
    if progress is not None:
        progress(0, total)

    async def worker(client: AsyncOpenAI) -> None:
        nonlocal done
        for position in pending:  # next() is synchronous: no two workers share a position
            outcome = await _prompt_one(
                position,
                sequences[position],
                client=client,
                endpoint=endpoint,
                spec=spec,
                budget=budget,
                max_retries=max_retries,
                backoff_base=backoff_base,
                backoff_max=backoff_max,
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
    if total:
        try:
            async with endpoint.client() as client, asyncio.TaskGroup() as group:
                for _ in range(min(concurrency, total)):
                    group.create_task(worker(client))
        except BaseExceptionGroup as failed:  # on_result raised: surface its own exception
            raise failed.exceptions[0] from None
    outcomes = [results[position] for position in positions]
    errors = Counter(outcome.error for outcome in outcomes if outcome.error is not None)
    logger.info(
        "prompted %d sequences in %.1f s: %d ok, %d failed %s, %d calls",
        total,
        time.monotonic() - started,
        total - sum(errors.values()),
        sum(errors.values()),
        dict(sorted(errors.items())),
        budget.used,
    )
    return outcomes


def run_prompts(
    sequences: Sequence[Sequence[str]],
    *,
    endpoint: LLMEndpoint,
    spec: PromptSpec,
    concurrency: int = 8,
    max_calls: int | None = None,
    max_retries: int = 5,
    backoff_base: float = 0.5,
    backoff_max: float = 30.0,
    indices: Sequence[int] | None = None,
    on_result: OnResult | None = None,
    progress: Progress | None = None,
) -> list[PromptOutcome]:
    """:func:`prompt_sequences` for synchronous callers (a Celery task, the CLI)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError("run_prompts called inside an event loop; await prompt_sequences")
    return asyncio.run(
        prompt_sequences(
            sequences,
            endpoint=endpoint,
            spec=spec,
            concurrency=concurrency,
            max_calls=max_calls,
            max_retries=max_retries,
            backoff_base=backoff_base,
            backoff_max=backoff_max,
            indices=indices,
            on_result=on_result,
            progress=progress,
        )
    )
