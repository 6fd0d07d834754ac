"""The low-ε benchmark's tuning splits never touch what it reports (issue 16's discipline)."""

from __future__ import annotations

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
