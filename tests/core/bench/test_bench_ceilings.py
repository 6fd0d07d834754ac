"""The representation ceilings diagnostic: each document's own phrases, and independent draws."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from benchmarks import ceilings
from benchmarks.bench_low_epsilon import Bench
from benchmarks.bench_utility import independent_draws, own_phrases
from workers.text.extraction import KeyphraseExtractor
from workers.text.vocabulary import Vocabulary

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"]


def _extractor() -> KeyphraseExtractor:
    return KeyphraseExtractor(Vocabulary.from_phrases("words", WORDS))


def test_own_phrases_first_distinct_and_most_frequent() -> None:
    texts = ["beta alpha beta gamma gamma gamma delta", "nothing here", "zeta"]
    matches = _extractor().extract_many(texts)
    # first distinct, in document order; a text without a phrase gets an empty bag
    assert own_phrases(matches, 2) == [[1, 0], [], [5]]
    assert own_phrases(matches, 10) == [[1, 0, 2, 3], [], [5]]
    # most frequent: gamma (3), beta (2), then the ties by first occurrence (alpha, delta)
    assert own_phrases(matches, 3, frequent=True) == [[2, 1, 0], [], [5]]


def test_independent_draws_come_from_each_class_own_bags_in_the_wanted_numbers() -> None:
    bags = [[0, 1, 2], [1, 2], [3, 4], [4, 5], []]
    labels = ["a", "a", "b", "b", "b"]
    draws, out = independent_draws(bags, labels, {"a": 50, "b": 30}, 6, 2, np.random.default_rng(0))
    assert Counter(out) == {"a": 50, "b": 30}
    for draw, label in zip(draws, out, strict=True):
        assert len(draw) == len(set(draw)) == 2  # distinct phrases
        assert set(draw) <= ({0, 1, 2} if label == "a" else {3, 4, 5})
    # the weights are each document's 1 / |bag|: in a, phrases 1 and 2 weigh 5/6, phrase 0
    # weighs 1/3, so phrase 0 is in fewer of a's pairs than phrase 1
    seen = Counter(i for draw, label in zip(draws, out, strict=True) if label == "a" for i in draw)
    assert seen[0] < seen[1]
    # seeded: the same generator seed gives the same draws
    again, _ = independent_draws(bags, labels, {"a": 50, "b": 30}, 6, 2, np.random.default_rng(0))
    assert again == draws


def test_independent_draws_shorten_to_a_class_support_and_skip_an_empty_class() -> None:
    draws, out = independent_draws(
        [[0], [0], []], ["a", "a", "b"], {"a": 3, "b": 4}, 6, 4, np.random.default_rng(1)
    )
    assert draws == [[0], [0], [0]]
    assert out == ["a", "a", "a"]


def test_wanted_counts_split_the_total_by_the_exact_class_counts() -> None:
    wanted = ceilings.wanted_counts(["x"] * 7 + ["y"] * 2 + ["z"], 100)
    assert wanted == {"x": 70, "y": 20, "z": 10}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_ceilings_on_ag_news_rows(tiny_bench: Bench) -> None:
    bench = tiny_bench
    record = ceilings.ceilings(bench, [4], total=40)
    assert record["public_size"] == bench.config(1.0, 0, {}).public_size
    assert record["total"] == 40
    accuracy = record["accuracy"]
    assert set(accuracy) == {"own first 4", "own frequent 4", "independent 4"}
    # own first 4 is the classifier on each private document's own phrases, labelled
    phrases = list(bench.vocabulary.phrases)[: record["public_size"]]
    extractor = KeyphraseExtractor(Vocabulary.from_phrases("public", phrases))
    bags = own_phrases(extractor.extract_many(bench.texts), 4)
    own = bench.score([" ".join(phrases[i] for i in bag) for bag in bags], bench.labels)
    assert accuracy["own first 4"] == pytest.approx(own)
    # four balanced topics: each stand-in is well above chance (0.25) on 60 test items
    for value in accuracy.values():
        assert 0.4 < value <= 1.0
    json.dumps(record)
