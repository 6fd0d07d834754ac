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

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from workers.errors import ConfigError
from workers.methods.dpkps.accounting import PrivacyReport
from workers.methods.dpkps.config import (
    EMBEDDING_DIMENSION,
    GenerationConfig,
    method_description,
)
from workers.methods.dpkps.density.cells import CellMixture, build_cell_structures
from workers.methods.dpkps.density.centroid import (
    CENTROID_SCALE,
    CentroidKDE,
    build_centroid_structures,
    build_moment_structures,
    centroid_scores,
    embed_units,
    moment_scores,
)
from workers.methods.dpkps.density.exact import ExactKernel, build_exact_structures
from workers.methods.dpkps.density.label_prior import apply_label_prior, name_directions
from workers.methods.dpkps.density.random_features import build_class_ensemble
from workers.methods.dpkps.features import RandomFourierFeatures
from workers.methods.dpkps.noise import noise_std
from workers.methods.dpkps.plan import CELLS, CLASS_COUNTS, KDE, VOCABULARY, Plan, plan
from workers.methods.dpkps.private_vocab import (
    PrivateVocabulary,
    public_vocabulary,
    select_private_vocabulary,
    select_thresholded_vocabulary,
)
from workers.methods.dpkps.proportions import noisy_class_counts
from workers.methods.dpkps.sampling import (
    class_contrast,
    class_shares,
    consistent_sequences,
    floored_bag_scores,
    floored_density,
    sample_iterative,
    sample_near_direction,
)
from workers.methods.dpkps.subspace import project_units, public_basis
from workers.methods.progress import TICK_EVERY, ticker
from workers.methods.proportions import shrunk_counts, split_by_counts
from workers.privacy.events import PrivacyEvent
from workers.privacy.sampling import PoissonSample, sampling_rate
from workers.privacy.units import pool
from workers.text.corpus import check_corpus
from workers.text.embeddings import Embedder, EmbeddingCache, select_device
from workers.text.extraction import KeyphraseExtractor
from workers.text.vocabulary import Vocabulary

STAGES = ("extract", "private_vocabulary", "embed", "dp_kde", "sequences")
ProgressFn = Callable[[str, float], None]


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


def padded(private: PrivateVocabulary, config: GenerationConfig, size: int) -> PrivateVocabulary:
    """Ṽ with public phrases appended (the public vocabulary's first ones, in its order)
    when the DP release holds too few for a sequence: fewer than L distinct phrases, or
    none. Post-processing of the release with public data only."""
    need = min(config.sequence_length if config.distinct else 1, size)
    if private.indices.size >= need:
        return private
    chosen = set(private.indices.tolist())
    extra = [i for i in range(size) if i not in chosen][: need - private.indices.size]
    return PrivateVocabulary(
        indices=np.concatenate([private.indices, np.asarray(extra, dtype=np.int64)]),
        noisy_counts=np.concatenate([private.noisy_counts, np.zeros(len(extra))]),
        event=private.event,
    )


def _noop(stage: str, fraction: float) -> None:
    return None


EMBED_CHUNK = 2048  # phrases of Ṽ looked up (or embedded) between two progress reports


def _embedded(
    vocabulary: Vocabulary,
    indices: NDArray[np.int64],
    embedder: Embedder,
    cache: EmbeddingCache | None,
    report_progress: ProgressFn,
) -> NDArray[np.float32]:
    """The embeddings of ``vocabulary.phrases[i]`` for ``i`` in ``indices`` (the public
    model on public phrases), cached when there is a cache, ``EMBED_CHUNK`` phrases at a
    time: the ``embed`` stage's fraction is the share of Ṽ's phrases done (its work is a
    function of Ṽ, a DP output, and of the public cache; never of the corpus)."""
    indices = np.asarray(indices, dtype=np.int64)
    parts: list[NDArray[np.float32]] = []
    for start in range(0, len(indices), EMBED_CHUNK):
        chunk = indices[start : start + EMBED_CHUNK]
        if cache is not None:
            parts.append(
                cache.lookup(
                    phrases=vocabulary.phrases,
                    fingerprint=vocabulary.fingerprint,
                    indices=chunk,
                    embedder=embedder,
                )
            )
        else:
            parts.append(embedder.encode([vocabulary.phrases[i] for i in chunk]))
        report_progress("embed", min(start + EMBED_CHUNK, len(indices)) / len(indices))
    if not parts:
        return np.asarray(embedder.encode([]), dtype=np.float32)
    return np.concatenate(parts).astype(np.float32, copy=False)


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
    """Run steps 1-6 of DP-KPS on a labelled private corpus.

    ``units`` (one id per document, e.g. a patient) makes the privacy unit the pooled
    documents of one id (:func:`workers.privacy.units.pool`); without it a unit is one
    document. ``planned`` is the plan the ledger reserved (computed here if None).
    """
    config.validate()
    report_progress = progress or _noop
    label_set = list(label_set)
    config = config.for_classes(len(label_set))  # the default subspace: by the label set
    check_corpus(documents, labels, label_set)
    config.check_vocabulary(vocabulary.name, len(vocabulary))
    device = select_device(config.device)
    the_plan = planned or plan(config, label_set, len(vocabulary))

    def planned_event(mechanism: str) -> PrivacyEvent:
        return next(e for e in the_plan.events if e.mechanism == mechanism)

    if config.embeds_documents and embedder.dim != EMBEDDING_DIMENSION:
        raise ConfigError(
            f"class centroids are planned in {EMBEDDING_DIMENSION} dimensions; the "
            f"embedding model has {embedder.dim}",
            field="kde_method",
        )
    # 1. keyphrase extraction against the public vocabulary (not needed for a public Ṽ)
    report_progress("extract", 0.0)
    public = config.vocabulary_selection == "public"
    extractor = None if public else KeyphraseExtractor(vocabulary)
    # From here on the run reads private documents: nothing below branches on them (no
    # error, no early exit, no progress that counts documents); every mechanism stays DP
    # on an all-zero histogram. Raw facts go to ``owner_diagnostics`` only.
    pooled = pool(labels, units, label_set=label_set)
    thresholded = config.vocabulary_selection == "threshold"
    # The thresholded histogram counts each unit's first S DISTINCT phrases: read a few
    # more matches so that repeats do not leave it short (the bound S applies later).
    limit = config.max_matches_per_document * (4 if thresholded else 1)
    tick = ticker(report_progress)  # may stop the run (a cancel); shows nothing
    doc_matches: list[list[int]] = []
    for n, d in enumerate(documents):
        if tick is not None and n % TICK_EVERY == 0:
            tick()
        doc_matches.append([] if extractor is None else extractor.extract(d, limit=limit))
    without_match = sum(1 for m in doc_matches if not m)
    # one list of matches per unit: its documents' matches in input order
    matches = [[i for d in u.documents for i in doc_matches[d]] for u in pooled]
    del doc_matches
    report_progress("extract", 1.0)
    report_progress("private_vocabulary", 0.0)

    # 2. private vocabulary: a noisy histogram over every public phrase, top N; or a
    # thresholded Gaussian histogram over the phrases that occur
    if public:
        private = public_vocabulary(
            vocabulary_size=len(vocabulary),
            size=min(config.candidate_count, len(vocabulary)),
        )
    elif thresholded:
        private = select_thresholded_vocabulary(
            matches,
            vocabulary_size=len(vocabulary),
            size=config.vocabulary_size,
            planned=planned_event(VOCABULARY),
            max_per_document=config.max_matches_per_document,
            threshold_delta=the_plan.threshold_delta,
        )
    else:
        private = select_private_vocabulary(
            matches,
            vocabulary_size=len(vocabulary),
            size=config.vocabulary_size,
            planned=planned_event(VOCABULARY),
            max_per_document=config.max_matches_per_document,
        )
    del matches
    private = padded(private, config, len(vocabulary))
    phrases = [vocabulary.phrases[i] for i in private.indices]
    events: list[PrivacyEvent] = [] if private.event is None else [private.event]
    report_progress("private_vocabulary", 1.0)

    # 3. embeddings of Ṽ (public phrases, public model), cached per (vocabulary, model)
    report_progress("embed", 0.0)
    vectors = _embedded(vocabulary, private.indices, embedder, cache, report_progress)
    embeddings = torch.as_tensor(vectors, dtype=torch.float32, device=device)
    report_progress("embed", 1.0)
    report_progress("dp_kde", 0.0)

    # Ṽ's first `core` phrases are every class's; the rest (the public Ṽ's extension, Ṽ⁺)
    # only those classes' whose released count is large (config.extension_size)
    core = min(config.public_size, len(phrases)) if config.extension_size else len(phrases)

    # Each unit's distinct keyphrases over Ṽ, in document order (one contribution per unit).
    private_extractor = KeyphraseExtractor(Vocabulary.from_phrases("private", phrases[:core]))
    keep = max(config.sequence_length, config.max_phrases_per_document)
    doc_phrases = [
        list(
            dict.fromkeys(i for d in u.documents for i in private_extractor.extract(documents[d]))
        )[:keep]
        for u in pooled
    ]
    unit_labels = [u.label for u in pooled]
    if public:  # no match against V was made: count the units without a phrase of Ṽ
        without_match = sum(1 for p in doc_phrases if not p)

    # 5. sequences per class: fixed, or split by noisy class counts (one count per unit)
    released_counts: list[float] | None = None  # shrunk, for the names' gate
    rates: dict[str, float] | None = None  # each class's sampling rate (embed_sample)
    if config.releases_class_counts:
        noisy, count_event = noisy_class_counts(
            unit_labels, label_set=label_set, planned=planned_event(CLASS_COUNTS)
        )
        events.append(count_event)
        if config.samples_units:  # q_c = min(1, m / ñ_c): a DP count and a public m
            rates = {
                label: sampling_rate(config.embed_sample, float(noisy[label]))
                for label in label_set
            }
    if config.uses_class_counts:
        assert config.total is not None
        # pulled towards their mean as far as their noise explains their spread
        wanted = split_by_counts(config.total, noisy, noise_std(count_event))
        shrunk = shrunk_counts(noisy, noise_std(count_event))
        released_counts = [shrunk[label] for label in label_set]
    else:
        assert config.per_class is not None
        wanted = {label: config.per_class for label in label_set}

    # 4 + 6. one DP-KDE per class (parallel composition), then sampling: the exact kernel
    # on Ṽ, or random-feature structures (either mode); only the one the run uses is built
    kernel: ExactKernel | None = None
    rff: RandomFourierFeatures | None = None
    centroids: list[CentroidKDE] = []
    mixtures: list[CellMixture] = []
    basis: NDArray[np.float64] | None = None  # the release's public subspace, if any
    if config.density_method == "exact":
        kernel = ExactKernel(embeddings, config.bandwidth)
    elif config.embeds_documents:
        # one vector per unit: the mean of its documents' embeddings (public model); only
        # the units of a Poisson sample with embed_sample (workers/privacy/sampling.py)
        embedded = list(range(len(pooled)))
        if rates is not None:
            sample = PoissonSample()
            ids = (
                [str(i) for i in range(len(pooled))]
                if units is None
                else [units[u.documents[0]] for u in pooled]
            )
            embedded = [i for i, u in enumerate(pooled) if sample.keeps(ids[i], rates[u.label])]
            del sample, ids
        unit_rows = embed_units(
            embedder,
            documents,
            [pooled[i].documents for i in embedded],
            window=config.document_window,
            tick=ticker(report_progress),
        )
        embedded_labels = [unit_labels[i] for i in embedded]
        del embedded
        if config.release_dimension < EMBEDDING_DIMENSION:
            # released in a public subspace: units rescaled there, phrases scored there
            basis = public_basis(np.asarray(vectors)[:core], config.release_dimension)
            unit_rows = project_units(unit_rows, basis)
            embeddings = embeddings @ torch.as_tensor(basis, dtype=embeddings.dtype)
        build = (
            build_centroid_structures
            if config.density_method == "centroid"
            else build_moment_structures
        )
        class_rows = [
            (label, unit_rows[[i for i, u in enumerate(embedded_labels) if u == label]])
            for label in label_set
        ]
        centroids = build(class_rows, planned=planned_event(KDE))
        if config.cells > 1:  # a second release: each class's units in its cells
            mixtures = build_cell_structures(
                class_rows,
                centroids,
                embeddings.to(torch.float64).cpu().numpy(),
                planned=planned_event(CELLS),
                max_cells=config.cells,
                kappa=config.cell_kappa,
                seed=config.seed,
            )
        del unit_rows, class_rows, embedded_labels
        if config.density_method == "centroid" and (
            config.label_prior > 0 or config.label_prior_lead > 0
        ):
            # the declared label names as a prior (public schema, public model)
            named = np.asarray(embedder.encode(label_set), dtype=np.float64)
            names = name_directions(named if basis is None else named @ basis)
            centroids, mixtures = apply_label_prior(
                centroids,
                mixtures,
                names,
                kappa=config.label_prior,
                counts=released_counts,
                lead=config.label_prior_lead,
            )
    else:
        rff = RandomFourierFeatures(
            dim=embeddings.shape[1],
            num_features=config.num_features,
            max_blocks=config.sequence_length if config.mode == "iterative" else 1,
            bandwidth=config.bandwidth,
            seed=config.seed,
            device=device,
        )
    generator = torch.Generator().manual_seed(config.seed + 1)
    by_class: dict[str, list[list[int]]] = {label: [] for label in label_set}
    for label, phrases_of_doc in zip(unit_labels, doc_phrases, strict=True):
        by_class[label].append(phrases_of_doc)
    sequences: list[SyntheticSequence] = []

    def emit(label: str, drawn: torch.Tensor) -> None:
        sequences.extend(
            SyntheticSequence(label, tuple(phrases[i] for i in row)) for row in drawn.tolist()
        )

    def emit_near(
        label: str, scores: torch.Tensor, direction: torch.Tensor | None, count: int
    ) -> None:
        """``count`` sequences drawn from ``scores`` (over Ṽ's first phrases, or over Ṽ⁺
        too), kept near the released ``direction`` by the configured selection (none
        without a direction)."""
        emit(
            label,
            sample_near_direction(
                scores,
                embeddings[: len(scores)],
                direction,
                count=count,
                factor=config.selection_factor,
                length=config.sequence_length,
                temperature=config.sampling_temperature,
                generator=generator,
                distinct=config.distinct,
            ),
        )

    def emit_cells(label: str, mixture: CellMixture, share: torch.Tensor) -> None:
        """Sequences of one class from its cells: how many from each by the cells' weights,
        then each cell's scores weighted by the class's share of every phrase."""
        weights = torch.as_tensor(mixture.weights, dtype=torch.float64)
        picks = torch.multinomial(weights, wanted[label], replacement=True, generator=generator)
        per_cell = torch.bincount(picks, minlength=len(weights)).tolist()
        for k, count in enumerate(per_cell):
            if not count:
                continue
            cell = CentroidKDE(label, mixture.directions[k], mixture.event)
            scores = centroid_scores(cell, embeddings, scale=CENTROID_SCALE)
            direction = torch.as_tensor(mixture.directions[k])
            emit_near(label, scores * share.to(scores.dtype), direction, count)

    bag_scores: list[torch.Tensor] = []
    exact_structures = (
        build_exact_structures(
            [(label, by_class[label]) for label in label_set],
            kernel,
            planned=planned_event(KDE),
            max_phrases=config.max_phrases_per_document,
            weighting=config.density_weighting,
        )
        if kernel is not None
        else []
    )
    for n, label in enumerate(label_set):
        if centroids:
            events.append(centroids[n].event)
            score = centroid_scores if config.density_method == "centroid" else moment_scores
            released = centroids[n]
            if mixtures:  # the class sum, both releases combined
                events.append(mixtures[n].event)
                released = CentroidKDE(label, mixtures[n].total, released.event)
            bag_scores.append(score(released, embeddings, scale=CENTROID_SCALE))
            report_progress("dp_kde", (n + 1) / len(label_set))
            continue
        if kernel is not None:
            exact = exact_structures[n]
            events.append(exact.event)
            bag_scores.append(floored_density(exact, noise_floor=config.noise_floor))
            report_progress("dp_kde", (n + 1) / len(label_set))
            continue
        assert rff is not None
        structures = build_class_ensemble(
            by_class[label],
            embeddings,
            rff,
            label=label,
            mode=config.mode,
            ensemble=config.ensemble,
            length=config.sequence_length,
            planned=planned_event(KDE),
            num_features=config.num_features,
            max_phrases=config.max_phrases_per_document,
            bound=config.contribution_bound,
        )
        events.extend(k.event for k in structures)
        report_progress("dp_kde", (n + 1) / len(label_set))
        if config.mode == "independent":
            bag_scores.append(
                floored_bag_scores(structures[0], embeddings, rff, noise_floor=config.noise_floor)
            )
            continue
        if wanted[label]:
            emit(
                label,
                sample_iterative(
                    structures,
                    embeddings,
                    rff,
                    count=wanted[label],
                    length=config.sequence_length,
                    temperature=config.sampling_temperature,
                    generator=generator,
                    distinct=config.distinct,
                    noise_floor=config.noise_floor,
                ),
            )
    # iterative mode sampled each class's sequences above, between private reads (shown
    # as part of dp_kde); independent mode samples them all here, from the releases only
    report_progress("sequences", 0.0)
    if bag_scores:
        # Independent mode: every class's released scores are known, so each class can
        # favour the phrases it owns over those all classes share (post-processing).
        stacked = torch.stack(bag_scores)
        weighted = class_contrast(stacked, config.class_contrast, over=core)
        # Ṽ⁺ for a class whose released (shrunk) count is at least extension_ratio·σ
        extended = [
            core < len(phrases)
            and released_counts is not None
            and max(released_counts[n], 0.0) >= config.extension_ratio * noise_std(c.event)
            for n, c in enumerate(centroids)
        ]
        shares = class_shares(stacked, config.class_contrast) if mixtures else None
        for n, label in enumerate(label_set):
            if mixtures and wanted[label]:
                assert shares is not None
                emit_cells(label, mixtures[n], shares[n])
            elif wanted[label]:
                # a class centroid's direction (moments: their first part, the sum)
                direction = (
                    torch.as_tensor(centroids[n].noisy_sum[: embeddings.shape[1]])
                    if centroids
                    else None
                )
                drawn_from = weighted[n] if extended and extended[n] else weighted[n][:core]
                emit_near(label, drawn_from, direction, wanted[label])
            report_progress("sequences", (n + 1) / len(label_set))

    drawn = len(sequences)
    if config.filters_sequences and centroids and sequences:
        # each sequence kept only where its own class's released direction is the nearest
        # (its public embedding against the released sums: post-processing)
        vectors_of = np.asarray(
            embedder.encode([" ".join(s.keyphrases) for s in sequences]), dtype=np.float64
        )
        if basis is not None:
            vectors_of = vectors_of @ basis
        # with cells, every class's cells: a sequence drawn near a cell is judged by it
        directions = np.concatenate(
            [m.directions for m in mixtures]
            if mixtures
            else [c.noisy_sum[None, :] for c in centroids]
        )
        owners = [n for n, m in enumerate(mixtures) for _ in m.directions] if mixtures else None
        index = {label: n for n, label in enumerate(label_set)}
        consistent = consistent_sequences(
            vectors_of, [index[s.label] for s in sequences], directions, owners
        )
        sequences = [s for s, kept in zip(sequences, consistent.tolist(), strict=True) if kept]
        del vectors_of
    report_progress("sequences", 1.0)

    diagnostics = OwnerDiagnostics(
        documents=len(documents),
        documents_without_match=without_match,
        documents_per_class={label: len(by_class[label]) for label in label_set},
        documents_without_private_phrase=sum(1 for p in doc_phrases if not p),
        units=len(pooled),
        documents_set_aside=len(documents) - sum(len(u.documents) for u in pooled),
    )
    del by_class, doc_phrases, pooled, unit_labels
    return GenerationResult(
        sequences=sequences,
        report=PrivacyReport(tuple(events), the_plan),
        private_vocabulary=phrases,
        config=config,
        vocabulary={
            "name": vocabulary.name,
            "size": len(vocabulary),
            "fingerprint": vocabulary.fingerprint,
        },
        embedding_model=embedder.name,
        owner_diagnostics=diagnostics,
        unit="row" if units is None else f"unit column {unit_name or 'unit'!r}",
        drawn=drawn,
    )


def shuffled(sequences: Sequence[SyntheticSequence], seed: int) -> list[SyntheticSequence]:
    """The sequences in a seeded random order, so classes are interleaved in output."""
    order = np.random.default_rng(seed).permutation(len(sequences))
    return [sequences[i] for i in order]
