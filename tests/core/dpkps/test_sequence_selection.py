"""Sequence selection for class centroids: draw F× the sequences, keep the 1/F whose phrases
lie nearest the released direction (post-processing of the releases with the public model).

What is checked here: the kept sequences are the ones nearest the direction, F = 1 is the
plain draw, the selection spends nothing (a run with it makes exactly the releases of a run
without it), it keeps a class's sequences on the class's own phrases, and a bad F names its
field in the engine, the job spec and the CLI.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from app.jobs.schemas import JobSpec
from tests.core.dpkps import invalid_field
from workers.errors import ConfigError
from workers.methods.dpkps.config import DEFAULT_SELECTION, MAX_SELECTION, GenerationConfig
from workers.methods.dpkps.sampling import (
    nearest_sequences,
    sample_from_scores,
    sample_near_direction,
)

D = 16


def unit(rows: torch.Tensor) -> torch.Tensor:
    return rows / rows.norm(dim=-1, keepdim=True)


def test_the_kept_sequences_are_those_whose_phrases_lie_nearest_the_direction() -> None:
    g = torch.Generator().manual_seed(0)
    embeddings = unit(torch.randn(200, D, generator=g, dtype=torch.float64))
    direction = torch.randn(D, generator=g, dtype=torch.float64)
    drawn = torch.randint(0, 200, (400, 5), generator=g)
    kept = nearest_sequences(drawn, embeddings, direction, 100)

    def cosines(rows: torch.Tensor) -> torch.Tensor:
        return unit(embeddings[rows].mean(dim=1)) @ unit(direction)

    assert kept.shape == (100, 5)
    rows = {tuple(r) for r in kept.tolist()}
    dropped = torch.stack([r for r in drawn if tuple(r.tolist()) not in rows])
    assert cosines(kept).min() >= cosines(dropped).max()
    # kept in their drawn order
    position = {tuple(r): i for i, r in enumerate(drawn.tolist())}
    order = [position[tuple(r)] for r in kept.tolist()]
    assert order == sorted(order)
    with pytest.raises(ConfigError) as caught:
        nearest_sequences(drawn, embeddings, direction, 401)
    assert caught.value.field == "sequence_selection"


def test_factor_one_is_the_plain_draw_and_a_larger_factor_moves_towards_the_direction() -> None:
    g = torch.Generator().manual_seed(1)
    embeddings = unit(torch.randn(300, D, generator=g, dtype=torch.float64))
    direction = embeddings[0] + embeddings[1]
    scores = torch.rand(300, generator=g, dtype=torch.float64)
    common: dict[str, Any] = dict(count=200, length=4, temperature=1.0)
    plain = sample_from_scores(scores, generator=torch.Generator().manual_seed(7), **common)
    one = sample_near_direction(
        scores, embeddings, direction, factor=1, generator=torch.Generator().manual_seed(7),
        **common,
    )  # fmt: skip
    assert torch.equal(plain, one)
    four = sample_near_direction(
        scores, embeddings, direction, factor=4, generator=torch.Generator().manual_seed(7),
        **common,
    )  # fmt: skip
    assert four.shape == plain.shape
    near = unit(embeddings[four].mean(dim=1)) @ unit(direction)
    anywhere = unit(embeddings[plain].mean(dim=1)) @ unit(direction)
    # the top quarter of 4 × 200 draws: well above the plain draws' cosine on average
    assert near.mean() > anywhere.mean() + 0.5 * anywhere.std()
    # every kept sequence still holds distinct phrases
    assert all(len(set(r)) == len(r) for r in four.tolist())


def test_selection_spends_nothing_and_keeps_a_class_on_its_own_phrases() -> None:
    from tests.core.dpkps.test_pipeline import TOPICS, assert_same_releases, own_phrase_shares

    def config(selection: int) -> GenerationConfig:
        return GenerationConfig(
            epsilon=6.0, delta=1e-6, noise="gaussian", per_class=40, sequence_length=3,
            public_vocabulary_size=16, label_prior=0.0, sequence_selection=selection, seed=3,
            centroid_cells=1, consistency_filter=False,
        )  # fmt: skip

    # means over 6 runs each (fresh DP noise; one run at a time, 15 runs: F = 1 0.876 ± 0.029,
    # F = 4 0.975 ± 0.023, so a gain under 0.04 is 3.9 standard errors from what it measures)
    shares, plain = own_phrase_shares(config(1), runs=6)
    chosen_shares, chosen = own_phrase_shares(config(4), runs=6)
    without, selected = float(np.mean(shares)), float(np.mean(chosen_shares))
    assert all(len(r.sequences) == 40 * len(TOPICS) for r in plain + chosen)
    # the same releases at the same cost: the selection is post-processing
    assert_same_releases(plain, chosen)
    # sequences whose phrases agree on the class's direction are more of its own phrases
    assert selected > without + 0.04, (selected, without)


@pytest.mark.parametrize("value", [0, MAX_SELECTION + 1, True, 2.5, "4"])
def test_a_bad_selection_names_its_field(value: Any) -> None:
    cfg = GenerationConfig(epsilon=1.0, delta=1e-6, noise="gaussian", sequence_selection=value)
    assert invalid_field(cfg) == "sequence_selection"


def test_selection_needs_a_released_direction() -> None:
    # Laplace: the exact kernel, no direction per class
    cfg = GenerationConfig(epsilon_vocab=1.0, epsilon_kde=2.0, sequence_selection=4)
    assert invalid_field(cfg) == "sequence_selection"
    assert GenerationConfig(epsilon_vocab=1.0, epsilon_kde=2.0).validate().selection_factor == 1

    def factor(epsilon: float, **given: Any) -> int:
        cfg = GenerationConfig(epsilon=epsilon, delta=1e-6, noise="gaussian", **given)
        return cfg.validate().selection_factor

    # by default with cells (each cell's sequences near that cell), none without them
    assert factor(1.0) == 1 and factor(2.0) == 1
    assert factor(4.0) == factor(6.0) == DEFAULT_SELECTION > 1
    assert factor(6.0, centroid_cells=1) == 1
    assert factor(1.0, centroid_cells=4) == DEFAULT_SELECTION
    assert factor(6.0, sequence_selection=2) == 2


def test_the_job_spec_takes_the_selection() -> None:
    base = {"vocabulary": "english", "document_type": "clinical note", "epsilon": 1.0,
            "delta": 1e-6, "noise": "gaussian"}  # fmt: skip
    spec = JobSpec.model_validate({**base, "sequence_selection": 2})
    assert spec.generation_config().selection_factor == 2
    with pytest.raises(ValueError, match="sequence_selection"):
        JobSpec.model_validate({**base, "sequence_selection": 0})
