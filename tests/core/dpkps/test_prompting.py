"""The prompting stage (method.md, step 7) against a real HTTP server.

Every test talks to :class:`tests.fake_llm.FakeLLM` over real HTTP through the real
openai client, so what is checked is what an endpoint would see: the prompt's content
(document type, keyphrases, public few-shot examples, never a label), how each kind of
fault is retried and counted, the call cap, the concurrency bound as measured by the
server, the order of the outcomes and resuming a run. One test, marked ``llm`` and
``slow``, generates text with the packaged SmolLM2 through the local server.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import re
import time
from collections.abc import Iterator
from typing import TypedDict

import pytest
from pydantic import SecretStr
from tenacity import AsyncRetrying, RetryCallState

from tests.fake_llm import Behaviour, FakeLLM, ok
from workers.errors import ConfigError
from workers.llm.client import LLMEndpoint, parse_retry_after, retry_wait
from workers.methods.dpkps.prompting import (
    DEFAULT_TEMPLATE,
    LIMITS,
    SYSTEM_MESSAGE,
    PromptOutcome,
    PromptSpec,
    build_messages,
    prompt_sequences,
    run_prompts,
)
from workers.settings import CoreSettings

SPEC = PromptSpec(document_type="news article")


class Backoff(TypedDict):
    backoff_base: float
    backoff_max: float


FAST: Backoff = {"backoff_base": 0.01, "backoff_max": 0.05}  # retries without real waiting
CODE = re.compile(r"^[a-z0-9_]+$")


@pytest.fixture
def llm() -> Iterator[FakeLLM]:
    with FakeLLM() as server:
        yield server


def seqs(n: int, prefix: str = "phrase") -> list[list[str]]:
    return [[f"{prefix}{i}a", f"{prefix}{i}b"] for i in range(n)]


# ----------------------------------------------------------------- prompt content


def test_messages_name_document_type_keyphrases_and_examples() -> None:
    spec = PromptSpec(
        document_type="discharge summary",
        few_shot=("Patient admitted with chest pain.", "Discharged home in good health."),
    )
    messages = build_messages(["atrial fibrillation", "warfarin", "follow-up"], spec)
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[0]["content"] == SYSTEM_MESSAGE
    user = messages[1]["content"]
    assert "discharge summary" in user
    assert "atrial fibrillation, warfarin, follow-up" in user
    assert "Example 1:\nPatient admitted with chest pain." in user
    assert "Example 2:\nDischarged home in good health." in user
    assert user.index("Example 2") < user.index("atrial fibrillation")


def test_default_prompt_without_examples_is_one_instruction() -> None:
    user = build_messages(["stock market", "oil  prices\n"], SPEC)[1]["content"]
    assert user == (
        "Write a short news article about stock market, oil prices. "
        "Reply with the news article itself, starting with its first sentence."
    )


def test_custom_template_and_literal_braces() -> None:
    spec = PromptSpec(document_type="tweet", template="{{json}} {document_type}: {keyphrases}")
    assert build_messages(["a", "b"], spec)[1]["content"] == "{json} tweet: a, b"


def test_what_reaches_the_llm_is_exactly_the_prompt_and_never_a_label(llm: FakeLLM) -> None:
    """Sequences come from a labelled run; the label must not travel with them."""
    labelled = [("Sports", ["football", "league"]), ("Business", ["shares", "profit"])]
    spec = PromptSpec(document_type="news article", few_shot=("A public example text.",))
    outcomes = run_prompts(
        [keyphrases for _, keyphrases in labelled],
        endpoint=llm.endpoint(max_tokens=77, temperature=0.3),
        spec=spec,
    )
    assert [o.error for o in outcomes] == [None, None]
    requests = sorted(llm.chat_requests, key=lambda r: "football" not in r.prompt_text)
    assert len(requests) == 2
    for (label, keyphrases), request in zip(labelled, requests, strict=True):
        assert request.messages == build_messages(keyphrases, spec)
        assert request.body["model"] == "fake-model"
        assert request.body["max_tokens"] == 77
        assert request.body["temperature"] == pytest.approx(0.3)
        assert label.lower() not in request.raw.decode().lower()
        assert set(request.body) <= {"model", "messages", "max_tokens", "temperature", "n"}
    # the fake echoes the prompt: the outcome text is the completion, stripped
    assert outcomes[0].text is not None and "football, league" in outcomes[0].text


# ----------------------------------------------------------------- retries


@pytest.mark.parametrize(
    "fault",
    ["500", "502", "503", "429", "408", "timeout:5", "malformed", "invalid", "empty", "disconnect"],
)
def test_each_fault_kind_is_retried_and_counted(llm: FakeLLM, fault: str) -> None:
    llm.script(fault, fault, "ok")
    [outcome] = run_prompts(
        [["alpha", "beta"]], endpoint=llm.endpoint(timeout=0.4), spec=SPEC, **FAST
    )
    assert outcome.error is None
    assert outcome.text is not None and "alpha, beta" in outcome.text
    assert outcome.attempts == 3
    assert len(llm.chat_requests) == 3
    assert llm.unused_script == []


@pytest.mark.parametrize(
    ("fault", "code"),
    [
        ("500", "http_500"),
        ("429", "http_429"),
        ("timeout:5", "timeout"),
        ("malformed", "malformed_response"),
        ("invalid", "malformed_response"),
        ("empty", "empty_content"),
        ("disconnect", "connection_error"),
    ],
)
def test_retries_give_up_with_the_last_fault_code(llm: FakeLLM, fault: str, code: str) -> None:
    llm.default = Behaviour.parse(fault)
    [outcome] = run_prompts(
        [["alpha"]], endpoint=llm.endpoint(timeout=0.3), spec=SPEC, max_retries=2, **FAST
    )
    assert outcome == PromptOutcome(index=0, text=None, error=code, attempts=3)
    assert len(llm.chat_requests) == 3


def test_connection_refused_is_a_connection_error() -> None:
    with FakeLLM() as gone:
        endpoint = gone.endpoint()
    [outcome] = run_prompts([["alpha"]], endpoint=endpoint, spec=SPEC, max_retries=1, **FAST)
    assert (outcome.error, outcome.attempts) == ("connection_error", 2)


def test_retry_after_is_honoured(llm: FakeLLM) -> None:
    llm.script("429:1", "ok")
    started = time.monotonic()
    [outcome] = run_prompts([["alpha"]], endpoint=llm.endpoint(), spec=SPEC, backoff_base=0.001)
    elapsed = time.monotonic() - started
    assert outcome.error is None and outcome.attempts == 2
    assert elapsed >= 1.0
    first, second = llm.chat_requests
    assert first.finished is not None and second.started - first.finished >= 0.95
    assert outcome.elapsed >= 1.0


def test_retry_after_is_capped_by_backoff_max(llm: FakeLLM) -> None:
    llm.script("429:30", "503:30", "ok")
    started = time.monotonic()
    [outcome] = run_prompts(
        [["alpha"]], endpoint=llm.endpoint(), spec=SPEC, backoff_base=0.01, backoff_max=0.1
    )
    assert outcome.error is None and outcome.attempts == 3
    assert time.monotonic() - started < 5.0


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
def test_client_errors_are_not_retried(llm: FakeLLM, status: int) -> None:
    llm.script(str(status), "ok")
    [outcome] = run_prompts([["alpha"]], endpoint=llm.endpoint(), spec=SPEC, **FAST)
    assert outcome == PromptOutcome(index=0, text=None, error=f"http_{status}", attempts=1)
    assert len(llm.chat_requests) == 1


def test_wrong_api_key_is_http_401_and_not_retried() -> None:
    with FakeLLM(api_key="right-key") as llm:
        [good] = run_prompts([["alpha"]], endpoint=llm.endpoint(), spec=SPEC)
        [bad] = run_prompts([["alpha"]], endpoint=llm.endpoint(api_key="wrong"), spec=SPEC)
        assert good.error is None
        assert llm.chat_requests[0].headers["authorization"] == "Bearer right-key"
        assert (bad.error, bad.attempts) == ("http_401", 1)
        assert len(llm.chat_requests) == 2


# ----------------------------------------------------------------- call cap


def test_call_cap_stops_the_run(llm: FakeLLM) -> None:
    outcomes = run_prompts(seqs(5), endpoint=llm.endpoint(), spec=SPEC, concurrency=1, max_calls=3)
    assert [o.error for o in outcomes] == [None, None, None, "call_cap_reached", "call_cap_reached"]
    assert [o.attempts for o in outcomes] == [1, 1, 1, 0, 0]
    assert len(llm.chat_requests) == 3


def test_call_cap_counts_retries(llm: FakeLLM) -> None:
    llm.default = Behaviour.parse("500")
    outcomes = run_prompts(
        seqs(4), endpoint=llm.endpoint(), spec=SPEC, concurrency=2, max_calls=5, **FAST
    )
    assert len(llm.chat_requests) == 5
    assert sum(o.attempts for o in outcomes) == 5
    assert all(o.error == "call_cap_reached" for o in outcomes)


# ----------------------------------------------------------------- concurrency, order, resume


@pytest.mark.parametrize("concurrency", [1, 4, 16])
def test_concurrency_bound_is_respected(concurrency: int) -> None:
    with FakeLLM(latency=0.25) as llm:
        outcomes = run_prompts(
            seqs(3 * concurrency), endpoint=llm.endpoint(), spec=SPEC, concurrency=concurrency
        )
        assert all(o.error is None for o in outcomes)
        assert llm.max_in_flight == concurrency


def test_outcomes_come_back_in_input_order(llm: FakeLLM) -> None:
    # later sequences answer first
    for i in range(6):
        llm.script_for(f"phrase{i}a", ok(delay=0.05 * (6 - i)))
    finished: list[int] = []
    outcomes = run_prompts(
        seqs(6),
        endpoint=llm.endpoint(),
        spec=SPEC,
        concurrency=6,
        on_result=lambda o: finished.append(o.index),
    )
    assert [o.index for o in outcomes] == list(range(6))
    assert all(o.text is not None and f"phrase{o.index}a" in o.text for o in outcomes)
    assert finished == list(reversed(range(6)))


def test_indices_resume_only_the_missing_positions(llm: FakeLLM) -> None:
    outcomes = run_prompts(seqs(6), endpoint=llm.endpoint(), spec=SPEC, indices=[4, 1])
    assert [o.index for o in outcomes] == [1, 4]
    prompted = " ".join(llm.prompts())
    assert "phrase1a" in prompted and "phrase4a" in prompted
    assert not any(f"phrase{i}a" in prompted for i in (0, 2, 3, 5))
    assert run_prompts(seqs(6), endpoint=llm.endpoint(), spec=SPEC, indices=[]) == []


def test_on_result_sees_every_outcome_and_progress_counts(llm: FakeLLM) -> None:
    llm.script_for("phrase2a", "400")
    seen: list[PromptOutcome] = []
    ticks: list[tuple[int, int]] = []

    async def persist(outcome: PromptOutcome) -> None:
        await asyncio.sleep(0)
        seen.append(outcome)

    outcomes = asyncio.run(
        prompt_sequences(
            seqs(5),
            endpoint=llm.endpoint(),
            spec=SPEC,
            concurrency=2,
            on_result=persist,
            progress=lambda done, total: ticks.append((done, total)),
        )
    )
    assert sorted(seen, key=lambda o: o.index) == outcomes
    assert outcomes[2].error == "http_400"
    assert ticks[0] == (0, 5) and ticks[-1] == (5, 5)
    assert [done for done, _ in ticks] == list(range(6))


def test_an_on_result_failure_stops_the_run(llm: FakeLLM) -> None:
    def broken(outcome: PromptOutcome) -> None:
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        run_prompts(seqs(3), endpoint=llm.endpoint(), spec=SPEC, on_result=broken)
    assert len(llm.chat_requests) <= 3


def test_run_prompts_refuses_a_running_loop(llm: FakeLLM) -> None:
    async def inside() -> None:
        run_prompts(seqs(1), endpoint=llm.endpoint(), spec=SPEC)

    with pytest.raises(RuntimeError, match="event loop"):
        asyncio.run(inside())


# ----------------------------------------------------------------- no text in errors or logs


def test_errors_and_logs_hold_codes_not_text(
    llm: FakeLLM, caplog: pytest.LogCaptureFixture
) -> None:
    llm.script("429", "500", "malformed", "empty", "timeout:5", "400")
    with caplog.at_level(logging.DEBUG, logger="workers"):
        outcomes = run_prompts(
            [["zebracanary", "quokkacanary"]] * 3,
            endpoint=llm.endpoint(timeout=0.3),
            spec=SPEC,
            concurrency=1,
            max_retries=1,
            **FAST,
        )
    assert [o.error for o in outcomes] == ["http_500", "empty_content", "http_400"]
    assert all(CODE.match(o.error or "") for o in outcomes)
    assert caplog.records, "expected retry and summary log lines"
    assert "canary" not in caplog.text and "[fake]" not in caplog.text


# ----------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"document_type": ""}, "document_type"),
        ({"document_type": "   "}, "document_type"),
        ({"document_type": "x" * (LIMITS["document_type_chars"] + 1)}, "document_type"),
        ({"template": "Write a {document_type}."}, "template"),
        ({"template": "{label}: {keyphrases}"}, "template"),
        ({"template": "{0} {keyphrases}"}, "template"),
        ({"template": "{keyphrases!r}"}, "template"),
        ({"template": "{keyphrases:>10}"}, "template"),
        ({"template": "{keyphrases} {"}, "template"),
        ({"template": ""}, "template"),
        ({"few_shot": ("x",) * (LIMITS["few_shot"] + 1)}, "few_shot"),
        ({"few_shot": ("x" * (LIMITS["example_chars"] + 1),)}, "few_shot"),
        ({"few_shot": ("fine", " ")}, "few_shot"),
        ({"few_shot": ("fine",), "template": "{document_type}: {keyphrases}"}, "template"),
    ],
)
def test_prompt_spec_validation_names_the_field(kwargs: dict[str, object], field: str) -> None:
    values: dict[str, object] = {"document_type": "news article", **kwargs}
    with pytest.raises(ConfigError) as caught:
        PromptSpec(**values).validate()  # type: ignore[arg-type]
    assert caught.value.field == field


def test_prompt_spec_accepts_a_list_and_the_default_template() -> None:
    spec = PromptSpec(document_type="review", few_shot=["Great phone."]).validate()  # type: ignore[arg-type]
    assert spec.few_shot == ("Great phone.",) and spec.template == DEFAULT_TEMPLATE
    hash(spec)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"concurrency": 0}, "concurrency"),
        ({"max_calls": 0}, "max_calls"),
        ({"max_retries": -1}, "max_retries"),
        ({"backoff_base": 2.0, "backoff_max": 1.0}, "backoff_max"),
        ({"indices": [0, 9]}, "indices"),
        ({"indices": [1, 1]}, "indices"),
    ],
)
def test_run_arguments_are_checked_before_any_call(
    llm: FakeLLM, kwargs: dict[str, object], field: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        run_prompts(seqs(3), endpoint=llm.endpoint(), spec=SPEC, **kwargs)  # type: ignore[arg-type]
    assert caught.value.field == field
    assert llm.chat_requests == []


def test_an_empty_sequence_is_named_by_position(llm: FakeLLM) -> None:
    with pytest.raises(ConfigError) as caught:
        run_prompts([["a"], [], ["b"]], endpoint=llm.endpoint(), spec=SPEC)
    assert caught.value.field == "sequences[1]"
    assert llm.chat_requests == []


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"base_url": "localhost:8000"}, "base_url"),
        ({"model": ""}, "model"),
        ({"timeout": 0}, "timeout"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": 3.0}, "temperature"),
    ],
)
def test_endpoint_validation_names_the_field(kwargs: dict[str, object], field: str) -> None:
    values: dict[str, object] = {"base_url": "http://127.0.0.1:1/v1", "model": "m", **kwargs}
    with pytest.raises(ConfigError) as caught:
        LLMEndpoint(**values).validate()  # type: ignore[arg-type]
    assert caught.value.field == field


def test_endpoint_from_settings_and_secret_key_not_in_repr() -> None:
    assert LLMEndpoint.from_settings(CoreSettings(llm_base_url="")) is None
    settings = CoreSettings(
        llm_base_url="https://api.example.com/v1",
        llm_model="gpt-4o-mini",
        llm_api_key=SecretStr("sk-very-secret"),
        llm_timeout=30.0,
        llm_max_tokens=128,
    )
    endpoint = LLMEndpoint.from_settings(settings)
    assert endpoint is not None
    assert (endpoint.model, endpoint.api_key, endpoint.timeout, endpoint.max_tokens) == (
        "gpt-4o-mini",
        "sk-very-secret",
        30.0,
        128,
    )
    assert "sk-very-secret" not in repr(endpoint) and "sk-very-secret" not in str(endpoint)
    with pytest.raises(ConfigError) as caught:
        LLMEndpoint.from_settings(CoreSettings(llm_base_url="https://x/v1", llm_model=""))
    assert caught.value.field == "llm_model"


# ----------------------------------------------------------------- pure helpers


def test_parse_retry_after_forms() -> None:
    assert parse_retry_after({"retry-after": "3"}) == 3.0
    assert parse_retry_after({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    assert parse_retry_after({}) is None
    assert parse_retry_after({"retry-after": "soon"}) is None
    now = 1_700_000_000.0
    date = email.utils.formatdate(now + 7, usegmt=True)
    assert parse_retry_after({"retry-after": date}, now=now) == pytest.approx(7.0)


def _failed_try(number: int) -> RetryCallState:
    """tenacity's record of a try that raised, as the client's wait sees it."""
    state = RetryCallState(AsyncRetrying(), None, (), {})
    state.attempt_number = number
    state.set_exception((OSError, OSError("refused"), None))
    return state


def test_backoff_grows_exponentially_with_full_jitter_and_cap() -> None:
    wait = retry_wait(0.5, 30.0)
    for attempt, window in [(1, 0.5), (2, 1.0), (3, 2.0), (10, 30.0)]:
        delays = [wait(_failed_try(attempt)) for _ in range(200)]
        assert min(delays) >= 0.0 and max(delays) <= window
        assert max(delays) - min(delays) > window / 2  # spread over the window: jittered
    assert retry_wait(0.0, 0.0)(_failed_try(5)) == 0.0


# ----------------------------------------------------------------- the packaged model


@pytest.mark.llm
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_packaged_smollm2_generates_text() -> None:
    from workers.llm.local import LocalLLMServer, packaged_gguf_path

    assert packaged_gguf_path().is_file()
    with LocalLLMServer(max_tokens=40, temperature=0.7, startup_timeout=120) as server:
        pid = server.pid
        assert server.endpoint.model == "SmolLM2-135M-Instruct"
        outcomes = run_prompts(
            [["stock market", "oil prices"], ["football", "championship"], ["vaccine", "trial"]],
            endpoint=server.endpoint,
            spec=SPEC,
            concurrency=2,
            max_retries=1,
        )
    assert [o.error for o in outcomes] == [None, None, None]
    assert all(o.text and o.text.strip() for o in outcomes)
    assert pid is not None and not _alive(pid)


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
