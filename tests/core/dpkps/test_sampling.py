"""Sampling from DP-KDE structures: the GEMM scorer is exact, draws follow the scores."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest
import torch

from tests.privacy_audit import planned
from workers.errors import ConfigError
from workers.methods.dpkps.config import ensemble_block_counts
from workers.methods.dpkps.density.random_features import DPKDE, build_class_ensemble
from workers.methods.dpkps.features import RandomFourierFeatures
from workers.methods.dpkps.sampling import (
    bag_scores,
    class_contrast,
    direct_scores,
    draw,
    gemm_scores,
    sample_from_scores,
    sample_independent,
    sample_iterative,
    structure_for,
)


def unit_rows(n: int, d: int, seed: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.nn.functional.normalize(torch.randn(n, d, generator=g, dtype=dtype), dim=1)


def ensemble(ensemble: str, length: int, *, dtype: torch.dtype = torch.float64, docs: int = 60):
    vocab, dim, features = 50, 16, 256
    emb = unit_rows(vocab, dim, 1, dtype)
    rff = RandomFourierFeatures(
        dim=dim, num_features=features, max_blocks=length, bandwidth=0.8, seed=2, dtype=dtype
    )
    rng = np.random.default_rng(3)
    corpus = [list(rng.permutation(vocab)[: rng.integers(1, length + 2)]) for _ in range(docs)]
    structures = build_class_ensemble(
        corpus,
        emb,
        rff,
        label="a",
        mode="iterative",
        ensemble=ensemble,
        length=length,
        planned=planned(
            "laplace",
            1.0,
            epsilon=50.0 / len(ensemble_block_counts(ensemble, length)),
            dimension=features,
            count=len(ensemble_block_counts(ensemble, length)),
        ),
        num_features=features,
    )
    return emb, rff, structures


def iterative(
    structures: Sequence[DPKDE],
    emb: torch.Tensor,
    rff: RandomFourierFeatures,
    *,
    count: int,
    length: int,
    temperature: float = 1.0,
    seed: int | None = None,
    **options: int,
) -> torch.Tensor:
    """``sample_iterative`` with a generator seeded by ``seed`` (unseeded if None)."""
    generator = torch.Generator() if seed is None else torch.Generator().manual_seed(seed)
    return sample_iterative(
        structures,
        emb,
        rff,
        count=count,
        length=length,
        temperature=temperature,
        generator=generator,
        **options,
    )


@pytest.mark.parametrize("kind", ["log", "linear"])
def test_gemm_scores_equal_direct_formula(kind: str) -> None:
    length = 6
    emb, rff, structures = ensemble(kind, length)
    assert [k.blocks for k in structures] == ensemble_block_counts(kind, length)
    rng = np.random.default_rng(4)
    for t in range(length):
        kde = structure_for(t, structures)
        prefix = [int(v) for v in rng.permutation(emb.shape[0])[:t]]
        direct = direct_scores(kde, emb, rff, prefix)
        gemm = gemm_scores(kde, emb, rff, torch.tensor([prefix], dtype=torch.long).reshape(1, t))
        scale = float(direct.abs().max())
        assert torch.allclose(gemm[0], direct, atol=1e-9 * scale, rtol=1e-9), (kind, t)


def test_gemm_scores_in_float32_within_tolerance() -> None:
    emb, rff, structures = ensemble("log", 4, dtype=torch.float32)
    kde = structure_for(2, structures)
    direct = direct_scores(kde, emb, rff, [3, 7])
    gemm = gemm_scores(kde, emb, rff, torch.tensor([[3, 7]]))[0]
    assert torch.allclose(gemm, direct, atol=1e-4 * float(direct.abs().max()))


def test_iterative_scorer_tracks_prefix_phases_exactly() -> None:
    """The incremental A += G update gives the same scores as recomputing from the prefix."""
    length = 5
    emb, rff, structures = ensemble("linear", length)
    seqs = iterative(structures, emb, rff, count=3, length=length, seed=0)
    assert seqs.shape == (3, length)
    for row in seqs.tolist():
        assert len(set(row)) == length  # distinct by default
        for t in range(1, length):
            kde = structure_for(t, structures)
            # the drawn phrase had a score that direct evaluation agrees on
            direct = direct_scores(kde, emb, rff, row[:t])
            gemm = gemm_scores(kde, emb, rff, torch.tensor([row[:t]]))[0]
            assert torch.allclose(gemm, direct, atol=1e-9 * float(direct.abs().max()))


def test_structure_for_picks_smallest_sufficient_block_count() -> None:
    _, _, structures = ensemble("log", 6)
    assert [structure_for(t, structures).blocks for t in range(6)] == [1, 2, 4, 4, 6, 6]
    with pytest.raises(ConfigError):
        structure_for(6, structures)


def test_zero_padding_does_not_change_the_sampling_distribution() -> None:
    """Scoring a prefix of length i with a B-block structure (B > i) only rescales scores
    by the same factor for every candidate when the noise is absent: the direct formula
    with padding equals the exact kernel sum up to one positive constant."""
    vocab, dim = 30, 8
    emb = unit_rows(vocab, dim, 7)
    docs = [[0, 1, 2, 3], [4, 5, 6, 7], [1, 2, 8, 9]]
    blocks = 4

    def exact(prefix: list[int], w: int) -> float:
        # Σ_docs exp(-‖x_doc − y‖²) with y zero-padded, all blocks scaled by 1/√B
        y = torch.zeros(blocks, dim, dtype=torch.float64)
        for b, v in enumerate([*prefix, w]):
            y[b] = emb[v]
        total = 0.0
        for d in docs:
            x = emb[torch.tensor(d)]
            total += math.exp(-float(((x - y) ** 2).sum()) / blocks)
        return total

    prefix = [2]
    values = np.array([exact(prefix, w) for w in range(vocab)])
    # padding blocks contribute exp(-‖x_b‖²/B) for b beyond the prefix, the same for all w
    unpadded = np.array(
        [
            sum(
                math.exp(
                    -float(
                        ((emb[torch.tensor(d[:2])] - emb[torch.tensor([*prefix, w])]) ** 2).sum()
                    )
                    / blocks
                )
                for d in docs
            )
            for w in range(vocab)
        ]
    )
    ratio = values / unpadded
    assert np.allclose(ratio, ratio[0], rtol=1e-12)


def test_draw_follows_clipped_tempered_scores() -> None:
    scores = torch.tensor([[4.0, 1.0, -3.0, 0.0]]).expand(40_000, -1)
    g = torch.Generator().manual_seed(1)
    picks = draw(scores, temperature=0.5, generator=g)
    freq = np.bincount(picks.numpy(), minlength=4) / picks.numel()
    expected = np.array([16.0, 1.0, 0.0, 0.0]) / 17.0  # clip at 0, then s^(1/τ) = s²
    assert np.allclose(freq, expected, atol=0.01)


def test_draw_falls_back_to_uniform_when_no_score_is_positive() -> None:
    scores = torch.tensor([[-1.0, -2.0, 0.0]]).expand(30_000, -1)
    picks = draw(scores, temperature=1.0, generator=torch.Generator().manual_seed(2))
    freq = np.bincount(picks.numpy(), minlength=3) / picks.numel()
    assert np.allclose(freq, 1 / 3, atol=0.015)


def test_draw_respects_banned_candidates_even_in_fallback() -> None:
    scores = torch.tensor([[-1.0, -1.0, -1.0]]).expand(1000, -1)
    banned = torch.tensor([[True, False, True]]).expand(1000, -1)
    picks = draw(scores, temperature=1.0, generator=torch.Generator().manual_seed(3), banned=banned)
    assert set(picks.tolist()) == {1}


def test_low_temperature_sharpens_without_underflow() -> None:
    scores = torch.tensor([[1e-3, 2e-3, 1e-30]])
    picks = draw(
        scores.expand(2000, -1), temperature=0.01, generator=torch.Generator().manual_seed(4)
    )
    assert set(picks.tolist()) == {1}


def test_independent_sequences_concentrate_on_the_class_phrases() -> None:
    """With little noise, a bag structure built on docs about phrases near a cluster draws
    from that cluster far more than from the rest of the vocabulary."""
    dim, per = 16, 20
    centre_a, centre_b = unit_rows(2, dim, 9)
    g = torch.Generator().manual_seed(10)
    near_a = torch.nn.functional.normalize(
        centre_a + 0.3 * torch.randn(per, dim, generator=g, dtype=torch.float64), dim=1
    )
    near_b = torch.nn.functional.normalize(
        centre_b + 0.3 * torch.randn(per, dim, generator=g, dtype=torch.float64), dim=1
    )
    emb = torch.cat([near_a, near_b])
    rff = RandomFourierFeatures(
        dim=dim, num_features=2048, max_blocks=1, seed=11, dtype=torch.float64
    )
    docs = [list(np.random.default_rng(i).permutation(per)[:5]) for i in range(500)]
    (kde,) = build_class_ensemble(
        docs,
        emb,
        rff,
        label="a",
        mode="independent",
        ensemble="log",
        length=4,
        planned=planned("laplace", 1.0, epsilon=20.0, dimension=2048),
        num_features=2048,
    )
    scores = bag_scores(kde, emb, rff)
    assert scores[:per].min() > scores[per:].max()
    seqs = sample_independent(
        kde,
        emb,
        rff,
        count=200,
        length=4,
        temperature=0.2,
        generator=torch.Generator().manual_seed(12),
    )
    assert (seqs < per).float().mean() > 0.9


def test_sampling_is_reproducible_for_a_seed() -> None:
    emb, rff, structures = ensemble("log", 4)
    a = iterative(structures, emb, rff, count=20, length=4, temperature=0.7, seed=5)
    b = iterative(structures, emb, rff, count=20, length=4, temperature=0.7, seed=5)
    assert torch.equal(a, b)


def test_batches_give_the_requested_number_of_sequences() -> None:
    emb, rff, structures = ensemble("log", 3)
    seqs = iterative(structures, emb, rff, count=25, length=3, seed=6, batch_size=10)
    assert seqs.shape == (25, 3)


def test_distinct_sequences_longer_than_vocabulary_are_refused() -> None:
    emb, rff, structures = ensemble("log", 3)
    with pytest.raises(ConfigError) as err:
        iterative(structures, emb[:2], rff, count=1, length=3)
    assert err.value.field == "sequence_length"


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan])
def test_temperature_must_be_positive_and_finite(bad: float) -> None:
    emb, rff, structures = ensemble("log", 2)
    with pytest.raises(ConfigError) as err:
        iterative(structures, emb, rff, count=1, length=2, temperature=bad)
    assert err.value.field == "temperature"


def test_class_contrast_keeps_owned_phrases_and_shrinks_shared_ones() -> None:
    # Two classes of equal mass. Phrase 0 is shared alike, 1 belongs to the first class,
    # 2 to the second, 3 to neither (clipped to 0 by the noise floor).
    scores = torch.tensor([[6.0, 6.0, 0.0, 0.0], [6.0, 0.0, 6.0, 0.0]], dtype=torch.float64)
    for power in (0.5, 1.0, 2.0):
        out = class_contrast(scores, power)
        assert torch.allclose(out[:, 0], torch.full((2,), 6.0 * 0.5**power, dtype=out.dtype))
        assert out[0, 1] == 6.0 and out[1, 2] == 6.0
        assert out[0, 2] == 0 and out[1, 1] == 0 and not out[:, 3].any()
    assert class_contrast(scores, 0.0) is scores


def test_class_contrast_compares_shares_not_raw_scores() -> None:
    # The second class has ten times the mass (more documents); a phrase that takes the
    # same share of both classes' mass is shared, whatever the raw scores say.
    scores = torch.tensor([[1.0, 1.0], [10.0, 10.0]], dtype=torch.float64)
    assert torch.allclose(class_contrast(scores, 1.0), scores * 0.5)
    empty = torch.zeros(2, 3, dtype=torch.float64)  # a class with nothing above the floor
    assert not class_contrast(empty, 1.0).any()


@pytest.mark.parametrize("bad", [-0.1, math.inf, math.nan])
def test_class_contrast_power_must_be_finite_and_non_negative(bad: float) -> None:
    with pytest.raises(ConfigError) as err:
        class_contrast(torch.ones(2, 2), bad)
    assert err.value.field == "class_contrast"


def test_contrast_moves_draws_towards_owned_phrases() -> None:
    scores = torch.tensor([[6.0, 6.0, 0.0], [6.0, 0.0, 6.0]], dtype=torch.float64)
    g = torch.Generator().manual_seed(5)
    plain = sample_from_scores(scores[0], count=4000, length=1, temperature=1.0, generator=g)
    g = torch.Generator().manual_seed(5)
    weighted = class_contrast(scores, 1.0)[0]
    sharp = sample_from_scores(weighted, count=4000, length=1, temperature=1.0, generator=g)
    # p(shared) is 1/2 without contrast and (6·½)/(6·½ + 6) = 1/3 with it
    assert abs(float((plain == 0).double().mean()) - 0.5) < 0.03
    assert abs(float((sharp == 0).double().mean()) - 1 / 3) < 0.03
    assert not (sharp == 2).any()


def test_distinct_draws_are_successive_draws_without_replacement() -> None:
    """The Gumbel top-k draws of sample_from_scores against the exact law of drawing one
    phrase after another without replacement, p ∝ s^(1/τ): ordered pairs, then the
    uniform order of the phrases with no positive score once the others are used up."""
    scores = torch.tensor([4.0, 2.0, 1.0, 0.5, 0.0, -1.0], dtype=torch.float64)
    tau, count = 0.7, 60_000
    g = torch.Generator().manual_seed(11)
    drawn = sample_from_scores(scores, count=count, length=6, temperature=tau, generator=g)
    assert all(sorted(r) == list(range(6)) for r in drawn[:500].tolist())  # distinct
    w = scores.clamp_min(0.0).pow(1.0 / tau)
    p = (w / w.sum()).tolist()
    chi2, cells = 0.0, 0
    for a in range(4):
        for b in range(4):
            if a == b:
                continue
            expected = count * p[a] * p[b] / (1.0 - p[a])
            seen = int(((drawn[:, 0] == a) & (drawn[:, 1] == b)).sum())
            chi2 += (seen - expected) ** 2 / expected
            cells += 1
    # 11 degrees of freedom: P(χ² > 35) < 0.001; a law off by a few % per cell fails
    assert chi2 < 35, chi2
    # phrases 4 and 5 (no positive score) come last, each first of the two half the time
    assert set(drawn[:, 4:].flatten().tolist()) == {4, 5}
    assert abs(float((drawn[:, 4] == 4).double().mean()) - 0.5) < 0.01
    # the old step-by-step sampler gives the same first-draw law
    g = torch.Generator().manual_seed(12)
    first = sample_from_scores(scores, count=count, length=1, temperature=tau, generator=g)
    step = draw(scores.expand(count, -1), temperature=tau, generator=g)
    for v in range(4):
        assert abs(float((first == v).double().mean()) - p[v]) < 0.01
        assert abs(float((step == v).double().mean()) - p[v]) < 0.01
