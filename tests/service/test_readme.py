"""README.md's service walkthrough, run as written.

The block after ``<!-- readme-walkthrough -->`` is what a newcomer pastes into a shell
from the repository's root: it starts ``keyseed serve``, makes the admin key, the
organisations and their keys, uploads the public HPO sample, dry-runs and runs a job at
the default total budget with the packaged LLM, releases it, downloads it as the client
and reads the ledger. This test runs that block with bash (``set -euo pipefail``) in a
fresh folder holding only a link to this checkout's ``.venv``, the one change being the
port (a free one instead of 8000, which may be taken on a test machine).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

MARKER = "<!-- readme-walkthrough -->"


def walkthrough(readme: str) -> str:
    """The ``sh`` block that follows the marker in README.md."""
    after = readme.split(MARKER, 1)[1]
    match = re.match(r"\s*```sh\n(.*?)\n```", after, flags=re.DOTALL)
    assert match, "README.md's walkthrough marker is not followed by a ```sh block"
    return match.group(1)


def test_walkthrough_block_is_found_and_complete() -> None:
    block = walkthrough((REPO / "README.md").read_text(encoding="utf-8"))
    # the flow the issue names, in order: start, admin key, organisations, upload, job,
    # release, download
    steps = [
        "keyseed serve",
        "keyseed admin bootstrap",
        "keyseed admin create-org",
        "/v1/datasets",
        "/jobs?dry_run=true",
        "/release",
        "/download",
        "/ledger",
    ]
    positions = [block.find(step) for step in steps]
    assert all(p >= 0 for p in positions), dict(zip(steps, positions, strict=True))
    assert positions == sorted(positions)


@pytest.mark.slow
@pytest.mark.llm
@pytest.mark.timeout(1800)
def test_walkthrough_runs_as_written(tmp_path: Path) -> None:
    if shutil.which("jq") is None or shutil.which("curl") is None:
        pytest.skip("the walkthrough needs curl and jq")
    venv = Path(sys.prefix)
    if not (venv / "bin" / "keyseed").exists():
        pytest.skip("keyseed is not installed in this interpreter's environment")
    from app.serve import free_port

    port = free_port()
    block = walkthrough((REPO / "README.md").read_text(encoding="utf-8"))
    script = block.replace("8000", str(port))
    (tmp_path / ".venv").symlink_to(venv)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("KEYSEED_") and k not in ("DATABASE_URL", "REDIS_URL")
    }
    env["HF_HUB_OFFLINE"] = "1"
    env["TRANSFORMERS_OFFLINE"] = "1"
    done = subprocess.run(
        ["bash", "-c", "set -euo pipefail\n" + script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=1700,
        check=False,
    )
    log = (tmp_path / "serve.log").read_text(errors="replace")[-3000:]
    assert done.returncode == 0, (
        f"exit {done.returncode}\n--- stdout\n{done.stdout[-3000:]}\n--- stderr\n"
        f"{done.stderr[-3000:]}\n--- serve.log\n{log}"
    )
    records = [
        json.loads(line)
        for line in (tmp_path / "corpus.jsonl").read_text().splitlines()
        if line.strip()
    ]
    assert len(records) == 12  # 2 per class, 6 declared classes
    assert {r["label"] for r in records} <= {
        "cardiovascular system",
        "eye",
        "genitourinary system",
        "metabolism",
        "musculoskeletal system",
        "nervous system",
    }
    assert all(r["text"] for r in records)
    # the ledger step printed the dataset's budget (jq's pretty print, the last object but
    # the audit count): ε = 1 spent out of the cap of 10
    budget = last_object(done.stdout)
    assert float(budget["epsilon_cap"]) == 10
    assert 0 < float(budget["spent"]) <= 1.0 + 1e-9


def last_object(text: str) -> dict[str, object]:
    """The last JSON object printed on lines of its own (``jq`` pretty-prints one)."""
    decoder = json.JSONDecoder()
    starts = [m.start() for m in re.finditer(r"^\{$", text, flags=re.MULTILINE)]
    for start in reversed(starts):
        try:
            value, _ = decoder.raw_decode(text[start:])
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    raise AssertionError(f"no JSON object in the walkthrough's output:\n{text[-2000:]}")
