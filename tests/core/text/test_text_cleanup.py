"""The cleanup of the small LLM's talk about the request, on its real completions.

``fixtures/smollm2_completions.json`` holds 160 raw completions of the packaged
SmolLM2-135M-Instruct for DP-KPS prompts on AG News keyphrase sequences (collected by
``benchmarks/text_cleanup.py``; synthetic text of a public data set). The levels below
are what the cleanup reached on them when it was written
(``benchmarks/notes/2026-12-07-text-cleanup.md``): 57 of 160 opened with meta-talk, 7
after cleaning, 5 of those the model declining to write anything ("I'm ready to help.").
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workers.text.cleanup import MIN_WORDS, clean_completion, opens_with_meta

FIXTURE = Path(__file__).parents[1] / "fixtures" / "smollm2_completions.json"


@pytest.fixture(scope="module")
def texts() -> list[str]:
    data = json.loads(FIXTURE.read_text(encoding="utf-8"))
    return [c["text"] for c in data["completions"]]


def share(flags: list[bool]) -> float:
    return sum(flags) / len(flags)


def test_the_cleanup_brings_the_meta_talk_share_below_five_percent(texts: list[str]) -> None:
    assert len(texts) == 160
    before = share([opens_with_meta(t) for t in texts])
    after = share([opens_with_meta(clean_completion(t)) for t in texts])
    assert before >= 0.30  # the problem, seen in these completions
    assert after <= 0.05


def test_the_cleanup_only_removes_and_never_empties_a_text(texts: list[str]) -> None:
    for text in texts:
        cleaned = clean_completion(text)
        assert cleaned.strip()
        assert cleaned in text  # a part of what the model wrote, nothing added or reworded
        assert len(cleaned.split()) >= MIN_WORDS or cleaned == text.strip()


def test_a_text_without_meta_talk_keeps_its_words(texts: list[str]) -> None:
    """Texts the detector passes lose at most outer quotes or a closing note: never more
    than a fifth of their words."""
    for text in texts:
        if opens_with_meta(text):
            continue
        cleaned = clean_completion(text)
        assert len(cleaned.split()) >= 0.8 * len(text.split()) or "\n" in text


@pytest.mark.parametrize(
    ("text", "expected"),
    [  # shapes taken from the fixture's completions
        (
            "Here's a rewritten version of the news article:\n\n\"Oil rose to a record as "
            'traders weighed supply."',
            "Oil rose to a record as traders weighed supply.",
        ),
        (
            "The news article is: The recent incident in Hong Kong drew a sharp response "
            "from the government.",
            "The recent incident in Hong Kong drew a sharp response from the government.",
        ),
        (
            "Awesome! Here's a sample news article that combines all these keyphrases:\n\n"
            "The Red Sox won the pennant on a late home run.",
            "The Red Sox won the pennant on a late home run.",
        ),
        (
            "Title: Shares fall after profit warning\n\nShares of the retailer fell sharply.",
            "Shares fall after profit warning\n\nShares of the retailer fell sharply.",
        ),
        (
            "The story of the bench and the late tumble of the visiting side.\n\n"
            "In this sentence I made a few things up.",
            "The story of the bench and the late tumble of the visiting side.",
        ),
        ("I'm ready to help.", "I'm ready to help."),  # nothing else to keep: left as is
        (
            "Stocks rallied on Friday as oil prices eased.",
            "Stocks rallied on Friday as oil prices eased.",
        ),
    ],
)
def test_shapes_of_meta_talk(text: str, expected: str) -> None:
    assert clean_completion(text) == expected
