"""``keyseed verify-prompts``: check a release's prompt log in one command (issue 66, item 4).

The log (``GET /v1/releases/{id}/prompts``, or a file saved from it) must be an intact
hash chain (each record numbered in turn, linked to the one before, its hash matching
its contents); each prompt shown in clear must hash to its record's digests, and a
prompt of a kind with a renderer (DP-KPS's, and the methods' public prompts) must be
the prompt its inputs render. ``--head`` (the report prints it) ties the log to the
signed report: the chain must end on that hash. ``--release`` (the release's JSONL
download) checks that every DP-KPS prompt's keyphrases are a released sequence.

Exit status: 0 when the log holds, 1 when it does not (the verdict names the first
records that break it), 2 when it cannot be read. It imports neither torch nor the web
stack: reading a URL needs httpx only.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

HANDLER = "app.cli.verify_prompts"
HEAD_DIGITS = 64


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "verify-prompts",
        help="check a release's prompt log: its hash chain, and that each prompt is the "
        "one its DP outputs and public inputs render",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    parser.add_argument(
        "log", help="the log: a JSONL file, '-' for standard input, or its URL "
        "(…/v1/releases/{id}/prompts; the key in KEYSEED_API_KEY)"
    )  # fmt: skip
    parser.add_argument(
        "--head", help="the head hash the release report gives: the log must end on it"
    )
    parser.add_argument(
        "--release",
        type=Path,
        help="the release's JSONL download: every DP-KPS prompt's keyphrases must be one of "
        "its sequences",
    )
    parser.add_argument("--api-key", help="API key for a URL (default: KEYSEED_API_KEY)")
    parser.set_defaults(handler=f"{HANDLER}:main")


class Unreadable(Exception):
    """The log could not be read (exit status 2)."""


def _read(source: str, api_key: str | None) -> str:
    if source == "-":
        return sys.stdin.read()
    if source.startswith(("http://", "https://")):
        import httpx

        key = api_key or os.environ.get("KEYSEED_API_KEY", "")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        try:
            response = httpx.get(source, headers=headers, timeout=60.0)
        except httpx.HTTPError as exc:
            raise Unreadable(f"{source}: {type(exc).__name__}") from None
        if response.status_code != 200:
            raise Unreadable(f"{source} answered {response.status_code}: {response.text[:300]}")
        return response.text
    try:
        return Path(source).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise Unreadable(f"{source}: {exc}") from None


def _released_sequences(path: Path) -> Counter[tuple[str, ...]]:
    from workers.llm.attestation import read_jsonl

    try:
        rows = read_jsonl(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise Unreadable(f"--release {path}: {exc}") from None
    return Counter(tuple(row.get("keyphrases") or ()) for row in rows)


def _unreleased(lines: list[dict[str, Any]], released: Counter[tuple[str, ...]]) -> list[str]:
    """The DP-KPS records whose keyphrases are no released sequence."""
    from workers.llm.attestation import DPKPS

    found = []
    for line in lines:
        content = line.get("content")
        if line.get("kind") != DPKPS or not isinstance(content, dict):
            continue
        phrases = tuple((content.get("inputs") or {}).get("keyphrases") or ())
        if phrases not in released:
            found.append(
                f"record {line.get('seq')} ({line.get('key')}): its keyphrases are not a "
                "sequence of the release"
            )
    return found


def main(args: argparse.Namespace) -> int:
    from workers.llm.attestation import read_jsonl, verify

    if args.head is not None and (
        len(args.head) != HEAD_DIGITS or any(c not in "0123456789abcdef" for c in args.head)
    ):
        print("keyseed verify-prompts: --head must be 64 lowercase hex digits", file=sys.stderr)
        return 2
    try:
        lines = read_jsonl(_read(args.log, args.api_key))
        released = _released_sequences(args.release) if args.release else None
    except (Unreadable, ValueError) as exc:
        print(f"keyseed verify-prompts: cannot read the log: {exc}", file=sys.stderr)
        return 2
    verdict = verify(lines)
    problems = list(verdict.problems)
    if args.head is not None and verdict.head != args.head:
        problems.append(
            f"the log ends on {verdict.head}, not on the head the report gives ({args.head})"
        )
    if released is not None:
        problems += _unreleased(lines, released)
    kinds = ", ".join(f"{kind}: {n}" for kind, n in sorted(verdict.by_kind.items())) or "none"
    print(f"prompt log: {verdict.records} records ({kinds})")
    print(f"head: {verdict.head}" + (" (the report's)" if args.head == verdict.head else ""))
    print(
        f"prompts shown in clear: {verdict.with_content}; rendered again from their inputs "
        f"and identical: {verdict.rederived}"
    )
    if released is not None:
        print(f"release checked: {sum(released.values())} released sequences")
    if problems:
        print(f"BROKEN: {len(problems)} problem(s)")
        for problem in problems:
            print(f"  - {problem}")
        return 1
    if args.head is None:
        print("OK: the chain is intact (give --head from the report to tie it to the report)")
    else:
        print("OK: the chain is intact and ends on the report's head")
    return 0
