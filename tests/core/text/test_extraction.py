"""Keyphrase extraction: word boundaries, leftmost-longest, order, limit, speed."""

from __future__ import annotations

import csv
import random
import time
from pathlib import Path

import pytest

from workers.errors import ConfigError, InputDataError
from workers.text.extraction import KeyphraseExtractor
from workers.text.vocabulary import (
    Vocabulary,
    english_vocabulary,
    medical_vocabulary,
    normalise,
)

PHRASES = [
    "cat",
    "heart",
    "heart failure",
    "congestive heart failure",
    "failure",
    "new york",
    "york times",
    "times",
    "x-ray",
    "u.s.",
    "-based",
    "c++",
    ".net",
    "covid-19",
    "café",
    "dog",
]


@pytest.fixture(scope="module")
def extractor() -> KeyphraseExtractor:
    return KeyphraseExtractor(Vocabulary.from_phrases("test", PHRASES))


def found(extractor: KeyphraseExtractor, text: str, limit: int | None = None) -> list[str]:
    return [extractor.vocabulary.phrases[i] for i in extractor.extract(text, limit)]


def test_returns_indices_in_document_order_with_repeats(extractor: KeyphraseExtractor) -> None:
    indices = extractor.extract("The dog saw a cat; the cat saw the dog. Dog!")
    v = extractor.vocabulary
    assert indices == [v.index_of(p) for p in ["dog", "cat", "cat", "dog", "dog"]]


def test_longest_match_wins_at_a_position(extractor: KeyphraseExtractor) -> None:
    assert found(extractor, "heart failure") == ["heart failure"]
    assert found(extractor, "congestive heart failure") == ["congestive heart failure"]
    assert found(extractor, "a heart, then failure") == ["heart", "failure"]
    assert found(extractor, "heart failures") == ["heart"]  # "failures" is another word


def test_matches_do_not_overlap_and_leftmost_wins(extractor: KeyphraseExtractor) -> None:
    # "new york" starts first, so the overlapping "york times" is rejected; "times"
    # starts after "new york" ends, so it matches.
    assert found(extractor, "the New York Times") == ["new york", "times"]
    assert found(extractor, "york times") == ["york times"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("concatenate", []),
        ("bobcat", []),
        ("cats", []),
        ("catalogue", []),
        ("cat", ["cat"]),
        ("cat.", ["cat"]),
        ("(cat)", ["cat"]),
        ("'cat'", ["cat"]),
        ("cat-like", ["cat"]),
        ("wild-cat", ["cat"]),
        ("cat_dog", ["cat", "dog"]),  # underscore is not alphanumeric
        ("cat/dog", ["cat", "dog"]),
        ("cat2", []),  # digits are alphanumeric
        ("2cat", []),
        ("catédrale", []),  # accented letters are alphanumeric
    ],
)
def test_word_boundaries(extractor: KeyphraseExtractor, text: str, expected: list[str]) -> None:
    assert found(extractor, text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("An X-Ray was taken", ["x-ray"]),
        ("two x-rays", []),
        ("x-ray-guided", ["x-ray"]),
        ("u.s.-based firms", ["u.s.", "-based"]),
        ("I like C++.", ["c++"]),
        ("use .NET today", [".net"]),
        ("asp.net", []),  # the character before "." is a letter
        ("COVID-19 cases", ["covid-19"]),
        ("covid-190", []),
    ],
)
def test_phrases_with_punctuation(
    extractor: KeyphraseExtractor, text: str, expected: list[str]
) -> None:
    assert found(extractor, text) == expected


def test_case_folding_and_unicode_forms(extractor: KeyphraseExtractor) -> None:
    assert found(extractor, "HEART Failure") == ["heart failure"]
    assert found(extractor, "ＣＡＴ") == ["cat"]  # full-width letters
    assert found(extractor, "CAFE\u0301 or Café") == ["café", "café"]


def test_multiword_phrases_span_irregular_whitespace(extractor: KeyphraseExtractor) -> None:
    text = "congestive\n\theart \u00a0 failure and heart\r\nfailure"
    assert found(extractor, text) == ["congestive heart failure", "heart failure"]


def test_limit(extractor: KeyphraseExtractor) -> None:
    text = "cat dog cat heart failure dog"
    assert found(extractor, text) == ["cat", "dog", "cat", "heart failure", "dog"]
    assert found(extractor, text, limit=0) == []
    assert found(extractor, text, limit=1) == ["cat"]
    assert found(extractor, text, limit=4) == ["cat", "dog", "cat", "heart failure"]
    assert found(extractor, text, limit=100) == found(extractor, text)
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(ConfigError) as info:
            extractor.extract(text, limit=bad)  # type: ignore[arg-type]
        assert info.value.field == "limit"


def test_empty_and_phraseless_text(extractor: KeyphraseExtractor) -> None:
    assert extractor.extract("") == []
    assert extractor.extract(" \n\t ") == []
    assert extractor.extract("nothing to see here") == []
    with pytest.raises(InputDataError) as info:
        extractor.extract(None)  # type: ignore[arg-type]
    assert info.value.field == "text"


def test_marker_characters_in_input_are_harmless(extractor: KeyphraseExtractor) -> None:
    assert found(extractor, "\ufdd0cat\ufdd1 \ufdd1dog") == ["cat", "dog"]
    assert found(extractor, "ca\ufdd1\ufdd0t") == []


def test_extract_many(extractor: KeyphraseExtractor) -> None:
    texts = ["cat", "", "heart failure dog", "concatenate"]
    assert extractor.extract_many(texts) == [extractor.extract(t) for t in texts]
    assert extractor.extract_many(iter(texts), limit=1) == [[0], [], [2], []]


def _reference(phrases: list[str], text: str) -> list[int]:
    """Leftmost-longest, word-boundary matching by brute force, for comparison."""
    text = normalise(text)
    out, i = [], 0
    while i < len(text):
        best = None
        if i == 0 or not text[i - 1].isalnum():
            for index, p in enumerate(phrases):
                if not text.startswith(p, i):
                    continue
                end = i + len(p)
                bounded = end == len(text) or not text[end].isalnum()
                if bounded and (best is None or len(p) > len(phrases[best])):
                    best = index
        if best is None:
            i += 1
        else:
            out.append(best)
            i += len(phrases[best])
    return out


def test_agrees_with_brute_force_on_random_texts() -> None:
    rng = random.Random(7)
    alphabet = "ab1-. "
    for _ in range(40):
        raw = {"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4))) for _ in range(12)}
        vocab = Vocabulary.from_phrases("random", sorted(raw))
        extractor = KeyphraseExtractor(vocab)
        for _ in range(25):
            text = "".join(rng.choice(alphabet + "A") for _ in range(rng.randint(0, 40)))
            assert extractor.extract(text) == _reference(list(vocab.phrases), text), (
                vocab.phrases,
                text,
            )


def test_medical_vocabulary_prefers_the_longer_term() -> None:
    v = medical_vocabulary()
    extractor = KeyphraseExtractor(v)
    text = "Congestive Heart Failure, then heart failure and fever."
    matched = [v.phrases[i] for i in extractor.extract(text)]
    assert matched == ["congestive heart failure", "heart failure", "fever"]


@pytest.mark.slow
def test_ag_news_against_english_vocabulary_is_fast(ag_news_path: Path) -> None:
    with open(ag_news_path, encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle))
    documents = [f"{row['title']}. {row['description']}" for row in rows[:6000]]
    assert len(documents) == 6000
    vocabulary = english_vocabulary()
    extractor = KeyphraseExtractor(vocabulary)
    start = time.process_time()
    matches = extractor.extract_many(documents)
    seconds = time.process_time() - start
    assert seconds < 3.0, f"6,000 documents took {seconds:.2f} s of CPU"
    assert sum(1 for m in matches if m) >= 5990
    assert sum(map(len, matches)) / len(matches) > 15
    first = [vocabulary.phrases[i] for i in matches[0]]
    assert first[:2] == ["fears", "pension"]  # "Fears for T N pension after talks..."
    assert all(0 <= i < len(vocabulary) for m in matches for i in m)
