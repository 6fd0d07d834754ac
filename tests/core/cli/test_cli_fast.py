"""``keyseed`` answers at once: a bad option or input file is refused before the engine loads.

Each case runs ``python -X importtime -m app.cli …`` in a subprocess from the repository
root and asserts the exit code, the one error line naming the option, and from
``-X importtime``'s list that neither torch, sentence-transformers nor numpy was imported:
nothing but the standard library and pydantic (:data:`ALLOWED`).
The wall time is recorded (``record_property``), not asserted: the machine may be busy.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
HEAVY = ("torch", "sentence_transformers", "numpy")
# What the checks may load besides the standard library: pydantic (and pydantic-settings's
# own dependencies); the "org" package is the standard copy module's Jython probe.
ALLOWED = {
    "app",
    "workers",
    "pydantic",
    "pydantic_core",
    "pydantic_settings",
    "dotenv",
    "annotated_types",
    "typing_extensions",
    "typing_inspection",
    "sitecustomize",
    "org",
}
LLM_CLIENT = {"tenacity", "tornado"}  # workers.llm.client, to resolve --llm openai's endpoint
IMPORT_LINE = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$")


def run_cli(*args: str, cwd: Path = REPO) -> tuple[subprocess.CompletedProcess[str], float]:
    unset = ("KEYSEED_LLM_API_KEY", "KEYSEED_LLM_API_KEY_FILE", "OPENAI_API_KEY")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env["PYTHONPATH"] = str(REPO)
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "app.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return result, time.monotonic() - started


def imported(stderr: str) -> set[str]:
    return {m.group(1) for line in stderr.splitlines() if (m := IMPORT_LINE.match(line))}


def messages(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if not line.startswith("import time:")]


def heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] in HEAVY)


def third_party(modules: set[str]) -> set[str]:
    """Top-level packages imported that are not the standard library's."""
    tops = {m.split(".")[0] for m in modules}
    return {m for m in tops - set(sys.stdlib_module_names) if not m.startswith("_")}


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    good = tmp_path / "in.csv"
    good.write_text("title,class,patient\nmatch today,Sports,p1\nshares up,Business,p2\n")
    return {
        "good": good,
        "latin1": _write(tmp_path / "latin1.csv", b"title,class\ncaf\xe9,Sports\n"),
        "no_label": _write(tmp_path / "no_label.csv", b"title,class\nmatch,Sports\nshares,\n"),
        "undeclared": _write(tmp_path / "undeclared.csv", b"title,class\nmatch,Health\n"),
        "empty": _write(tmp_path / "empty.csv", b""),
        "missing": tmp_path / "missing.csv",
        "folder": tmp_path,
        "out": tmp_path / "out.jsonl",
    }


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def generate(files: dict[str, Path], *extra: str, input_file: str = "good") -> list[str]:
    args = {
        "--input": str(files[input_file]),
        "--text-column": "title",
        "--label-column": "class",
        "--labels": "Sports,Business",
        "--epsilon": "1",
        "--output": str(files["out"]),
    }
    for option, value in zip(extra[::2], extra[1::2], strict=True):
        if value == "-":
            args.pop(option)
        else:
            args[option] = value
    return ["generate", *(f"{option}={value}" for option, value in args.items())]


LLM = ("--method", "aug-pe", "--llm", "local", "--delta", "1e-6")
CASES: list[tuple[str, Callable[[dict[str, Path]], list[str]], str]] = [
    ("epsilon 0", lambda f: generate(f, "--epsilon", "0"), "error: --epsilon: must be between"),
    ("epsilon nan", lambda f: generate(f, "--epsilon", "nan"), "error: --epsilon:"),
    ("delta 1", lambda f: generate(f, "--delta", "1"), "error: --delta: must be between"),
    ("delta < 0", lambda f: generate(f, "--delta", "-1e-6"), "error: --delta:"),
    (
        "sequence length",
        lambda f: generate(f, "--sequence-length", "0"),
        "error: --sequence-length:",
    ),
    ("no labels", lambda f: generate(f, "--labels", "-"), "error: --labels: declare the label"),
    ("one label", lambda f: generate(f, "--labels", "Sports"), "error: --labels: a labelled"),
    ("output", lambda f: generate(f, "--output", "x.csv"), "error: --output: must name a .jsonl"),
    (
        "missing file",
        lambda f: generate(f, input_file="missing"),
        "error: --input: {missing} does not exist",
    ),
    (
        "a folder",
        lambda f: generate(f, input_file="folder"),
        "error: --input: {folder} is a directory",
    ),
    ("empty file", lambda f: generate(f, input_file="empty"), "error: --input: {empty} is empty"),
    (
        "not UTF-8",
        lambda f: generate(f, input_file="latin1"),
        "error: --input: {latin1} is not valid UTF-8 (first bad byte on line 2)",
    ),
    (
        "text column",
        lambda f: generate(f, "--text-column", "body"),
        "error: --text-column: {good}: column 'body' is not in the header",
    ),
    (
        "label column",
        lambda f: generate(f, "--label-column", "label"),
        "error: --label-column: {good}: column 'label' is not in the header",
    ),
    (
        "unit column",
        lambda f: generate(f, "--unit-column", "person"),
        "error: --unit-column: {good}: column 'person' is not in the header",
    ),
    (
        "empty label",
        lambda f: generate(f, input_file="no_label"),
        "error: --label-column: {no_label}: 1 row(s) have an empty label (rows 2)",
    ),
    (
        "undeclared label",
        lambda f: generate(f, input_file="undeclared"),
        "error: --label-column: 1 document(s) carry a label outside the declared set",
    ),
    (
        "no OpenAI key",
        lambda f: generate(f, "--llm", "openai"),
        "error: --llm: set KEYSEED_LLM_API_KEY",
    ),
    ("aug-pe epsilon", lambda f: generate(f, *LLM, "--epsilon", "0"), "error: --epsilon:"),
    (
        "aug-pe delta 0",
        lambda f: generate(f, "--method", "aug-pe", "--llm", "local"),
        "error: --delta:",
    ),
    ("aug-pe option", lambda f: generate(f, *LLM, "--iterations", "0"), "error: --iterations:"),
    (
        "aug-pe one label",
        lambda f: generate(f, *LLM, "--labels", "Sports"),
        "error: --labels: a labelled corpus needs at least two labels",
    ),
    (
        "foreign option",
        lambda f: generate(f, "--teachers", "4"),
        "error: --teachers: an option of --method pate-tutor",
    ),
    (
        "aug-pe column",
        lambda f: generate(f, *LLM, "--label-column", "label"),
        "error: --label-column: {good}: column 'label' is not in the header",
    ),
    (
        "dp-eda not UTF-8",
        lambda f: generate(
            f, "--method", "dp-eda", "--llm", "local", "--delta", "1e-6", input_file="latin1"
        ),
        "error: --input: {latin1} is not valid UTF-8",
    ),
]


@pytest.mark.parametrize(
    ("make_args", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_a_bad_input_is_refused_before_the_engine_loads(
    files: dict[str, Path],
    record_property: Callable[[str, object], None],
    make_args: Callable[[dict[str, Path]], list[str]],
    expected: str,
) -> None:
    args = make_args(files)
    result, seconds = run_cli(*args)
    record_property("seconds", round(seconds, 3))
    shown = messages(result.stderr)
    assert result.returncode == 2, shown
    assert len(shown) == 1, shown  # one line, naming the option
    assert shown[0].startswith(expected.format(**files)), shown
    assert heavy(imported(result.stderr)) == []
    allowed = ALLOWED | (LLM_CLIENT if "--llm=openai" in args else set())
    assert third_party(imported(result.stderr)) <= allowed
    assert not files["out"].exists()


def test_a_good_run_does_import_the_engine_so_the_check_can_fail(files: dict[str, Path]) -> None:
    # The same probe on a run that gets past the checks: torch is imported there, so the
    # assertion above would see it. (--llm none, a tiny vocabulary: the run is quick.)
    vocabulary = files["folder"] / "vocab.txt"
    vocabulary.write_text("match\nshares\ntoday\n")
    args = generate(files, "--vocabulary", str(vocabulary), "--vocabulary-size", "2")
    result, _ = run_cli(*args, "--per-class", "2", "--sequence-length", "2")
    assert result.returncode == 0, messages(result.stderr)
    assert "torch" in imported(result.stderr)


@pytest.mark.parametrize(
    "command",
    [
        ["--help"],
        ["generate", "--help"],
        ["evaluate", "--help"],
        ["admin", "--help"],
        ["admin", "create-org", "--help"],
    ],
)
def test_help_and_parsing_load_no_engine(
    command: list[str], record_property: Callable[[str, object], None]
) -> None:
    result, seconds = run_cli(*command)
    record_property("seconds", round(seconds, 3))
    assert result.returncode == 0, messages(result.stderr)
    assert "usage: keyseed" in result.stdout
    assert heavy(imported(result.stderr)) == []
