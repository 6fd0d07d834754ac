"""Empirical privacy evidence: a one-run audit with canaries (issue 66, item 3).

Every DP release claims an upper bound ε. An audit gives a *lower* bound from what was
released: if the mechanism leaked more than it claims, the lower bound can exceed the
claim, and a bug (noise switched off, a sensitivity too small) shows. The audit here is
Steinke, Nasr & Jagielski's one-run scheme ("Privacy auditing with one (1) training
run", NeurIPS 2023) with canaries shaped as in Meeus et al.'s "The Canary's Echo"
(ICML 2025): an in-distribution prefix and a high-perplexity suffix.

1. **Canaries** (:func:`make_canaries`): ``m`` documents made from public text only:
   the prefix is a public template naming the job's document type and one declared
   class (the classes take turns), the suffix a few words drawn at random from the rare
   end of the job's public vocabulary (words the generator could emit, but that a
   class's own documents seldom hold). Words are drawn from one seeded stream, the
   inclusion coins from another, independent one (:class:`numpy.random.SeedSequence`
   children of the recorded seed).
2. **Inclusion**: each canary joins the generation input with probability ½ (its coin).
   Canaries are public documents: adding them changes nothing about the guarantee the
   private documents get, and they are never stored as dataset rows.
3. **Membership test on the released corpus alone** (:func:`membership_scores`): a
   canary's score is how often its suffix words occur in the released documents of its
   class (``log(1 + count)`` summed over its words; occurrences in other classes break
   ties). Nothing else is read: not the coins, not the private documents, not any
   intermediate release.
4. **Guesses** (:func:`guesses`): the ``k₊`` highest scores are guessed *in*, the ``k₋``
   lowest *out*, the rest abstain; ties are broken by the canary's index, which the
   coins do not depend on. ``k = k₊ + k₋`` guesses, ``r`` of them right.
5. **Bound** (:func:`epsilon_lower_bound`): for an ε-DP mechanism the number of right
   guesses is stochastically dominated by Binomial(k, e^ε/(1 + e^ε)) (Steinke et al.,
   Theorem 3.1: the coins are independent and each is "randomised response" through the
   mechanism). The lower bound at confidence 1 − β is the largest ε whose p-value
   P[Binomial(k, e^ε/(1 + e^ε)) ≥ r] is at most β: a mechanism whose true ε is below it
   would have produced ``r`` or more right guesses with probability at most β. The tail
   is the exact binomial one (:func:`scipy.stats.binom.sf`).

δ > 0 (Gaussian releases): Steinke et al.'s (ε, δ) statement adds to the binomial tail
``2·m·δ·α`` with ``α = max_{1 ≤ i ≤ r} P[r > Binomial(k, q) ≥ r − i] / i`` (their
Theorem 3.3 as their published code computes it; :func:`p_value`), so a δ-mechanism is
only refuted where that term stays below β too; for δ = 0 the term vanishes and the test
is the pure-ε one exactly.

What the bound is and is not: evidence, not a proof. A bound at or below the claimed ε
says the audit found no leak beyond the claim; it cannot show that ε is as small as
claimed (one run of a real synthetic-data mechanism seldom reveals a single canary, and
with ``k`` guesses the bound can never exceed :func:`largest_bound`). A bound above the
claim is a red flag: at confidence 1 − β the release leaks more than it claims.

This module is pure: no I/O, no logging, no database. The service stores the canary set
with the job (the owner's, until release) and runs the audit on the released corpus.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from workers.errors import ConfigError

DEFAULT_CANARIES = 64  # m: see benchmarks/notes/2026-12-07-canary-audit.md for its cost
MAX_CANARIES = 1000
DEFAULT_SUFFIX = 6  # rare words per canary
DEFAULT_CONFIDENCE = 0.95
RARE_FROM = 0.5  # the suffix's words come from the last half of the usable vocabulary
WORD = re.compile(r"[a-z]{3,}")
TOKEN = re.compile(r"[a-z]+")
PREFIX = "{document_type} about {label}:"
TIE_WEIGHT = 1e-3  # occurrences in other classes' documents: a tie-breaker only


# -- canaries ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Canary:
    """One canary: a public prefix naming its class, then rare public words."""

    label: str
    prefix: str
    suffix: tuple[str, ...]

    @property
    def text(self) -> str:
        return f"{self.prefix} {' '.join(self.suffix)}"


@dataclass(frozen=True)
class CanarySet:
    """The canaries of a run, their coins (True: in the generation input) and the seed
    that drew both. The coins are the audit's secret until the corpus is released."""

    seed: int
    canaries: tuple[Canary, ...]
    included: tuple[bool, ...]

    def __post_init__(self) -> None:
        if len(self.canaries) != len(self.included):
            raise ValueError("one coin per canary")

    @property
    def included_canaries(self) -> list[Canary]:
        """The canaries whose coin came up heads: these join the generation input."""
        return [c for c, kept in zip(self.canaries, self.included, strict=True) if kept]

    def to_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "canaries": [
                {"label": c.label, "prefix": c.prefix, "suffix": list(c.suffix)}
                for c in self.canaries
            ],
            "included": list(self.included),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CanarySet:
        return cls(
            seed=int(data["seed"]),
            canaries=tuple(
                Canary(str(c["label"]), str(c["prefix"]), tuple(str(w) for w in c["suffix"]))
                for c in data["canaries"]
            ),
            included=tuple(bool(b) for b in data["included"]),
        )


def rare_words(phrases: Sequence[str], *, stop: int | None = None) -> list[str]:
    """The single-word phrases (3 letters or more, a-z) of ``phrases[start:stop]``, where
    ``start`` is :data:`RARE_FROM` of ``stop``: the rare end of a vocabulary ordered by
    frequency (the built-in ones are), within the phrases the generator can emit."""
    stop = len(phrases) if stop is None else min(stop, len(phrases))
    start = int(stop * RARE_FROM)
    words = [p for p in phrases[start:stop] if WORD.fullmatch(p)]
    if len(words) < DEFAULT_SUFFIX:  # a small vocabulary: its every word will do
        words = [p for p in phrases[:stop] if WORD.fullmatch(p)]
    return list(dict.fromkeys(words))


def make_canaries(
    *,
    phrases: Sequence[str],
    labels: Sequence[str],
    count: int,
    seed: int,
    document_type: str,
    suffix_length: int = DEFAULT_SUFFIX,
    stop: int | None = None,
) -> CanarySet:
    """``count`` canaries over the declared ``labels`` (in turn) from the public
    ``phrases`` (see :func:`rare_words` for ``stop``), and one fair coin each.

    Suffixes share no word when the vocabulary holds enough rare words; otherwise each
    canary draws its own (so canaries may share words, and the test sees them blurred),
    at most as many as there are words. Raises :class:`ConfigError` when the vocabulary
    holds no usable word at all.
    """
    if isinstance(count, bool) or not 1 <= count <= MAX_CANARIES:
        raise ConfigError(f"must be between 1 and {MAX_CANARIES}", field="audit_canaries")
    if not labels:
        raise ConfigError("no declared label", field="labels")
    words = rare_words(phrases, stop=stop)
    if not words:
        raise ConfigError(
            "the vocabulary holds no single word of 3 letters or more for a canary",
            field="audit_canaries",
        )
    suffix_length = min(suffix_length, len(words))  # a tiny vocabulary: shorter suffixes
    content, coins = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    if len(words) >= count * suffix_length:
        drawn = content.choice(len(words), size=count * suffix_length, replace=False)
        suffixes = drawn.reshape(count, suffix_length).tolist()
    else:
        suffixes = [
            content.choice(len(words), size=suffix_length, replace=False).tolist()
            for _ in range(count)
        ]
    canaries = tuple(
        Canary(
            label=labels[i % len(labels)],
            prefix=PREFIX.format(document_type=document_type, label=labels[i % len(labels)]),
            suffix=tuple(words[j] for j in suffixes[i]),
        )
        for i in range(count)
    )
    included = tuple(bool(b) for b in coins.integers(0, 2, size=count))
    return CanarySet(seed=seed, canaries=canaries, included=included)


# -- the membership test -------------------------------------------------------------------


def membership_scores(
    canaries: Sequence[Canary], released: Sequence[tuple[str, str]]
) -> NDArray[np.float64]:
    """Each canary's score from the released corpus alone (``(label, text)`` pairs): its
    suffix words' occurrences in the released documents of its class, as
    ``Σ log(1 + count)``, plus :data:`TIE_WEIGHT` times the same over every class."""
    by_class: dict[str, Counter[str]] = {}
    overall: Counter[str] = Counter()
    for label, text in released:
        tokens = TOKEN.findall(text.lower())
        by_class.setdefault(label, Counter()).update(tokens)
        overall.update(tokens)
    scores = np.zeros(len(canaries))
    for i, canary in enumerate(canaries):
        own = by_class.get(canary.label, Counter())
        scores[i] = sum(math.log1p(own[w]) for w in canary.suffix) + TIE_WEIGHT * sum(
            math.log1p(overall[w]) for w in canary.suffix
        )
    return scores


def copied(canaries: Sequence[Canary], released: Sequence[tuple[str, str]]) -> int:
    """How many canaries appear whole in a released document (their suffix in order)."""
    texts = [" " + " ".join(TOKEN.findall(text.lower())) + " " for _, text in released]
    return sum(1 for c in canaries if any(f" {' '.join(c.suffix)} " in text for text in texts))


def guesses(scores: NDArray[np.float64], *, positives: int, negatives: int) -> NDArray[np.int64]:
    """+1 (in) for the ``positives`` highest scores, −1 (out) for the ``negatives``
    lowest, 0 (abstain) for the rest; ties in canary order (independent of the coins)."""
    m = len(scores)
    if positives < 0 or negatives < 0 or positives + negatives > m:
        raise ConfigError("guesses must be ≥ 0 and at most one per canary", field="guesses")
    order = np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")
    out = np.zeros(m, dtype=np.int64)
    out[order[:positives]] = 1
    if negatives:
        out[order[m - negatives :]] = -1
    return out


# -- the bound -----------------------------------------------------------------------------


def _q(epsilon: float) -> float:
    """e^ε/(1 + e^ε): the accuracy of ε-DP randomised response."""
    return 1.0 / (1.0 + math.exp(-epsilon))


def p_value(
    *, canaries: int, guesses: int, correct: int, epsilon: float, delta: float = 0.0
) -> float:
    """P[``correct`` or more right guesses] for an (ε, δ)-DP mechanism, at most
    (Steinke et al., Theorems 3.1 and 3.3): the exact tail P[Binomial(k, q) ≥ r] with
    q = e^ε/(1 + e^ε), plus ``2·m·δ·α`` when δ > 0 (see the module docstring)."""
    m, k, r = canaries, guesses, correct
    if not 0 <= r <= k <= m:
        raise ValueError("need 0 ≤ correct ≤ guesses ≤ canaries")
    if epsilon < 0 or not 0 <= delta <= 1:
        raise ValueError("need ε ≥ 0 and 0 ≤ δ ≤ 1")
    from scipy.stats import binom  # here: the API imports this module for its constants

    q = _q(epsilon)
    tail = float(binom.sf(r - 1, k, q))  # P[Binomial(k, q) ≥ r]
    if delta == 0:
        return tail
    alpha, below = 0.0, 0.0
    for i in range(1, r + 1):
        below += float(binom.pmf(r - i, k, q))  # P[r > Binomial(k, q) ≥ r − i]
        alpha = max(alpha, below / i)
    return min(1.0, tail + 2.0 * m * delta * alpha)


def epsilon_lower_bound(
    *,
    canaries: int,
    guesses: int,
    correct: int,
    confidence: float = DEFAULT_CONFIDENCE,
    delta: float = 0.0,
    tolerance: float = 1e-9,
) -> float:
    """The largest ε (to ``tolerance``, from below) whose p-value is at most
    β = 1 − ``confidence``; 0 when even ε = 0 is not refuted.

    >>> round(epsilon_lower_bound(canaries=20, guesses=10, correct=10), 6)
    1.051873
    >>> epsilon_lower_bound(canaries=20, guesses=10, correct=5)
    0.0
    """
    if not 0 < confidence < 1:
        raise ValueError("confidence must be in (0, 1)")
    beta = 1.0 - confidence

    def refuted(epsilon: float) -> bool:
        return (
            p_value(
                canaries=canaries, guesses=guesses, correct=correct, epsilon=epsilon, delta=delta
            )
            <= beta
        )

    if not refuted(0.0):
        return 0.0
    low, high = 0.0, 1.0
    while refuted(high):  # the tail tends to 1 (or to 2mδα ≥ β, where nothing is refuted)
        low, high = high, 2.0 * high
        if high > 1e4:
            return low
    while high - low > tolerance:
        middle = (low + high) / 2.0
        if refuted(middle):
            low = middle
        else:
            high = middle
    return low


def largest_bound(*, canaries: int, guesses: int, confidence: float, delta: float = 0.0) -> float:
    """The bound if every guess were right: the most this audit can ever show."""
    return epsilon_lower_bound(
        canaries=canaries, guesses=guesses, correct=guesses, confidence=confidence, delta=delta
    )


# -- the audit -----------------------------------------------------------------------------


@dataclass(frozen=True)
class AuditResult:
    """One audit's figures (public once the corpus is released)."""

    canaries: int  # m
    included: int  # coins that came up heads
    guesses: int  # k = k₊ + k₋
    correct: int  # r
    confidence: float  # 1 − β
    claimed_epsilon: float
    delta: float
    epsilon_lower_bound: float
    largest_possible_bound: float
    copied_as_documents: int  # canaries found whole in a released document

    @property
    def exceeds_claim(self) -> bool:
        return self.epsilon_lower_bound > self.claimed_epsilon

    def in_words(self) -> str:
        """The finding, for a privacy officer."""
        bound, claim = self.epsilon_lower_bound, self.claimed_epsilon
        level = f"{self.confidence:.0%}"
        how = (
            f"{self.canaries} public canary documents (each included in the generation "
            f"input by a fair coin: {self.included} were) and a membership test on the "
            f"released corpus alone: {self.correct} of {self.guesses} guesses right"
        )
        if self.exceeds_claim:
            return (
                f"WARNING: the audit's lower bound ε ≥ {bound:.3g} ({level} confidence) "
                f"exceeds the claimed ε = {claim:.3g}: the release leaked more about its "
                f"input than its guarantee allows. Do not distribute it; report it. ({how}.)"
            )
        return (
            f"The audit found no evidence that ε exceeds {bound:.3g} ({level} confidence; "
            f"claimed ε = {claim:.3g}). This is a lower bound, not a proof: it can catch a "
            "release that leaks more than claimed (noise missing or too small), but it "
            "cannot show that the claim is tight, and with this many guesses it could never "
            f"show more than ε = {self.largest_possible_bound:.3g}. ({how}.)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "canaries": self.canaries,
            "included": self.included,
            "guesses": self.guesses,
            "correct": self.correct,
            "confidence": self.confidence,
            "claimed_epsilon": self.claimed_epsilon,
            "delta": self.delta,
            "epsilon_lower_bound": self.epsilon_lower_bound,
            "largest_possible_bound": self.largest_possible_bound,
            "exceeds_claim": self.exceeds_claim,
            "copied_as_documents": self.copied_as_documents,
            "in_words": self.in_words(),
        }


def default_guesses(canaries: int) -> tuple[int, int]:
    """k₊ = k₋ = ⌊m/4⌋: half the canaries guessed, the surest quarter each way."""
    return canaries // 4, canaries // 4


def run_audit(
    canary_set: CanarySet,
    released: Sequence[tuple[str, str]],
    *,
    claimed_epsilon: float,
    delta: float = 0.0,
    confidence: float = DEFAULT_CONFIDENCE,
    positives: int | None = None,
    negatives: int | None = None,
) -> AuditResult:
    """The audit of one release: score, guess, count the right guesses, bound ε.

    ``released`` is the released corpus as ``(label, text)`` pairs; the coins are read
    only to count the right guesses, after the guesses are made.
    """
    m = len(canary_set.canaries)
    default_pos, default_neg = default_guesses(m)
    pos = default_pos if positives is None else positives
    neg = default_neg if negatives is None else negatives
    scores = membership_scores(canary_set.canaries, released)
    guess = guesses(scores, positives=pos, negatives=neg)
    truth = np.where(np.asarray(canary_set.included, dtype=bool), 1, -1)
    correct = int(np.sum((guess != 0) & (guess == truth)))
    k = pos + neg
    return AuditResult(
        canaries=m,
        included=int(sum(canary_set.included)),
        guesses=k,
        correct=correct,
        confidence=confidence,
        claimed_epsilon=float(claimed_epsilon),
        delta=float(delta),
        epsilon_lower_bound=epsilon_lower_bound(
            canaries=m, guesses=k, correct=correct, confidence=confidence, delta=delta
        ),
        largest_possible_bound=largest_bound(
            canaries=m, guesses=k, confidence=confidence, delta=delta
        ),
        copied_as_documents=copied(canary_set.canaries, released),
    )
