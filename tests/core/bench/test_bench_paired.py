"""The paired diagnostic of the low-ε benchmark: seeded releases inside its block only, the
engine's OpenDP samplers everywhere else, and the variants it compares."""

from __future__ import annotations

import doctest

import numpy as np
import pytest

import workers.methods.dpkps.stages as dpkps_stages
import workers.privacy.noise as samplers
from benchmarks import paired
from tests.privacy_audit import planned
from workers.methods.dpkps.noise import release_counts, release_vector


def test_the_seeded_samplers_exist_only_inside_the_block() -> None:
    opendp = samplers.gaussian_noise, samplers.discrete_gaussian_noise
    with paired.seeded_noise(3):
        assert samplers.gaussian_noise is not opendp[0]
        assert samplers.discrete_gaussian_noise is not opendp[1]
    assert (samplers.gaussian_noise, samplers.discrete_gaussian_noise) == opendp
    with pytest.raises(RuntimeError), paired.seeded_noise(3):
        raise RuntimeError("a failed run")
    assert (samplers.gaussian_noise, samplers.discrete_gaussian_noise) == opendp


def _draws(seed: int, factor: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    with paired.seeded_noise(seed, sums_factor=factor):
        sums = samplers.gaussian_noise(np.zeros(20_000), scale=4.0)
        counts = samplers.discrete_gaussian_noise(np.zeros(20_000, dtype=np.int64), scale=14.0)
    return sums, counts


def test_one_seed_gives_the_same_releases_and_another_seed_others() -> None:
    first, again, other = _draws(1), _draws(1), _draws(2)
    np.testing.assert_array_equal(first[0], again[0])
    np.testing.assert_array_equal(first[1], again[1])
    assert not np.array_equal(first[0], other[0])
    # the requested scales (20,000 draws: the standard deviation within 3 %)
    assert np.std(first[0]) == pytest.approx(4.0, rel=0.03)
    assert np.std(first[1]) == pytest.approx(14.0, rel=0.03)
    assert first[1].dtype == np.int64


def test_scaling_the_sums_noise_keeps_every_later_draw_paired() -> None:
    full, half, none = _draws(5), _draws(5, 0.5), _draws(5, 0.0)
    np.testing.assert_allclose(half[0], 0.5 * full[0])
    np.testing.assert_array_equal(none[0], np.zeros(20_000))
    # the count release drawn after the sums is the same draw whatever the factor
    np.testing.assert_array_equal(half[1], full[1])
    np.testing.assert_array_equal(none[1], full[1])
    with pytest.raises(ValueError, match="sums-noise"), paired.seeded_noise(0, sums_factor=-1):
        pass


def test_the_engine_reads_the_seeded_samplers_through_the_module() -> None:
    """DP-KPS's Gaussian releases go through ``workers.privacy.noise``'s attributes, so the
    block reaches them (if the engine bound the function at import, the diagnostic would
    silently compare unpaired runs)."""
    sums = planned("gaussian", 1.0, multiplier=4.0, dimension=50)
    counts = planned("discrete_gaussian", 1.0, multiplier=14.0, dimension=50)

    def releases(seed: int) -> tuple[np.ndarray, np.ndarray]:
        with paired.seeded_noise(seed):
            vector, _ = release_vector(np.zeros(50), sums, sensitivity=1.0, name="t")
            noisy, _ = release_counts(
                np.zeros(50, dtype=np.int64), counts, sensitivity=1.0, name="t"
            )
        return vector, noisy

    one, two = releases(7), releases(7)
    np.testing.assert_array_equal(one[0], two[0])
    np.testing.assert_array_equal(one[1], two[1])
    # outside the block the engine's noise is OpenDP's, unseeded
    three, _ = release_vector(np.zeros(50), sums, sensitivity=1.0, name="t")
    assert not np.array_equal(one[0], three)


def test_exact_counts_split_the_total_by_the_private_counts_inside_the_block_only() -> None:
    original = dpkps_stages.split_by_counts
    noisy = {"a": 500.0, "b": -3.0, "c": 40.0}
    with paired.exact_counts(["a"] * 30 + ["b"] * 60 + ["c"] * 10):
        assert dpkps_stages.split_by_counts(100, noisy, 14.0) == {"a": 30, "b": 60, "c": 10}
    assert dpkps_stages.split_by_counts is original


def test_variants_and_seeds_parse_or_name_what_is_wrong() -> None:
    assert paired.parse_variant("defaults") == paired.Variant("defaults")
    assert paired.parse_variant("exact-counts").exact_counts
    assert paired.parse_variant("sums-noise=0.5").sums_factor == 0.5
    assert paired.parse_variant("set:consistency_filter=false,subspace=0").settings == {
        "consistency_filter": False,
        "subspace": 0,
    }
    for bad in ("nonsense", "set:", "set:=1", "sums-noise=x", "sums-noise=-1"):
        with pytest.raises(ValueError, match="variant"):
            paired.parse_variant(bad)
    assert paired.parse_seeds("0-3") == [0, 1, 2, 3]
    assert paired.parse_seeds("2,5") == [2, 5]
    for bad in ("a-b", "3-1", "-1"):
        with pytest.raises(ValueError, match="--seeds"):
            paired.parse_seeds(bad)


def test_summary_is_the_paired_difference_with_its_standard_error() -> None:
    s = paired.summary([0.30, 0.31, 0.32, 0.33], [0.31, 0.31, 0.34, 0.32])
    d = np.array([0.01, 0.0, 0.02, -0.01])
    assert s["mean"] == pytest.approx(0.32)
    assert s["difference"] == pytest.approx(d.mean())
    assert s["standard_error"] == pytest.approx(d.std(ddof=1) / 2, abs=1e-6)
    assert s["up"] == 2
    assert paired.summary([0.3], [0.2])["standard_error"] == 0.0
    with pytest.raises(ValueError, match="same"):
        paired.summary([0.3, 0.2], [0.3])


def test_the_module_examples_hold() -> None:
    assert doctest.testmod(paired).failed == 0
