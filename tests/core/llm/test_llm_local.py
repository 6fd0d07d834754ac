"""The packaged SmolLM2 on the batched local server (``workers.llm.local``, ``serve``,
``engine``), over real HTTP.

What is shown: concurrent requests are decoded together (the server's own counters: all
slots busy at once, far fewer ``llama_decode`` calls than generated tokens, where one
request at a time needs one per token; wall-clock figures are in BENCHMARKS.md, not
here, because a shared CI machine makes them noisy); token counts reach the client's
``LLMCosts``; a slot reuses the prompt prefix it holds; the OpenAI-shaped answers and
errors; the weight conversion is made once; prompts sent together decode their common
prefix once. Marked ``llm`` and ``slow``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from workers.llm.client import LLMCosts
from workers.llm.engine import (
    BatchEngine,
    EngineError,
    RequestTooLong,
    SamplingParams,
    _common_prefix,
    convert_weights,
)
from workers.llm.local import LocalLLMServer, packaged_gguf_path
from workers.methods.dpkps.prompting import PromptSpec, run_prompts

pytestmark = [pytest.mark.llm, pytest.mark.slow, pytest.mark.timeout(600)]

SPEC = PromptSpec(document_type="news article")
TOPICS = [
    ["stock market", "oil prices"],
    ["football", "championship"],
    ["vaccine", "clinical trial"],
    ["election", "parliament"],
    ["smartphone", "battery"],
    ["drought", "harvest"],
    ["museum", "exhibition"],
    ["airline", "strike"],
]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("llm-cache")


@pytest.fixture(scope="module")
def server(cache_dir: Path) -> Iterator[LocalLLMServer]:
    with LocalLLMServer(max_tokens=24, cache_dir=cache_dir, startup_timeout=300) as running:
        yield running


def slots(server: LocalLLMServer) -> dict[str, int]:
    response = httpx.get(server.base_url.removesuffix("/v1") + "/slots", timeout=10)
    response.raise_for_status()
    data: dict[str, int] = response.json()
    return data


def chat(server: LocalLLMServer, body: dict[str, object]) -> httpx.Response:
    return httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=300)


def test_concurrent_requests_are_decoded_together(server: LocalLLMServer) -> None:
    assert server.engine == "batched" and server.slots == 8
    before = slots(server)
    costs = LLMCosts()
    outcomes = run_prompts(
        TOPICS, endpoint=server.endpoint, spec=SPEC, concurrency=8, max_retries=0, costs=costs
    )
    after = slots(server)
    assert [o.error for o in outcomes] == [None] * 8
    assert after["max_busy"] == 8  # all eight slots were serving at the same moment
    decodes = after["decode_calls"] - before["decode_calls"]
    generated = after["completion_tokens"] - before["completion_tokens"]
    # one request at a time needs a llama_decode per generated token; here each call
    # advanced several sequences at once
    assert generated >= 8 * 12
    assert decodes <= generated / 3
    # the client's costs are the server's own token counts
    assert costs.calls == 8
    assert costs.completion_tokens == generated == sum(o.completion_tokens for o in outcomes)
    assert costs.prompt_tokens == after["prompt_tokens"] - before["prompt_tokens"] > 8 * 20


def test_slots_reuse_the_prompt_prefix_they_hold(server: LocalLLMServer) -> None:
    """Every DP-KPS prompt starts with the same system message and template: once the
    slots hold one, a new prompt decodes only what differs."""
    run_prompts(TOPICS, endpoint=server.endpoint, spec=SPEC, concurrency=8, max_retries=0)
    before = slots(server)
    others = [[f"{a} report", f"{b} news"] for a, b in TOPICS]
    costs = LLMCosts()
    run_prompts(others, endpoint=server.endpoint, spec=SPEC, concurrency=8, costs=costs)
    reused = slots(server)["reused_tokens"] - before["reused_tokens"]
    assert reused >= 8 * 20
    assert reused < costs.prompt_tokens  # the keyphrases themselves are decoded


def test_answers_are_openai_chat_completions_with_usage(server: LocalLLMServer) -> None:
    models = httpx.get(f"{server.base_url}/models", timeout=10).json()
    assert models["data"][0]["id"] == "SmolLM2-135M-Instruct"
    body = {
        "model": "SmolLM2-135M-Instruct",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        "max_tokens": 3,
        "temperature": 0.0,
    }
    first, second = chat(server, body).json(), chat(server, body).json()
    assert first["object"] == "chat.completion"
    [choice] = first["choices"]
    assert choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] in ("stop", "length")
    usage = first["usage"]
    assert 1 <= usage["completion_tokens"] <= 3
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    # temperature 0 is greedy: the same prompt gives the same text
    assert second["choices"][0]["message"]["content"] == choice["message"]["content"]


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"messages": []}, 400),
        ({"messages": [{"role": "robot", "content": "x"}]}, 400),
        ({"messages": [{"role": "user", "content": 3}]}, 400),
        ({"messages": [{"role": "user", "content": "x"}], "n": 2}, 400),
        ({"messages": [{"role": "user", "content": "x"}], "stream": True}, 400),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, 400),
        ({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, 400),
        ({"messages": [{"role": "user", "content": "word " * 3000}]}, 400),  # > 2,048 tokens
    ],
)
def test_bad_requests_are_400_without_quoting_the_prompt(
    server: LocalLLMServer, body: dict[str, object], status: int
) -> None:
    response = chat(server, body)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert "word word" not in error["message"]


def test_unknown_paths_and_bodies(server: LocalLLMServer) -> None:
    root = server.base_url.removesuffix("/v1")
    assert httpx.get(f"{root}/health", timeout=10).json() == {"status": "ok"}
    assert httpx.get(f"{root}/v1/nothing", timeout=10).status_code == 404
    broken = httpx.post(f"{server.base_url}/chat/completions", content=b"{not json", timeout=10)
    assert broken.status_code == 400


def test_stop_strings_cut_the_text(cache_dir: Path) -> None:
    with BatchEngine(packaged_gguf_path(), slots=2, threads=1, cache_dir=cache_dir) as engine:
        prompt = engine.chat_prompt([{"role": "user", "content": "Count from 1 to 20."}])
        greedy = SamplingParams(max_tokens=40, temperature=0.0)
        full = engine.submit(prompt, greedy).result(timeout=120)
        assert full.text.strip()
        stop = full.text.strip()[len(full.text.strip()) // 2 :][:3]
        cut = engine.submit(prompt, SamplingParams(max_tokens=40, temperature=0.0, stop=(stop,)))
        result = cut.result(timeout=120)
        assert result.finish_reason == "stop"
        assert stop not in result.text
        assert full.text.startswith(result.text)


def test_prompts_arriving_together_decode_their_common_prefix_once(cache_dir: Path) -> None:
    """Eight prompts with one system message, sent at once to an empty engine: the first
    decodes the common prefix, the seven others take its cells (``llama_kv_self_seq_cp``)
    and decode only their own ends; each greedy answer begins as a one-slot engine's,
    which decodes every prompt whole."""
    words = ["apple", "river", "castle", "violin", "tiger", "pencil", "winter", "rocket"]
    system = (
        "You are a helpful assistant. You answer with one word only, the word the user "
        "asks for, and nothing else."
    )

    def messages(word: str) -> list[dict[str, str]]:
        return [
            {"role": "system", "content": system},
            {"role": "user", "content": f"Repeat this word: {word}"},
        ]

    greedy = SamplingParams(max_tokens=8, temperature=0.0)
    with BatchEngine(packaged_gguf_path(), slots=8, threads=1, cache_dir=cache_dir) as engine:
        prompts = [engine.chat_prompt(messages(word)) for word in words]
        together = [engine.submit(prompt, greedy) for prompt in prompts]
        answers = [future.result(timeout=300).text for future in together]
        stats = engine.stats
    common = min(_common_prefix(prompts[0], prompt) for prompt in prompts[1:])
    assert common >= 30  # the system message and the user turn's first words
    assert stats.shared_tokens >= 7 * common
    assert stats.prompt_tokens - stats.reused_tokens <= sum(map(len, prompts)) - 7 * common
    with BatchEngine(packaged_gguf_path(), slots=1, threads=1, cache_dir=cache_dir) as alone:
        singly = [alone.submit(prompt, greedy).result(timeout=300).text for prompt in prompts]
    assert len(set(answers)) >= 6  # the prompts' own ends were read
    for shared, whole in zip(answers, singly, strict=True):
        assert shared.split()[:3] == whole.split()[:3]


def test_the_engine_refuses_what_does_not_fit_and_fails_what_it_cannot_finish(
    cache_dir: Path,
) -> None:
    engine = BatchEngine(
        packaged_gguf_path(), slots=1, ctx_per_slot=256, threads=1, cache_dir=cache_dir
    ).start()
    try:
        with pytest.raises(RequestTooLong):
            engine.submit(list(range(300)), SamplingParams())
        prompt = engine.chat_prompt([{"role": "user", "content": "Tell a long story."}])
        running = engine.submit(prompt, SamplingParams(max_tokens=200))
        waiting = engine.submit(prompt, SamplingParams(max_tokens=200))
    finally:
        engine.close()
    for future in (running, waiting):  # in flight or queued: both fail, neither hangs
        assert future.done()
        if future.exception() is not None:
            assert isinstance(future.exception(), EngineError)
    assert waiting.exception() is not None
    with pytest.raises(EngineError):
        engine.submit(prompt, SamplingParams())


def test_the_weights_are_converted_once(cache_dir: Path) -> None:
    source = packaged_gguf_path()
    first = convert_weights(source, "q8_0", cache_dir)
    stamp = os.stat(first).st_mtime_ns
    again = convert_weights(source, "q8_0", cache_dir)
    assert again == first and os.stat(again).st_mtime_ns == stamp
    assert not list(cache_dir.glob(".*.partial"))


def test_steps_decode_their_sequences_in_order_and_the_lane_gives_way_to_other_work(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Requests finish at different times, so freed slots are taken out of sequence
    order; every batch still reaches llama.cpp in sequence order (an unsorted one decodes
    ~2.5× slower); and while another process keeps a core busy, the lane drops to one
    thread."""
    from workers.llm import engine as engine_module
    from workers.llm.llamacpp import llama

    batches: list[list[int]] = []
    restarts: list[tuple[int, list[int]]] = []  # (seq, sequences still generating)
    last: dict[int, int] = {}  # seq -> last position decoded
    lib, ffi = llama()

    def spy(ctx: object, batch: Any) -> int:
        ids = [batch.seq_id[i][0] for i in range(batch.n_tokens)]
        starts = {}
        for i, seq in enumerate(ids):
            starts.setdefault(seq, batch.pos[i])
        for seq, pos in starts.items():  # a new request in a freed slot starts over
            if seq in last and pos <= last[seq]:
                going = [s for s in starts if s != seq and s in last and starts[s] > last[s]]
                restarts.append((seq, going))
        for i, seq in enumerate(ids):
            last[seq] = batch.pos[i]
        batches.append(ids)
        return int(lib.llama_decode(ctx, batch))

    class SpiedLib:  # cffi's lib takes no new attributes: the engine gets this one instead
        llama_decode = staticmethod(spy)

        def __getattr__(self, name: str) -> Any:
            return getattr(lib, name)

    monkeypatch.setattr(engine_module, "llama", lambda verbose=None: (SpiedLib(), ffi))
    lengths = [3, 20, 6, 20, 9, 14, 20, 5, 11, 17]
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        with BatchEngine(packaged_gguf_path(), slots=4, threads=2, cache_dir=cache_dir) as engine:
            assert engine.lanes == 1
            prompts = [
                engine.chat_prompt([{"role": "user", "content": f"Write about {', '.join(t)}."}])
                for t in TOPICS + TOPICS[:2]
            ]
            futures = [
                engine.submit(prompt, SamplingParams(max_tokens=n, temperature=0.0))
                for prompt, n in zip(prompts, lengths, strict=True)
            ]
            results = [future.result(timeout=300) for future in futures]
            stats = engine.stats
    finally:
        spinner.kill()
        spinner.wait()
    assert all(r.completion_tokens >= 1 for r in results)
    assert all(ids == sorted(ids) for ids in batches)
    # a freed slot took a new request while a later sequence was still generating: the
    # lane's arrival order (its dict of active slots) was not sequence order
    assert any(others and seq < max(others) for seq, others in restarts)
    assert stats.thread_switches >= 1 and stats.threads == 1


def test_the_server_stops_when_its_launcher_is_killed() -> None:
    """A launcher killed with SIGKILL (no atexit, no stop()) leaves no server behind: the
    server, in a session of its own, sees its parent go and shuts down."""
    import signal
    import time

    from workers.llm.local import free_port

    launcher = subprocess.Popen(
        [sys.executable, "-m", "workers.llm.local", "--port", str(free_port())],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert launcher.stdout is not None
        assert b"local LLM" in launcher.stdout.readline()  # the server answers
        children = Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children").read_text()
        (server_pid,) = (int(pid) for pid in children.split())
    finally:
        launcher.kill()
        launcher.wait(timeout=30)

    def alive(pid: int) -> bool:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return False
        return state != "Z"

    deadline = time.monotonic() + 60
    while alive(server_pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if alive(server_pid):
        os.kill(server_pid, signal.SIGKILL)
        pytest.fail("the server outlived its launcher by a minute")
