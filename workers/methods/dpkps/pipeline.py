"""The DP-KPS engine end to end, up to the keyphrase sequences (method.md, steps 1-6).

:func:`generate_sequences` takes a labelled private corpus and returns keyphrase
sequences per class together with the exact privacy spend of the run. Prompting an LLM
with the sequences (step 7) is post-processing and lives in
:mod:`workers.methods.dpkps.prompting`; callers persist the sequences first, so prompting can be
retried without touching private data or spending budget again.

What leaves :func:`generate_sequences` in :class:`GenerationResult`:

* ``sequences``, ``private_vocabulary`` and ``report``: DP releases and their cost,
  safe to store, log in aggregate and ship with a released corpus;
* ``owner_diagnostics``: raw facts about the private corpus (how many documents, how
  many matched nothing, class sizes) for the data owner running the offline command
  line. They are NOT differentially private and must never reach a log, a response, a
  manifest or a prompt; the service discards them.

Defaults were chosen by measurement on AG News; see ``benchmarks/notes/`` and BENCHMARKS.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workers.errors import ConfigError
from workers.methods.dpkps import stages
from workers.methods.dpkps.accounting import PrivacyReport
from workers.methods.dpkps.config import (
    EMBEDDING_DIMENSION,
    GenerationConfig,
    method_description,
)
from workers.methods.dpkps.plan import Plan, plan
from workers.methods.dpkps.stages import ProgressFn
from workers.privacy.events import PrivacyEvent
from workers.privacy.units import Unit
from workers.text.corpus import check_corpus
from workers.text.embeddings import Embedder, EmbeddingCache, select_device
from workers.text.vocabulary import Vocabulary

STAGES = ("extract", "private_vocabulary", "embed", "dp_kde", "sequences")  # as reported


@dataclass(frozen=True)
class SyntheticSequence:
    label: str
    keyphrases: tuple[str, ...]


@dataclass(frozen=True)
class OwnerDiagnostics:
    """Raw, NOT private facts about the corpus, for the data owner's eyes only."""

    documents: int
    documents_without_match: int
    documents_per_class: dict[str, int]
    documents_without_private_phrase: int
    units: int
    documents_set_aside: int  # a unit's documents outside its one class (unit column only)


@dataclass
class GenerationResult:
    sequences: list[SyntheticSequence]
    report: PrivacyReport
    private_vocabulary: list[str]
    config: GenerationConfig
    vocabulary: dict[str, Any]
    embedding_model: str
    owner_diagnostics: OwnerDiagnostics = field(repr=False)
    drawn: int  # sequences drawn, before the consistency filter kept ``sequences``
    unit: str = "row"

    def manifest(self) -> dict[str, Any]:
        """Everything public about the run: method, parameters, models, spend."""
        return {
            "method": method_description(self.config),
            "parameters": self.config.to_dict(),
            "vocabulary": self.vocabulary,
            "embedding_model": self.embedding_model,
            "privacy": {**self.report.to_dict(), "unit": self.unit},
            "sequences": len(self.sequences),
            # drawn from the releases before the consistency filter: both counts are
            # post-processing of the releases (public), so an owner sees what it dropped
            "sequences_drawn": self.drawn,
        }


def _noop(stage: str, fraction: float) -> None:
    return None


def _diagnostics(
    documents: Sequence[str],
    pooled: Sequence[Unit],
    grouped: dict[str, list[list[int]]],
    unit_phrases: Sequence[list[int]],
    *,
    label_set: Sequence[str],
    without_match: int | None,
) -> OwnerDiagnostics:
    """The owner's raw facts (NOT private). ``without_match``: the documents that matched
    no phrase of V; None when no match against V was made (a public Ṽ), and then the units
    without a phrase of Ṽ are counted instead."""
    without_phrase = sum(1 for p in unit_phrases if not p)
    return OwnerDiagnostics(
        documents=len(documents),
        documents_without_match=without_phrase if without_match is None else without_match,
        documents_per_class={label: len(grouped[label]) for label in label_set},
        documents_without_private_phrase=without_phrase,
        units=len(pooled),
        documents_set_aside=len(documents) - sum(len(u.documents) for u in pooled),
    )


def generate_sequences(
    documents: Sequence[str],
    labels: Sequence[str],
    *,
    label_set: Sequence[str],
    vocabulary: Vocabulary,
    config: GenerationConfig,
    embedder: Embedder,
    cache: EmbeddingCache | None = None,
    progress: ProgressFn | None = None,
    units: Sequence[str] | None = None,
    unit_name: str | None = None,
    planned: Plan | None = None,
) -> GenerationResult:
    """Run steps 1-6 of DP-KPS on a labelled private corpus: the stages of
    :mod:`workers.methods.dpkps.stages`, in order.

    ``units`` (one id per document, e.g. a patient) makes the privacy unit the pooled
    documents of one id (:func:`workers.privacy.units.pool`); without it a unit is one
    document. ``planned`` is the plan the ledger reserved (computed here if None).
    """
    config.validate()
    report = progress or _noop
    label_set = list(label_set)
    config = config.for_classes(len(label_set))  # the default subspace: by the label set
    check_corpus(documents, labels, label_set)
    config.check_vocabulary(vocabulary.name, len(vocabulary))
    device = select_device(config.device)
    the_plan = planned or plan(config, label_set, len(vocabulary))
    if config.embeds_documents and embedder.dim != EMBEDDING_DIMENSION:
        raise ConfigError(
            f"class centroids are planned in {EMBEDDING_DIMENSION} dimensions; the "
            f"embedding model has {embedder.dim}",
            field="kde_method",
        )
    # private reads: extraction, Ṽ, each unit's phrases of Ṽ, class counts, densities
    found = stages.extract(
        documents, labels, units, label_set=label_set, vocabulary=vocabulary, config=config,
        progress=report,
    )  # fmt: skip
    pooled, without_match = found.units, found.without_match
    private = stages.private_vocabulary(
        found.matches, vocabulary_size=len(vocabulary), config=config, the_plan=the_plan,
        progress=report,
    )  # fmt: skip
    del found  # the raw matches
    phrases = [vocabulary.phrases[i] for i in private.indices]
    embeddings = stages.embed(
        vocabulary, private.indices, embedder=embedder, cache=cache, device=device,
        progress=report,
    )  # fmt: skip
    report("dp_kde", 0.0)
    keep = max(config.sequence_length, config.max_phrases_per_document)
    unit_phrases = stages.unit_phrases(documents, pooled, phrases, keep=keep)
    unit_labels = [u.label for u in pooled]
    counts = stages.class_counts(unit_labels, label_set=label_set, config=config, the_plan=the_plan)
    grouped = stages.by_class(unit_labels, unit_phrases, label_set)
    releases = stages.release_densities(
        documents, pooled, units, grouped, embeddings, counts=counts, embedder=embedder,
        label_set=label_set, config=config, the_plan=the_plan, progress=report,
    )  # fmt: skip
    diagnostics = _diagnostics(
        documents, pooled, grouped, unit_phrases, label_set=label_set,
        without_match=None if config.vocabulary_selection == "public" else without_match,
    )  # fmt: skip
    del grouped, unit_phrases, pooled, unit_labels
    return finish_sequences(
        releases, counts, private.event, phrases, diagnostics, embedder=embedder,
        vocabulary=vocabulary, label_set=label_set, config=config, the_plan=the_plan,
        progress=report, unit="row" if units is None else f"unit column {unit_name or 'unit'!r}",
    )  # fmt: skip


def finish_sequences(
    releases: stages.Releases,
    counts: stages.ClassCounts,
    vocabulary_event: PrivacyEvent | None,
    phrases: Sequence[str],
    diagnostics: OwnerDiagnostics,
    *,
    embedder: Embedder,
    vocabulary: Vocabulary,
    label_set: Sequence[str],
    config: GenerationConfig,
    the_plan: Plan,
    progress: ProgressFn,
    unit: str,
) -> GenerationResult:
    """USES ONLY DP OUTPUTS AND PUBLIC INPUTS (and passes the owner's ``diagnostics`` on):
    the post-processing of a run's releases, from the label prior to the filtered
    sequences, and its result; the same for a run in one process and a sharded one
    (workers/methods/dpkps/shards.py). The events come in the ledger's order: Ṽ's release
    if any, the class counts if released, then the densities'."""
    releases = stages.label_prior(
        releases, embedder=embedder, label_set=label_set, config=config, counts=counts.released
    )
    scores = stages.class_scores(releases, config=config)
    drawn = stages.sample(
        releases, scores, label_set=label_set, counts=counts, config=config, progress=progress,
    )  # fmt: skip
    kept = stages.filter_sequences(
        drawn, phrases=phrases, releases=releases, embedder=embedder, label_set=label_set,
        config=config, progress=progress,
    )  # fmt: skip
    events = [e for e in (vocabulary_event, counts.event) if e is not None]
    return GenerationResult(
        sequences=[SyntheticSequence(label, tuple(phrases[i] for i in row)) for label, row in kept],
        report=PrivacyReport((*events, *releases.events), the_plan),
        private_vocabulary=list(phrases),
        config=config,
        vocabulary={
            "name": vocabulary.name,
            "size": len(vocabulary),
            "fingerprint": vocabulary.fingerprint,
        },
        embedding_model=embedder.name,
        owner_diagnostics=diagnostics,
        unit=unit,
        drawn=len(drawn),
    )


def shuffled(sequences: Sequence[SyntheticSequence], seed: int) -> list[SyntheticSequence]:
    """The sequences in a seeded random order, so classes are interleaved in output."""
    order = np.random.default_rng(seed).permutation(len(sequences))
    return [sequences[i] for i in order]
