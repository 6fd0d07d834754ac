"""Temporary: the subset of ``workers.llm.client`` Aug-PE uses, until that module is merged.

Same names and signatures (``LLMEndpoint``, ``LLMCosts``, ``LLMOutcome``, ``complete``,
``run_sync``); replaced by the shared client as soon as it lands.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar, cast

from workers.dpkps.prompting import LLMEndpoint

T = TypeVar("T")
Messages = list[dict[str, str]]

__all__ = ["LLMCosts", "LLMEndpoint", "LLMOutcome", "complete", "run_sync"]


@dataclass(frozen=True)
class LLMOutcome:
    index: int
    text: str | None
    error: str | None
    attempts: int
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass
class LLMCosts:
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

    def as_dict(self) -> dict[str, int | float]:
        values: dict[str, int | float] = asdict(self)
        values["wall_seconds"] = round(self.wall_seconds, 3)
        return values


async def complete(
    messages_for: Callable[[int], Messages],
    count: int,
    *,
    endpoint: LLMEndpoint,
    concurrency: int = 8,
    max_retries: int = 3,
    indices: Sequence[int] | None = None,
    costs: LLMCosts | None = None,
) -> list[LLMOutcome]:
    positions = list(range(count)) if indices is None else sorted(indices)
    pending = iter(positions)
    results: dict[int, LLMOutcome] = {}
    calls = 0
    started = time.monotonic()

    async def one(client: Any, index: int) -> LLMOutcome:
        nonlocal calls
        for attempt in range(1, max_retries + 2):
            calls += 1
            try:
                answer = await client.chat.completions.create(
                    model=endpoint.model,
                    messages=cast(Any, messages_for(index)),
                    max_tokens=endpoint.max_tokens,
                    temperature=endpoint.temperature,
                    n=1,
                )
                text = answer.choices[0].message.content
                if isinstance(text, str) and text.strip():
                    usage = answer.usage
                    return LLMOutcome(
                        index,
                        text.strip(),
                        None,
                        attempt,
                        int(getattr(usage, "prompt_tokens", 0) or 0),
                        int(getattr(usage, "completion_tokens", 0) or 0),
                    )
            except Exception:
                await asyncio.sleep(0.01 * attempt)
                continue
        return LLMOutcome(index, None, "failed", max_retries + 1)

    async def worker(client: Any) -> None:
        for index in pending:
            results[index] = await one(client, index)

    if positions:
        async with endpoint.client() as client, asyncio.TaskGroup() as group:
            for _ in range(min(concurrency, len(positions))):
                group.create_task(worker(client))
    if costs is not None:
        costs.add(
            LLMCosts(
                calls=calls,
                prompt_tokens=sum(o.prompt_tokens for o in results.values()),
                completion_tokens=sum(o.completion_tokens for o in results.values()),
                wall_seconds=time.monotonic() - started,
            )
        )
    return [results[i] for i in positions]


def run_sync(coroutine: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coroutine)
