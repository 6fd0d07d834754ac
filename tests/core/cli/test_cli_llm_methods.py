"""``keyseed generate --method pate-tutor`` and ``--method dp-eda``: the options generated
from each method's parameter model (one option for a field two methods share, refused
for a method that does not take it), dry runs that plan from public inputs only, and
runs end to end (PATE-tutor on the packaged local LLM; DP-EDA against the fake
OpenAI-compatible server of ``tests/fake_llm.py``, with a phrase file as vocabulary).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.cli import build_parser, main
from app.cli.checks import run_params
from tests.core.cli.generate_runs import (
    LABELS,
    TEXTS,
    generate_args,
    manifest_of,
    serving,
    write_corpus,
)
from tests.fake_llm import FakeLLM
from workers.methods.registry import LLM_METHODS, METHODS

PATE = {
    "--teachers": "2",
    "--queries": "4",
    "--negatives": "4",
    "--candidates": "6",
    "--num-released": "4",
    "--max-tokens": "24",
}
EDA = {
    "--iterations": "2",
    "--domain": "2",
    "--parents": "2",
    "--initial-population": "4",
    "--offspring": "4",
    "--top-r": "2",
    "--nearest-phrases": "2",
    "--candidates": "1",
    "--rounds": "1",
    "--perplexity-percentile": "100",
    "--max-tokens": "24",
}
PHRASES = "football match\nlate goal\nbank profits\nstock market\nshare price\nteam coach\n"
# Each method's small run; --vocabulary (the phrase file) where the run reads one.
TINY = {
    "dpkps": {"--sequence-length": "2", "--vocabulary-size": "4", "--per-class": "2"},
    "aug-pe": {"--iterations": "1", "--population": "4", "--num-released": "4"},
    "pate-tutor": PATE,
    "dp-eda": EDA,
}
READS_PHRASES = ("dpkps", "dp-eda")


def topical(body: dict[str, Any]) -> str:
    user = str(body["messages"][-1]["content"])
    topical.calls += 1  # type: ignore[attr-defined]
    n = topical.calls  # type: ignore[attr-defined]
    if "Sports" in user:
        return f"The team won the match with a late goal, report {n}."
    return f"Shares and bank profits moved the market, report {n}."


topical.calls = 0  # type: ignore[attr-defined]


@pytest.fixture
def corpus(tmp_path: Path) -> dict[str, Path]:
    phrases = tmp_path / "phrases.txt"
    phrases.write_text(PHRASES, encoding="utf-8")
    path = write_corpus(tmp_path / "private.csv")
    return {"input": path, "out": tmp_path / "out.jsonl", "phrases": phrases}


@pytest.fixture
def llm(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeLLM]:
    with serving(topical, monkeypatch) as server:
        yield server


def args_for(
    method: str, corpus: dict[str, Path], *extra: str, llm: str = "openai", **options: str
) -> list[str]:
    common = {"--document-type": "news article", "--epsilon": "8", "--delta": "1e-5", "--llm": llm}
    tiny = {**TINY[method]}
    if method in READS_PHRASES:
        tiny["--vocabulary"] = str(corpus["phrases"])
    return generate_args(method, corpus, *extra, **{**common, **tiny, **options})


@pytest.mark.parametrize("method", ["pate-tutor", "dp-eda"])
def test_dry_run_plans_the_method_without_reading_the_input(
    method: str, corpus: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    corpus["input"].unlink()  # a dry run never opens --input
    assert main(args_for(method, corpus, "--dry-run")) == 0
    planned = json.loads(capsys.readouterr().out)
    entry = LLM_METHODS[method]
    params = entry.params.model_validate(planned["parameters"])
    assert planned["method"] == method
    assert planned["events"] == [e.to_dict() for e in entry.plan(params, LABELS)]
    assert planned["planned_llm_calls"] == entry.planned_calls(params, len(LABELS)) > 0
    assert 0 < float(planned["privacy"]["epsilon"]) <= 8.0 + 1e-9
    assert float(planned["privacy"]["delta"]) == 1e-5


def test_every_method_dry_runs_in_one_format(
    corpus: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    corpus["input"].unlink()  # a dry run never opens --input
    keys = set()
    for method, entry in METHODS.items():
        args = args_for(method, corpus, "--dry-run")
        assert main(args) == 0
        planned = json.loads(capsys.readouterr().out)
        keys.add(tuple(planned))
        params = run_params(build_parser("generate").parse_args(args))
        classes = len(LABELS)
        assert planned["parameters"] == entry.engine_parameters(params, classes)
        assert planned["planned_llm_calls"] == entry.planned_calls(params, classes) > 0
        assert planned["method"] == method
        assert planned["description"] == entry.described(params, classes)
        assert planned["labels"] == list(LABELS)
        assert planned["max_released"] == entry.max_released(params, classes) > 0
        assert sorted(planned["events"], key=json.dumps) == sorted(
            planned["privacy"]["events"], key=json.dumps
        )
        assert planned["by_mechanism"]
        assert 0 < float(planned["privacy"]["epsilon"]) <= 8.0 + 1e-9
    assert keys == {
        (
            "method",
            "description",
            "parameters",
            "labels",
            "planned_llm_calls",
            "max_released",
            "events",
            "by_mechanism",
            "privacy",
        )
    }


@pytest.mark.parametrize(
    ("method", "options", "expected"),
    [
        ("pate-tutor", {"--teachers": "1"}, "error: --teachers: Input should be greater than"),
        ("pate-tutor", {"--num-released": "7"}, "error: --num-released: must be at most the 6"),
        ("pate-tutor", {"--iterations": "2"}, "error: --iterations: an option of --method aug-pe"),
        ("pate-tutor", {"--epsilon-kde": "1"}, "error: --epsilon-kde: an option of --method dpkps"),
        ("dp-eda", {"--parents": "3"}, "error: --parents: must be at most the limited domain"),
        ("dp-eda", {"--teachers": "3"}, "error: --teachers: an option of --method pate-tutor"),
        ("dp-eda", {"--population": "3"}, "error: --population: an option of --method aug-pe"),
    ],
)
def test_a_bad_or_foreign_option_is_named(
    method: str,
    options: dict[str, str],
    expected: str,
    corpus: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(args_for(method, corpus, "--dry-run", **options)) == 2
    assert expected in capsys.readouterr().err
    assert not corpus["out"].exists()


def test_dp_eda_runs_and_its_manifest_names_the_decoder(
    corpus: dict[str, Path], llm: FakeLLM
) -> None:
    # 30 documents a class: enough votes for LimitedDomain's noisy threshold at ε = 40
    write_corpus(corpus["input"], 60)
    assert main(args_for("dp-eda", corpus, "--epsilon", "40")) == 0
    records = [json.loads(line) for line in corpus["out"].read_text().splitlines()]
    assert records and all(r["label"] in LABELS and r["text"] for r in records)
    manifest = manifest_of(corpus["out"])
    assert manifest["method"] == "dp-eda"
    assert manifest["decoder"]["name"] == "llm_reconstruction"
    assert manifest["llm_costs"]["calls"] == len(llm.chat_requests) > 0
    assert not any(TEXTS[label] in p for label in LABELS for p in llm.prompts())
    assert not corpus["out"].with_name("out.checkpoints").exists()


@pytest.mark.llm
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_pate_tutor_with_the_packaged_local_llm(corpus: dict[str, Path]) -> None:
    assert main(args_for("pate-tutor", corpus, llm="local")) == 0
    manifest = manifest_of(corpus["out"])
    assert manifest["method"] == "pate-tutor"
    costs = manifest["llm_costs"]
    assert costs["calls"] >= 4 + 4 + 6 and costs["completion_tokens"] > 0
    lines = corpus["out"].read_text(encoding="utf-8").splitlines()
    assert 0 < len(lines) <= 4
    assert all(json.loads(line)["label"] in LABELS for line in lines)
