"""``keyseed generate --method pate-tutor`` and ``--method dp-eda``: the options generated
from each method's parameter model (one option for a field two methods share, refused
for a method that does not take it), dry runs that plan from public inputs only, and
runs end to end (PATE-tutor on the packaged local LLM; DP-EDA against the fake
OpenAI-compatible server of ``tests/fake_llm.py``, with a phrase file as vocabulary).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.cli import main
from tests.fake_llm import FakeLLM
from workers.methods.registry import LLM_METHODS

LABELS = ("Sports", "Business")
TEXTS = {
    "Sports": "The team won the match with a late goal in the final minute.",
    "Business": "Shares rose after the bank reported higher quarterly profits.",
}
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
    path = tmp_path / "private.csv"
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=["text", "class"])
        writer.writeheader()
        for i in range(12):
            label = LABELS[i % 2]
            writer.writerow({"text": f"{TEXTS[label]} ({i})", "class": label})
    phrases = tmp_path / "phrases.txt"
    phrases.write_text(PHRASES, encoding="utf-8")
    return {"input": path, "out": tmp_path / "out.jsonl", "phrases": phrases}


@pytest.fixture
def llm(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeLLM]:
    with FakeLLM(content_fn=topical) as server:
        monkeypatch.setenv("KEYSEED_LLM_BASE_URL", server.base_url)
        monkeypatch.setenv("KEYSEED_LLM_MODEL", server.model)
        yield server


def args_for(
    method: str, corpus: dict[str, Path], *extra: str, llm: str = "openai", **options: str
) -> list[str]:
    args = [
        "generate",
        "--method",
        method,
        "--input",
        str(corpus["input"]),
        "--text-column",
        "text",
        "--label-column",
        "class",
        "--labels",
        ",".join(LABELS),
        "--output",
        str(corpus["out"]),
        "--document-type",
        "news article",
        "--epsilon",
        "8",
        "--delta",
        "1e-5",
        "--llm",
        llm,
    ]
    tiny = PATE if method == "pate-tutor" else {**EDA, "--vocabulary": str(corpus["phrases"])}
    for option, value in {**tiny, **options}.items():
        args += [option, value]
    return args + list(extra)


def manifest_of(out: Path) -> dict[str, Any]:
    data = json.loads(out.with_name("out.manifest.json").read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


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
    with open(corpus["input"], "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=["text", "class"])
        writer.writeheader()
        for i in range(60):
            label = LABELS[i % 2]
            writer.writerow({"text": f"{TEXTS[label]} ({i})", "class": label})
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
