"""What a run of any method released, in the one shape its callers save it in.

Each registry entry (:mod:`workers.methods.registry`) turns its run's own result into a
:class:`RunOutcome`: the released sequences (DP-KPS's keyphrases; none for a method that
writes its texts), the texts the run wrote (None: they are written afterwards, by
prompting an LLM with the sequences, post-processing), the public manifest, and the ε the
run reports by mechanism, so the worker checks it against the ledger whatever ran. All
of it is DP output or public configuration.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workers.llm.client import LLMCosts


@dataclass(frozen=True)
class RunOutcome:
    """A run's releases (module docstring)."""

    sequences: list[tuple[str, Sequence[str]]]  # (label, keyphrases), in release order
    texts: list[str] | None  # one per sequence, when the run wrote them itself
    manifest: dict[str, Any]  # public: method, parameters, models, privacy
    epsilon_by_mechanism: dict[str, float]  # as the run reports it
    epsilon: float  # the run's ε, composed at its δ
    as_planned: bool  # the run's releases are the ones its plan (the reservation) holds
    private_vocabulary: list[str] | None = None  # DP output of a run that releases one
    llm_costs: LLMCosts | None = None  # the LLM work of a run that writes its texts

    def released(self) -> list[tuple[str, str]]:
        """``(label, text)`` of the released corpus as it stands after the run: the texts
        the run wrote, else each sequence's keyphrases joined by spaces."""
        if self.texts is not None:
            return [
                (label, text) for (label, _), text in zip(self.sequences, self.texts, strict=True)
            ]
        return [(label, " ".join(phrases)) for label, phrases in self.sequences]
