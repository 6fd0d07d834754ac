"""A dry run's verdict in words (issue 66, item 5): the class signal against the noise.

DP-KPS releases, for each class, a noisy sum over the class's documents (by default the
sum of their embeddings' unit vectors; every unit adds at most ``sensitivity`` to any one
score). What a class's documents add along a direction is about its document count, and
the noise on one released score has standard deviation σ, so

    signal-to-noise = (documents per class × sensitivity) ÷ σ

says how far a class's release stands out of its noise. The bands below are read off
BENCHMARKS.md's curve (the default at ε = 0.25 to 6 on eight corpora, 42 points, the
density release's σ as the planner gives it): every point with a ratio of 25 or more kept
0.85-0.99 of real-text accuracy, the points between 10 and 25 kept 0.66-0.91, and those
under 10 kept 0.43-0.85. They are what the benchmark corpora did, not a promise for a new
one. The ratio uses the upload's raw document count, so only the dataset's owner is given
it (the same rule as the dry run's ``noise`` block).

For a total budget the verdict also names the smallest ε on a fixed grid that would bring
the ratio to the strong band, by planning the same spec at each ε (public inputs only).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from workers.privacy.events import PrivacyEvent

DENSITY_MECHANISM = "kde"  # each class's density (centroid, exact kernel or features)
STRONG = 25.0
MODERATE = 10.0
# fraction of real-text accuracy on BENCHMARKS.md's curve, per band (min, max)
OBSERVED = {"strong": (0.85, 0.99), "moderate": (0.66, 0.91), "weak": (0.43, 0.85)}
EPSILON_GRID = (0.25, 0.5, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 10.0)

STD_PER_SCALE = {
    "laplace": math.sqrt(2.0),
    "discrete_laplace": math.sqrt(2.0),
    "gumbel_top_k": math.pi / math.sqrt(6.0),
}


def noise_std(event: PrivacyEvent) -> float:
    """The standard deviation of the noise on one released score of ``event`` (σ for a
    Gaussian; √2·b for Laplace b; π·b/√6 for a Gumbel selection)."""
    return event.scale * STD_PER_SCALE.get(event.noise, 1.0)


def signal_to_noise(events: Sequence[PrivacyEvent], documents: int, classes: int) -> float | None:
    """Documents per class times a unit's contribution over the noise σ of the noisiest
    per-class density release; None when the plan has no such release."""
    density = [e for e in events if e.mechanism == DENSITY_MECHANISM and e.partition]
    if not density or documents <= 0 or classes <= 0:
        return None
    worst = max(density, key=noise_std)
    return documents / classes * worst.sensitivity / noise_std(worst)


def level(ratio: float) -> str:
    return "strong" if ratio >= STRONG else "moderate" if ratio >= MODERATE else "weak"


@dataclass(frozen=True)
class Verdict:
    signal_to_noise: float
    level: str
    observed_fraction_of_real: tuple[float, float]
    epsilon_for_strong: float | None
    summary: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def verdict(
    events: Sequence[PrivacyEvent],
    *,
    documents: int,
    classes: int,
    epsilon: float | None,
    replan: Callable[[float], Sequence[PrivacyEvent]] | None,
) -> Verdict | None:
    """The verdict for a plan's ``events`` on a dataset of ``documents`` documents in
    ``classes`` classes. ``replan(ε)`` gives the same spec's events at another total ε
    (None for a per-mechanism budget, which has no single ε to raise)."""
    ratio = signal_to_noise(events, documents, classes)
    if ratio is None:
        return None
    band = level(ratio)
    low, high = OBSERVED[band]
    needed: float | None = None
    if band != "strong" and replan is not None and epsilon is not None:
        for candidate in EPSILON_GRID:
            if candidate <= epsilon:
                continue
            better = signal_to_noise(replan(candidate), documents, classes)
            if better is not None and better >= STRONG:
                needed = candidate
                break
    words = {
        "strong": "expect class separation close to real text's",
        "moderate": "expect fair class separation, weaker for the smallest classes",
        "weak": "expect weak class separation",
    }[band]
    summary = (
        f"The class signal is about {ratio:.3g}× the noise on each released score "
        f"({documents / classes:.3g} documents a class on average against a noise σ of "
        f"{documents / classes / ratio:.3g}): {words}. On the benchmark corpora a ratio "
        f"in this band kept {low:.2f}-{high:.2f} of real-text accuracy (BENCHMARKS.md)."
    )
    if band != "strong" and replan is not None:
        summary += (
            f" ε = {needed:g} would bring the ratio to {STRONG:g} or more."
            if needed is not None
            else f" No ε up to {EPSILON_GRID[-1]:g} brings the ratio to {STRONG:g}: the "
            "corpus has too few documents a class for a strong signal; merging classes "
            "or adding documents would help more than budget."
        )
    return Verdict(round(ratio, 3), band, (low, high), needed, summary)
