"""Every parameter of a DP-KPS run, validated without loading the numerical stack.

The service validates job specs with :class:`GenerationConfig` in its API process, and
the command line builds its parser from the defaults here, so this module imports
neither torch nor OpenDP. Errors name the offending field.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from workers.errors import ConfigError
from workers.privacy.limits import check_delta, check_epsilon

MODES = ("independent", "iterative")
ENSEMBLES = ("log", "linear")
KDE_METHODS = ("exact", "random_features", "centroid", "moments")
# "centroid" (independent mode, Gaussian noise): each class releases the sum of its units'
# document embeddings (L2 Δ = 1, EMBEDDING_DIMENSION coordinates), and a phrase's score
# is its cosine with that sum (workers/methods/dpkps/density/centroid.py,
# build_centroid_structures).
# "moments": the same sum and the sum of the vectors' outer products (L2 Δ = √2), a
# phrase scored by the degree-2 polynomial kernel density (build_moment_structures).
EMBEDDING_DIMENSION = 384  # the packaged sentence model (all-MiniLM-L6-v2)
# Temperatures chosen by measurement for each way of estimating the density (see the
# GenerationConfig docstring and benchmarks/notes/2026-11-23-ag-ablation-why-the-defaults.md).
DEFAULT_TEMPERATURE = {"exact": 0.7, "random_features": 0.3, "centroid": 2.0, "moments": 2.0}
EXACT_KERNEL_LIMIT = 20_000  # |Ṽ| for the exact kernel, computed in blocks of rows
# Cells (class centroids only; workers/methods/dpkps/density/cells.py, build_cell_structures): a
# class sum places up to K_max cells, whose sums a second release gives; chosen on the
# tuning splits (benchmarks/notes/2026-11-28-cells.md). Below CELLS_FROM_EPSILON the default is one
# cell (the class sum alone, one release): there, splitting a class cost accuracy.
DEFAULT_CELLS = 8
CELLS_FROM_EPSILON = 4.0
MAX_CELLS = 64
DEFAULT_CELL_SHARE = 0.3  # of the KDE's share of μ², to the first release (the class sum)
DEFAULT_CELL_KAPPA = 1.0  # a cell's expected sum ≥ κ noise norms
# The declared label names as a prior for each class's direction (class centroids only;
# density/label_prior.py, with_label_prior): κ of w = κ·g·σ²·d/ŝ, chosen on a tuning split in
# the small hospital's shape (benchmarks/notes/2026-11-28-label-names-prior.md); 0 turns it off.
DEFAULT_LABEL_PRIOR = 0.5
MAX_LABEL_PRIOR = 100.0
# Sequence selection (class centroids; sampling.py, sample_near_direction): F× the
# sequences are drawn and the 1/F whose phrases lie nearest the released direction kept;
# by default with cells (each cell's sequences near that cell), chosen on the tuning
# splits (benchmarks/notes/2026-11-28-sequences-kept-near-their-cell.md).
DEFAULT_SELECTION = 8
MAX_SELECTION = 16
# The release subspace (class centroids; subspace.py): each unit's vector projected on the
# top k principal directions of Ṽ's public phrase embeddings and rescaled there to its own
# norm, so the class sums are released in k coordinates with the same L2 Δ = 1. k = 128
# gained on small classes and lost on Yelp's ten business categories
# (benchmarks/notes/2026-11-29-public-subspace.md), so by default (None) it is used where
# the declared label set has SUBSPACE_FROM_CLASSES or more classes (issue 16's
# small-hospital regime, "20 or more classes"; a public input, so the plan knows it) and a
# class has one cell; 0: the whole space.
DEFAULT_SUBSPACE: int | None = None
SUGGESTED_SUBSPACE = 128  # the k chosen on the tuning splits, for corpora of small classes
SUBSPACE_FROM_CLASSES = 20
# A Poisson sample of units embedded (class centroids and moments; issue 65;
# workers/privacy/sampling.py): each class's units are kept independently with probability
# q_c = min(1, m / ñ_c), ñ_c the class's released (DP) count, so about m units a class are
# embedded whatever the corpus holds. None (the default): m = DEFAULT_EMBED_SAMPLE for
# class centroids and moments; 0: every unit. 4,000 is above the largest class of every
# reported corpus (Yelp categories' 3,062 Restaurants reviews, with six count-noise σ to
# spare at ε = 0.25), so the reported curve is measured at q = 1, every unit embedded; a
# sample of 4,000 has the signal-to-noise of a class of about 1,100 units at ε = 1 even at
# ε = 0.25, where AG report's 750 a class already reach 0.95 of real text
# (benchmarks/notes/2026-12-08-embed-sample-default.md). Where the run releases no class
# counts for a ``total``, they are released for the rate with SAMPLE_COUNT_SHARE of μ²
# (about 0.5 % more noise on the class sums; the counts' σ is ten times the sums').
DEFAULT_EMBED_SAMPLE = 4_000
MAX_EMBED_SAMPLE = 10_000_000
SAMPLE_COUNT_SHARE = 0.01


NOISES = ("laplace", "gaussian")
# How the private vocabulary is chosen (workers/methods/dpkps/private_vocab.py):
# "histogram": noise on every phrase of the public vocabulary, top N; "threshold": Gaussian
# noise on the phrases that occur, those above a threshold that bounds δ (Gaussian only);
# "public": the first N phrases of the public vocabulary (for the built-in ones, the most
# frequent), no release and no budget: the class densities select among them.
VOCABULARY_METHODS = ("histogram", "threshold", "public")
# |Ṽ| of a public Ṽ (the most frequent phrases) by density method: class centroids and
# moments put their noise on the embedding's coordinates, whatever |Ṽ| is, and gained from
# 30,000 phrases (GenerationConfig's docstring); the exact kernel puts noise on every
# phrase, and more phrases was worse.
PUBLIC_VOCABULARY_SIZE = {
    "exact": 5000,
    "random_features": 5000,
    "centroid": 30_000,
    "moments": 30_000,
}
PUBLIC_VOCABULARY_DEFAULTS = ", ".join(  # in words, for the CLI's help and the job spec
    f"{size:,} with {method}" for method, size in PUBLIC_VOCABULARY_SIZE.items()
)
DEFAULT_VOCABULARY_METHOD = {"laplace": "histogram", "gaussian": "histogram"}
# A document's weights in the exact-kernel density (workers/methods/dpkps/density/exact.py): "l1",
# they sum to 1; "l2", L2 norm 1 (Gaussian noise only; sensitivity λ_max of the kernel).
KDE_WEIGHTINGS = ("l1", "l2")
DEFAULT_KDE_WEIGHTING = {"laplace": "l1", "gaussian": "l1"}


def moments_dimension(dim: int) -> int:
    """Coordinates of a "moments" release: the sum (d) and an upper triangle (d(d+1)/2).

    >>> moments_dimension(384)
    74304
    """
    return dim + dim * (dim + 1) // 2


def ensemble_block_counts(ensemble: str, length: int) -> list[int]:
    """Block counts of the structures an iterative run builds for sequences of ``length``.

    >>> ensemble_block_counts("log", 10)
    [1, 2, 4, 8, 10]
    >>> ensemble_block_counts("log", 8)
    [1, 2, 4, 8]
    >>> ensemble_block_counts("linear", 4)
    [1, 2, 3, 4]
    """
    if length < 1:
        raise ConfigError("must be ≥ 1", field="sequence_length")
    if ensemble == "linear":
        return list(range(1, length + 1))
    if ensemble == "log":
        top = math.ceil(math.log2(length)) if length > 1 else 0
        return sorted({min(2**j, length) for j in range(top + 1)})
    raise ConfigError(f"must be one of {ENSEMBLES}", field="ensemble")


def method_description(config: GenerationConfig) -> str:
    """What ran, derived from the configuration (the audit trail names the real kernel)."""
    if config.density_method == "exact":
        kde = "the exact Gaussian kernel density on the private vocabulary"
        if config.density_weighting == "l2":
            kde += " (document weights of L2 norm 1)"
    elif config.density_method == "centroid":
        kde = "the class centroids of the document embeddings (linear kernel)"
        if config.subspace is None:  # resolved by the label set at the run
            if config.for_classes(SUBSPACE_FROM_CLASSES).release_dimension < EMBEDDING_DIMENSION:
                kde += (
                    f", released in the top {SUGGESTED_SUBSPACE} principal directions of the "
                    f"public phrases' embeddings with {SUBSPACE_FROM_CLASSES} or more classes"
                )
        elif config.release_dimension < EMBEDDING_DIMENSION:
            kde += (
                f", released in the top {config.release_dimension} principal directions of "
                "the public phrases' embeddings"
            )
        if config.cells > 1:
            kde += f", each class split into up to {config.cells} cells by a second release"
    elif config.density_method == "moments":
        kde = "the first two moments of the document embeddings (polynomial kernel)"
    else:
        kde = f"random Fourier features ({config.mode} sequences)"
    if config.samples_units:
        kde += (
            f"; a Poisson sample of about {config.sample_size:,} units a class embedded, at "
            "a rate set by the released class counts"
        )
    if config.selection_factor > 1:  # validated: only with a direction per class
        kde += (
            f"; of every {config.selection_factor} sequences drawn, the one whose phrases lie "
            "nearest the released direction kept"
        )
    if config.filters_sequences and config.cells > 1:  # validated: only with class centroids
        kde += "; a sequence kept only where its nearest cell is one of its own class's"
    elif config.filters_sequences:
        kde += (
            "; a sequence kept only where its own class's released direction is the nearest "
            "to its embedding"
        )
    described = f"DP-KPS (Nagesh et al., 2024) with DP-KDE by {kde}"
    vocabulary = {  # the noisy histogram is the paper's: no mention needed
        "threshold": "a thresholded Gaussian histogram over the phrases that occur",
        "public": f"the first {config.candidate_count:,} phrases of the public vocabulary",
    }.get(config.vocabulary_selection)
    return described if vocabulary is None else f"{described}; Ṽ: {vocabulary}"


def check_temperature(temperature: float) -> float:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise ConfigError("must be a number", field="temperature")
    if not (math.isfinite(temperature) and temperature > 0):
        raise ConfigError("must be finite and > 0", field="temperature")
    return float(temperature)


def _check_between(
    value: float, *, field: str, high: float, unit: str = "", low_open: bool = False
) -> float:
    """A finite number in [0, high] (or (0, high]); the message names ``field``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError("must be a number", field=field)
    if not (math.isfinite(value) and 0 <= value <= high) or (low_open and value == 0):
        low = "> 0 and ≤" if low_open else "between 0 and"
        raise ConfigError(f"must be {low} {high:g}{unit}", field=field)
    return float(value)


def check_noise_floor(value: float) -> float:
    return _check_between(value, field="noise_floor", high=10, unit=" (standard deviations)")


def check_class_contrast(value: float) -> float:
    return _check_between(value, field="class_contrast", high=10)


# Upper bounds that keep a single job within a worker's memory; far above useful values.
LIMITS = {
    "per_class": 1_000_000,
    "total": 10_000_000,
    "vocabulary_size": 200_000,
    "max_matches_per_document": 1_000,
    "sequence_length": 64,
    "num_features": 65_536,
    "max_phrases_per_document": 1_000,
}


def _check_choice(value: object, choices: Sequence[str], field: str) -> None:
    """``value`` is one of ``choices``, or the error names ``field`` and lists them."""
    if value not in choices:
        raise ConfigError(f"must be one of {', '.join(choices)}", field=field)


def _check_int(value: object, *, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError("must be an integer", field=name)
    if not low <= value <= high:
        raise ConfigError(f"must be between {low} and {high} (got {value})", field=name)
    return value


@dataclass(frozen=True)
class GenerationConfig:
    """Every parameter of a run. Privacy parameters are keyword-only by construction.

    A job spec and the command line set the public ones
    (:class:`~workers.methods.dpkps.params.DPKPSParams`); the research levers
    (:data:`~workers.methods.dpkps.params.RESEARCH_FIELDS`: ``bandwidth``,
    ``contribution_bound``, ``noise_floor``, ``class_contrast``,
    ``max_phrases_per_document``, ``kde_weighting``, ``cell_share``, ``cell_kappa``,
    ``label_prior``, ``distinct``) keep the defaults below in
    every product run and are varied by the benchmarks only (``benchmarks/experiments.py``;
    docs/parameters.md has, per field, its default, its rule and its study).

    With one total Gaussian budget (``epsilon``, ``delta``, ``noise="gaussian"``) the
    independent mode defaults to class centroids (``kde_method="centroid"``) over a public
    Ṽ (the 30,000 most frequent phrases of the vocabulary, :data:`PUBLIC_VOCABULARY_SIZE`),
    τ = 2: chosen on AG News rows 0–3,799 (about 3,000 private documents, 800 test, issue
    16), where at ε = 0.25 / 1 / 6 (δ = 1e-6) they gave 0.79 / 0.84 / 0.84 against
    0.22 / 0.56 / 0.80 for the noisy histogram and the exact kernel (0.90 on the real
    texts). At ε ≤ 1 a histogram over 300,000 public phrases buries the real ones and a
    threshold leaves at most a handful (0 at ε = 0.25); a centroid is 384 numbers per
    class whatever Ṽ is, with L2 Δ = 1. τ: 0.5 / 1 / 2 / 4 gave 0.74 / 0.78 / 0.84 / 0.83
    at ε = 1. A public Ṽ of 30,000 phrases instead of 5,000 then gave 0.795 / 0.845 / 0.857
    (5 runs each), and no worse on two Yelp tuning splits.
    benchmarks/notes/2026-11-24-ag-tune-how-the-defaults-were-chosen.md and the notes after it
    have every measurement. The older Gaussian path stays selectable
    (``kde_method="exact"``: the noisy histogram then);
    ``vocabulary_method`` selects the thresholded or public Ṽ and ``kde_weighting`` the
    L2 weights explicitly. Laplace runs keep the defaults below.

    Cells (``centroid_cells``, :func:`workers.methods.dpkps.density.cells.build_cell_structures`):
    from ε = 4 on, each class sum takes 0.3 of the density's μ² and places up to 8 cells
    among its phrases; a second release gives the cells' sums, and each sequence is drawn
    around one cell. On the tuning splits, as prototypes with fresh noise per run, they
    gained +0.010 on AG News rows 0–3,799 at ε = 6 (8 runs each) and +0.023 / +0.018 on
    the Yelp tuning split at ε = 4 / 6, but lost 0.02 on Yelp at ε = 1 and were neutral
    on AG at ε = 2: hence one cell (the class sum alone) below ε = 4.

    Label names (``label_prior``,
    :func:`workers.methods.dpkps.density.label_prior.with_label_prior`): each class's
    released direction is pulled towards its declared label name's embedding by κ·g·σ²·d/ŝ
    (κ = 0.5; g from how far the released sums agree with the names, 0 for names
    that say nothing). Post-processing. Chosen on a tuning split in the small hospital's
    shape (20 Yelp labels of 20 reviews): 0.086 → 0.157 at ε = 1; no tuning split lost
    (Yelp tune +0.03 / +0.01 at ε = 1 / 6, AG News rows 0–3,799 +0.016 at ε = 0.25). With
    a ``total`` (released counts), g is at least the posterior probability that the names
    are informative given that agreement and how much it could tell (its power, from the
    counts and σ): where a few dozen documents a class at ε ≤ 0.5 leave the agreement no
    power, the names keep most of their weight instead of a coin toss's (the same tuning
    split, paired: 0.109 → 0.165 at ε = 0.25, 0.185 → 0.193 at ε = 1; names replaced by
    codes +0.002 / −0.002).

    Sequence selection (``sequence_selection``,
    :func:`workers.methods.dpkps.sampling.sample_near_direction`): with cells, each cell
    draws 8× its sequences and keeps the eighth whose phrases' mean embedding lies nearest
    the cell's released direction, so a sequence's phrases agree on one subject.
    Post-processing. On the tuning splits at ε = 6: AG News rows 0–3,799 0.850 → 0.863,
    the small-hospital tuning split 0.215 → 0.242, the Yelp tuning split 0.734 → 0.727 (within
    1.5 standard errors); at ε = 4 on AG +0.004. Around a class's one direction (no cells,
    ε = 1) it cost AG 0.008: hence none without cells.

    Consistency filter (``consistency_filter``; by default on with class centroids,
    :func:`workers.methods.dpkps.sampling.consistent_sequences`): each drawn sequence is
    embedded by the public model and kept only if its own class's released direction (after
    the label names' prior) is the nearest to it, or, with cells, if its nearest cell among
    every class's cells is one of its own class's; so a job returns fewer sequences than it
    asked for, in proportions the releases decide (the manifest's ``sequences_drawn`` says
    how many were drawn). Post-processing. On the tuning splits, paired on the same
    releases: +0.004 to +0.008 at ε = 1, +0.010 at ε = 0.5 and 2 on the 50 Yelp labels,
    nothing at ε = 0.25. With cells, judged by the class sums it cost the Yelp categories
    0.02; judged by the cells it gained on the Yelp tuning split at ε = 6 (+0.010, all five
    pairs) and kept the medical tuning split (+0.001), so it is on with cells too
    (benchmarks/notes/2026-11-30-consistency-filter.md and
    benchmarks/notes/2026-11-30-medical-abstracts-filter-with-cells.md).

    Release subspace (``subspace`` = k, :mod:`workers.methods.dpkps.subspace`): each
    unit's vector is projected on the top k principal directions of Ṽ's public phrase
    embeddings and rescaled there to its own norm, so each class sum (and cell) is released
    in k coordinates with the same σ and L2 Δ = 1; phrases are scored by their cosine with
    the released direction as before. k = 128 (:data:`SUGGESTED_SUBSPACE`) was chosen on the
    tuning splits (the small-hospital tuning split, 20 classes, +0.016 / +0.012 at ε = 1 / 2,
    AG News rows 0–3,799 +0.019 at ε = 0.25, the ten-class Yelp tuning split −0.004 at
    ε = 1); on the reported splits at ε = 1 it lifted the small hospital 0.49 → 0.55 of
    real and the 50 Yelp labels 0.75 → 0.76 (ten runs each), but cost Yelp's ten business
    categories 0.03 (0.94 → 0.90). So by default (``subspace`` None,
    :meth:`GenerationConfig.for_classes`) it is used where a class has one cell and the
    declared label set, a public input, has :data:`SUBSPACE_FROM_CLASSES` or more classes
    (issue 16's small-hospital regime), and the whole space elsewhere; the rule was set
    after the reported splits were seen.

    The defaults were chosen by measurement on AG News (6,000 private documents, 4
    classes, ε = 1 + 5, keyphrase sequences only, classifier on sentence embeddings);
    benchmarks/notes/2026-11-23-ag-ablation-why-the-defaults.md has the ablation behind each.
    In short:

    * independent mode: the iterative ensemble splits ε_kde over ⌈log₂ L⌉ + 1
      structures in 384·B dimensions and its noise swamps the prefix signal at this
      size (accuracy about 0.4 against 0.8);
    * the exact kernel on Ṽ (``kde_method``, independent mode): independent sequences
      query the density only at the phrases of Ṽ, so it is released there directly,
      with sensitivity the largest column sum of the kernel (about 1 at σ = 0.3). The
      random-feature structure has sensitivity c·I: the noise in a score is about ±27
      documents' worth against ±0.3 here, and its kernel values carry a random-feature
      error besides. At ε = 1 + 5: mean 0.817 over 6 runs (exact, τ = 0.7) against
      0.793 over 10 (random features, τ = 0.3, no floor);
    * σ = 0.3: on unit vectors a wider kernel scores every phrase alike, so sequences
      drift to generic words (exact kernel, σ = 0.5: 0.756);
    * τ per method (:data:`DEFAULT_TEMPERATURE`): with the exact kernel the scores are
      close to the class's phrase frequencies, and sharpening them narrows the
      sequences to a class's top words (τ = 0.3: 0.77–0.80, τ = 0.5: 0.80–0.81,
      τ = 0.7: 0.808–0.821 over 6 runs, τ = 1: 0.795–0.833 over 8, mean 0.814; 0.7 for
      the smaller spread). The random-feature scores of the many noise winners in Ṽ (at
      ε_voc = 1 most of it) are pure noise, and τ = 0.3 keeps them out (τ = 1: 0.65);
    * I = 1,024 with c = 0.5 (random features): the DP noise in a score grows like
      c·√I/ε and the random feature error shrinks like 1/√I; a document's mean of M = 8
      phrase features has L1 norm about 0.4·I (the worst case √2·I is a single phrase),
      so clipping at 0.5·I changes few documents and cuts the noise by 2.8×;
    * no noise floor (the paper's plain clipping at 0): subtracting one noise standard
      deviation before clipping also drops the real phrases whose class scores are
      within the noise (random features: 10 runs without the floor gave a mean of 0.793,
      8 runs with it 0.778; a run's spread is about ±0.01);
    * class contrast β = 1: without it a class's sequences were mostly the words every
      class uses ("said", "new", weekdays, agency names). Weighting each class's scores
      by its share of the phrase (see :func:`workers.methods.dpkps.sampling.class_contrast`,
      post-processing of the released scores) raised accuracy with both methods (exact
      kernel, τ = 1: 0.759 without it against 0.795–0.833 with it).
    """

    epsilon_vocab: float | None = None  # per-mechanism ε (Laplace noise); or `epsilon`
    epsilon_kde: float | None = None
    epsilon_count: float | None = None  # set: split `total` by noisy class counts
    per_class: int | None = 100  # fixed number of sequences per declared label
    total: int | None = None  # with epsilon_count, or with `epsilon` (counts get a share)
    epsilon: float | None = None  # total budget, split among the mechanisms by the shares
    delta: float = 0.0  # with `epsilon`: > 0 for Gaussian noise
    noise: str = "laplace"  # "laplace" (pure ε) | "gaussian" (ε, δ), with `epsilon`
    share_vocab: float = 1.0  # shares of the total (of ε for Laplace, of μ² for Gaussians)
    share_kde: float = 1.0
    share_count: float = 0.1
    vocabulary_size: int = 1000  # N: size of the private vocabulary
    max_matches_per_document: int = 10  # S: sensitivity of the vocabulary histogram
    sequence_length: int = 8  # L
    mode: str = "independent"  # "independent" | "iterative"
    ensemble: str = "log"  # "log" | "linear" (iterative mode)
    kde_method: str | None = None  # "exact" | "random_features" | "centroid" | "moments";
    # None: independent mode → centroid (Gaussian noise) or exact (Laplace); else random_features
    vocabulary_method: str | None = None  # "histogram" | "threshold" (Gaussian) | "public";
    # None: public for centroid or moments, else histogram
    kde_weighting: str | None = None  # exact kernel: "l1" | "l2" (Gaussian); None: "l1"
    public_vocabulary_size: int | None = None  # |Ṽ| of a public Ṽ; None: per kde_method
    centroid_cells: int | None = None  # K_max cells per class (centroid); None: by epsilon
    cell_share: float = DEFAULT_CELL_SHARE  # with cells: the class sum's share of the KDE's
    cell_kappa: float = DEFAULT_CELL_KAPPA  # with cells: a cell's sum ≥ κ·σ√d (K_c's rule)
    label_prior: float = DEFAULT_LABEL_PRIOR  # centroid: κ of the label names' prior; 0: off
    sequence_selection: int | None = None  # F: draw F× the sequences, keep the 1/F nearest
    # their class's (or cell's) released direction; 1: off; None: F = 8 with cells, else 1
    consistency_filter: bool | None = None  # keep a sequence only where its own class's
    # released direction is the nearest to its embedding (post-processing; fewer sequences);
    # None: on with class centroids (with cells, judged by every class's cells), else off
    subspace: int | None = DEFAULT_SUBSPACE  # centroid: release in the top-k principal
    # directions of Ṽ's public embeddings (each unit rescaled there to its own norm); 0: the
    # whole space; None: by the number of declared classes (for_classes)
    embed_sample: int | None = None  # centroid, moments: m, about this many units of each
    # class embedded (a Poisson sample at q_c = min(1, m / ñ_c), ñ_c the released class
    # count); 0: every unit; None: DEFAULT_EMBED_SAMPLE (sample_size)
    num_features: int = 1024  # I: random Fourier features
    bandwidth: float = 0.3  # σ of the Gaussian kernel on unit vectors
    temperature: float | None = None  # τ: p ∝ clip(score)^(1/τ); None: per kde_method
    noise_floor: float = 0.0  # scores minus this many noise std before clipping
    class_contrast: float = 1.0  # β: weight by the class's share of a phrase, ^β (independent)
    contribution_bound: float = 0.5  # c: ‖φ_j‖₁ ≤ c·I, so the sensitivity is c·I
    max_phrases_per_document: int = 8  # M: phrases averaged per document (independent)
    distinct: bool = True  # no phrase twice in one sequence (post-processing)
    seed: int = 0  # public randomness (features, sampling); DP noise is never seeded
    device: str | None = None  # None: GPU if torch sees one, else CPU

    def validate(self) -> GenerationConfig:
        self._check_budget()
        if self.total is None:
            if self.per_class is None:
                raise ConfigError("give per_class, or total with epsilon_count", field="per_class")
            _check_int(self.per_class, name="per_class", low=1, high=LIMITS["per_class"])
        else:
            _check_int(self.total, name="total", low=1, high=LIMITS["total"])
        for name in (
            "vocabulary_size",
            "max_matches_per_document",
            "sequence_length",
            "num_features",
            "max_phrases_per_document",
        ):
            _check_int(getattr(self, name), name=name, low=1, high=LIMITS[name])
        if self.public_vocabulary_size is not None:
            _check_int(
                self.public_vocabulary_size,
                name="public_vocabulary_size",
                low=1,
                high=LIMITS["vocabulary_size"],
            )
        _check_choice(self.mode, MODES, "mode")
        _check_choice(self.ensemble, ENSEMBLES, "ensemble")
        if not (isinstance(self.bandwidth, (int, float)) and math.isfinite(self.bandwidth)):
            raise ConfigError("must be a finite number", field="bandwidth")
        if self.bandwidth <= 0:
            raise ConfigError("must be > 0", field="bandwidth")
        if self.kde_method is not None:
            _check_choice(self.kde_method, KDE_METHODS, "kde_method")
        if self.kde_method in ("centroid", "moments") and (
            self.mode != "independent" or self.noise != "gaussian"
        ):
            raise ConfigError(
                "class centroids score independent sequences, with Gaussian noise",
                field="kde_method",
            )
        self._check_vocabulary_and_weighting()
        self._check_cells()
        if self.mode == "iterative" and self.kde_method == "exact":
            raise ConfigError(
                "the iterative mode scores prefixes in a continuous space: random_features",
                field="kde_method",
            )
        if self.density_method == "exact" and self.candidate_count > EXACT_KERNEL_LIMIT:
            public = self.vocabulary_selection == "public"
            raise ConfigError(
                f"the exact kernel holds at most {EXACT_KERNEL_LIMIT:,} phrases; "
                "use kde_method random_features for a larger private vocabulary",
                field="public_vocabulary_size" if public else "vocabulary_size",
            )
        if self.temperature is not None:
            check_temperature(self.temperature)
        check_noise_floor(self.noise_floor)
        check_class_contrast(self.class_contrast)
        if not (
            isinstance(self.contribution_bound, (int, float))
            and math.isfinite(self.contribution_bound)
            and 0 < self.contribution_bound <= math.sqrt(2.0)
        ):
            raise ConfigError("must be in (0, √2]", field="contribution_bound")
        _check_int(self.seed, name="seed", low=0, high=2**63 - 1)
        if self.distinct and self.sequence_length > self.candidate_count:
            raise ConfigError(
                "sequences of distinct phrases cannot be longer than the private vocabulary",
                field="sequence_length",
            )
        return self

    def _check_vocabulary_and_weighting(self) -> None:
        """``vocabulary_method`` and ``kde_weighting``: known values, and the Gaussian-only
        ones with a Gaussian budget, the L2 weights with the exact kernel."""
        if self.vocabulary_method is not None:
            _check_choice(self.vocabulary_method, VOCABULARY_METHODS, "vocabulary_method")
        if self.kde_weighting is not None:
            _check_choice(self.kde_weighting, KDE_WEIGHTINGS, "kde_weighting")
        gaussian_only = {
            "vocabulary_method": (
                self.vocabulary_method == "threshold",
                "the thresholded vocabulary is a Gaussian (ε, δ) release",
            ),
            "kde_weighting": (
                self.kde_weighting == "l2",
                "L2 document weights are bounded for Gaussian noise",
            ),
        }
        for name, (chosen, why) in gaussian_only.items():
            if chosen and self.noise != "gaussian":
                raise ConfigError(
                    f"{why}: give a total epsilon, delta > 0 and noise gaussian", field=name
                )
        if self.kde_weighting == "l2" and self.density_method != "exact":
            raise ConfigError(
                "document weights apply to the exact kernel: give kde_method exact",
                field="kde_weighting",
            )

    def _check_cells(self) -> None:
        """``centroid_cells`` (an integer ≥ 1; more than one only with class centroids and a
        total Gaussian budget), ``cell_share`` in (0, 1) and ``cell_kappa`` > 0."""
        if self.centroid_cells is not None:
            _check_int(self.centroid_cells, name="centroid_cells", low=1, high=MAX_CELLS)
            if self.centroid_cells > 1 and (
                self.density_method != "centroid" or self.epsilon is None
            ):
                raise ConfigError(
                    "cells split class centroids: give kde_method centroid and a total "
                    "Gaussian budget, or centroid_cells 1",
                    field="centroid_cells",
                )
        _check_between(self.cell_share, field="cell_share", high=1, low_open=True)
        if self.cell_share >= 1:
            raise ConfigError("must be below 1 (the cells need a share)", field="cell_share")
        _check_between(self.cell_kappa, field="cell_kappa", high=1000, low_open=True)
        _check_between(self.label_prior, field="label_prior", high=MAX_LABEL_PRIOR)
        if self.embed_sample is not None:
            _check_int(self.embed_sample, name="embed_sample", low=0, high=MAX_EMBED_SAMPLE)
        if self.embed_sample and not self.embeds_documents:
            raise ConfigError(
                "a sample of units is embedded for class centroids or moments: give "
                "kde_method centroid or moments, or embed_sample 0",
                field="embed_sample",
            )
        if self.subspace is not None:
            _check_int(self.subspace, name="subspace", low=0, high=EMBEDDING_DIMENSION)
        if (
            self.subspace not in (None, 0, EMBEDDING_DIMENSION)
            and self.density_method != "centroid"
        ):
            raise ConfigError(
                "a release subspace is for class centroids: give kde_method centroid, "
                "or subspace 0",
                field="subspace",
            )
        if self.sequence_selection is not None:
            _check_int(
                self.sequence_selection, name="sequence_selection", low=1, high=MAX_SELECTION
            )
            if self.sequence_selection > 1 and not self.embeds_documents:
                raise ConfigError(
                    "selecting sequences needs a released direction per class: give kde_method "
                    "centroid or moments, or sequence_selection 1",
                    field="sequence_selection",
                )

        if self.consistency_filter is not None and not isinstance(self.consistency_filter, bool):
            raise ConfigError("must be true, false or null", field="consistency_filter")
        if self.consistency_filter and self.density_method != "centroid":
            raise ConfigError(
                "the consistency filter reads each class's released direction: give "
                "kde_method centroid, or consistency_filter false",
                field="consistency_filter",
            )

    def _check_budget(self) -> None:
        """One total budget (``epsilon``, ``delta``, ``noise``, shares) or per-mechanism ε."""
        _check_choice(self.noise, NOISES, "noise")
        if self.epsilon is None:
            if self.epsilon_vocab is None or self.epsilon_kde is None:
                raise ConfigError(
                    "give a total epsilon, or epsilon_vocab and epsilon_kde",
                    field="epsilon" if self.epsilon_vocab is None else "epsilon_kde",
                )
            check_epsilon(self.epsilon_vocab, field="epsilon_vocab")
            check_epsilon(self.epsilon_kde, field="epsilon_kde")
            if self.noise != "laplace" or self.delta != 0:
                raise ConfigError(
                    "per-mechanism ε is pure (Laplace); give a total epsilon and delta for "
                    "Gaussian noise",
                    field="noise" if self.noise != "laplace" else "delta",
                )
            if (self.epsilon_count is None) != (self.total is None):
                raise ConfigError(
                    "noisy class counts need both total and epsilon_count", field="total"
                )
            if self.epsilon_count is not None:
                check_epsilon(self.epsilon_count, field="epsilon_count")
            return
        for name in ("epsilon_vocab", "epsilon_kde", "epsilon_count"):
            if getattr(self, name) is not None:
                raise ConfigError("give a total epsilon or per-mechanism ε, not both", field=name)
        check_epsilon(self.epsilon, field="epsilon")
        check_delta(self.delta, gaussian=self.noise == "gaussian")
        for name in ("share_vocab", "share_kde", "share_count"):
            _check_between(getattr(self, name), field=name, high=1000, low_open=True)

    def check_vocabulary(self, name: str, size: int) -> None:
        """N must not exceed the public vocabulary it is drawn from."""
        if self.vocabulary_selection == "public":
            if self.distinct and self.sequence_length > size:
                raise ConfigError(
                    f"vocabulary {name!r} has fewer than {self.sequence_length} phrases",
                    field="sequence_length",
                )
            return  # a public Ṽ takes the whole vocabulary when it is smaller
        if self.vocabulary_size > size:
            raise ConfigError(
                f"asks for {self.vocabulary_size} phrases but vocabulary {name!r} has {size}",
                field="vocabulary_size",
            )

    @property
    def density_method(self) -> str:
        """How the class densities are estimated: ``kde_method``, or its mode's default."""
        if self.kde_method is not None:
            return self.kde_method
        if self.mode != "independent":
            return "random_features"
        return "centroid" if self.noise == "gaussian" else "exact"

    @property
    def embeds_documents(self) -> bool:
        """Whether the class densities are released from the documents' embeddings (class
        centroids or moments), rather than from their phrases."""
        return self.density_method in ("centroid", "moments")

    @property
    def candidate_count(self) -> int:
        """The phrases a run embeds at most: for a public Ṽ, ``public_vocabulary_size``;
        else ``vocabulary_size``."""
        if self.vocabulary_selection == "public":
            return self.public_size
        return self.vocabulary_size

    @property
    def public_size(self) -> int:
        """|Ṽ| of a public Ṽ: ``public_vocabulary_size``, or the default for
        :attr:`density_method`."""
        if self.public_vocabulary_size is not None:
            return self.public_vocabulary_size
        return PUBLIC_VOCABULARY_SIZE[self.density_method]

    @property
    def vocabulary_selection(self) -> str:
        """How Ṽ is chosen: ``vocabulary_method``, or the default: public for class
        centroids or moments, else the noisy histogram."""
        if self.vocabulary_method is not None:
            return self.vocabulary_method
        if self.embeds_documents:
            return "public"  # the densities select; a private Ṽ would cost budget for little
        return DEFAULT_VOCABULARY_METHOD[self.noise]

    @property
    def density_weighting(self) -> str:
        """A document's weights in the exact-kernel density: ``kde_weighting``, or the
        default."""
        if self.kde_weighting is not None:
            return self.kde_weighting
        return DEFAULT_KDE_WEIGHTING[self.noise]

    @property
    def sampling_temperature(self) -> float:
        """τ: ``temperature``, or the default measured for :attr:`density_method`."""
        if self.temperature is not None:
            return self.temperature
        return DEFAULT_TEMPERATURE[self.density_method]

    @property
    def cells(self) -> int:
        """K_max: ``centroid_cells``, or by default (class centroids, a total budget) 8
        from ε = 4 on and 1 below it, where one cell did better
        (benchmarks/notes/2026-11-28-cells.md)."""
        if self.centroid_cells is not None:
            return self.centroid_cells
        if self.density_method != "centroid" or self.epsilon is None:
            return 1
        return DEFAULT_CELLS if self.epsilon >= CELLS_FROM_EPSILON else 1

    @property
    def selection_factor(self) -> int:
        """F: ``sequence_selection``, or by default :data:`DEFAULT_SELECTION` with cells
        (each cell's sequences kept near that cell) and 1 (every draw kept) without them,
        where keeping a class's sequences near its one direction cost accuracy."""
        if self.sequence_selection is not None:
            return self.sequence_selection
        return DEFAULT_SELECTION if self.cells > 1 else 1

    @property
    def filters_sequences(self) -> bool:
        """Whether the consistency filter runs: ``consistency_filter``, or by default with
        class centroids (released directions to compare each sequence with; with cells, every
        class's cells: benchmarks/notes/2026-11-30-medical-abstracts-filter-with-cells.md)."""
        if self.consistency_filter is not None:
            return self.consistency_filter
        return self.density_method == "centroid"

    def for_classes(self, classes: int) -> GenerationConfig:
        """This configuration with ``subspace`` resolved for a label set of ``classes``
        declared classes (public): by default :data:`SUGGESTED_SUBSPACE` with class
        centroids, a total Gaussian budget, one cell per class and at least
        :data:`SUBSPACE_FROM_CLASSES` classes; else 0, the whole space."""
        if self.subspace is not None:
            return self
        # class centroids take a total Gaussian budget (validate), so only cells are left
        small = (
            self.density_method == "centroid"
            and self.cells == 1
            and classes >= SUBSPACE_FROM_CLASSES
        )
        return replace(self, subspace=SUGGESTED_SUBSPACE if small else 0)

    @property
    def release_dimension(self) -> int:
        """k: the coordinates of each class sum's (and cell's) release with class
        centroids: ``subspace``; the whole embedding space when 0. Needs ``subspace``
        resolved (:meth:`for_classes`): the default depends on the label set."""
        if self.density_method != "centroid":
            return EMBEDDING_DIMENSION
        k = self.subspace
        if k is None:
            raise ValueError("subspace is resolved by the label set: call for_classes first")
        return EMBEDDING_DIMENSION if k in (0, EMBEDDING_DIMENSION) else k

    @property
    def uses_class_counts(self) -> bool:
        """Whether the run splits a total among the classes by noisy class counts."""
        return self.total is not None

    @property
    def sample_size(self) -> int:
        """m of ``embed_sample``: the one given, else :data:`DEFAULT_EMBED_SAMPLE` where
        the run embeds documents (class centroids or moments), else 0."""
        if self.embed_sample is not None:
            return self.embed_sample
        return DEFAULT_EMBED_SAMPLE if self.embeds_documents else 0

    @property
    def samples_units(self) -> bool:
        """Whether only a Poisson sample of the units is embedded (``embed_sample``)."""
        return self.embeds_documents and self.sample_size > 0

    @property
    def releases_class_counts(self) -> bool:
        """Whether the run releases noisy class counts: to split a total by them, or to
        set the sampling rate of :attr:`samples_units`."""
        return self.uses_class_counts or self.samples_units

    @property
    def count_share(self) -> float:
        """The class counts' share: ``share_count`` with a total, else (counts released for
        the sampling rate alone) :data:`SAMPLE_COUNT_SHARE`."""
        return self.share_count if self.uses_class_counts else SAMPLE_COUNT_SHARE

    def to_dict(self) -> dict[str, Any]:
        """Every parameter, with the defaults that depend on the mode resolved."""
        out = asdict(self)
        out["kde_method"], out["temperature"] = self.density_method, self.sampling_temperature
        out["vocabulary_method"] = self.vocabulary_selection
        out["kde_weighting"] = self.density_weighting
        out["public_vocabulary_size"] = self.public_size
        out["centroid_cells"] = self.cells
        out["sequence_selection"] = self.selection_factor
        out["consistency_filter"] = self.filters_sequences
        out["embed_sample"] = self.sample_size
        # None until resolved by the label set (for_classes): the plan's events say which
        out["subspace"] = (
            None
            if self.subspace is None and self.density_method == "centroid"
            else self.release_dimension
        )
        return out


# The small-ε options of issue 16 (``vocabulary_method``, ``kde_weighting``,
# ``public_vocabulary_size``) were a subclass's until the job spec carried them; they are
# GenerationConfig's own now, and the old name stays for the benchmarks.
LowEpsilonConfig = GenerationConfig
