"""The ``keyseed`` command: one entry point, sub-commands registered by their modules.

Each module that adds commands exposes ``register(subparsers)``; it only declares
arguments and stores a handler ``"module:function"`` that is imported when the command
runs, so ``keyseed generate`` never loads the web stack and ``keyseed admin`` never
loads torch. A known command's parser is built from its own module alone
(:data:`COMMANDS`); ``keyseed --help`` and an unknown command build them all.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Each command, by the module that registers it (``register(subparsers)``).
COMMANDS = {
    "generate": "app.cli.options",
    "evaluate": "app.cli.options",
    "admin": "app.identity.cli",
    "serve": "app.serve",
    "api": "app.serve",
    "demo": "app.demo",
    "verify-prompts": "app.cli.verify_prompts",
}
REGISTRARS = tuple(dict.fromkeys(COMMANDS.values()))


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, or, for a known ``command``, one with only the commands its
    module registers: ``keyseed generate`` then imports nothing the web stack needs."""
    parser = argparse.ArgumentParser(
        prog="keyseed",
        description="Differentially private synthetic text: DP-KPS and three other methods, "
        "on files (generate, evaluate) or as a service (serve, api, admin, demo).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    registrars = (COMMANDS[command],) if command in COMMANDS else REGISTRARS
    for name in registrars:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    command = arguments[0] if arguments else None
    args = build_parser(command).parse_args(arguments)
    module, _, function = args.handler.partition(":")
    handler = getattr(importlib.import_module(module), function)
    return int(handler(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
