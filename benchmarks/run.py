"""``make bench``: run every benchmark and write BENCHMARKS.md.

Each section comes from a module of this folder with ``run() -> dict`` and
``markdown(dict) -> str``. The raw figures are written beside the report as JSON.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

SECTIONS = (
    "bench_utility",
    "bench_low_epsilon",
    "bench_scoring",
    "bench_prompting",
    "bench_methods",
    "bench_load",
)


def machine() -> str:
    cpus = os.cpu_count()
    return (
        f"{platform.node() or 'host'}: {cpus} CPUs, Python {platform.python_version()}, "
        f"torch {torch.__version__} ({'CUDA' if torch.cuda.is_available() else 'CPU only'})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output", type=Path, default=Path("BENCHMARKS.md"))
    parser.add_argument("--only", nargs="*", choices=SECTIONS, default=list(SECTIONS))
    args = parser.parse_args(argv)
    parts = [
        "# keyseed benchmarks",
        "",
        f"Written by `make bench` on {time.strftime('%Y-%m-%d')}; {machine()}."
        + (
            f" Re-run this time: {', '.join(args.only)}; the other sections are from the "
            "previous run."
            if set(args.only) != set(SECTIONS)
            else ""
        ),
        "Figures are from one run on a shared machine; rerun `make bench` to reproduce.",
        "",
    ]
    raw: dict[str, object] = {}
    stored = args.output.with_suffix(".json")
    earlier = json.loads(stored.read_text()) if stored.exists() else {}
    for name in SECTIONS:
        if name not in args.only:
            # --only re-runs some sections; the others keep their last measured figures
            if name in earlier:
                raw[name] = earlier[name]
                parts.append(importlib.import_module(f"benchmarks.{name}").markdown(earlier[name]))
            continue
        module = importlib.import_module(f"benchmarks.{name}")
        started = time.perf_counter()
        print(f"[bench] {name} …", file=sys.stderr, flush=True)
        results = module.run()
        raw[name] = results
        parts.append(module.markdown(results))
        print(f"[bench] {name} done in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    args.output.write_text("\n".join(parts), encoding="utf-8")
    args.output.with_suffix(".json").write_text(json.dumps(raw, indent=1, default=str))
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
