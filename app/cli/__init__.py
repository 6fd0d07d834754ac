"""The ``keyseed`` command: one entry point, sub-commands registered by their modules.

Each module that adds commands exposes ``register(subparsers)``; it only declares
arguments and stores a handler ``"module:function"`` that is imported when the command
runs, so ``keyseed generate`` never loads the web stack and ``keyseed admin`` never
loads torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

REGISTRARS = (
    "app.cli.options",
    "app.identity.cli",
    "app.serve",
    "app.demo",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="keyseed",
        description="Differentially private synthetic text by keyphrase prompt seeding.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in REGISTRARS:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    module, _, function = args.handler.partition(":")
    handler = getattr(importlib.import_module(module), function)
    return int(handler(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
