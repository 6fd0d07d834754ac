"""Progress of a CMake/Ninja build read from ``pip install -v`` on stdin.

Prints one line when the build starts, a line every 10 % of its steps (Ninja's
``[k/n]`` counter) with the elapsed time and an estimate of the time left, and the last
40 lines of the log if pip fails (the exit status is pip's: the Makefile sets pipefail).
"""

from __future__ import annotations

import collections
import re
import sys
import time

STEP = re.compile(r"^\s*\[(\d+)/(\d+)\]")


def main() -> int:
    began = time.monotonic()
    tail: collections.deque[str] = collections.deque(maxlen=40)
    shown = -1
    for line in sys.stdin:
        tail.append(line)
        match = STEP.match(line)
        if not match:
            if line.startswith("Successfully installed llama"):  # not the build deps'
                print(f"   done in {time.monotonic() - began:.0f} s", flush=True)
            elif line.startswith("ERROR") or "error:" in line.lower():
                print("".join(tail), end="", flush=True)
            continue
        done, total = int(match.group(1)), int(match.group(2))
        tenth = done * 10 // total
        if tenth > shown:
            shown = tenth
            elapsed = time.monotonic() - began
            left = elapsed * (total - done) / done if done else 0.0
            print(
                f"   {done}/{total} compiled ({tenth * 10} %), {elapsed:.0f} s, "
                f"about {left:.0f} s left",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
