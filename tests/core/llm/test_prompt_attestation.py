"""The hash-chained prompt log (workers.llm.attestation) and ``keyseed verify-prompts``."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fake_llm import FakeLLM
from workers.llm import attestation
from workers.llm.attestation import (
    DPKPS,
    GENESIS,
    MemoryPromptLog,
    Prompt,
    chain_hash,
    digest,
    recording,
    verify,
)
from workers.methods.dpkps.prompting import PromptSpec, build_messages, run_prompts

ROOT = Path(__file__).resolve().parents[3]
SEQUENCES = [["chest pain", "dyspnea"], ["knee arthritis"], ["fracture", "cast", "x-ray"]]
SPEC = PromptSpec("clinical note", ("An example note.",), PromptSpec("x").template)


def prompt(number: int, text: str = "hello") -> Prompt:
    messages = [{"role": "user", "content": f"{text} {number}"}]
    return Prompt(f"test/{number}", "test", messages, {"value": text}, {"n": number})


@pytest.fixture
def llm() -> Iterator[FakeLLM]:
    with FakeLLM() as server:
        yield server


def dpkps_log(llm: FakeLLM) -> MemoryPromptLog:
    log = MemoryPromptLog()
    with recording(log):
        outcomes = run_prompts(
            SEQUENCES, endpoint=llm.endpoint(), spec=SPEC, concurrency=3, ids=[4, 9, 17]
        )
    assert all(o.ok for o in outcomes)
    return log


# -- the chain ---------------------------------------------------------------------------


def test_records_chain_each_to_the_one_before_and_verify() -> None:
    log = MemoryPromptLog()
    log.append([prompt(0), prompt(1)])
    log.append([prompt(2)])
    assert [line["seq"] for line in log.lines] == [0, 1, 2]
    assert log.lines[0]["prev"] == GENESIS
    assert [line["prev"] for line in log.lines[1:]] == [line["hash"] for line in log.lines[:-1]]
    assert all(chain_hash(line) == line["hash"] for line in log.lines)
    # the record holds digests of the prompt and its inputs, the content them in clear
    first = log.lines[0]
    assert first["prompt_sha256"] == digest(first["content"]["messages"])
    assert first["inputs"] == {"value": digest("hello")}
    verdict = verify(log.lines)
    assert verdict.ok and verdict.records == 3 and verdict.head == log.head
    assert verify([]).ok and verify([]).head == GENESIS


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        ("prompt_sha256", "record 1 (test/1): its hash does not match its contents"),
        ("content", "record 1 (test/1): the prompt shown is not the prompt recorded"),
        ("inputs", "record 1 (test/1): the inputs shown are not the inputs recorded"),
    ],
)
def test_one_byte_changed_breaks_the_chain_at_its_record(where: str, expected: str) -> None:
    log = MemoryPromptLog()
    log.append([prompt(0), prompt(1), prompt(2)])
    lines = json.loads(json.dumps(log.lines))
    line = lines[1]
    if where == "prompt_sha256":  # one hex digit of the record's digest
        digit = line["prompt_sha256"][0]
        line["prompt_sha256"] = ("1" if digit != "1" else "2") + line["prompt_sha256"][1:]
    elif where == "content":  # one byte of the prompt shown
        line["content"]["messages"][0]["content"] = "hellp 1"
    else:
        line["content"]["inputs"]["value"] = "hellp"
    verdict = verify(lines)
    assert not verdict.ok
    assert verdict.problems[0] == expected


def test_a_removed_or_reordered_record_is_named() -> None:
    log = MemoryPromptLog()
    log.append([prompt(n) for n in range(4)])
    removed = log.lines[:1] + log.lines[2:]
    problems = verify(removed).problems
    assert problems[0] == "record 1 (test/2): numbered 2, expected 1"
    assert "record 1 (test/2): does not follow the record before it (prev)" in problems
    # a forger who renumbers and rehashes the rest still cannot hide the cut from the head
    forged = copy.deepcopy(removed)
    prev = GENESIS
    for number, line in enumerate(forged):
        line["seq"], line["prev"] = number, prev
        line["hash"] = prev = chain_hash(line)
    assert verify(forged).ok and verify(forged).head != log.head


def test_a_retried_request_appends_nothing_and_the_chain_goes_on() -> None:
    log = MemoryPromptLog()
    log.append([prompt(0), prompt(1)])
    head = log.head
    log.append([prompt(1), prompt(0)])  # sent again: the same requests
    assert log.head == head and len(log.lines) == 2
    log.append([prompt(1), prompt(2), prompt(3)])  # a batch resumed after a crash
    assert [line["key"] for line in log.lines] == ["test/0", "test/1", "test/2", "test/3"]
    assert log.lines[2]["prev"] == head
    assert verify(log.lines).ok
    # the same key with another prompt (a parent text the LLM wrote anew) is recorded
    log.append([prompt(3, "changed")])
    assert len(log.lines) == 5 and verify(log.lines).ok


# -- what is recorded where prompts leave ----------------------------------------------


def test_every_dpkps_prompt_sent_is_recorded_before_it_leaves_and_renders_again(
    llm: FakeLLM,
) -> None:
    log = dpkps_log(llm)
    assert [line["key"] for line in log.lines] == [
        "dpkps/sequence/4",
        "dpkps/sequence/9",
        "dpkps/sequence/17",
    ]
    sent = sorted(json.dumps(r.messages, sort_keys=True) for r in llm.chat_requests)
    recorded = sorted(json.dumps(line["content"]["messages"], sort_keys=True) for line in log.lines)
    assert sent == recorded  # exactly what was recorded left, and nothing else
    line = log.lines[1]
    assert line["kind"] == DPKPS
    assert line["refs"] == {
        "position": 9,
        "document_type": "clinical note",
        "model": llm.model,
    }
    assert line["content"]["inputs"] == {
        "keyphrases": ["knee arthritis"],
        "template": SPEC.template,
        "few_shot": ["An example note."],
    }
    assert line["content"]["messages"] == build_messages(["knee arthritis"], SPEC)
    verdict = verify(log.lines)
    assert verdict.ok and verdict.rederived == 3


def test_a_prompt_other_than_its_inputs_render_is_caught_even_when_rehashed(
    llm: FakeLLM,
) -> None:
    """A forger who changes what a prompt was built from, and recomputes every digest
    and hash consistently, is caught by rendering the prompt again."""
    lines = copy.deepcopy(dpkps_log(llm).lines)
    lines[1]["content"]["inputs"]["keyphrases"] = ["knee", "arthritis"]
    prev = GENESIS
    for line in lines:
        line["inputs"] = {k: digest(v) for k, v in line["content"]["inputs"].items()}
        line["prev"] = prev
        line["hash"] = prev = chain_hash(line)
    problems = verify(lines).problems
    assert problems == ["record 1 (dpkps/sequence/9): the prompt is not the one its inputs render"]


def test_without_a_bound_log_nothing_is_recorded(llm: FakeLLM) -> None:
    assert attestation.current() is None
    outcomes = run_prompts(SEQUENCES[:1], endpoint=llm.endpoint(), spec=SPEC)
    assert outcomes[0].ok


def test_the_methods_public_prompts_render_again_from_their_refs() -> None:
    from workers.methods.aug_pe.prompts import random_messages
    from workers.methods.common import MethodParams, random_source
    from workers.methods.dp_eda.decoding import reconstruction_messages

    params = MethodParams(document_type="news article", epsilon=1.0, delta=1e-6)
    random = random_source("aug_pe/random/0", params, "Sports").prompt(
        random_messages(document_type="news article", label="Sports")
    )
    rebuilt = attestation.Source(
        key="dp_eda/reconstruction/0.1/0/0/0",
        kind=attestation.RECONSTRUCTION,
        inputs={"phrases": ["goal", "late win"], "draft": None},
        refs={"document_type": "news article", "label": "Sports"},
    ).prompt(
        reconstruction_messages(
            document_type="news article", label="Sports", phrases=["goal", "late win"], draft=None
        )
    )
    log = MemoryPromptLog()
    log.append([random, rebuilt])
    verdict = verify(log.lines)
    assert verdict.ok and verdict.rederived == 2
    wrong = copy.deepcopy(log.lines)
    wrong[0]["refs"]["label"] = "Business"  # the refs say Business, the prompt Sports
    prev = GENESIS
    for line in wrong:
        line["prev"], line["hash"] = prev, chain_hash({**line, "prev": prev})
        prev = line["hash"]
    assert verify(wrong).problems == [
        "record 0 (aug_pe/random/0): the prompt is not the one its inputs render"
    ]


# -- keyseed verify-prompts --------------------------------------------------------------


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    code = (
        "import sys; from app.cli import main; rc = main(sys.argv[1:]); "
        "assert 'torch' not in sys.modules and 'fastapi' not in sys.modules, 'heavy import'; "
        "sys.exit(rc)"
    )
    return subprocess.run(
        [sys.executable, "-c", code, "verify-prompts", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        timeout=60,
        check=False,
    )


def write(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def test_the_cli_passes_an_intact_log_and_names_the_record_that_breaks(
    llm: FakeLLM, tmp_path: Path
) -> None:
    log = dpkps_log(llm)
    good = write(tmp_path / "good.jsonl", log.lines)
    done = cli(str(good), "--head", log.head)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "OK: the chain is intact and ends on the report's head" in done.stdout
    assert "rendered again from their inputs and identical: 3" in done.stdout

    other = cli(str(good), "--head", "f" * 64)
    assert other.returncode == 1 and "not on the head the report gives" in other.stdout

    text = good.read_text(encoding="utf-8")
    tampered = tmp_path / "tampered.jsonl"
    tampered.write_text(text.replace("knee arthritis", "knee arthritiz", 1), encoding="utf-8")
    broken = cli(str(tampered), "--head", log.head)
    assert broken.returncode == 1
    assert "BROKEN" in broken.stdout
    assert "record 1 (dpkps/sequence/9): the prompt shown is not the prompt recorded" in (
        broken.stdout
    )

    released = write(
        tmp_path / "release.jsonl",
        [{"label": "a", "text": "t", "keyphrases": s} for s in SEQUENCES[:2]],
    )
    partial = cli(str(good), "--release", str(released))
    assert partial.returncode == 1
    assert "record 2 (dpkps/sequence/17): its keyphrases are not a sequence" in partial.stdout

    unreadable = cli(str(tmp_path / "missing.jsonl"))
    assert unreadable.returncode == 2 and "cannot read the log" in unreadable.stderr
    assert cli(str(good), "--head", "xyz").returncode == 2
