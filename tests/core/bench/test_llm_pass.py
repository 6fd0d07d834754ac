"""The LLM pass diagnostic of the low-ε benchmark: the paired runs' sequences, a seeded
sample of each label's, written out through the packaged SmolLM2 and scored three ways."""

from __future__ import annotations

import doctest
import json
from collections import Counter

import pytest

from benchmarks import llm_pass, paired
from benchmarks.bench_low_epsilon import SPLITS, Bench
from workers.methods.dpkps.pipeline import SyntheticSequence
from workers.methods.dpkps.prompting import PromptSpec


def test_doctests() -> None:
    assert doctest.testmod(llm_pass).failed == 0


def _sequences(counts: dict[str, int]) -> list[SyntheticSequence]:
    return [
        SyntheticSequence(label, (f"{label}{i}",)) for label, n in counts.items() for i in range(n)
    ]


def test_the_sample_takes_at_most_per_class_of_each_label_seeded_in_order() -> None:
    seqs = _sequences({"a": 10, "b": 3, "c": 1})
    chosen = llm_pass.sample(seqs, 4, seed=7)
    assert Counter(s.label for s in chosen) == {"a": 4, "b": 3, "c": 1}
    positions = [seqs.index(s) for s in chosen]
    assert positions == sorted(positions)  # the input's order
    assert llm_pass.sample(seqs, 4, seed=7) == chosen  # seeded
    assert any(llm_pass.sample(seqs, 4, seed=s) != chosen for s in range(8, 12))
    assert llm_pass.sample(seqs, 0, seed=7) == seqs  # 0: every sequence


def test_every_split_has_a_public_document_type() -> None:
    for split in SPLITS:
        assert llm_pass.document_type(split)


def test_a_configured_endpoint_is_used_as_the_product_would_with_the_runs_max_tokens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KEYSEED_LLM_BASE_URL", "https://llm.example.org/v1")
    monkeypatch.setenv("KEYSEED_LLM_MODEL", "a-hosted-model")
    monkeypatch.setenv("KEYSEED_LLM_API_KEY", "sk-test")
    with llm_pass.llm_endpoint(max_tokens=77) as endpoint:
        assert (endpoint.base_url, endpoint.model) == (
            "https://llm.example.org/v1",
            "a-hosted-model",
        )
        assert endpoint.api_key == "sk-test"
        assert endpoint.max_tokens == 77


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_one_run_writes_the_paired_runs_sequences_out_through_the_packaged_llm(
    tiny_bench: Bench,
) -> None:
    from workers.llm.local import LocalLLMServer

    bench = tiny_bench
    settings = {"per_class": 6}
    with paired.seeded_noise(4):
        expected = bench.sequences(1.0, 4, settings)
    assert expected
    spec = PromptSpec(document_type="news article").validate()
    with LocalLLMServer(max_tokens=24) as server:
        record = llm_pass.one_run(bench, server.endpoint, 1.0, 4, settings, per_class=2, spec=spec)
    # the sequences are the paired runs' own for the seed, scored as bench_low_epsilon does
    assert record["sequences"] == len(expected)
    assert record["accuracy_all_sequences"] == pytest.approx(
        bench.score([" ".join(s.keyphrases) for s in expected], [s.label for s in expected])
    )
    per_label = Counter(s.label for s in expected)
    assert record["sample"] == sum(min(2, n) for n in per_label.values())
    # every sampled sequence came back as a text from the LLM, and cost tokens
    assert record["texts"] == record["sample"]
    assert record["completion_tokens"] > 0
    example = record["example"]
    assert tuple(example["keyphrases"]) in {s.keyphrases for s in expected}
    assert example["text"].strip()
    for key in ("accuracy_sequences", "accuracy_texts", "accuracy_joined"):
        assert 0.0 <= record[key] <= 1.0
    json.dumps(record)  # a JSON line as written
