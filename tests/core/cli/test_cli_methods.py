"""``keyseed generate --method aug-pe``: options from the model, dry run, manifest, resume.

The runs go through ``app.cli.main`` in-process against the fake OpenAI-compatible
server of ``tests/fake_llm.py`` (``--llm openai`` with ``KEYSEED_LLM_BASE_URL``), on a
tiny two-class corpus; one slow test uses the packaged local LLM.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.cli import main
from tests.core.cli.generate_runs import LABELS, generate_args, manifest_of, serving, write_corpus
from tests.fake_llm import FakeLLM
from workers.methods.aug_pe import AugPEParams, plan_aug_pe, runner
from workers.privacy.accountant import compose
from workers.privacy.noise import gaussian_noise

TINY = {
    "--iterations": "2",
    "--population": "4",
    "--num-released": "4",
    "--initial-variation-folds": "1",
    "--variation-folds": "1",
    "--max-tokens": "32",
}
AUG_PE = {
    "--document-type": "news article",
    "--epsilon": "2",
    "--delta": "1e-4",
    "--llm": "openai",
    **TINY,
}


def topical(body: dict[str, object]) -> str:
    """A short text on the topic of the label in the prompt."""
    messages = body.get("messages")
    user = str(messages[-1]["content"]) if isinstance(messages, list) else ""
    if "Sports" in user:
        return "The team won the match with a late goal."
    return "Shares and bank profits moved the market."


@pytest.fixture
def corpus(tmp_path: Path) -> dict[str, Path]:
    path = write_corpus(tmp_path / "private.csv", patients=True)
    return {"input": path, "out": tmp_path / "out.jsonl"}


@pytest.fixture
def llm(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeLLM]:
    with serving(topical, monkeypatch) as server:
        yield server


def aug_pe_args(corpus: dict[str, Path], *extra: str, **options: str) -> list[str]:
    return generate_args("aug-pe", corpus, *extra, **{**AUG_PE, **options})


def tiny_params(**changes: object) -> AugPEParams:
    values: dict[str, object] = {
        "document_type": "news article",
        "epsilon": 2.0,
        "delta": 1e-4,
        "iterations": 2,
        "population": 4,
        "num_released": 4,
        "initial_variation_folds": 1,
        "variation_folds": 1,
        "max_tokens": 32,
    }
    return AugPEParams.model_validate({**values, **changes})


def test_dry_run_prints_the_planned_events_without_reading_the_input(
    corpus: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    corpus["input"].unlink()  # a dry run never opens --input
    assert main(aug_pe_args(corpus, "--dry-run")) == 0
    planned = json.loads(capsys.readouterr().out)
    params = tiny_params()
    events = plan_aug_pe(params, LABELS)
    assert planned["method"] == "aug-pe"
    assert planned["parameters"] == params.to_dict()
    assert planned["description"].startswith("Aug-PE")
    assert planned["labels"] == list(LABELS)
    assert planned["planned_llm_calls"] == params.planned_calls()
    assert planned["max_released"] == params.num_released
    assert planned["privacy"] == compose(events).to_dict(delta=1e-4)
    assert sorted(planned["privacy"]["events"], key=json.dumps) == sorted(
        (e.to_dict() for e in events), key=json.dumps
    )
    assert planned["privacy"]["delta"] == 1e-4
    assert 1.9 < float(planned["privacy"]["epsilon"]) <= 2.0
    assert not corpus["out"].exists()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"--population": "0"}, "error: --population: Input should be greater than or equal to 1"),
        ({"--llm-temperature": "5"}, "error: --llm-temperature: Input should be less than or"),
        ({"--iterations": "two"}, "error: --iterations: Input should be a valid integer"),
        ({"--delta": "0"}, "error: --delta: Input should be greater than 0"),
        ({"--num-released": "99"}, "error: --num-released: must be at most the 8 candidates"),
        ({"--variation-folds": "0", "--no-keep-selected": ""}, "error: --keep-selected: "),
        ({"--epsilon-kde": "1"}, "error: --epsilon-kde: an option of --method dpkps"),
        ({"--sequence-length": "4"}, "error: --sequence-length: an option of --method dpkps"),
        ({"--temperature": "0.5"}, "error: --temperature: an option of --method dpkps"),
    ],
)
def test_a_bad_option_is_named(
    corpus: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
    changes: dict[str, str],
    message: str,
) -> None:
    flags = [k for k, v in changes.items() if not v]
    values = {k: v for k, v in changes.items() if v}
    assert main(aug_pe_args(corpus, *flags, "--dry-run", **values)) == 2
    assert message in capsys.readouterr().err


def test_an_aug_pe_option_with_dpkps_and_aug_pe_without_an_llm_are_refused(
    corpus: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    args = aug_pe_args(corpus)
    dpkps = args[:1] + args[3:]  # no --method: DP-KPS
    assert main([*dpkps, "--epsilon-vocab", "1", "--epsilon-kde", "1", "--dry-run"]) == 2
    assert "error: --iterations: an option of --method aug-pe" in capsys.readouterr().err
    assert main([*args, "--llm", "none"]) == 2
    assert "error: --llm: aug-pe writes texts with an LLM" in capsys.readouterr().err
    assert not corpus["out"].exists()


def test_manifest_records_the_privacy_block_every_event_and_llm_costs(
    corpus: dict[str, Path], llm: FakeLLM
) -> None:
    assert main(aug_pe_args(corpus, "--unit-column", "patient")) == 0
    records = [json.loads(x) for x in corpus["out"].read_text(encoding="utf-8").splitlines()]
    assert len(records) == 4
    assert {r["label"] for r in records} <= set(LABELS)
    assert all(isinstance(r["text"], str) and r["text"] for r in records)
    manifest = manifest_of(corpus["out"])
    assert manifest["method"] == "aug-pe"
    assert manifest["parameters"] == tiny_params().to_dict()
    privacy = manifest["privacy"]
    assert isinstance(privacy, dict)
    events = plan_aug_pe(tiny_params(), LABELS)
    composed = compose(events).to_dict(delta=1e-4)  # every planned event, once
    assert {k: privacy[k] for k in composed} == composed
    assert privacy["unit"] == "patient"  # the registry's outcome: the unit and the plan
    assert privacy["planned"] == {"events": [e.to_dict() for e in events]}
    assert len(privacy["events"]) == 1 + 2 * len(LABELS)
    assert privacy["accountant"] == compose(events).name
    assert privacy["epsilon"] == str(compose(events).epsilon(1e-4))
    assert float(privacy["epsilon"]) <= 2.0
    assert privacy["delta"] == 1e-4
    assert "unit" in str(manifest["adjacency"])  # --unit-column is the privacy unit
    assert manifest["llm"] == {"llm": "openai", "base_url": llm.base_url, "model": llm.model}
    assert manifest["labels"] == {"names": list(LABELS), "source": "declared"}
    costs = manifest["llm_costs"]
    assert isinstance(costs, dict)
    assert costs["calls"] == len(llm.chat_requests) == tiny_params().planned_calls()
    assert costs["prompt_tokens"] > 0
    assert costs["completion_tokens"] > 0
    assert manifest["documents_written"] == 4
    assert not corpus["out"].with_name("out.checkpoints").exists()  # removed on success
    # no private document reached the LLM
    assert not any("(3)" in p or "quarterly" in p for p in llm.prompts())


def test_a_failed_run_resumes_from_its_checkpoints_without_releasing_again(
    corpus: dict[str, Path], llm: FakeLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoints = corpus["out"].with_name("out.checkpoints")
    with FakeLLM(default="400") as broken:  # every seed request fails: the run stops
        monkeypatch.setenv("KEYSEED_LLM_BASE_URL", broken.base_url)
        assert main(aug_pe_args(corpus)) == 2
    counts = (checkpoints / "aug-pe-counts").read_bytes()  # released before the failure
    assert not corpus["out"].exists()
    monkeypatch.setenv("KEYSEED_LLM_BASE_URL", llm.base_url)
    draws: list[object] = []

    def spy(*args: Any, **kwargs: Any) -> Any:
        draws.append(args)
        return gaussian_noise(*args, **kwargs)

    monkeypatch.setattr(runner, "gaussian_noise", spy)
    assert main(aug_pe_args(corpus)) == 0
    assert draws == []  # the class counts were loaded, not drawn (and spent) again
    manifest = manifest_of(corpus["out"])
    privacy = manifest["privacy"]
    assert isinstance(privacy, dict)
    noisy = json.loads(counts)
    assert [e for e in privacy["events"] if e["name"] == "class-counts"] == [noisy["event"]]
    composed = compose(plan_aug_pe(tiny_params(), LABELS)).to_dict(delta=1e-4)
    assert {k: privacy[k] for k in composed} == composed
    assert (checkpoints / "aug-pe-counts").exists() is False  # removed once written
    assert manifest["released_per_class"] is not None


def test_checkpoints_of_other_parameters_are_refused(
    corpus: dict[str, Path], llm: FakeLLM, capsys: pytest.CaptureFixture[str]
) -> None:
    with FakeLLM(default="400") as broken, pytest.MonkeyPatch.context() as patch:
        patch.setenv("KEYSEED_LLM_BASE_URL", broken.base_url)
        assert main(aug_pe_args(corpus)) == 2
    capsys.readouterr()
    assert main(aug_pe_args(corpus, **{"--seed": "7"})) == 2
    assert "error: --checkpoints: the checkpoints belong to a run with other parameters" in (
        capsys.readouterr().err
    )


@pytest.mark.llm
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_aug_pe_with_the_packaged_local_llm(corpus: dict[str, Path]) -> None:
    args = aug_pe_args(corpus, **{"--population": "2", "--num-released": "2"})
    args[args.index("openai")] = "local"
    assert main(args) == 0
    manifest = manifest_of(corpus["out"])
    costs = manifest["llm_costs"]
    assert isinstance(costs, dict)
    assert costs["calls"] >= tiny_params(population=2, num_released=2).planned_calls()
    assert costs["completion_tokens"] > 0
    assert len(corpus["out"].read_text(encoding="utf-8").splitlines()) == 2


def test_dpkps_prompts_the_openai_endpoint_it_resolved_before_the_run(
    corpus: dict[str, Path], llm: FakeLLM, tmp_path: Path
) -> None:
    vocabulary = tmp_path / "vocab.txt"
    vocabulary.write_text("match\ngoal\nteam\nshares\nbank\nprofits\n", encoding="utf-8")
    options = {
        "--vocabulary": str(vocabulary),
        "--vocabulary-size": "4",
        "--epsilon-vocab": "2",
        "--epsilon-kde": "4",
        "--per-class": "2",
        "--sequence-length": "2",
        "--llm": "openai",
    }
    args = generate_args("dpkps", corpus, **options)
    assert main(args) == 0
    records = [json.loads(line) for line in corpus["out"].read_text().splitlines()]
    assert len(records) == 2 * len(LABELS)
    assert {r["text"] for r in records} <= {topical({"messages": [{"content": x}]}) for x in LABELS}
    prompting = manifest_of(corpus["out"])["prompting"]
    assert isinstance(prompting, dict)
    assert prompting["llm"] == "openai" and prompting["base_url"] == llm.base_url
    assert prompting["succeeded"] == len(records)
