"""Shared fixtures. Paths to the read-only material beside the repository."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("KEYSEED_SHARED", REPO.parent / "shared"))
AG_NEWS = SHARED / "data" / "ag_news_test.csv"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


# The longest files (minutes each on two cores), started first so that under pytest-xdist
# (``make test``) none of them is left running alone at the end while the other workers
# idle. Within a file the order is unchanged.
LONG_FIRST = (
    "tests/proof/test_fuzz_api.py",
    "tests/service/test_readme.py",
    "tests/proof/test_budget_race.py",
    "tests/proof/test_crashes.py",
    "tests/proof/test_embedded_recovery.py",
    "tests/core/privacy/test_sharded_neighbouring.py",
    "tests/core/methods/test_llm_audit.py",
    "tests/service/test_sharded_jobs.py",
    "tests/core/cli/test_cli.py",
    "tests/service/test_serve.py",
    "tests/core/evaluation/test_evaluation.py",
    "tests/core/bench/test_llm_pass.py",
    "tests/core/privacy/test_neighbouring.py",
    "tests/core/dpkps/test_thresholded_vocabulary.py",
    "tests/core/dpkps/test_label_prior.py",
    "tests/service/test_llm_method_audit.py",
    "tests/core/bench/test_static_embedder.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # schemathesis names each operation's item ``test[GET /path]`` but leaves every one
    # the node id of the bare function; pytest-xdist schedules by node id, so it would
    # run the first operation only. Each item gets the id its name says.
    for item in items:
        if "[" in item.name and "[" not in item.nodeid:
            params = item.name.partition("[")[2].removesuffix("]")
            if hasattr(item, "_id"):  # pytest 9: a structured node id
                item._id = item._id.with_params(params)
            else:
                item._nodeid = f"{item.nodeid}[{params}]"
    rank = {path: n for n, path in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


@pytest.fixture(scope="session")
def ag_news_path() -> Path:
    if not AG_NEWS.exists():
        pytest.skip(f"AG News is not available at {AG_NEWS} (../shared is absent); skipping")
    return AG_NEWS


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Figures that tests recorded (``request.node.user_properties``: ``("figures", …)``),
    printed at the end and written as JSON to ``$KEYSEED_PROOF_REPORT`` if set (``make
    proof`` writes ``out/proof/figures.json``; RELIABILITY.md quotes it)."""
    import json

    figures = {
        report.nodeid: value
        for report in terminalreporter.stats.get("passed", [])
        for name, value in getattr(report, "user_properties", [])
        if name == "figures"
    }
    if not figures:
        return
    terminalreporter.section("figures")
    for nodeid, value in figures.items():
        terminalreporter.write_line(f"{nodeid}: {json.dumps(value, default=str)[:2000]}")
    destination = os.environ.get("KEYSEED_PROOF_REPORT")
    if destination:
        Path(destination).parent.mkdir(parents=True, exist_ok=True)
        Path(destination).write_text(json.dumps(figures, indent=1, default=str) + "\n")
