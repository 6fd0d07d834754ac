"""``make bench``: run every benchmark and write BENCHMARKS.md, a short report of what the
product does today.

Each benchmark is a module of this folder with ``run() -> dict`` and ``markdown(dict) -> str``
(its short part of the report). The raw figures are written beside the report as JSON
(BENCHMARKS.json); ``--render`` rewrites BENCHMARKS.md from them without running anything.
``LAYOUT`` orders the report: the product default's accuracy against ε first, then the
head-to-head of the four methods, the pure-ε path's utility, speed, prompting throughput,
scale (hospital-size corpora, ingest) and load, and last an index of the notes that changed
a default (read from ``benchmarks/notes/README.md``). Tuning studies are never part of the
report: each is a dated file under ``benchmarks/notes/``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import re
import sys
import time
from pathlib import Path
from typing import Any

SECTIONS = (
    "bench_utility",
    "bench_low_epsilon",
    "bench_scoring",
    "bench_prompting",
    "bench_methods",
    "bench_scale",
    "bench_shards",
    "bench_ingest",
    "bench_load",
    "bench_download",
)
# The report's order: a module's function, or a line of text of its own.
LAYOUT: tuple[tuple[str, str] | str, ...] = (
    ("bench_low_epsilon", "markdown"),
    ("bench_methods", "markdown"),
    ("bench_utility", "markdown"),
    "## Speed\n",
    ("bench_utility", "speed_markdown"),
    ("bench_scoring", "markdown"),
    ("bench_prompting", "markdown"),
    "## Scale\n",
    ("bench_scale", "markdown"),
    ("bench_shards", "markdown"),
    ("bench_ingest", "markdown"),
    ("bench_load", "markdown"),
    ("bench_download", "markdown"),
)
# Figures a section's run() does not make (measured by hand, with their own records); a new
# run keeps them from the previous BENCHMARKS.json.
KEPT = {"bench_low_epsilon": ("other_corpora",)}
REPORT = "report"  # BENCHMARKS.json's key for the machine and when each section was measured
REPO = Path(__file__).resolve().parents[1]
NOTES = REPO / "benchmarks" / "notes"
# a line of the notes' index: | date | [title](file) | outcome |
INDEX_LINE = re.compile(r"^\| (\d{4}-\d{2}-\d{2}) \| \[(.+)\]\(([^)]+\.md)\) \| (.+) \|$")


def machine() -> str:
    import torch

    cpus = os.cpu_count()
    return (
        f"{platform.node() or 'host'}: {cpus} CPUs, Python {platform.python_version()}, "
        f"torch {torch.__version__} ({'CUDA' if torch.cuda.is_available() else 'CPU only'})"
    )


def notes_index(readme: Path = NOTES / "README.md") -> list[tuple[str, str, str, str]]:
    """The notes' index: (date, title, file name, outcome), one per line of its table."""
    found = []
    for line in readme.read_text(encoding="utf-8").splitlines():
        match = INDEX_LINE.match(line)
        if match:
            found.append((match[1], match[2], match[3], match[4]))
    return found


def defaults_index() -> str:
    """The report's last section: the notes whose outcome changed a default."""
    lines = [
        "## How the defaults were chosen",
        "",
        "Each default was set by a tuning study on splits that are never reported (AG tune and "
        "tuning splits of Yelp, OHSUMED and the 20 Newsgroups), each a dated note (moved",
        "unabridged from earlier versions of this file). The notes that changed a default:",
        "",
    ]
    lines += [
        f"- {date}: [{title}](benchmarks/notes/{name}): {outcome}."
        for date, title, name, outcome in notes_index()
        if outcome.startswith("changed default")
    ]
    lines += [
        "",
        "Every other study (prototypes removed, options off by default, diagnostics, the DP",
        "classifier reference, the report's changelog) is listed in",
        "[benchmarks/notes/README.md](benchmarks/notes/README.md).",
        "",
    ]
    return "\n".join(lines)


def render(raw: dict[str, Any]) -> str:
    """BENCHMARKS.md from BENCHMARKS.json's figures; runs nothing."""
    meta = raw.get(REPORT, {})
    measured = meta.get("measured", {})
    dates = "; ".join(f"{name} {measured[name]}" for name in SECTIONS if name in measured)
    parts = [
        "# keyseed benchmarks",
        "",
        "What keyseed does today, written by `make bench` (`python -m benchmarks.run`; `--render`",
        "rewrites this file from BENCHMARKS.json without running anything). The figures are",
        f"BENCHMARKS.json's, each section's as last measured ({dates}); machine: "
        f"{meta.get('machine', 'not recorded')}. How each default was chosen, and every study",
        "that changed none, is in [benchmarks/notes/](benchmarks/notes/README.md).",
        "",
    ]
    for item in LAYOUT:
        if isinstance(item, str):
            parts.append(item)
            continue
        name, function = item
        if name in raw:
            module = importlib.import_module(f"benchmarks.{name}")
            parts.append(getattr(module, function)(raw[name]))
    parts.append(defaults_index())
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output", type=Path, default=Path("BENCHMARKS.md"))
    parser.add_argument("--only", nargs="*", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument(
        "--render",
        action="store_true",
        help="rewrite the report from BENCHMARKS.json's stored figures; run nothing",
    )
    args = parser.parse_args(argv)
    stored = args.output.with_suffix(".json")
    earlier = json.loads(stored.read_text()) if stored.exists() else {}
    if args.render:
        args.output.write_text(render(earlier), encoding="utf-8")
        print(f"wrote {args.output} from {stored}", file=sys.stderr)
        return 0
    raw: dict[str, Any] = {}
    meta = dict(earlier.get(REPORT, {}))
    measured = dict(meta.get("measured", {}))
    for name in SECTIONS:
        if name not in args.only:
            # --only re-runs some sections; the others keep their last measured figures
            if name in earlier:
                raw[name] = earlier[name]
            continue
        module = importlib.import_module(f"benchmarks.{name}")
        started = time.perf_counter()
        print(f"[bench] {name} …", file=sys.stderr, flush=True)
        results = module.run()
        for key in KEPT.get(name, ()):
            if key not in results and key in earlier.get(name, {}):
                results[key] = earlier[name][key]
        raw[name] = results
        measured[name] = time.strftime("%Y-%m-%d")
        print(f"[bench] {name} done in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    meta.update(machine=machine(), measured=measured)
    raw[REPORT] = meta
    stored.write_text(json.dumps(raw, indent=1, default=str))
    args.output.write_text(render(raw), encoding="utf-8")
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
