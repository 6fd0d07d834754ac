"""The noisy class counts shrunk before a total is split by them (post-processing).

At a small ε the counts' Gaussian noise (σ ≈ 14 at ε = 1, δ = 1e-6) is as large as a
class of a few dozen documents, so a split by the counts as released gives some classes
nothing and others double. :func:`shrunk_counts` pulls them towards their mean by the
positive-part James–Stein rule, with the counts' public noise scale. Checked here: on
balanced classes under that noise it splits evenly and errs far less than the released
counts; on counts far apart it leaves them almost as released; the pipeline applies it
with its count release's own σ and spends nothing more.
"""

from __future__ import annotations

import doctest
from collections import Counter
from typing import Any

import numpy as np
import pytest

from tests.core.dpkps.test_pipeline import TOPICS, corpus
from workers.errors import ConfigError
from workers.methods import proportions
from workers.methods.dpkps import stages
from workers.methods.dpkps.config import GenerationConfig
from workers.methods.dpkps.pipeline import generate_sequences
from workers.methods.proportions import allocate, shrunk_counts
from workers.text.embeddings import SentenceEmbedder
from workers.text.vocabulary import Vocabulary

SIGMA = 14.0  # the class counts' σ at ε = 1, δ = 1e-6 (a total Gaussian budget)


def labelled(values: np.ndarray) -> dict[str, float]:
    return {f"c{i}": float(v) for i, v in enumerate(values)}


def test_doctests_hold() -> None:
    assert doctest.testmod(proportions, raise_on_error=True).attempted >= 6


def test_balanced_classes_under_large_noise_split_evenly_and_err_less() -> None:
    """24 classes of 20 documents (the small hospital's tuning shape) at ε = 1."""
    rng = np.random.default_rng(0)
    true = np.full(24, 20.0)
    raw_error, shrunk_error, raw_empty, shrunk_empty = [], [], 0, 0
    for _ in range(400):
        noisy = labelled(true + rng.normal(0.0, SIGMA, true.size))
        shrunk = shrunk_counts(noisy, SIGMA)
        raw_error.append(sum((noisy[k] - 20.0) ** 2 for k in noisy))
        shrunk_error.append(sum((shrunk[k] - 20.0) ** 2 for k in shrunk))
        raw_empty += sum(n == 0 for n in allocate(2000, noisy).values())
        shrunk_empty += sum(n == 0 for n in allocate(2000, shrunk).values())
    # the released counts leave about one class in 13 without a sequence (P(ñ < 0) = 0.08;
    # 707 of 9,600 here), the shrunk ones about one in 1,600 (6); given a σ half the true
    # one, the same rule leaves 332 and errs 0.62 as much as the released counts (0.09 here)
    assert raw_empty > 500
    assert shrunk_empty < 30
    assert np.mean(shrunk_error) < 0.2 * np.mean(raw_error)


def test_counts_far_apart_are_kept_almost_as_released() -> None:
    rng = np.random.default_rng(1)
    true = np.array([1200.0, 600.0, 300.0, 150.0, 80.0, 40.0, 20.0, 10.0])
    noisy = labelled(true + rng.normal(0.0, SIGMA, true.size))
    shrunk = shrunk_counts(noisy, SIGMA)
    for k in noisy:
        assert shrunk[k] == pytest.approx(noisy[k], abs=0.02 * 1200)
    order = sorted(noisy, key=noisy.__getitem__)
    assert sorted(shrunk, key=shrunk.__getitem__) == order


def test_a_total_of_the_counts_is_kept() -> None:
    rng = np.random.default_rng(2)
    noisy = labelled(rng.normal(50.0, SIGMA, 10))
    assert sum(shrunk_counts(noisy, SIGMA).values()) == pytest.approx(sum(noisy.values()))


def test_fewer_than_four_counts_are_returned_as_released() -> None:
    noisy = {"a": 3.0, "b": -4.0, "c": 40.0}
    assert shrunk_counts(noisy, SIGMA) == noisy


@pytest.mark.parametrize("value", [float("nan"), -1.0, float("inf")])
def test_a_bad_noise_scale_names_its_field(value: float) -> None:
    with pytest.raises(ConfigError) as caught:
        shrunk_counts({"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0}, value)
    assert caught.value.field == "noise_std"


def test_the_pipeline_splits_by_the_shrunk_counts_at_its_own_sigma(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Five declared labels (two without documents), a total Gaussian budget of ε = 1: the
    sequences per class are the split of the total by the released counts shrunk with the
    count release's σ, and the run's releases are those it planned."""
    seen: list[Any] = []
    released = stages.noisy_class_counts

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(released(*args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(stages, "noisy_class_counts", spy)
    texts, labels = corpus(per_class=12)
    label_set = [*TOPICS, "oncology", "paediatrics"]
    phrases = [p for words in TOPICS.values() for p in words] + ["zz unrelated"]
    cfg = GenerationConfig(
        epsilon=1.0, delta=1e-6, noise="gaussian", per_class=None, total=500,
        sequence_length=3, public_vocabulary_size=16, seed=3,
        consistency_filter=False,  # the split itself, not what the filter keeps of it
    )  # fmt: skip
    result = generate_sequences(
        texts, labels, label_set=label_set, vocabulary=Vocabulary.from_phrases("t", phrases),
        config=cfg, embedder=SentenceEmbedder(),
    )  # fmt: skip
    assert result.report.as_planned
    [(noisy, event)] = seen
    assert event.mechanism == "class_counts" and event.noise == "gaussian"
    expected = allocate(500, shrunk_counts(noisy, event.scale))
    got = Counter(s.label for s in result.sequences)
    assert {label: got.get(label, 0) for label in label_set} == expected
