"""The one-run canary audit (workers/privacy/audit.py, issue 66 item 3).

* The bound: the exact binomial tail against values computed by hand (fractions), the
  closed form when every guess is right, and the (ε, δ) term of Steinke et al.
* The canaries: public words from the rare end of the vocabulary, one fair coin each,
  the guesses a function of the released corpus alone.
* The audit catches a mechanism whose noise is switched off: the DP-KPS engine with
  OpenDP's noise replaced by nothing gives a lower bound above the claimed ε, while the
  real engine at the same ε gives one at or below it.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from workers.errors import ConfigError
from workers.privacy import audit
from workers.privacy.audit import (
    Canary,
    CanarySet,
    copied,
    epsilon_lower_bound,
    guesses,
    largest_bound,
    make_canaries,
    membership_scores,
    p_value,
    run_audit,
)

# -- the bound ------------------------------------------------------------------------------


def _tail(k: int, r: int, q: Fraction) -> Fraction:
    """P[Binomial(k, q) ≥ r], exactly."""
    return sum((math.comb(k, j) * q**j * (1 - q) ** (k - j) for j in range(r, k + 1)), Fraction(0))


@pytest.mark.parametrize(
    ("k", "r", "odds"),
    [(10, 8, 3), (10, 10, 3), (20, 15, 2), (32, 20, 1), (7, 0, 5), (50, 49, 9)],
)
def test_the_p_value_is_the_exact_binomial_tail(k: int, r: int, odds: int) -> None:
    # ε = ln(odds): q = e^ε/(1 + e^ε) = odds/(odds + 1), a rational number
    q = Fraction(odds, odds + 1)
    expected = float(_tail(k, r, q))
    found = p_value(canaries=2 * k, guesses=k, correct=r, epsilon=math.log(odds))
    assert found == pytest.approx(expected, rel=1e-12, abs=1e-300)


def test_a_known_value_of_the_tail() -> None:
    # P[Bin(10, 3/4) ≥ 8] = (45·3⁸ + 10·3⁹ + 3¹⁰)/4¹⁰ = 551124/1048576
    found = p_value(canaries=10, guesses=10, correct=8, epsilon=math.log(3))
    assert found == pytest.approx(551124 / 1048576, rel=1e-12)


@pytest.mark.parametrize(("k", "confidence"), [(10, 0.95), (32, 0.95), (100, 0.99), (2, 0.5)])
def test_every_guess_right_has_a_closed_form(k: int, confidence: float) -> None:
    # P[Bin(k, q) ≥ k] = q^k = β ⇔ q = β^(1/k) ⇔ ε = ln(q/(1 − q))
    q = (1 - confidence) ** (1 / k)
    expected = math.log(q / (1 - q))
    found = epsilon_lower_bound(canaries=4 * k, guesses=k, correct=k, confidence=confidence)
    assert found == pytest.approx(expected, abs=1e-8)
    assert largest_bound(canaries=4 * k, guesses=k, confidence=confidence) == found


def test_the_bound_is_the_largest_epsilon_refuted() -> None:
    """At the bound the tail is β (from below); just above it, more than β."""
    for k, r in [(32, 28), (64, 50), (200, 130), (16, 16)]:
        bound = epsilon_lower_bound(canaries=2 * k, guesses=k, correct=r, confidence=0.95)
        assert bound > 0
        assert p_value(canaries=2 * k, guesses=k, correct=r, epsilon=bound) <= 0.05
        assert p_value(canaries=2 * k, guesses=k, correct=r, epsilon=bound + 1e-6) > 0.05


def test_no_better_than_chance_refutes_nothing() -> None:
    for k, r in [(32, 16), (32, 0), (64, 35), (10, 5)]:
        assert epsilon_lower_bound(canaries=2 * k, guesses=k, correct=r) == 0.0
    assert epsilon_lower_bound(canaries=10, guesses=0, correct=0) == 0.0


def test_the_delta_term_is_steinke_et_al_s() -> None:
    # k = 2, r = 2: tail q²; α = max(P[X = 1]/1, (P[X = 1] + P[X = 0])/2)
    q = 1 / (1 + math.exp(-1.0))
    m, delta = 8, 1e-3
    alpha = max(2 * q * (1 - q), (2 * q * (1 - q) + (1 - q) ** 2) / 2)
    found = p_value(canaries=m, guesses=2, correct=2, epsilon=1.0, delta=delta)
    assert found == pytest.approx(q**2 + 2 * m * delta * alpha, rel=1e-12)
    # δ can only weaken the evidence
    pure = epsilon_lower_bound(canaries=128, guesses=64, correct=60)
    approximate = epsilon_lower_bound(canaries=128, guesses=64, correct=60, delta=1e-5)
    assert 0 < approximate <= pure


def test_the_bound_refuses_impossible_counts() -> None:
    with pytest.raises(ValueError):
        p_value(canaries=4, guesses=5, correct=1, epsilon=1.0)
    with pytest.raises(ValueError):
        p_value(canaries=10, guesses=5, correct=6, epsilon=1.0)


# -- canaries, scores, guesses ----------------------------------------------------------------

PHRASES = [f"common{i:03d}" for i in range(100)] + [
    "".join(letters) for letters in itertools.product("bcdfg", "aeiou", "klmnp", "aeiou")
][:400]


def test_canaries_are_public_words_from_the_rare_end_and_fair_coins() -> None:
    words = audit.rare_words(PHRASES)
    assert set(words) <= set(PHRASES[250:])
    found = make_canaries(
        phrases=PHRASES, labels=["a", "b"], count=40, seed=7, document_type="news article"
    )
    assert len(found.canaries) == len(found.included) == 40
    assert [c.label for c in found.canaries[:4]] == ["a", "b", "a", "b"]
    assert found.canaries[1].prefix == "news article about b:"
    suffix_words = [w for c in found.canaries for w in c.suffix]
    assert len(suffix_words) == len(set(suffix_words)) == 40 * audit.DEFAULT_SUFFIX
    assert set(suffix_words) <= set(words)
    # reproducible from the recorded seed, and through the stored form
    assert (
        make_canaries(
            phrases=PHRASES, labels=["a", "b"], count=40, seed=7, document_type="news article"
        )
        == found
    )
    assert CanarySet.from_dict(found.to_dict()) == found
    # the coins are fair: over many seeds about half come up heads
    heads = [
        sum(
            make_canaries(
                phrases=PHRASES, labels=["a"], count=50, seed=s, document_type="d"
            ).included
        )
        for s in range(40)
    ]
    assert abs(np.mean(heads) / 50 - 0.5) < 0.03


def test_a_tiny_vocabulary_still_makes_canaries_and_an_empty_one_is_refused() -> None:
    small = make_canaries(
        phrases=["heart failure", "knee", "femur", "fall"], labels=["x"], count=5, seed=1,
        document_type="note",
    )  # fmt: skip
    assert all(
        len(c.suffix) == 3 and set(c.suffix) <= {"knee", "femur", "fall"} for c in small.canaries
    )
    with pytest.raises(ConfigError) as caught:
        make_canaries(phrases=["heart failure"], labels=["x"], count=5, seed=1, document_type="n")
    assert caught.value.field == "audit_canaries"
    with pytest.raises(ConfigError):
        make_canaries(phrases=PHRASES, labels=["x"], count=0, seed=1, document_type="n")


def test_the_membership_score_reads_the_released_corpus_of_the_canary_s_class() -> None:
    canaries = [
        Canary("a", "p", ("alpha", "beta")),
        Canary("b", "p", ("gamma", "delta")),
        Canary("a", "p", ("omega", "sigma")),
    ]
    released = [("a", "alpha beta alpha"), ("b", "omega"), ("b", "gamma")]
    scores = membership_scores(canaries, released)
    assert scores[0] == pytest.approx(
        math.log(3) + math.log(2) + 1e-3 * (math.log(3) + math.log(2))
    )
    assert scores[1] == pytest.approx(math.log(2) * (1 + 1e-3))
    assert 0 < scores[2] < scores[1]  # "omega" only in another class's documents: a tie-breaker
    assert copied(canaries, released) == 1  # "alpha beta" in order, whole
    assert copied(canaries, [("a", "beta alpha")]) == 0


def test_guesses_take_the_extremes_and_break_ties_by_canary_order() -> None:
    scores = np.array([0.0, 3.0, 0.0, 1.0, 0.0, 2.0])
    assert guesses(scores, positives=2, negatives=2).tolist() == [0, 1, -1, 0, -1, 1]
    assert guesses(np.zeros(4), positives=1, negatives=1).tolist() == [1, 0, 0, -1]
    with pytest.raises(ConfigError):
        guesses(scores, positives=4, negatives=3)


def test_an_audit_counts_right_guesses_only_after_guessing() -> None:
    canaries = tuple(
        Canary("a", "p", (f"word{chr(97 + i // 26)}{chr(97 + i % 26)}",)) for i in range(40)
    )
    coins = tuple(i % 2 == 0 for i in range(40))
    canary_set = CanarySet(seed=0, canaries=canaries, included=coins)
    # a release that shows exactly the included canaries' words: every guess right
    leaky = [("a", " ".join(c.suffix[0] for c, kept in zip(canaries, coins, strict=True) if kept))]
    result = run_audit(canary_set, leaky, claimed_epsilon=0.1)
    assert (result.guesses, result.correct, result.included) == (20, 20, 20)
    assert result.epsilon_lower_bound == pytest.approx(
        largest_bound(canaries=40, guesses=20, confidence=0.95)
    )
    assert result.epsilon_lower_bound > 1.8
    assert result.copied_as_documents == 20  # one-word suffixes, each whole in the release
    assert result.exceeds_claim and "WARNING" in result.in_words()
    quiet = run_audit(canary_set, [("a", "nothing here")], claimed_epsilon=1.0)
    assert quiet.epsilon_lower_bound == 0.0 and not quiet.exceeds_claim
    assert quiet.copied_as_documents == 0
    assert "no evidence that ε exceeds 0" in quiet.in_words()
    assert "lower bound, not a proof" in quiet.in_words()
    assert quiet.to_dict()["in_words"] == quiet.in_words()


# -- the audit against the engine --------------------------------------------------------------

TOPICS = {
    "cardiology": ["heart failure", "chest pain", "arrhythmia", "blood pressure", "stent"],
    "neurology": ["seizure", "migraine", "stroke", "tremor", "memory loss"],
    "dermatology": ["rash", "eczema", "itching", "skin lesion", "psoriasis"],
}
FILLER = ["patient", "follow up", "clinic", "history"]
CLAIMED = 1.0  # ε_voc + ε_kde


def _pseudo_words(count: int, seed: int = 3) -> list[str]:
    """Made-up words (public, meaningless): the rare end of the test vocabulary."""
    rng = np.random.default_rng(seed)
    syllables = ["ka", "lo", "mir", "tas", "ven", "qu", "dor", "pel", "zin", "rub", "sa", "fo"]
    found: dict[str, None] = {}
    while len(found) < count:
        found["".join(rng.choice(syllables, size=3))] = None
    return list(found)


def _engine_audit(monkeypatch: pytest.MonkeyPatch | None) -> Any:
    """One DP-KPS run (histogram Ṽ + exact kernel, ε = 0.5 + 0.5) on a topic corpus with
    64 canaries drawn from the vocabulary's made-up words, and its audit; with
    ``monkeypatch``, OpenDP's noise is switched off (the release equals the aggregate)."""
    from workers.methods.dpkps.config import GenerationConfig
    from workers.methods.dpkps.pipeline import generate_sequences
    from workers.privacy import noise as samplers
    from workers.text.vocabulary import Vocabulary

    if monkeypatch is not None:
        monkeypatch.setattr(samplers, "_add", lambda noise, data, scale: list(data.tolist()))
    phrases = [w for words in TOPICS.values() for w in words] + FILLER + _pseudo_words(800)
    vocabulary = Vocabulary.from_phrases("audit-test", phrases)
    rng = np.random.default_rng(0)
    texts, labels = [], []
    for label, words in TOPICS.items():
        for _ in range(40):
            picked = [*rng.choice(words, size=3, replace=False), str(rng.choice(FILLER))]
            texts.append("The patient reports " + ", ".join(picked) + ".")
            labels.append(label)
    canaries = make_canaries(
        phrases=vocabulary.phrases,
        labels=list(TOPICS),
        count=64,
        seed=int(np.random.default_rng().integers(2**62)),
        document_type="clinical note",
    )
    added = canaries.included_canaries
    config = GenerationConfig(
        epsilon_vocab=0.5, epsilon_kde=0.5, vocabulary_size=300, sequence_length=5, per_class=60
    )
    result = generate_sequences(
        [*texts, *(c.text for c in added)],
        [*labels, *(c.label for c in added)],
        label_set=list(TOPICS),
        vocabulary=vocabulary,
        config=config,
        embedder=_embedder(),
    )
    assert float(result.report.epsilon) == pytest.approx(CLAIMED)
    released = [(s.label, " ".join(s.keyphrases)) for s in result.sequences]
    return run_audit(canaries, released, claimed_epsilon=float(result.report.epsilon))


_EMBEDDER: list[Any] = []


def _embedder() -> Any:
    from workers.text.embeddings import SentenceEmbedder

    if not _EMBEDDER:
        _EMBEDDER.append(SentenceEmbedder())
    return _EMBEDDER[0]


@pytest.mark.slow
def test_the_audit_catches_the_engine_with_its_noise_switched_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    broken = _engine_audit(monkeypatch)
    assert broken.copied_as_documents == 0
    assert broken.epsilon_lower_bound > CLAIMED, broken
    assert broken.exceeds_claim and "WARNING" in broken.in_words()


@pytest.mark.slow
def test_the_real_engine_at_the_same_epsilon_stays_within_its_claim() -> None:
    # one run, real OpenDP noise; a valid audit exceeds the truth with probability ≤ 5 %,
    # and this release leaks far less than ε = 1 about any one canary
    honest = _engine_audit(None)
    assert honest.epsilon_lower_bound <= CLAIMED, honest
    assert not honest.exceeds_claim
    assert honest.copied_as_documents == 0
