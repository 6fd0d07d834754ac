"""The low-ε benchmark's tuning splits never touch what it reports (issue 16's discipline)."""

from __future__ import annotations

from collections import Counter

import pytest

from benchmarks import bench_low_epsilon as bench


@pytest.fixture(scope="module")
def splits() -> dict[str, tuple[list[str], list[str], list[str], list[str]]]:
    if not all((bench.DATA / name).exists() for name in ("yelp_test.csv", "ag_news_test.csv")):
        pytest.skip(f"the shared corpora are not at {bench.DATA}")
    return {name: make() for name, make in bench.SPLITS.items()}


def _texts(split: tuple[list[str], list[str], list[str], list[str]]) -> set[str]:
    return set(split[0]) | set(split[2])


def test_yelp_tuning_splits_share_no_review_with_the_reported_ones(splits) -> None:
    reported = _texts(splits["yelp-small"]) | _texts(splits["yelp-category"])
    for name, private_size in (("yelp-tune", 2000), ("yelp-small-tune", 1000)):
        private, labels, test, test_labels = splits[name]
        assert len(private) == len(labels) == private_size
        assert len(test) == len(test_labels) == 1000
        assert not set(private) & set(test)
        assert not _texts(splits[name]) & reported, name


def test_yelp_tuning_labels_are_the_reported_label_kinds(splits) -> None:
    categories = set(splits["yelp-category"][1])
    assert set(splits["yelp-tune"][1]) <= categories and len(set(splits["yelp-tune"][1])) >= 8
    assert all(" / " in label for label in splits["yelp-small-tune"][1])


def test_ag_tune_and_report_are_disjoint(splits) -> None:
    assert not _texts(splits["ag-tune"]) & _texts(splits["ag-report"])


def test_yelp_hospital_has_the_held_out_corpus_shape_and_reported_test_reviews(splits) -> None:
    private, labels, test, test_labels = splits["yelp-hospital"]
    counts = Counter(labels)
    assert len(counts) == 24 and max(counts.values()) == 40 and min(counts.values()) >= 30
    assert 900 <= len(private) <= 1000
    assert set(test_labels) <= set(counts) and max(Counter(test_labels).values()) <= 40
    assert set(test) <= set(splits["yelp-small"][2])  # the reported 2,000, never tuned on
    assert not set(private) & set(test)
    for name in ("yelp-tune", "yelp-small-tune"):
        assert not _texts(splits["yelp-hospital"]) & _texts(splits[name]), name


def test_the_hospital_tuning_split_is_small_balanced_and_apart_from_what_is_reported(
    splits,
) -> None:
    private, labels, test, test_labels = splits["yelp-hospital-tune"]
    counts = Counter(labels)
    assert len(counts) == 20 and set(counts.values()) == {20}
    assert set(test_labels) <= set(counts) and max(Counter(test_labels).values()) <= 40
    assert not set(private) & set(test)
    reported = (
        _texts(splits["yelp-small"])
        | _texts(splits["yelp-category"])
        | _texts(splits["yelp-hospital"])
    )
    assert not _texts(splits["yelp-hospital-tune"]) & reported
