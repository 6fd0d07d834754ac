"""The public Ṽ's extension: a larger public Ṽ for the classes whose released count is large.

An option, off by default (benchmarks/notes/2026-12-01-public-extension.md says why). With
class centroids, one cell and a total split by released class counts, a class whose released
(shrunk) count is at least ``extension_ratio`` times its class sum's noise σ samples from
the vocabulary's first ``public_extension`` phrases; every other class keeps the first
``public_vocabulary_size``. The rule reads released counts, the plan's σ and public phrases
only: post-processing, so a run with it makes exactly the releases of a run without it.
Checked here: it is off unless asked for, and refused where it cannot apply; the class
shares on Ṽ are unchanged by the extension; on a corpus of one large and two small classes
only the large one draws from the extension; and where no class reaches the ratio the run's
sequences are exactly those of a run without the extension (the same seeded releases).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from benchmarks.paired import seeded_noise
from tests.core.test_pipeline import FILLER, TOPICS
from workers.errors import ConfigError
from workers.methods.dpkps.config import (
    DEFAULT_EXTENSION_RATIO,
    GenerationConfig,
    method_description,
)
from workers.methods.dpkps.pipeline import generate_sequences
from workers.methods.dpkps.sampling import class_contrast, class_shares
from workers.text.embeddings import SentenceEmbedder
from workers.text.vocabulary import Vocabulary

TOTAL = dict(epsilon=1.0, delta=1e-6, noise="gaussian", per_class=None, total=600)


def test_the_extension_is_off_by_default_and_on_where_asked() -> None:
    cfg = GenerationConfig(**TOTAL).validate()  # type: ignore[arg-type]
    assert cfg.public_extension == 0 and cfg.extension_size == 0
    assert cfg.candidate_count == cfg.public_size
    assert "whose released count is at least" not in method_description(cfg)
    asked = dataclasses.replace(cfg, public_extension=100_000).validate()
    assert asked.extension_size == 100_000 and asked.candidate_count == 100_000
    assert asked.extension_ratio == DEFAULT_EXTENSION_RATIO
    assert asked.to_dict()["public_extension"] == 100_000
    assert "drawn from the first 100,000 public phrases" in method_description(asked)
    # no larger than |Ṽ|: nothing to extend
    same = dataclasses.replace(asked, public_vocabulary_size=100_000)
    assert same.validate().extension_size == 0 and same.to_dict()["public_extension"] == 0


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"public_extension": -1}, "public_extension"),
        ({"public_extension": True}, "public_extension"),
        ({"public_extension": 10**6}, "public_extension"),
        ({"extension_ratio": -0.5}, "extension_ratio"),
        ({"extension_ratio": float("nan")}, "extension_ratio"),
        ({"public_extension": 50_000, "total": None, "per_class": 20}, "public_extension"),
        ({"public_extension": 50_000, "centroid_cells": 4}, "public_extension"),
        ({"public_extension": 50_000, "kde_method": "exact"}, "public_extension"),
    ],
)
def test_a_bad_extension_names_its_field(changes: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        GenerationConfig(**{**TOTAL, **changes}).validate()  # type: ignore[arg-type]
    assert caught.value.field == field


def test_the_shares_on_the_public_vocabulary_ignore_the_extension() -> None:
    scores = torch.rand(4, 50, generator=torch.Generator().manual_seed(0)) + 0.01
    for power in (0.0, 1.0, 2.0):
        on_core = class_shares(scores[:, :30], power)
        assert torch.allclose(class_shares(scores, power, over=30)[:, :30], on_core)
        assert torch.allclose(
            class_contrast(scores, power, over=30)[:, :30], class_contrast(scores[:, :30], power)
        )


def skewed_corpus() -> tuple[list[str], list[str]]:
    """Cardiology with 150 documents, neurology and dermatology with 8 each: only
    cardiology's count can clear the ratio."""
    texts, labels = [], []
    for label, count in (("cardiology", 150), ("neurology", 8), ("dermatology", 8)):
        words = TOPICS[label]
        for i in range(count):
            picked = [words[i % 5], words[(i + 2) % 5], FILLER[i % len(FILLER)]]
            texts.append("The patient reports " + ", ".join(picked) + ".")
            labels.append(label)
    return texts, labels


# Ṽ: the fillers and one phrase of each topic; the extension: every other topic phrase
CORE = [*FILLER, *(words[0] for words in TOPICS.values())]
EXTENSION = [w for words in TOPICS.values() for w in words[1:]]


def run(cfg: GenerationConfig, seed: int = 0) -> list[tuple[str, tuple[str, ...]]]:
    texts, labels = skewed_corpus()
    vocabulary = Vocabulary.from_phrases("t", [*CORE, *EXTENSION])
    with seeded_noise(seed):
        result = generate_sequences(
            texts, labels, label_set=list(TOPICS), vocabulary=vocabulary, config=cfg,
            embedder=SentenceEmbedder(),
        )  # fmt: skip
    assert result.report.as_planned
    return [(s.label, s.keyphrases) for s in result.sequences]


BASE = GenerationConfig(
    **TOTAL, sequence_length=2, public_vocabulary_size=len(CORE),  # type: ignore[arg-type]
    public_extension=len(CORE) + len(EXTENSION), extension_ratio=10.0, seed=4,
    consistency_filter=False, label_prior=0.0,
)  # fmt: skip


def test_only_a_class_whose_released_count_clears_the_ratio_draws_from_the_extension() -> None:
    # σ ≈ 4.4 at ε = 1: the ratio 10 asks for about 44 documents; cardiology has 150
    sequences = run(BASE)
    used: dict[str, set[str]] = {label: set() for label in TOPICS}
    for owner, seq in sequences:
        used[owner].update(seq)
    assert used["cardiology"] & set(EXTENSION)
    for small in ("neurology", "dermatology"):
        assert used[small] and used[small] <= set(CORE)


def test_where_no_class_clears_the_ratio_the_run_is_the_run_without_the_extension() -> None:
    for seed in (0, 1):
        never = run(dataclasses.replace(BASE, extension_ratio=1e5), seed)
        off = run(dataclasses.replace(BASE, public_extension=0), seed)
        assert never == off
        assert {p for _, seq in never for p in seq} <= set(CORE)
