"""A public subspace for the class-sum release (class centroids; public inputs only).

The noise a released class sum adds to a document's score is σ·‖x‖ for the part of the
document the release sees; a document's margin between classes lies mostly in the
directions along which texts vary most. So each unit's vector is projected on the top k
principal directions of Ṽ's phrase embeddings (the public model on public phrases, or on a
DP-released Ṽ: post-processing either way) and rescaled to its own norm there: the L2
bound of 1 holds as before, σ is the same, and the release has k coordinates instead of
d. The phrases are scored in the same coordinates (their projections, not rescaled, so a
phrase's score is its cosine with the released direction mapped back to the whole space).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray


def public_basis(phrase_embeddings: NDArray[np.floating[Any]], k: int) -> NDArray[np.float64]:
    """A d × k orthonormal basis: the top ``k`` principal directions of the (centred)
    phrase embeddings, each signed so its largest coordinate is positive (deterministic).

    >>> rows = np.array([[1.0, 0.0], [-1.0, 0.0], [0.0, 0.1], [0.0, -0.1]])
    >>> public_basis(rows, 1).ravel().tolist()
    [1.0, 0.0]
    """
    rows = np.asarray(phrase_embeddings, dtype=np.float64)
    if not 1 <= k <= rows.shape[1]:
        raise ValueError(f"k must be between 1 and {rows.shape[1]}")
    centred = rows - rows.mean(axis=0)
    values, vectors = np.linalg.eigh(centred.T @ centred)
    basis = vectors[:, np.argsort(values, kind="stable")[::-1][:k]]
    signs = np.sign(basis[np.abs(basis).argmax(axis=0), np.arange(k)])
    out: NDArray[np.float64] = basis * np.where(signs == 0, 1.0, signs)
    return out


def project_units(rows: NDArray[np.float64], basis: NDArray[np.float64]) -> NDArray[np.float64]:
    """Each row's coordinates on ``basis`` rescaled to the row's own norm (≤ 1 stays ≤ 1);
    a row with no component there becomes 0.

    >>> project_units(np.array([[0.6, 0.8], [0.0, 0.5]]), np.array([[1.0], [0.0]])).tolist()
    [[1.0], [0.0]]
    """
    data = np.asarray(rows, dtype=np.float64)
    inside = data @ basis
    norms = np.linalg.norm(inside, axis=1, keepdims=True)
    scale = np.where(norms > 1e-12, np.linalg.norm(data, axis=1, keepdims=True), 0.0)
    out: NDArray[np.float64] = inside * scale / np.maximum(norms, 1e-12)
    return out
