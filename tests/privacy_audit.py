"""Empirical privacy-loss estimates from samples of a mechanism on neighbouring inputs.

Given outputs of a mechanism on corpus ``D`` and on ``D'`` (one document added), the
privacy loss of an event ``E`` is ``|ln P[M(D) ∈ E] − ln P[M(D') ∈ E]|``; an ε-DP
mechanism keeps it ≤ ε for every event. We estimate it on tail events of a
one-dimensional statistic that carries the whole difference: ``{M ≥ t}`` and
``{M ≤ t}`` for thresholds ``t`` at the quantiles of the pooled samples, keeping only
events that both samples hit at least ``min_count`` times, so each ratio is measured to
a few per cent.

Why tails: for Laplace noise of scale ``b`` and a shift ``Δ`` between the two inputs,
``P[M(D') ≥ t] / P[M(D) ≥ t] = e^{Δ/b}`` exactly for every ``t`` beyond the larger of
the two centres; the tail events reach the worst case, where bins in the middle do not.
The estimate is therefore about ε for a correct mechanism and about 2ε for one whose
noise is half as wide (the control every test runs).

For (ε, δ) mechanisms (Gaussian noise) the log ratio of far tails grows without bound;
what the guarantee bounds is ``P[M(D) ∈ E] − δ`` against ``e^ε P[M(D') ∈ E]``, which
:func:`estimate_epsilon_at_delta` measures on the same events.
"""

from __future__ import annotations

import numpy as np

from workers.privacy.events import PrivacyEvent


def _tail_frequencies(
    x: np.ndarray, y: np.ndarray, min_count: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Frequencies in both samples of the tail events both samples hit ≥ min_count times."""
    x = np.sort(np.asarray(x, dtype=float))
    y = np.sort(np.asarray(y, dtype=float))
    thresholds = np.unique(np.quantile(np.concatenate([x, y]), np.linspace(0.005, 0.995, 199)))
    out = []
    for upper in (True, False):
        if upper:  # counts of samples >= t
            cx = x.size - np.searchsorted(x, thresholds, side="left")
            cy = y.size - np.searchsorted(y, thresholds, side="left")
        else:  # counts of samples <= t
            cx = np.searchsorted(x, thresholds, side="right")
            cy = np.searchsorted(y, thresholds, side="right")
        ok = (cx >= min_count) & (cy >= min_count)
        if ok.any():
            out.append((cx[ok] / x.size, cy[ok] / y.size))
    if not out:
        raise ValueError("no tail event holds enough samples of both outputs")
    return out


def estimate_privacy_loss(x: np.ndarray, y: np.ndarray, *, min_count: int = 400) -> float:
    """Largest |log ratio| of tail frequencies of two samples (events hit ≥ min_count)."""
    return max(
        float(np.abs(np.log(px) - np.log(py)).max())
        for px, py in _tail_frequencies(x, y, min_count)
    )


def estimate_epsilon_at_delta(
    x: np.ndarray, y: np.ndarray, *, delta: float, min_count: int = 400
) -> float:
    """Largest ε̂ with P[A ∈ E] = e^ε̂·P[B ∈ E] + δ over the same tail events, both ways.

    An (ε, δ)-DP mechanism keeps ``P[M(D) ∈ E] ≤ e^ε P[M(D') ∈ E] + δ`` for every event
    and both orders; for the Gaussian mechanism the worst events are tails, so the
    estimate is about ε for a correct noise scale and far above it for half the scale.
    """
    best = 0.0
    for px, py in _tail_frequencies(x, y, min_count):
        for a, b in ((px, py), (py, px)):
            room = a - delta
            if (room > 0).any():
                best = max(best, float(np.log(room[room > 0] / b[room > 0]).max()))
    return best


def planned(
    noise: str,
    sensitivity: float,
    *,
    epsilon: float | None = None,
    multiplier: float | None = None,
    dimension: int = 1,
    count: int = 1,
    mechanism: str = "t",
) -> PrivacyEvent:
    """A planned release as :mod:`workers.methods.dpkps.plan` makes them: ε per release for the
    Laplace family (scale Δ/ε), the noise multiplier σ/Δ for the Gaussian family."""
    pure = noise in ("laplace", "discrete_laplace")
    if pure:
        assert epsilon is not None
        scale = sensitivity / epsilon
    else:
        assert multiplier is not None
        scale = multiplier * sensitivity
    return PrivacyEvent(
        mechanism=mechanism,
        noise=noise,
        scale=scale,
        sensitivity=sensitivity,
        norm="l1" if pure else "l2",
        dimension=dimension,
        count=count,
        epsilon=repr(epsilon) if pure else None,
    )
