"""Progress of a run on a terminal: one tqdm bar per stage, as the service shows it.

:class:`StageBars` is a progress callback (``(stage, fraction)``, what the engine and the
LLM methods report) that draws the running stage as "[k/n] title"
(:func:`workers.methods.progress.run_stages`). A stage whose amount of work is public
(embedding the vocabulary, sampling, prompting) gets a bar with its percentage, the time
spent and an estimate of the time left (tqdm's rate over the work done so far); a stage
that reads the private corpus gets its time spent only, and "done" at its end, as the
service shows it to others than the owner. k never goes down: a report of an earlier
stage than the one drawn is not drawn.
"""

from __future__ import annotations

import sys
from typing import IO, Any

from workers.methods.progress import Stage, stage_number

STEPS = 1000  # a bar's resolution
PUBLIC_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {elapsed}<{remaining}"
PRIVATE_FORMAT = "{desc}: {elapsed}{postfix}"


class StageBars:
    """Draw a run's stages (``stages``, in order) on ``file`` (stderr by default)."""

    def __init__(self, stages: tuple[Stage, ...], *, file: IO[str] | None = None) -> None:
        from tqdm import tqdm

        self._tqdm = tqdm
        self.stages = stages
        self.file = file if file is not None else sys.stderr
        self.number: int | None = None
        self.bar: Any = None

    def __call__(self, stage: str, fraction: float) -> None:
        number = stage_number(self.stages, stage)
        if number is None or (self.number is not None and number < self.number):
            return
        current = self.stages[number - 1]
        if number != self.number:
            self.close()
            self.number = number
            self.bar = self._tqdm(
                total=STEPS if current.public_work else None,
                desc=f"[{number}/{len(self.stages)}] {current.title}",
                file=self.file,
                leave=True,
                bar_format=PUBLIC_FORMAT if current.public_work else PRIVATE_FORMAT,
            )
        fraction = min(max(float(fraction), 0.0), 1.0)
        if current.public_work:
            self.bar.update(round(STEPS * fraction) - self.bar.n)
        elif fraction >= 1.0:
            self.bar.set_postfix_str("done", refresh=False)
        self.bar.refresh()

    def prompts(self, done: int, total: int) -> None:
        """The prompting stage's callback: ``done`` of ``total`` prompts."""
        self("prompts", done / total if total else 1.0)

    def close(self) -> None:
        """End the bar drawn (the next stage, or the run, starts afresh)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
