"""The private side of PATE-tutor: keyed-hash partition, teachers, noisy votes, tutor.

Everything here that reads private data returns only DP outputs (noisy labels, noisy
counts); clean vote sums and clean counts are local variables (pate-tutor.md §7 rule 9).

* :func:`assign_teachers` — teacher(r) = HMAC-SHA256(k, id(r)) mod M (rule 3) with a key
  drawn by :func:`new_key` per run (never derived from data). id(r) is the unit id, or
  for a document without a unit column its label and text: adding or removing one unit
  leaves every other unit's teacher as it was, so exactly one teacher's data changes.
* :func:`train_teachers` — teacher m: logistic regression, positives its units'
  embeddings, negatives the public pool A (balanced class weights). A teacher with no
  positive answers P(private | x) = 0 for every x (a fixed, data-independent output);
  one added unit moves it to a trained model, a change of at most √2 like any other.
* :func:`vote_sums` — S(x) = Σ_m (P_m(public|x), P_m(private|x)), Eq. 1 of the paper.
* :func:`noisy_votes` — S + N(0, σ²) on every coordinate (OpenDP, one call);
  :func:`pseudo_labels` the arg-max (post-processing).
* :func:`tutor_counts` — units per class plus Gaussian noise (OpenDP), rounded to
  integers (post-processing, :func:`noisy_counts`), rule 5.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray
from sklearn.linear_model import LogisticRegression

from workers.privacy.noise import gaussian_noise

KEY_BYTES = 32
MAX_ITER = 1000


def new_key() -> bytes:
    """A fresh secret key for the teacher hash (cryptographic randomness)."""
    return secrets.token_bytes(KEY_BYTES)


def record_identity(*, unit: str | None, label: str, text: str) -> str:
    """What the keyed hash reads: the unit id, or a document's label and text."""
    if unit is not None:
        return "unit\x1f" + unit
    return "document\x1f" + label + "\x1f" + text


def assign_teachers(identities: Sequence[str], *, key: bytes, teachers: int) -> NDArray[np.int64]:
    """teacher(r) = HMAC-SHA256(key, id(r)) mod M for every identity."""
    out = np.empty(len(identities), dtype=np.int64)
    for i, identity in enumerate(identities):
        digest = hmac.new(key, identity.encode("utf-8", "surrogatepass"), hashlib.sha256)
        out[i] = int.from_bytes(digest.digest()[:8], "big") % teachers
    return out


def fit_classifier(
    features: NDArray[np.float32], targets: NDArray[np.int64], *, regularization: float
) -> LogisticRegression | None:
    """Logistic regression (lbfgs, deterministic); ``None`` when one class is missing."""
    if np.unique(targets).size < 2:
        return None
    model = LogisticRegression(
        C=regularization, class_weight="balanced", max_iter=MAX_ITER, random_state=0
    )
    model.fit(features, targets)
    return model


def private_probability(
    model: LogisticRegression | None, features: NDArray[np.float32], *, default: float
) -> NDArray[np.float64]:
    """P(private | x) of a fitted classifier, or ``default`` for every x without one."""
    if model is None:
        return np.full(len(features), default, dtype=np.float64)
    column = int(np.flatnonzero(model.classes_ == 1)[0])
    return np.asarray(model.predict_proba(features)[:, column], dtype=np.float64)


def train_teachers(
    positives: NDArray[np.float32],
    owner: NDArray[np.int64],
    *,
    teachers: int,
    negatives: NDArray[np.float32],
    regularization: float,
) -> list[LogisticRegression | None]:
    """Teacher m fits its rows of ``positives`` (``owner == m``) against ``negatives``."""
    models: list[LogisticRegression | None] = []
    for m in range(teachers):
        own = positives[owner == m]
        if len(own) == 0:
            models.append(None)
            continue
        features = np.concatenate([own, negatives]).astype(np.float32)
        targets = np.concatenate(
            [np.ones(len(own), dtype=np.int64), np.zeros(len(negatives), dtype=np.int64)]
        )
        models.append(fit_classifier(features, targets, regularization=regularization))
    return models


def vote_sums(
    models: Sequence[LogisticRegression | None], queries: NDArray[np.float32]
) -> NDArray[np.float64]:
    """S(x) = Σ_m (1 − p_m(x), p_m(x)) for every query row: shape (Q, 2)."""
    sums = np.zeros((len(queries), 2), dtype=np.float64)
    for model in models:
        p = private_probability(model, queries, default=0.0)
        sums[:, 0] += 1.0 - p
        sums[:, 1] += p
    return sums


def noisy_votes(sums: NDArray[np.float64], *, sigma: float) -> NDArray[np.float64]:
    """``sums`` plus N(0, σ²) on every coordinate, drawn by OpenDP in one call."""
    return gaussian_noise(sums, scale=sigma)


def pseudo_labels(noisy: NDArray[np.float64]) -> NDArray[np.int64]:
    """ŷ = argmax over (public, private) of the noisy votes (1 = looks private)."""
    return np.asarray(np.argmax(noisy, axis=1), dtype=np.int64)


def tutor_counts(
    classes: NDArray[np.int64], *, num_classes: int, sigma: float
) -> NDArray[np.int64]:
    """Units per class plus N(0, σ²) (Δ₂ = 1 under add/remove), rounded to integers."""
    return noisy_counts(np.bincount(classes, minlength=num_classes), sigma=sigma)


def noisy_counts(counts: NDArray[np.integer], *, sigma: float) -> NDArray[np.int64]:
    """``counts`` (any shape) plus N(0, σ²) on every entry, drawn by OpenDP in one call,
    rounded to the nearest integers (post-processing)."""
    noisy = gaussian_noise(np.asarray(counts, dtype=np.float64), scale=sigma)
    return np.rint(noisy).astype(np.int64)
