"""The cleanup on fresh completions of the packaged SmolLM2 (``llm`` and ``slow``).

A handful of DP-KPS prompts (the product's default template, AG News-like keyphrase
sequences) go to the real model on the batched local server; every completion comes
back through :func:`~workers.methods.dpkps.prompting.run_prompts`, which cleans it
(``clean=True``, the default). Raw completions are asked for too (``clean=False``; the
sampling is not seeded, so not the same texts): the test checks what the cleanup
promises on real output, not a particular wording.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from workers.llm.local import LocalLLMServer
from workers.methods.dpkps.prompting import PromptSpec, run_prompts
from workers.text.cleanup import clean_completion, opens_with_meta

pytestmark = [pytest.mark.llm, pytest.mark.slow, pytest.mark.timeout(600)]

SPEC = PromptSpec(document_type="news article")
SEQUENCES = [
    ["oil prices", "opec", "crude", "barrel"],
    ["playoffs", "pitcher", "inning", "red sox"],
    ["microsoft", "software", "linux", "server"],
    ["baghdad", "insurgents", "election", "troops"],
    ["shares", "quarterly profit", "analysts", "forecast"],
    ["olympic", "gold medal", "athens", "sprint"],
    ["nasa", "spacecraft", "launch", "orbit"],
    ["prime minister", "parliament", "vote", "coalition"],
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalLLMServer]:
    cache: Path = tmp_path_factory.mktemp("llm-cache")
    with LocalLLMServer(max_tokens=64, cache_dir=cache, startup_timeout=300) as running:
        yield running


def test_real_completions_come_back_cleaned_and_never_empty(server: LocalLLMServer) -> None:
    raw = run_prompts(SEQUENCES, endpoint=server.endpoint, spec=SPEC, concurrency=8, clean=False)
    cleaned = run_prompts(SEQUENCES, endpoint=server.endpoint, spec=SPEC, concurrency=8)
    assert all(o.ok for o in raw + cleaned)
    raw_texts = [o.text or "" for o in raw]
    texts = [o.text or "" for o in cleaned]
    # run_prompts returns cleaned texts: none is empty, none is still a raw completion's
    # meta-talk; the cleanup never empties a raw completion either
    assert all(len(t.split()) >= 3 for t in texts)
    assert all(clean_completion(t).strip() for t in raw_texts)
    # the fixture's rate after cleaning is 7 of 160 (mostly the model declining to write,
    # "I'm ready to help."): three or more of eight would be far above it
    assert sum(opens_with_meta(t) for t in texts) <= 2
    assert sum(opens_with_meta(clean_completion(t)) for t in raw_texts) <= 2
