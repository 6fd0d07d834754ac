"""The benchmarks' named experiments (benchmarks/experiments.py): each sets engine
fields only, each validates on a configuration of the kind its study ran, and every
research lever the product left (docs/parameters.md) has one, ``distinct`` aside."""

from __future__ import annotations

import pytest

from benchmarks.experiments import EXPERIMENTS, configure, overrides
from workers.errors import ConfigError
from workers.methods.dpkps.config import GenerationConfig
from workers.methods.dpkps.params import ENGINE_FIELDS, RESEARCH_FIELDS, RESEARCH_VALUES

BASES = (
    GenerationConfig(epsilon_vocab=1.0, epsilon_kde=5.0),  # the first ablation's
    GenerationConfig(epsilon=1.0, delta=1e-6, noise="gaussian", per_class=None, total=200),
    GenerationConfig(epsilon=6.0, delta=1e-6, noise="gaussian"),  # with cells
)


def _validates(config: GenerationConfig, name: str) -> bool:
    try:
        configure(config, name)
    except ConfigError:
        return False
    return True


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_each_experiment_sets_engine_fields_and_validates(name: str) -> None:
    assert set(overrides(name)) <= set(ENGINE_FIELDS), name
    assert any(_validates(base, name) for base in BASES), name
    assert EXPERIMENTS[name].note, name


def test_every_research_lever_has_an_experiment() -> None:
    varied = {k for e in EXPERIMENTS.values() for k in e.overrides}
    assert RESEARCH_FIELDS - varied == {"distinct"}  # never varied
    values = {(k, v) for e in EXPERIMENTS.values() for k, v in e.overrides.items()}
    assert {(k, v) for k, vs in RESEARCH_VALUES.items() for v in vs} <= values
    with pytest.raises(ValueError, match="unknown experiment"):
        overrides("no-such-thing")
