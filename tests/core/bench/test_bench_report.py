"""BENCHMARKS.md: a short report rendered from BENCHMARKS.json, the default's utility first,
and an index of the dated tuning notes under benchmarks/notes/ that matches the folder."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from benchmarks import run

REPO = Path(__file__).resolve().parents[3]
NOTES = REPO / "benchmarks" / "notes"


@pytest.fixture(scope="module")
def rendered() -> str:
    raw = json.loads((REPO / "BENCHMARKS.json").read_text(encoding="utf-8"))
    return run.render(raw)


def test_report_is_short(rendered: str) -> None:
    assert len(rendered.splitlines()) <= 300


def test_first_section_is_the_defaults_utility_curve(rendered: str) -> None:
    sections = [line for line in rendered.splitlines() if line.startswith("## ")]
    assert sections[0].startswith("## What the default gives: accuracy against ε")
    first = rendered.split(sections[0], 1)[1].split("\n## ", 1)[0]
    # every reported corpus of the stored curve and of the corpora measured by hand
    raw = json.loads((REPO / "BENCHMARKS.json").read_text(encoding="utf-8"))["bench_low_epsilon"]
    from benchmarks.bench_low_epsilon import REPORTED

    for split in {p["split"] for p in raw["curve"]}:
        assert f"| {REPORTED[split]} |" in first
    for corpus in raw.get("other_corpora", []):
        assert f"| {corpus['name']} † |" in first
    assert "fraction of the same classifier trained on the real" in first
    # the order the issue asks for: head-to-head, then speed, prompting and load, then the index
    order = [s.split(":")[0] for s in sections]
    for earlier, later in [
        ("## Head-to-head", "## Speed"),
        ("## Speed", "## Prompting throughput (`benchmarks/bench_prompting.py`)"),
        ("## Prompting throughput (`benchmarks/bench_prompting.py`)", "## Load"),
        ("## Load", "## How the defaults were chosen"),
    ]:
        assert order.index(earlier) < order.index(later)
    assert order[-1] == "## How the defaults were chosen"


def test_speed_names_the_path_it_measures(rendered: str) -> None:
    speed = rendered.split("\n## Speed\n", 1)[1].split("\n## ", 1)[0]
    assert "pure-ε (Laplace) path" in speed
    assert "not the default" in speed


def test_no_tuning_study_in_the_report(rendered: str) -> None:
    # the notebook's headings name their session: "(a ninth session; now a default)"
    assert not re.search(r"\(an? [a-z-]+ session", rendered)
    assert "### Why the defaults" not in rendered


def test_notes_index_matches_the_folder() -> None:
    index = run.notes_index()
    named = [name for _, _, name, _ in index]
    assert len(named) == len(set(named))
    for name in named:
        assert (NOTES / name).is_file(), name
    on_disk = {p.name for p in NOTES.glob("*.md")} - {"README.md"}
    assert on_disk == set(named), sorted(on_disk ^ set(named))
    for date, _, name, outcome in index:
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}-[a-z0-9-]+\.md", name)
        assert name.startswith(date)
        assert outcome.startswith(("changed default", "no default changed", "a summary"))


def test_every_note_that_changed_a_default_is_linked(rendered: str) -> None:
    index = rendered.split("## How the defaults were chosen", 1)[1]
    changed = [n for _, _, n, outcome in run.notes_index() if outcome.startswith("changed")]
    assert changed
    for name in changed:
        assert f"(benchmarks/notes/{name})" in index


def test_committed_report_is_the_rendered_one(rendered: str) -> None:
    committed = (REPO / "BENCHMARKS.md").read_text(encoding="utf-8")
    assert committed == rendered, "BENCHMARKS.md drifted: run `python -m benchmarks.run --render`"
