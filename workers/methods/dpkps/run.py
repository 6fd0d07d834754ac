"""DP-KPS's entry points in the methods registry's shape (:mod:`workers.methods.registry`).

:func:`plan_dpkps` gives the events of a run from its public parameters, label set and
vocabulary size, so the whole (ε, δ) is reserved before the first private read;
:func:`run_dpkps` runs it: the pipeline's steps 1-6 (:func:`generate_sequences`) on a
labelled private corpus, its keyphrase sequences released with their privacy report.
Prompting an LLM with the sequences is post-processing of the release, outside the run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from workers.errors import ConfigError
from workers.methods.dpkps.params import DPKPSParams
from workers.methods.dpkps.plan import Plan, plan
from workers.privacy.events import PrivacyEvent

if TYPE_CHECKING:  # types only: the pipeline loads numpy and torch
    from workers.methods.dpkps.pipeline import GenerationResult
    from workers.methods.dpkps.stages import ProgressFn
    from workers.text.embeddings import Embedder, EmbeddingCache
    from workers.text.vocabulary import Vocabulary

DESCRIPTION = (
    "DP-KPS (Nagesh et al., 2024): DP keyphrase sequences from per-class density releases, "
    "optionally written out by an LLM"
)


def plan_dpkps(
    params: DPKPSParams, label_set: Sequence[str], vocabulary_size: int | None = None
) -> list[PrivacyEvent]:
    """Every release of a run of ``params`` (public inputs only: the label set and the
    size of the vocabulary the run reads)."""
    return list(plan_of(params, label_set, vocabulary_size).events)


def plan_of(params: DPKPSParams, label_set: Sequence[str], vocabulary_size: int | None) -> Plan:
    """:func:`plan_dpkps` with the (ε, δ) the events compose to."""
    if vocabulary_size is None:
        raise ConfigError("DP-KPS plans with its vocabulary's size", field="vocabulary")
    return plan(params.generation_config(), label_set, vocabulary_size)


def run_dpkps(
    documents: Sequence[str],
    labels: Sequence[str],
    *,
    label_set: Sequence[str],
    units: Sequence[str] | None,
    params: DPKPSParams,
    vocabulary: Vocabulary,
    embedder: Embedder,
    cache: EmbeddingCache | None = None,
    progress: ProgressFn | None = None,
    unit_name: str | None = None,
    device: str | None = None,
    planned: Plan | None = None,
) -> GenerationResult:
    """A run of ``params`` on ``device`` (None: the GPU if torch sees one); ``planned``
    is the plan the ledger reserved (computed by the run if None)."""
    from workers.methods.dpkps.pipeline import generate_sequences

    return generate_sequences(
        documents,
        labels,
        label_set=label_set,
        vocabulary=vocabulary,
        config=params.generation_config(device),
        embedder=embedder,
        cache=cache,
        progress=progress,
        units=units,
        unit_name=unit_name,
        planned=planned,
    )
