"""Drawing keyphrase sequences from released DP-KDE structures (method.md, steps 5 and 6).

Everything here is post-processing of DP releases: it reads only noisy sums, public
embeddings and public random features, so it may be repeated at will.

Scores ``s(y) = Σ_k F̃_k f_k(y)`` can be negative because of the noise; they are clipped
at 0, raised to ``1/τ`` (temperature τ; τ < 1 sharpens noisy scores) and normalised. A
row whose scores are all ≤ 0 falls back to the uniform distribution.

The iterative mode uses the exact GEMM formulation: with ``A_k`` the phase of the prefix
and ``G_k,w`` the phase a candidate adds, ``cos(A + G) = cos A cos G − sin A sin G``, so
the scores of every candidate for a batch of ``Q`` prefixes are
``C (F̃∘cos A)ᵀ − S (F̃∘sin A)ᵀ`` with ``C = cos G`` and ``S = sin G``: two matrix
products per step. :func:`direct_scores` evaluates the random-feature formula literally
and serves as its reference in tests and benchmarks.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from workers.errors import ConfigError
from workers.methods.dpkps.config import check_class_contrast, check_noise_floor, check_temperature
from workers.methods.dpkps.density.exact import ExactKDE
from workers.methods.dpkps.density.random_features import DPKDE
from workers.methods.dpkps.features import RandomFourierFeatures, feature_map
from workers.methods.dpkps.noise import noise_std


def draw(
    scores: torch.Tensor,
    *,
    temperature: float,
    generator: torch.Generator,
    banned: torch.Tensor | None = None,
) -> torch.Tensor:
    """One index per row of ``scores`` (Q × V), ``p ∝ clip(s, 0)^(1/τ)``.

    Uniform draws come from a CPU generator, so the same seed gives the same sequences
    on every device (up to float ties).
    """
    s = scores.to(torch.float64).clamp_min(0.0)
    allowed = torch.ones_like(s, dtype=torch.bool) if banned is None else ~banned
    s = torch.where(allowed, s, torch.zeros_like(s))
    peak = s.amax(dim=1, keepdim=True)
    positive = peak > 0
    with torch.no_grad():
        rel = torch.where(positive, s / torch.where(positive, peak, torch.ones_like(peak)), s)
        weights = torch.where(rel > 0, rel.pow(1.0 / temperature), torch.zeros_like(rel))
    # underflow of tiny weights at low temperature, or no positive score: uniform fallback
    empty = weights.sum(dim=1, keepdim=True) <= 0
    weights = torch.where(empty & allowed, torch.ones_like(weights), weights)
    cdf = weights.cumsum(dim=1).cpu()
    total = cdf[:, -1:]
    u = torch.rand(cdf.shape[0], 1, generator=generator, dtype=torch.float64) * total
    idx = torch.searchsorted(cdf, u, right=True).clamp_max(cdf.shape[1] - 1)
    return idx.squeeze(1).to(scores.device)


def score_noise_std(kde: DPKDE) -> float:
    """Standard deviation of the DP noise in a score ``s(y) = Σ_k F̃_k f_k(y)``.

    The noise part is ``Σ_k Z_k f_k(y)`` with ``Z_k`` independent of standard deviation
    ``s`` (Laplace ``√2·b``, Gaussian σ), so its variance is ``s² · ‖f(y)‖²``;
    ``‖f(y)‖² = Σ_k 2cos²(·) = I + Σ_k cos(2·)``, which is ``I`` up to ``O(√I)``. The
    result depends only on public quantities (``I`` and the noise scale), so using it is
    post-processing.
    """
    return math.sqrt(kde.num_features) * noise_std(kde.event)


def bag_scores(kde: DPKDE, embeddings: torch.Tensor, rff: RandomFourierFeatures) -> torch.Tensor:
    """``s(e_v)`` for every candidate ``v`` (one pass, one product)."""
    phase = rff.project(embeddings, 0, kde.num_features)
    feats = feature_map(phase, rff.phases(kde.num_features))
    weights = torch.as_tensor(kde.noisy_sum, dtype=feats.dtype, device=feats.device)
    return feats @ weights


def _gemm(
    weights: torch.Tensor,
    prefix_phase: torch.Tensor,
    block_phase: torch.Tensor,
    scale: float,
    beta: torch.Tensor,
) -> torch.Tensor:
    """Scores (Q × V) of all candidates after ``Q`` prefixes: two matrix products.

    ``prefix_phase`` (Q × I) is ``Σ_{b<t} √2/σ ω_bᵀ e_{p_b}``; ``block_phase`` (V × I) is
    ``√2/σ ω_tᵀ e_w`` for every candidate ``w``; ``scale`` is ``1/√B``.
    """
    a = beta + scale * prefix_phase
    g = scale * block_phase
    w = math.sqrt(2.0) * weights
    return (torch.cos(a) * w) @ torch.cos(g).T - (torch.sin(a) * w) @ torch.sin(g).T


def structure_for(step: int, structures: Sequence[DPKDE]) -> DPKDE:
    """The structure with the fewest blocks that holds a prefix of ``step + 1`` phrases."""
    for kde in sorted(structures, key=lambda k: k.blocks):
        if kde.blocks >= step + 1:
            return kde
    raise ConfigError("no structure is long enough for the sequence", field="sequence_length")


def gemm_scores(
    kde: DPKDE,
    embeddings: torch.Tensor,
    rff: RandomFourierFeatures,
    prefixes: torch.Tensor,
) -> torch.Tensor:
    """Scores (Q × V) of every candidate after each prefix (Q × (t−1)) by the GEMM form."""
    features, (q, done) = kde.num_features, prefixes.shape
    beta = rff.phases(features)
    acc = torch.zeros(q, features, dtype=beta.dtype, device=beta.device)
    for b in range(done):
        acc += rff.project(embeddings[prefixes[:, b].to(beta.device)], b, features)
    weights = torch.as_tensor(kde.noisy_sum, dtype=beta.dtype, device=beta.device)
    block_phase = rff.project(embeddings, done, features)
    return _gemm(weights, acc, block_phase, 1.0 / math.sqrt(kde.blocks), beta)


def _check_distinct_length(length: int, vocab: int) -> int:
    """``vocab``, once sequences of ``length`` distinct phrases are known to fit in it."""
    if length > vocab:
        raise ConfigError(
            f"sequences of {length} distinct phrases need at least {length} phrases in the "
            f"private vocabulary (it has {vocab})",
            field="sequence_length",
        )
    return vocab


def _draw_sequences(
    scorer: _Scorer,
    vocab: int,
    count: int,
    length: int,
    *,
    temperature: float,
    generator: torch.Generator,
    distinct: bool,
) -> torch.Tensor:
    if distinct:
        _check_distinct_length(length, vocab)
    out = torch.zeros(count, length, dtype=torch.long)
    banned = torch.zeros(count, vocab, dtype=torch.bool) if distinct else None
    for t in range(length):
        scores = scorer.scores(t) - scorer.floor(t)
        mask = None if banned is None else banned.to(scores.device)
        pick = draw(scores, temperature=temperature, generator=generator, banned=mask).cpu()
        out[:, t] = pick
        if banned is not None:
            banned[torch.arange(count), pick] = True
        scorer.advance(t, pick)
    return out


class _Scorer(ABC):
    """Scores of all candidates at step ``t`` for a batch of sequences being drawn."""

    @abstractmethod
    def scores(self, t: int) -> torch.Tensor: ...

    @abstractmethod
    def floor(self, t: int) -> float:
        """What is subtracted from the scores of step ``t`` before clipping at 0."""

    def advance(self, t: int, pick: torch.Tensor) -> None:  # noqa: B027 - no-op by default
        """Account for the phrases just drawn at step ``t``."""


class _BagScorer(_Scorer):
    def __init__(self, scores: torch.Tensor, count: int, floor: float) -> None:
        self._scores = scores.unsqueeze(0).expand(count, -1)
        self._floor = floor

    def scores(self, t: int) -> torch.Tensor:
        return self._scores

    def floor(self, t: int) -> float:
        return self._floor


class _PrefixScorer(_Scorer):
    """Keeps each prefix's phase ``A`` and updates it by the drawn phrase: O(V·I·Q) a step."""

    def __init__(
        self,
        structures: Sequence[DPKDE],
        embeddings: torch.Tensor,
        rff: RandomFourierFeatures,
        count: int,
        noise_floor: float,
    ) -> None:
        self.structures, self.embeddings, self.rff = structures, embeddings, rff
        self.noise_floor = noise_floor
        self.features = structures[0].num_features
        self.beta = rff.phases(self.features)
        dev, dtype = self.beta.device, self.beta.dtype
        self.weights = {
            k.blocks: torch.as_tensor(k.noisy_sum, dtype=dtype, device=dev) for k in structures
        }
        self.acc = torch.zeros(count, self.features, dtype=dtype, device=dev)
        self.block_phase = torch.zeros(0)

    def scores(self, t: int) -> torch.Tensor:
        kde = structure_for(t, self.structures)
        self.block_phase = self.rff.project(self.embeddings, t, self.features)
        return _gemm(
            self.weights[kde.blocks],
            self.acc,
            self.block_phase,
            1.0 / math.sqrt(kde.blocks),
            self.beta,
        )

    def floor(self, t: int) -> float:
        return self.noise_floor * score_noise_std(structure_for(t, self.structures))

    def advance(self, t: int, pick: torch.Tensor) -> None:
        self.acc += self.block_phase[pick.to(self.acc.device)]


def floored_bag_scores(
    kde: DPKDE, embeddings: torch.Tensor, rff: RandomFourierFeatures, *, noise_floor: float
) -> torch.Tensor:
    """``clip(s(e_v) − noise_floor · std, 0)`` for every candidate ``v`` of one class."""
    floor = check_noise_floor(noise_floor) * score_noise_std(kde)
    return (bag_scores(kde, embeddings, rff) - floor).clamp_min(0.0)


def floored_density(kde: ExactKDE, *, noise_floor: float) -> torch.Tensor:
    """``clip(s(v) − noise_floor · std, 0)`` from an exact-kernel release (one class)."""
    floor = check_noise_floor(noise_floor) * kde.noise_std
    return (torch.as_tensor(kde.noisy_density, dtype=torch.float64) - floor).clamp_min(0.0)


def class_shares(scores: torch.Tensor, power: float) -> torch.Tensor:
    """``π_c(v)^power`` of :func:`class_contrast`: the factor it puts on each score, for
    scores that refine a class's (its cells' directions). Post-processing.

    >>> s = torch.tensor([[4.0, 4.0, 0.0], [4.0, 0.0, 4.0]])
    >>> class_shares(s, 1.0).tolist()
    [[0.5, 1.0, 0.0], [0.5, 0.0, 1.0]]
    """
    power = check_class_contrast(power)
    s = scores.clamp_min(0.0).to(torch.float64)
    tiny = torch.finfo(s.dtype).tiny
    rel = s / s.sum(dim=1, keepdim=True).clamp_min(tiny)
    share = rel / rel.sum(dim=0, keepdim=True).clamp_min(tiny)
    return share.pow(power) if power else torch.ones_like(share)


def class_contrast(scores: torch.Tensor, power: float) -> torch.Tensor:
    """Weight each class's clipped scores by how much of a phrase's mass is that class's.

    ``scores`` (C × V) are the clipped bag scores of the C classes. Each row is turned
    into a distribution ``r_c(v) = s_c(v) / Σ_u s_c(u)``; the share of class ``c`` in
    phrase ``v`` is ``π_c(v) = r_c(v) / Σ_c' r_c'(v)``, and the result is
    ``s_c(v) · π_c(v)^power``. A phrase every class uses alike ("said", a weekday) keeps
    ``1/C`` of its weight per factor, a phrase one class owns keeps all of it. ``power``
    0 returns the scores unchanged. It reads only released scores: post-processing.

    >>> s = torch.tensor([[4.0, 4.0, 0.0], [4.0, 0.0, 4.0]])
    >>> class_contrast(s, 1.0).tolist()
    [[2.0, 4.0, 0.0], [2.0, 0.0, 4.0]]
    """
    if check_class_contrast(power) == 0:
        return scores
    # Entries are ≥ 0, so a zero row or column sum has only zeros above it: dividing by
    # a tiny positive number instead (in class_shares) leaves them 0.
    s = scores.clamp_min(0.0).to(torch.float64)
    return (s * class_shares(scores, power)).to(scores.dtype)


def sample_from_scores(
    scores: torch.Tensor,
    *,
    count: int,
    length: int,
    temperature: float,
    generator: torch.Generator,
    distinct: bool = True,
) -> torch.Tensor:
    """``count`` sequences of ``length`` draws ``p ∝ scores^(1/τ)`` (independent mode).

    With distinct phrases, the draws are made at once by the Gumbel top-k trick: the
    ``length`` largest of ``log p(v) + G_v`` (``G`` standard Gumbel, fresh per sequence), in
    order, are distributed exactly as ``length`` successive draws without replacement
    (Vieira 2014; Kool et al. 2019), at the cost of one draw instead of ``length``.
    Phrases with no positive score come after every positive one, in uniform random order:
    the uniform fallback of :func:`draw` once a sequence has used up the positive ones.
    """
    temperature = check_temperature(temperature)
    if distinct:
        return _gumbel_sequences(
            scores, count, length, temperature=temperature, generator=generator
        )
    return _draw_sequences(
        _BagScorer(scores, count, 0.0),
        scores.shape[0],
        count,
        length,
        temperature=temperature,
        generator=generator,
        distinct=distinct,
    )


SELECTION_BATCH = 4096  # sequences whose mean embedding is computed at once


def nearest_sequences(
    drawn: torch.Tensor, embeddings: torch.Tensor, direction: torch.Tensor, count: int
) -> torch.Tensor:
    """The ``count`` rows of ``drawn`` (sequences of phrase indices) whose phrases' mean
    public embedding has the largest cosine with ``direction``, in their drawn order.
    Reads only drawn indices, public embeddings and a released direction: post-processing.

    >>> e = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
    >>> nearest_sequences(torch.tensor([[1, 2], [0, 2], [0, 1]]), e, torch.tensor([1.0, 0.0]), 2)
    tensor([[0, 2],
            [0, 1]])
    """
    if count > drawn.shape[0]:
        raise ConfigError("cannot keep more sequences than were drawn", field="sequence_selection")
    if count <= 0:
        return drawn[:0]
    phrases = embeddings.to(torch.float64)
    unit = direction.to(phrases) / direction.to(phrases).norm().clamp_min(1e-300)
    rows = drawn.to(phrases.device)
    parts = []
    for start in range(0, rows.shape[0], SELECTION_BATCH):  # memory: batch × L × d
        mean = phrases[rows[start : start + SELECTION_BATCH]].mean(dim=1)
        parts.append((mean @ unit / mean.norm(dim=1).clamp_min(1e-300)).cpu())
    cos = torch.cat(parts)
    keep = torch.sort(torch.argsort(-cos, stable=True)[:count]).values
    return drawn[keep.to(drawn.device)]


def consistent_sequences(
    vectors: NDArray[np.floating[Any]],
    own: Sequence[int],
    directions: NDArray[np.floating[Any]],
    owners: Sequence[int] | None = None,
) -> NDArray[np.bool_]:
    """Which sequences to keep: those whose embedding (a row of ``vectors``, in the release's
    coordinates) has the largest cosine with one of its own class's released directions
    among all the classes'. ``directions`` holds one direction per class (row ``c`` is class
    ``c``'s), or, given ``owners`` (the class of each row), several: a class's cells, so that
    a sequence drawn near one of its class's cells is kept where that cell, not the class's
    combined sum, is the nearest. Reads only the sequences' public embeddings and the
    released directions: post-processing.

    >>> vectors = np.array([[1.0, 0.1], [1.0, 0.1], [0.0, 1.0]])
    >>> consistent_sequences(vectors, [0, 1, 1], np.array([[2.0, 0.0], [0.0, 0.5]])).tolist()
    [True, False, True]
    >>> cells = np.array([[2.0, 0.0], [0.0, 0.5], [3.0, 0.3]])  # class 1 has a second cell
    >>> consistent_sequences(vectors, [0, 1, 1], cells, owners=[0, 1, 1]).tolist()
    [False, True, True]
    """
    rows = np.asarray(vectors, dtype=np.float64)
    sums = np.asarray(directions, dtype=np.float64)
    labels = np.asarray(own, dtype=np.int64)
    owner = np.arange(len(sums)) if owners is None else np.asarray(owners, dtype=np.int64)
    if rows.ndim != 2 or sums.ndim != 2 or rows.shape[1] != sums.shape[1]:
        raise ConfigError(
            "one row per sequence, one direction per class", field="consistency_filter"
        )
    if owner.shape != (len(sums),) or (owner.size and owner.min() < 0):
        raise ConfigError("one class index per direction", field="consistency_filter")
    if labels.shape != (rows.shape[0],) or (
        labels.size and not 0 <= labels.min() <= labels.max() <= owner.max(initial=-1)
    ):
        raise ConfigError("one class index per sequence", field="consistency_filter")
    units = sums / np.maximum(np.linalg.norm(sums, axis=1, keepdims=True), 1e-300)
    keep: NDArray[np.bool_] = owner[np.argmax(rows @ units.T, axis=1)] == labels
    return keep


def sample_near_direction(
    scores: torch.Tensor,
    embeddings: torch.Tensor,
    direction: torch.Tensor | None,
    *,
    count: int,
    factor: int,
    length: int,
    temperature: float,
    generator: torch.Generator,
    distinct: bool = True,
) -> torch.Tensor:
    """``factor`` × ``count`` sequences drawn as :func:`sample_from_scores` does, then the
    ``count`` whose phrases lie nearest ``direction`` together (:func:`nearest_sequences`).
    Independent draws scatter a sequence's phrases over everything its class scores;
    keeping the sequences whose phrases agree on the released direction keeps them on one
    subject. ``factor`` 1 is :func:`sample_from_scores` (no direction needed).
    Post-processing."""
    if factor < 1:
        raise ConfigError("must be ≥ 1", field="sequence_selection")
    if factor > 1 and direction is None:
        raise ConfigError(
            "selecting sequences needs a released direction", field="sequence_selection"
        )
    drawn = sample_from_scores(
        scores,
        count=count * factor,
        length=length,
        temperature=temperature,
        generator=generator,
        distinct=distinct,
    )
    if factor == 1 or direction is None:
        return drawn
    return nearest_sequences(drawn, embeddings, direction, count)


GUMBEL_BATCH = 256  # sequences per Gumbel batch: memory stays batch × |Ṽ|
_BELOW = 1e12  # keys of phrases without a positive score sit this far below the rest


def _gumbel_sequences(
    scores: torch.Tensor,
    count: int,
    length: int,
    *,
    temperature: float,
    generator: torch.Generator,
) -> torch.Tensor:
    """``count`` sequences of ``length`` distinct phrases, ``p ∝ clip(scores, 0)^(1/τ)``
    drawn without replacement (see :func:`sample_from_scores`)."""
    vocab = _check_distinct_length(length, scores.shape[0])
    s = scores.to(torch.float64).cpu().clamp_min(0.0)
    positive = s > 0
    logs = torch.where(positive, s.clamp_min(1e-300).log() / temperature, torch.zeros_like(s))
    if positive.any():
        logs = logs - logs[positive].max()  # the largest positive key near 0
    base = torch.where(positive, logs.clamp_min(-_BELOW / 2), torch.full_like(s, -_BELOW))
    out = torch.zeros(count, length, dtype=torch.long)
    for start in range(0, count, GUMBEL_BATCH):
        rows = min(GUMBEL_BATCH, count - start)
        u = torch.rand(rows, vocab, generator=generator, dtype=torch.float64)
        gumbel = -torch.log(-torch.log(u.clamp(1e-300, 1.0 - 1e-16)))
        out[start : start + rows] = torch.topk(base + gumbel, length, dim=1).indices
    return out.to(scores.device)


def sample_independent(
    kde: DPKDE,
    embeddings: torch.Tensor,
    rff: RandomFourierFeatures,
    *,
    count: int,
    length: int,
    temperature: float,
    generator: torch.Generator,
    distinct: bool = True,
    noise_floor: float = 0.0,
) -> torch.Tensor:
    """``count`` sequences of ``length`` draws from one bag structure (count × length).

    ``noise_floor`` (in standard deviations of the score noise, see
    :func:`score_noise_std`) is subtracted before clipping: candidates whose score is
    within the noise are not drawn. 0 is the paper's plain clipping.
    """
    return sample_from_scores(
        floored_bag_scores(kde, embeddings, rff, noise_floor=noise_floor),
        count=count,
        length=length,
        temperature=temperature,
        generator=generator,
        distinct=distinct,
    )


def sample_iterative(
    structures: Sequence[DPKDE],
    embeddings: torch.Tensor,
    rff: RandomFourierFeatures,
    *,
    count: int,
    length: int,
    temperature: float,
    generator: torch.Generator,
    distinct: bool = True,
    batch_size: int = 1024,
    noise_floor: float = 0.0,
) -> torch.Tensor:
    """Prefix-conditioned sequences by the exact GEMM scorer (count × length)."""
    temperature = check_temperature(temperature)
    noise_floor = check_noise_floor(noise_floor)
    ordered = sorted(structures, key=lambda k: k.blocks)
    if not ordered or ordered[0].blocks < 1:
        raise ConfigError("the iterative mode needs sequence structures", field="mode")
    if any(k.num_features != ordered[0].num_features for k in ordered):
        raise ConfigError("all structures of a class must share I", field="num_features")
    parts = [
        _draw_sequences(
            _PrefixScorer(ordered, embeddings, rff, min(batch_size, count - start), noise_floor),
            embeddings.shape[0],
            min(batch_size, count - start),
            length,
            temperature=temperature,
            generator=generator,
            distinct=distinct,
        )
        for start in range(0, count, batch_size)
    ]
    return torch.cat(parts, dim=0) if parts else torch.zeros(0, length, dtype=torch.long)


def direct_scores(
    kde: DPKDE,
    embeddings: torch.Tensor,
    rff: RandomFourierFeatures,
    prefix: Sequence[int],
) -> torch.Tensor:
    """Reference: ``s(Pw)`` for every candidate ``w`` by the literal random-feature formula.

    Builds each query vector ``y = (e_{p_1}, …, e_{p_t−1}, e_w, 0, …)/√B`` in ``R^{B·d}``
    and evaluates ``Σ_k F̃_k √2 cos(√2 ω_kᵀ y/σ + β_k)``. Cost ``O(|Ṽ| · I · d · t)``.
    """
    blocks, features = kde.blocks, kde.num_features
    t = len(prefix) + 1
    if not 1 <= t <= blocks:
        raise ConfigError("prefix too long for this structure", field="sequence_length")
    vocab, dim = embeddings.shape
    dev, dtype = rff.beta.device, rff.beta.dtype
    omega = rff.omega[:t, :, :features].reshape(t * dim, features)  # blocks beyond t meet zeros
    scale = 1.0 / (math.sqrt(blocks) * rff.bandwidth)
    head = embeddings[torch.as_tensor(list(prefix), dtype=torch.long, device=dev)].reshape(-1)
    queries = torch.cat([head.expand(vocab, -1), embeddings], dim=1).to(dtype) * scale
    feats = math.sqrt(2.0) * torch.cos(math.sqrt(2.0) * (queries @ omega) + rff.phases(features))
    return feats @ torch.as_tensor(kde.noisy_sum, dtype=dtype, device=dev)
