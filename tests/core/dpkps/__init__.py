"""What the DP-KPS engine's tests share: three class labels, a validated configuration,
the field an invalid one names."""

from __future__ import annotations

from typing import Any

import pytest

from workers.errors import ConfigError
from workers.methods.dpkps.config import GenerationConfig

LABELS = ["a", "b", "c"]


def config(**overrides: Any) -> GenerationConfig:
    """A validated configuration with Gaussian noise: ε = 1, δ = 1e-6 and 10 sequences per
    class unless ``overrides`` say otherwise."""
    base: dict[str, Any] = dict(epsilon=1.0, delta=1e-6, noise="gaussian", per_class=10)
    return GenerationConfig(**{**base, **overrides}).validate()


def invalid_field(cfg: GenerationConfig) -> str:
    """The field named by the :class:`ConfigError` that validating ``cfg`` raises (a
    failure if it raises none)."""
    with pytest.raises(ConfigError) as caught:
        cfg.validate()
    return str(caught.value.field)
