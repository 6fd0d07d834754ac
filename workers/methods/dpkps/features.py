"""Random Fourier features for the Gaussian kernel (Rahimi & Recht 2007; method.md step 4).

``f_k(z) = √2 · cos(√2 · ω_kᵀ z + β_k)`` with ``ω_k ~ N(0, I)`` and ``β_k ~ U[0, 2π)``
gives ``E[f_k(x) f_k(y)] = exp(−‖x − y‖²)``. Scaling every vector by ``1/σ`` turns that
into ``exp(−‖x − y‖²/σ²)``, the kernel with bandwidth ``σ``.

For sequence structures a vector is a concatenation of ``B`` phrase embeddings, so ``ω_k``
is split into blocks ``ω_k,b`` of the embedding dimension. ``ω`` and ``β`` are public
randomness, independent of the data: they are drawn from a seed on the CPU (the same
numbers on every device) and shared by all classes and every structure of a run; a
structure with ``B`` blocks and ``I`` features uses the first ``B`` blocks and the first
``I`` features.
"""

from __future__ import annotations

import math

import torch

from workers.errors import ConfigError


class RandomFourierFeatures:
    """Frequencies ``ω`` (blocks × d × I) and phases ``β`` (I) on one device."""

    def __init__(
        self,
        *,
        dim: int,
        num_features: int,
        max_blocks: int,
        bandwidth: float = 1.0,
        seed: int = 0,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        if num_features < 1:
            raise ConfigError("must be ≥ 1", field="num_features")
        if max_blocks < 1:
            raise ConfigError("must be ≥ 1", field="sequence_length")
        if not (math.isfinite(bandwidth) and bandwidth > 0):
            raise ConfigError("must be finite and > 0", field="bandwidth")
        self.dim = dim
        self.num_features = num_features
        self.max_blocks = max_blocks
        self.bandwidth = float(bandwidth)
        self.seed = seed
        self.device = device
        self.dtype = dtype
        gen = torch.Generator(device="cpu").manual_seed(seed)
        omega = torch.randn(max_blocks, dim, num_features, generator=gen, dtype=torch.float64)
        beta = torch.rand(num_features, generator=gen, dtype=torch.float64) * (2 * math.pi)
        self.omega = omega.to(device=device, dtype=dtype)
        self.beta = beta.to(device=device, dtype=dtype)

    def project(
        self, embeddings: torch.Tensor, block: int, features: int | None = None
    ) -> torch.Tensor:
        """``√2/σ · E ω_block`` for unit rows ``E`` (n × d): the phase each row adds."""
        if not 0 <= block < self.max_blocks:
            raise ConfigError(f"block {block} out of range", field="sequence_length")
        omega = self.omega[block] if features is None else self.omega[block, :, :features]
        return (math.sqrt(2.0) / self.bandwidth) * (embeddings.to(omega) @ omega)

    def phases(self, features: int | None = None) -> torch.Tensor:
        return self.beta if features is None else self.beta[:features]


def feature_map(phase_sum: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """``√2 · cos(phase + β)``: the feature vector of a point, each entry in [−√2, √2]."""
    out: torch.Tensor = math.sqrt(2.0) * torch.cos(phase_sum + beta)
    return out
