"""The DP-KPS run as named stages, each a function of its inputs (method.md, steps 1-6).

:func:`workers.methods.dpkps.pipeline.generate_sequences` calls them in this order; the
second column is the stage their progress reports carry (the service shows them):

=============================  ==================  ==========================================
stage                          reported as         reads
=============================  ==================  ==========================================
:func:`extract`                extract             PRIVATE ROWS (documents, labels, units)
:func:`private_vocabulary`     private_vocabulary  PRIVATE ROWS (the units' matches)
:func:`embed`                  embed               DP outputs (Ṽ) and public inputs only
:func:`unit_phrases`           dp_kde              PRIVATE ROWS (documents)
:func:`class_counts`           dp_kde              PRIVATE ROWS (the units' classes)
:func:`release_densities`      dp_kde              PRIVATE ROWS; returns DP releases only
:func:`label_prior`            dp_kde              DP outputs and public inputs only
:func:`class_scores`           sequences           DP outputs and public inputs only
:func:`sample`                 sequences           DP outputs and public inputs only
:func:`filter_sequences`       sequences           DP outputs and public inputs only
=============================  ==================  ==========================================

:func:`release_densities` builds the run's one estimator (:mod:`workers.methods.dpkps.density`):
:func:`release_exact`, :func:`release_random_features`, or :func:`release_centroids` on the
units' vectors from :func:`embedded_units` (PRIVATE ROWS) in the subspace of
:func:`release_space` (DP outputs and public inputs only).

A run of class centroids or moments over a public Ṽ may also be split across workers by
privacy unit (:mod:`workers.methods.dpkps.shards`): each shard returns exact additive sums
and one reduce releases them through the same functions as here (:func:`counts_from_release`,
:func:`release_sums`, :func:`place_class_cells`, :func:`release_cell_sums`,
:func:`centroid_releases`), then :func:`workers.methods.dpkps.pipeline.finish_sequences`
post-processes both alike.

The private reads end with the density release: a :class:`Releases` holds DP outputs and
public inputs only, so everything after it (prior, scores, sampling, filter, and prompting
in :mod:`workers.methods.dpkps.prompting`) is post-processing and may run anywhere. Classes
hold disjoint units, so the density releases of different classes compose in parallel.

From the first private read on, nothing branches on the data in a way that shows (no error,
no early exit, no progress that counts documents); raw facts leave only as the owner's
diagnostics (:class:`~workers.methods.dpkps.pipeline.OwnerDiagnostics`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch
from numpy.typing import NDArray

from workers.methods.dpkps.config import EMBEDDING_DIMENSION, GenerationConfig
from workers.methods.dpkps.density.cells import (
    CellMixture,
    cell_sums,
    place_cells,
    release_cells,
)
from workers.methods.dpkps.density.centroid import (
    CENTROID_SCALE,
    CentroidKDE,
    centroid_scores,
    class_moments,
    class_sum,
    embed_units,
    moment_scores,
    release_class_sums,
)
from workers.methods.dpkps.density.exact import ExactKDE, ExactKernel, build_exact_structures
from workers.methods.dpkps.density.label_prior import apply_label_prior, name_directions
from workers.methods.dpkps.density.random_features import DPKDE, build_class_ensemble
from workers.methods.dpkps.features import RandomFourierFeatures
from workers.methods.dpkps.noise import noise_std
from workers.methods.dpkps.plan import CELLS, CLASS_COUNTS, KDE, VOCABULARY, Plan
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
from workers.privacy.units import Unit, pool
from workers.text.embeddings import Embedder, EmbeddingCache
from workers.text.extraction import KeyphraseExtractor
from workers.text.vocabulary import Vocabulary

ProgressFn = Callable[[str, float], None]
Drawn = tuple[str, tuple[int, ...]]  # one sequence: its class, its phrases' indices in Ṽ
EMBED_CHUNK = 2048  # phrases of Ṽ looked up (or embedded) between two progress reports


def planned_event(the_plan: Plan, mechanism: str) -> PrivacyEvent:
    """The release of ``mechanism`` that ``the_plan`` reserved."""
    return next(e for e in the_plan.events if e.mechanism == mechanism)


# --- Extraction and the private vocabulary ---------------------------------------------


@dataclass(frozen=True)
class Extracted:
    """The privacy units and, per unit, its matches against the public vocabulary V.
    RAW: never persisted, logged or shown; ``without_match`` is an owner diagnostic."""

    units: list[Unit]
    matches: list[list[int]]
    without_match: int  # documents that matched no phrase of V


def extract(
    documents: Sequence[str],
    labels: Sequence[str],
    unit_ids: Sequence[str] | None,
    *,
    label_set: Sequence[str],
    vocabulary: Vocabulary,
    config: GenerationConfig,
    progress: ProgressFn,
) -> Extracted:
    """Step 1. READS PRIVATE ROWS: pools the documents into units (one per document, or
    per id of ``unit_ids``) and lists each unit's matches against the public vocabulary,
    in document order (no matching at all for a public Ṽ)."""
    progress("extract", 0.0)
    extractor = None if config.vocabulary_selection == "public" else KeyphraseExtractor(vocabulary)
    units = pool(labels, unit_ids, label_set=label_set)
    # The thresholded histogram counts each unit's first S DISTINCT phrases: read a few
    # more matches so that repeats do not leave it short (the bound S applies later).
    thresholded = config.vocabulary_selection == "threshold"
    limit = config.max_matches_per_document * (4 if thresholded else 1)
    tick = ticker(progress)  # may stop the run (a cancel); shows nothing
    doc_matches: list[list[int]] = []
    for n, d in enumerate(documents):
        if tick is not None and n % TICK_EVERY == 0:
            tick()
        doc_matches.append([] if extractor is None else extractor.extract(d, limit=limit))
    without_match = sum(1 for m in doc_matches if not m)
    matches = [[i for d in u.documents for i in doc_matches[d]] for u in units]
    progress("extract", 1.0)
    return Extracted(units=units, matches=matches, without_match=without_match)


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


def private_vocabulary(
    matches: Sequence[Sequence[int]],
    *,
    vocabulary_size: int,
    config: GenerationConfig,
    the_plan: Plan,
    progress: ProgressFn,
) -> PrivateVocabulary:
    """Step 2, Ṽ. READS PRIVATE ROWS (the units' matches) and returns a DP release: a
    noisy histogram over every public phrase, top N; or a thresholded Gaussian histogram
    over the phrases that occur; or (no release) the public vocabulary's first phrases.
    Padded with public phrases where it holds too few for a sequence (:func:`padded`)."""
    progress("private_vocabulary", 0.0)
    selection = config.vocabulary_selection
    if selection == "public":
        private = public_vocabulary(
            vocabulary_size=vocabulary_size, size=min(config.candidate_count, vocabulary_size)
        )
    elif selection == "threshold":
        private = select_thresholded_vocabulary(
            matches,
            vocabulary_size=vocabulary_size,
            size=config.vocabulary_size,
            planned=planned_event(the_plan, VOCABULARY),
            max_per_document=config.max_matches_per_document,
            threshold_delta=the_plan.threshold_delta,
        )
    else:
        private = select_private_vocabulary(
            matches,
            vocabulary_size=vocabulary_size,
            size=config.vocabulary_size,
            planned=planned_event(the_plan, VOCABULARY),
            max_per_document=config.max_matches_per_document,
        )
    private = padded(private, config, vocabulary_size)
    progress("private_vocabulary", 1.0)
    return private


# --- Embeddings of Ṽ (public) ----------------------------------------------------------


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


def embed(
    vocabulary: Vocabulary,
    indices: NDArray[np.int64],
    *,
    embedder: Embedder,
    cache: EmbeddingCache | None,
    device: str,
    progress: ProgressFn,
) -> torch.Tensor:
    """Step 3. USES ONLY DP OUTPUTS AND PUBLIC INPUTS: the public model's embeddings of
    Ṽ's phrases (``indices`` into the public vocabulary), cached per (vocabulary, model)."""
    progress("embed", 0.0)
    vectors = _embedded(vocabulary, indices, embedder, cache, progress)
    embeddings = torch.as_tensor(vectors, dtype=torch.float32, device=device)
    progress("embed", 1.0)
    return embeddings


def unit_phrases(
    documents: Sequence[str],
    units: Sequence[Unit],
    phrases: Sequence[str],
    *,
    keep: int,
) -> list[list[int]]:
    """READS PRIVATE ROWS: each unit's distinct phrases of ``phrases`` (Ṽ's first ones),
    as indices into them, in document order, at most ``keep`` (one contribution per unit)."""
    extractor = KeyphraseExtractor(Vocabulary.from_phrases("private", list(phrases)))
    return [
        list(dict.fromkeys(i for d in u.documents for i in extractor.extract(documents[d])))[:keep]
        for u in units
    ]


def by_class(
    unit_labels: Sequence[str], phrases_of_units: Sequence[list[int]], label_set: Sequence[str]
) -> dict[str, list[list[int]]]:
    """The units' phrase lists grouped by class (RAW: the private phrases of each unit)."""
    grouped: dict[str, list[list[int]]] = {label: [] for label in label_set}
    for label, phrases in zip(unit_labels, phrases_of_units, strict=True):
        grouped[label].append(phrases)
    return grouped


# --- Class counts ------------------------------------------------------------------------


@dataclass(frozen=True)
class ClassCounts:
    """How many sequences each class gets, and what the count release (if any) said."""

    wanted: dict[str, int]  # sequences per class: public, or a split of DP counts
    released: list[float] | None  # DP counts shrunk to their mean, in label order
    rates: dict[str, float] | None  # each class's Poisson sampling rate (embed_sample)
    event: PrivacyEvent | None  # the count release, if one was made


def class_counts(
    unit_labels: Sequence[str],
    *,
    label_set: Sequence[str],
    config: GenerationConfig,
    the_plan: Plan,
) -> ClassCounts:
    """READS PRIVATE ROWS (each unit's class) where the run releases noisy class counts
    (one count per unit); what it returns is DP: the counts split a ``total`` among the
    classes (pulled towards their mean as far as their noise explains their spread) and
    set the sampling rates ``q_c = min(1, m / ñ_c)`` of ``embed_sample``. Without a
    release, every class gets ``per_class`` sequences."""
    if not config.releases_class_counts:
        assert config.per_class is not None
        return ClassCounts({label: config.per_class for label in label_set}, None, None, None)
    noisy, event = noisy_class_counts(
        unit_labels, label_set=label_set, planned=planned_event(the_plan, CLASS_COUNTS)
    )
    return counts_from_release(noisy, event, label_set=label_set, config=config)


def counts_from_release(
    noisy: dict[str, float],
    event: PrivacyEvent,
    *,
    label_set: Sequence[str],
    config: GenerationConfig,
) -> ClassCounts:
    """USES ONLY DP OUTPUTS AND PUBLIC INPUTS: what a run takes from its class count
    release ``noisy`` (:func:`class_counts`; the sharded path releases the shards' summed
    tally, workers/methods/dpkps/shards.py): the sampling rates, the split of a total."""
    rates = None
    if config.samples_units:
        rates = {
            label: sampling_rate(config.sample_size, float(noisy[label])) for label in label_set
        }
    if not config.uses_class_counts:
        assert config.per_class is not None
        return ClassCounts({label: config.per_class for label in label_set}, None, rates, event)
    assert config.total is not None
    wanted = split_by_counts(config.total, noisy, noise_std(event))
    shrunk = shrunk_counts(noisy, noise_std(event))
    return ClassCounts(wanted, [shrunk[label] for label in label_set], rates, event)


# --- Density release (steps 4-5): private reads in, DP releases out ------------------------


@dataclass(frozen=True, eq=False)
class Releases:
    """Every class's released density (in label order) and the public space it scores
    in. DP outputs and public inputs only: a stage given a ``Releases`` reads no private
    row. One of ``exact``, ``centroids`` or ``ensembles`` is filled."""

    embeddings: torch.Tensor  # Ṽ's public embeddings, projected on ``basis`` if any
    events: tuple[PrivacyEvent, ...]  # the releases' costs, in ledger order
    exact: tuple[ExactKDE, ...] = ()
    centroids: tuple[CentroidKDE, ...] = ()  # class sums (or moments)
    mixtures: tuple[CellMixture, ...] = ()  # each class's cells (a second release)
    ensembles: tuple[tuple[DPKDE, ...], ...] = ()  # random features: each class's
    rff: RandomFourierFeatures | None = None  # the public random features, if used
    basis: NDArray[np.float64] | None = None  # the public subspace of the release, if any


def _reported(progress: ProgressFn, classes: int) -> None:
    for n in range(classes):
        progress("dp_kde", (n + 1) / classes)


def release_exact(
    grouped: dict[str, list[list[int]]],
    embeddings: torch.Tensor,
    *,
    label_set: Sequence[str],
    config: GenerationConfig,
    the_plan: Plan,
    progress: ProgressFn,
) -> Releases:
    """READS PRIVATE ROWS (each class's units' phrases of Ṽ); returns DP releases only:
    the exact Gaussian kernel density of every class at every phrase of Ṽ, plus noise."""
    kernel = ExactKernel(embeddings, config.bandwidth)  # public: Ṽ and the public model
    exact = build_exact_structures(
        [(label, grouped[label]) for label in label_set],
        kernel,
        planned=planned_event(the_plan, KDE),
        max_phrases=config.max_phrases_per_document,
        weighting=config.density_weighting,
    )
    _reported(progress, len(label_set))
    return Releases(embeddings, tuple(k.event for k in exact), exact=tuple(exact))


def release_space(
    embeddings: torch.Tensor, *, config: GenerationConfig
) -> NDArray[np.float64] | None:
    """USES ONLY DP OUTPUTS AND PUBLIC INPUTS: the public subspace class sums are
    released in (of Ṽ's phrases' embeddings), or None (the whole space)."""
    if not config.embeds_documents or config.release_dimension >= EMBEDDING_DIMENSION:
        return None
    return public_basis(embeddings.cpu().numpy(), config.release_dimension)


def embedded_units(
    documents: Sequence[str],
    units: Sequence[Unit],
    unit_ids: Sequence[str] | None,
    *,
    rates: dict[str, float] | None,
    basis: NDArray[np.float64] | None,
    embedder: Embedder,
    config: GenerationConfig,
    progress: ProgressFn,
) -> tuple[NDArray[np.float64], list[str]]:
    """READS PRIVATE ROWS: one vector per unit, the mean of its documents' embeddings
    (public model), rescaled in the public subspace ``basis`` if any, and its class; only
    the units of a Poisson sample at the classes' ``rates`` (embed_sample;
    workers/privacy/sampling.py) where there are rates. RAW."""
    chosen = list(range(len(units)))
    if rates is not None:
        sample = PoissonSample()
        ids = (
            [str(i) for i in range(len(units))]
            if unit_ids is None
            else [unit_ids[u.documents[0]] for u in units]
        )
        chosen = [i for i, u in enumerate(units) if sample.keeps(ids[i], rates[u.label])]
        del sample, ids
    rows = embed_units(
        embedder,
        documents,
        [units[i].documents for i in chosen],
        tick=ticker(progress),
    )
    if basis is not None:
        rows = project_units(rows, basis)
    return rows, [units[i].label for i in chosen]


def release_centroids(
    rows: NDArray[np.float64],
    row_labels: Sequence[str],
    embeddings: torch.Tensor,
    *,
    basis: NDArray[np.float64] | None,
    label_set: Sequence[str],
    config: GenerationConfig,
    the_plan: Plan,
    progress: ProgressFn,
) -> Releases:
    """READS PRIVATE ROWS (the units' vectors ``rows``, in the public subspace ``basis``
    if any, and classes); returns DP releases only: each class's sum (or first two
    moments) plus Gaussian noise, and with ``cells`` > 1 a second release of its cells.
    The releases themselves are :func:`release_sums` and :func:`release_cell_sums`, which
    the sharded path (workers/methods/dpkps/shards.py) calls on the shards' exact sums."""
    embeddings = scored_embeddings(embeddings, basis)
    linear = config.density_method == "centroid"  # else moments
    class_rows = [
        (label, rows[[i for i, u in enumerate(row_labels) if u == label]]) for label in label_set
    ]
    dimension = rows.shape[1] if rows.ndim == 2 else config.release_dimension
    raws = [
        class_sum(given, dimension) if linear else class_moments(given) for _, given in class_rows
    ]
    centroids = release_sums(raws, label_set=label_set, config=config, the_plan=the_plan)
    del raws
    mixtures: list[CellMixture] = []
    if config.cells > 1:  # a second release: each class's units in its cells
        centres = place_class_cells(centroids, embeddings, config=config, the_plan=the_plan)
        cells = [
            cell_sums(given, placed, config.cells)
            for (_, given), placed in zip(class_rows, centres, strict=True)
        ]
        mixtures = release_cell_sums(cells, centroids, centres, config=config, the_plan=the_plan)
        del cells
    del rows, class_rows
    return centroid_releases(embeddings, centroids, mixtures, basis=basis, progress=progress)


def scored_embeddings(embeddings: torch.Tensor, basis: NDArray[np.float64] | None) -> torch.Tensor:
    """USES ONLY PUBLIC INPUTS: Ṽ's embeddings in the release's subspace (unchanged
    without one), where phrases are scored."""
    if basis is None:
        return embeddings
    return embeddings @ torch.as_tensor(basis, dtype=embeddings.dtype)


def release_sums(
    raws: Sequence[NDArray[np.float64]],
    *,
    label_set: Sequence[str],
    config: GenerationConfig,
    the_plan: Plan,
) -> list[CentroidKDE]:
    """READS each class's RAW sum of its units' vectors (or moments), in label order;
    returns their DP releases (the planned ``kde`` Gaussian)."""
    return release_class_sums(
        list(zip(label_set, raws, strict=True)),
        planned=planned_event(the_plan, KDE),
        moments=config.density_method != "centroid",
    )


def place_class_cells(
    centroids: Sequence[CentroidKDE],
    embeddings: torch.Tensor,
    *,
    config: GenerationConfig,
    the_plan: Plan,
) -> list[NDArray[np.float64]]:
    """USES ONLY DP OUTPUTS AND PUBLIC INPUTS: each class's cell centres, placed by its
    released sum among Ṽ's phrases (``embeddings``, in the release's space)."""
    return place_cells(
        centroids,
        embeddings.to(torch.float64).cpu().numpy(),
        planned=planned_event(the_plan, CELLS),
        max_cells=config.cells,
        kappa=config.cell_kappa,
        seed=config.seed,
    )


def release_cell_sums(
    raws: Sequence[NDArray[np.float64]],
    centroids: Sequence[CentroidKDE],
    centres: Sequence[NDArray[np.float64]],
    *,
    config: GenerationConfig,
    the_plan: Plan,
) -> list[CellMixture]:
    """READS each class's RAW cell sums (``cells`` × d, in label order); returns their DP
    release (the planned ``kde_cells`` Gaussian), each combined with its class sum."""
    return release_cells(raws, centroids, centres, planned=planned_event(the_plan, CELLS))


def centroid_releases(
    embeddings: torch.Tensor,
    centroids: Sequence[CentroidKDE],
    mixtures: Sequence[CellMixture],
    *,
    basis: NDArray[np.float64] | None,
    progress: ProgressFn,
) -> Releases:
    """USES ONLY DP OUTPUTS AND PUBLIC INPUTS: the class sums (and cells) as the run's
    :class:`Releases`, events in the ledger's order (a class's sum, then its cells)."""
    events: list[PrivacyEvent] = []
    for n, centroid in enumerate(centroids):
        events.append(centroid.event)
        if mixtures:
            events.append(mixtures[n].event)
    _reported(progress, len(centroids))
    return Releases(
        embeddings,
        tuple(events),
        centroids=tuple(centroids),
        mixtures=tuple(mixtures),
        basis=basis,
    )


def release_random_features(
    grouped: dict[str, list[list[int]]],
    embeddings: torch.Tensor,
    *,
    label_set: Sequence[str],
    config: GenerationConfig,
    the_plan: Plan,
    progress: ProgressFn,
) -> Releases:
    """READS PRIVATE ROWS (each class's units' phrases of Ṽ); returns DP releases only:
    each class's noisy random-feature sums, one bag (independent mode) or one structure
    per block count of the ensemble (iterative mode). The features are public (seeded)."""
    rff = RandomFourierFeatures(
        dim=embeddings.shape[1],
        num_features=config.num_features,
        max_blocks=config.sequence_length if config.mode == "iterative" else 1,
        bandwidth=config.bandwidth,
        seed=config.seed,
        device=str(embeddings.device),  # drawn on the CPU from the seed, then moved
    )
    ensembles = []
    for n, label in enumerate(label_set):
        structures = build_class_ensemble(
            grouped[label],
            embeddings,
            rff,
            label=label,
            mode=config.mode,
            ensemble=config.ensemble,
            length=config.sequence_length,
            planned=planned_event(the_plan, KDE),
            num_features=config.num_features,
            max_phrases=config.max_phrases_per_document,
            bound=config.contribution_bound,
        )
        ensembles.append(tuple(structures))
        progress("dp_kde", (n + 1) / len(label_set))
    events = tuple(k.event for structures in ensembles for k in structures)
    return Releases(embeddings, events, ensembles=tuple(ensembles), rff=rff)


def release_densities(
    documents: Sequence[str],
    units: Sequence[Unit],
    unit_ids: Sequence[str] | None,
    grouped: dict[str, list[list[int]]],
    embeddings: torch.Tensor,
    *,
    counts: ClassCounts,
    embedder: Embedder,
    label_set: Sequence[str],
    config: GenerationConfig,
    the_plan: Plan,
    progress: ProgressFn,
) -> Releases:
    """Steps 4-5. READS PRIVATE ROWS (the units' phrases of Ṽ, ``grouped`` by class, or
    their documents' embeddings); returns DP releases only: one density per class (parallel
    composition) by the run's estimator, the only one built."""
    if config.density_method == "exact":
        return release_exact(
            grouped, embeddings, label_set=label_set, config=config, the_plan=the_plan,
            progress=progress,
        )  # fmt: skip
    if not config.embeds_documents:
        return release_random_features(
            grouped, embeddings, label_set=label_set, config=config, the_plan=the_plan,
            progress=progress,
        )  # fmt: skip
    basis = release_space(embeddings, config=config)
    rows, row_labels = embedded_units(
        documents, units, unit_ids, rates=counts.rates, basis=basis, embedder=embedder,
        config=config, progress=progress,
    )  # fmt: skip
    return release_centroids(
        rows, row_labels, embeddings, basis=basis, label_set=label_set, config=config,
        the_plan=the_plan, progress=progress,
    )  # fmt: skip


def label_prior(
    releases: Releases,
    *,
    embedder: Embedder,
    label_set: Sequence[str],
    config: GenerationConfig,
    counts: list[float] | None,
) -> Releases:
    """USES ONLY DP OUTPUTS AND PUBLIC INPUTS: the class centroids (and their cells)
    pulled towards the embeddings of the declared label names (public schema, public
    model), gated on the released sums and ``counts`` (the released, shrunk class counts).
    Unchanged unless the run uses class centroids with a label prior."""
    if config.density_method != "centroid" or config.label_prior <= 0:
        return releases
    named = np.asarray(embedder.encode(list(label_set)), dtype=np.float64)
    names = name_directions(named if releases.basis is None else named @ releases.basis)
    centroids, mixtures = apply_label_prior(
        releases.centroids,
        releases.mixtures,
        names,
        kappa=config.label_prior,
        counts=counts,
    )
    return replace(releases, centroids=tuple(centroids), mixtures=tuple(mixtures))


# --- Sampling and filtering (step 6): DP outputs and public inputs only --------------------


def class_scores(releases: Releases, *, config: GenerationConfig) -> torch.Tensor | None:
    """USES ONLY DP OUTPUTS AND PUBLIC INPUTS: every class's clipped score of every
    phrase of Ṽ (one row per class), from which independent sequences are drawn; None for
    iterative sequences (drawn from the ensembles directly)."""
    e = releases.embeddings
    if releases.centroids:
        score = centroid_scores if config.density_method == "centroid" else moment_scores
        released = list(releases.centroids)
        if releases.mixtures:  # each class's sum, both releases combined
            pairs = zip(released, releases.mixtures, strict=True)
            released = [CentroidKDE(c.label, m.total, c.event) for c, m in pairs]
        return torch.stack([score(c, e, scale=CENTROID_SCALE) for c in released])
    if releases.exact:
        floor = config.noise_floor
        return torch.stack([floored_density(k, noise_floor=floor) for k in releases.exact])
    if config.mode != "independent":
        return None
    assert releases.rff is not None
    return torch.stack(
        [
            floored_bag_scores(s[0], e, releases.rff, noise_floor=config.noise_floor)
            for s in releases.ensembles
        ]
    )


def _rows(label: str, drawn: torch.Tensor) -> list[Drawn]:
    return [(label, tuple(row)) for row in drawn.tolist()]


def _near(
    releases: Releases,
    scores: torch.Tensor,
    direction: torch.Tensor | None,
    *,
    count: int,
    config: GenerationConfig,
    generator: torch.Generator,
) -> torch.Tensor:
    """``count`` sequences drawn from ``scores`` (over Ṽ), kept near the released
    ``direction`` by the configured selection (none without a direction)."""
    return sample_near_direction(
        scores,
        releases.embeddings,
        direction,
        count=count,
        factor=config.selection_factor,
        length=config.sequence_length,
        temperature=config.sampling_temperature,
        generator=generator,
        distinct=config.distinct,
    )


def _from_cells(
    releases: Releases,
    mixture: CellMixture,
    share: torch.Tensor,
    *,
    count: int,
    config: GenerationConfig,
    generator: torch.Generator,
) -> list[Drawn]:
    """Sequences of one class from its cells: how many from each by the cells' weights,
    then each cell's scores weighted by the class's share of every phrase."""
    weights = torch.as_tensor(mixture.weights, dtype=torch.float64)
    picks = torch.multinomial(weights, count, replacement=True, generator=generator)
    drawn: list[Drawn] = []
    for k, many in enumerate(torch.bincount(picks, minlength=len(weights)).tolist()):
        if not many:
            continue
        cell = CentroidKDE(mixture.label, mixture.directions[k], mixture.event)
        scores = centroid_scores(cell, releases.embeddings, scale=CENTROID_SCALE)
        direction = torch.as_tensor(mixture.directions[k])
        near = _near(
            releases,
            scores * share.to(scores.dtype),
            direction,
            count=many,
            config=config,
            generator=generator,
        )
        drawn.extend(_rows(mixture.label, near))
    return drawn


def sample(
    releases: Releases,
    scores: torch.Tensor | None,
    *,
    label_set: Sequence[str],
    counts: ClassCounts,
    config: GenerationConfig,
    progress: ProgressFn,
) -> list[Drawn]:
    """USES ONLY DP OUTPUTS AND PUBLIC INPUTS: ``counts.wanted`` sequences per class, as
    indices into Ṽ, drawn with a generator seeded by the (public) config. Iterative mode
    grows each from its class's ensemble; independent mode draws from the class's
    ``scores``, contrasted against the other classes' (:func:`class_contrast`), from its
    cells where there are cells, else near its released direction where there is one."""
    progress("sequences", 0.0)
    generator = torch.Generator().manual_seed(config.seed + 1)
    drawn: list[Drawn] = []
    if scores is None:  # iterative
        assert releases.rff is not None
        for n, label in enumerate(label_set):
            if counts.wanted[label]:
                rows = sample_iterative(
                    releases.ensembles[n],
                    releases.embeddings,
                    releases.rff,
                    count=counts.wanted[label],
                    length=config.sequence_length,
                    temperature=config.sampling_temperature,
                    generator=generator,
                    distinct=config.distinct,
                    noise_floor=config.noise_floor,
                )
                drawn.extend(_rows(label, rows))
        return drawn
    weighted = class_contrast(scores, config.class_contrast)
    shares = class_shares(scores, config.class_contrast) if releases.mixtures else None
    for n, label in enumerate(label_set):
        count = counts.wanted[label]
        if shares is not None and count:
            mixture = releases.mixtures[n]
            drawn += _from_cells(
                releases, mixture, shares[n], count=count, config=config, generator=generator
            )
        elif count:
            # a class centroid's direction (moments: their first part, the sum)
            direction = (
                torch.as_tensor(releases.centroids[n].noisy_sum[: releases.embeddings.shape[1]])
                if releases.centroids
                else None
            )
            near = _near(
                releases, weighted[n], direction, count=count, config=config, generator=generator
            )
            drawn.extend(_rows(label, near))
        progress("sequences", (n + 1) / len(label_set))
    return drawn


def filter_sequences(
    drawn: list[Drawn],
    *,
    phrases: Sequence[str],
    releases: Releases,
    embedder: Embedder,
    label_set: Sequence[str],
    config: GenerationConfig,
    progress: ProgressFn,
) -> list[Drawn]:
    """USES ONLY DP OUTPUTS AND PUBLIC INPUTS: with the consistency filter (class
    centroids), each sequence kept only where its own class's released direction (with
    cells: one of its class's cells) is the nearest to its public embedding."""
    if config.filters_sequences and releases.centroids and drawn:
        texts = [" ".join(phrases[i] for i in row) for _, row in drawn]
        vectors = np.asarray(embedder.encode(texts), dtype=np.float64)
        if releases.basis is not None:
            vectors = vectors @ releases.basis
        mixtures = releases.mixtures
        directions = np.concatenate(
            [m.directions for m in mixtures]
            if mixtures
            else [c.noisy_sum[None, :] for c in releases.centroids]
        )
        owners = [n for n, m in enumerate(mixtures) for _ in m.directions] if mixtures else None
        index = {label: n for n, label in enumerate(label_set)}
        own = [index[label] for label, _ in drawn]
        kept = consistent_sequences(vectors, own, directions, owners)
        drawn = [d for d, keep in zip(drawn, kept.tolist(), strict=True) if keep]
    progress("sequences", 1.0)
    return drawn
