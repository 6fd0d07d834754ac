"""What a run of the shared LLM client costs (``workers.llm.client.LLMCosts``).

Against :class:`tests.fake_llm.FakeLLM` over real HTTP: its ``usage`` counts words (prompt
words, completion words), so the expected token figures are computed from what the
server actually received and answered.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from tests.fake_llm import Behaviour, FakeLLM
from workers.llm.client import LLMCosts, complete, run_sync
from workers.methods.dpkps.prompting import PromptSpec, build_messages, run_prompts

SPEC = PromptSpec(document_type="news article")
FAST = {"backoff_base": 0.01, "backoff_max": 0.05}


@pytest.fixture
def llm() -> Iterator[FakeLLM]:
    with FakeLLM() as server:
        yield server


def words(messages: list[dict[str, str]]) -> int:
    return sum(len(m["content"].split()) for m in messages)


def test_costs_count_every_call_and_the_reported_tokens(llm: FakeLLM) -> None:
    llm.script_for("alpha", "500", "ok")  # one retry for the first sequence
    sequences = [["alpha", "beta"], ["gamma", "delta"], ["epsilon"]]
    costs = LLMCosts()
    outcomes = run_prompts(sequences, endpoint=llm.endpoint(), spec=SPEC, costs=costs, **FAST)
    assert [o.error for o in outcomes] == [None, None, None]
    assert costs.calls == 4 == len(llm.chat_requests)
    expected_prompt = sum(words(build_messages(s, SPEC)) for s in sequences)
    expected_completion = sum(len((o.text or "").split()) for o in outcomes)
    assert costs.prompt_tokens == expected_prompt
    assert costs.completion_tokens == expected_completion
    assert [o.prompt_tokens for o in outcomes] == [
        words(build_messages(s, SPEC)) for s in sequences
    ]
    assert sum(o.completion_tokens for o in outcomes) == expected_completion
    assert costs.total_tokens == expected_prompt + expected_completion
    assert costs.wall_seconds > 0


def test_costs_add_up_over_runs_and_count_failed_calls(llm: FakeLLM) -> None:
    costs = LLMCosts()
    run_prompts([["alpha"]], endpoint=llm.endpoint(), spec=SPEC, costs=costs)
    first = LLMCosts().add(costs)
    llm.default = Behaviour.parse("503")
    [failed] = run_prompts(
        [["beta"]], endpoint=llm.endpoint(), spec=SPEC, costs=costs, max_retries=2, **FAST
    )
    assert failed.error == "http_503" and failed.attempts == 3
    assert costs.calls == first.calls + 3
    assert costs.prompt_tokens == first.prompt_tokens  # a failed call reports no usage
    assert costs.completion_tokens == first.completion_tokens
    assert costs.wall_seconds > first.wall_seconds


def test_costs_are_recorded_when_on_result_stops_the_run(llm: FakeLLM) -> None:
    costs = LLMCosts()

    def stop(outcome: object) -> None:
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        run_prompts(
            [["a"], ["b"]],
            endpoint=llm.endpoint(),
            spec=SPEC,
            costs=costs,
            on_result=stop,
            concurrency=1,  # one worker: "b" is never started, so the count is exact
        )
    assert costs.calls == len(llm.chat_requests) == 1
    assert costs.prompt_tokens == words(build_messages(["a"], SPEC))
    assert costs.completion_tokens > 0


def test_a_call_cut_off_by_the_stop_is_counted_though_it_may_not_have_arrived(
    llm: FakeLLM,
) -> None:
    """Concurrent workers: "b" may be cancelled before or after its bytes reach the server.

    ``calls`` counts every call started (the client cannot know whether a cancelled one was
    received), so it is an upper bound on what the server saw; tokens only from completions.
    """
    costs = LLMCosts()

    def stop(outcome: object) -> None:
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        run_prompts([["a"], ["b"]], endpoint=llm.endpoint(), spec=SPEC, costs=costs, on_result=stop)
    assert 1 <= len(llm.chat_requests) <= costs.calls <= 2
    one = words(build_messages(["a"], SPEC))  # "b"'s prompt has as many words
    assert costs.prompt_tokens in (one, 2 * one)  # one or both answered


def test_the_manifest_form_of_costs() -> None:
    costs = LLMCosts(calls=3, prompt_tokens=40, completion_tokens=90, wall_seconds=1.23456)
    assert costs.as_dict() == {
        "calls": 3,
        "prompt_tokens": 40,
        "completion_tokens": 90,
        "wall_seconds": 1.235,
    }


def test_complete_builds_each_request_lazily_by_position(llm: FakeLLM) -> None:
    built: list[int] = []

    def messages_for(position: int) -> list[dict[str, str]]:
        built.append(position)
        return [{"role": "user", "content": f"request {position}"}]

    outcomes = run_sync(
        complete(messages_for, 5, endpoint=llm.endpoint(), indices=[3, 1], concurrency=1)
    )
    assert [o.index for o in outcomes] == [1, 3]
    assert sorted(built) == [1, 3]
    assert sorted(llm.prompts()) == ["request 1", "request 3"]


def test_run_sync_refuses_a_running_loop(llm: FakeLLM) -> None:
    async def inside() -> None:
        run_sync(complete(lambda _: [], 1, endpoint=llm.endpoint()))

    with pytest.raises(RuntimeError, match="event loop"):
        asyncio.run(inside())
