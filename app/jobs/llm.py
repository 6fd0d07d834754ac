"""The LLM endpoint a job names, as the prompting stage calls it.

* ``local``: the packaged SmolLM2 served by llama.cpp with continuous batching
  (``workers.llm.local``). ``keyseed serve`` runs one server for every worker and passes
  its URL in ``KEYSEED_LOCAL_LLM_URL``; without it, a server is started for the duration
  of the task and stopped after it.
* any other name: an endpoint of ``KEYSEED_LLM_ENDPOINTS`` (its key stays on the server).

Errors are :class:`~workers.errors.LLMError` with a generic message: no URL of a
configured endpoint, no key, no answer body.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from app.config import Settings
from workers.errors import ConfigError, LLMError
from workers.llm.client import LLMEndpoint
from workers.llm.engine import DEFAULT_SLOTS

LOCAL = "local"
LOCAL_CONCURRENCY = DEFAULT_SLOTS  # the local server decodes this many completions at once


def served_model(base_url: str, *, timeout: float = 10.0) -> str:
    """The id of the model an OpenAI-compatible server serves (``GET /models``)."""
    try:
        response = httpx.get(f"{base_url.rstrip('/')}/models", timeout=timeout)
        response.raise_for_status()
        return str(response.json()["data"][0]["id"])
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise LLMError("the local LLM server does not answer", field="llm") from exc


def concurrency(settings: Settings, name: str) -> int:
    if name == LOCAL:
        return min(settings.llm_concurrency, LOCAL_CONCURRENCY)
    return settings.llm_concurrency


@contextmanager
def endpoint(settings: Settings, name: str) -> Iterator[LLMEndpoint]:
    """The endpoint of LLM ``name`` for the duration of the block."""
    if name == LOCAL:
        if settings.local_llm_url:
            yield LLMEndpoint(
                base_url=settings.local_llm_url,
                model=served_model(settings.local_llm_url),
                timeout=settings.llm_timeout,
                max_tokens=settings.llm_max_tokens,
            ).validate()
            return
        from workers.llm.local import LocalLLMServer

        with LocalLLMServer(
            max_tokens=settings.llm_max_tokens, request_timeout=settings.llm_timeout
        ) as server:
            yield server.endpoint
        return
    configured = settings.llm_endpoints.get(name)
    if configured is None:
        raise ConfigError("the job names an LLM endpoint this server does not offer", field="llm")
    yield LLMEndpoint(
        base_url=configured.base_url,
        model=configured.model,
        api_key=configured.key() or "not-needed",
        timeout=settings.llm_timeout,
        max_tokens=settings.llm_max_tokens,
    ).validate()
