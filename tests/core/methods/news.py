"""A tiny private corpus of news sentences in two classes, for the end-to-end tests of
the LLM methods (the fake LLM answers them with :class:`tests.fake_llm.Topical`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.fake_llm import FakeLLM
    from workers.methods.checkpoints import Checkpoints
    from workers.methods.skeleton import RunInputs
    from workers.text.embeddings import Embedder

LABEL_SET = ["Sports", "Business"]
SPORTS = [
    "The home side scored twice in injury time to win the cup final.",
    "A late penalty gave the champions a narrow victory in the derby.",
    "The striker signed a new contract after a record-breaking season.",
    "Fans celebrated as the team clinched the league title on Sunday.",
]
BUSINESS = [
    "Shares fell sharply after the bank reported quarterly losses.",
    "The central bank raised interest rates to curb inflation.",
    "Oil prices climbed as investors weighed supply cuts.",
    "The retailer's profits beat analysts' expectations this quarter.",
]


def corpus(canary: str, *, sports: int, business: int) -> tuple[list[str], list[str]]:
    """The documents and their labels: the first ``sports - 1`` sports sentences, one that
    quotes ``canary``, then the first ``business`` business sentences."""
    quoting = f"The coach praised the defence after a clean sheet ({canary})."
    documents = [*SPORTS[: sports - 1], quoting, *BUSINESS[:business]]
    return documents, ["Sports"] * sports + ["Business"] * business


@dataclass(frozen=True)
class NewsRun:
    """An LLM method's run on a news corpus, as its end-to-end tests make it:
    ``run(llm, embedder, store, units=…, progress=…, **overrides)`` calls ``runner``
    (``run_aug_pe``, ``run_dp_eda``, ``run_pate_tutor``: the same run inputs) with
    ``params(**tiny)`` changed by ``overrides``, the fake ``llm`` as its endpoint, and
    ``inputs`` (e.g. DP-EDA's vocabulary)."""

    runner: Callable[..., Any]
    params: Callable[..., Any]
    tiny: dict[str, Any]
    documents: list[str]
    labels: list[str]
    inputs: dict[str, Any] = field(default_factory=dict)

    def __call__(
        self,
        llm: FakeLLM,
        embedder: Embedder,
        store: Checkpoints,
        *,
        units: list[str] | None = None,
        progress: Callable[[str, float], None] | None = None,
        **overrides: Any,
    ) -> Any:
        inputs: RunInputs = {
            "label_set": LABEL_SET,
            "units": units,
            "llm": llm.endpoint(),
            "embedder": embedder,
            "checkpoints": store,
            "progress": progress,
        }
        params = self.params(**{**self.tiny, **overrides})
        return self.runner(self.documents, self.labels, params=params, **inputs, **self.inputs)
