"""The low-ε benchmark's tuning splits never touch what it reports (issue 16's discipline)."""

from __future__ import annotations

from collections import Counter

import pytest

from benchmarks import bench_low_epsilon as bench


@pytest.fixture(scope="module")
def splits() -> dict[str, tuple[list[str], list[str], list[str], list[str]]]:
    if not all((bench.DATA / name).exists() for name in ("yelp_test.csv", "ag_news_test.csv")):
        pytest.skip(f"the shared corpora are not at {bench.DATA}")
    return {
        name: make() for name, make in bench.SPLITS.items() if name not in bench.OPTIONAL_SPLITS
    }


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


def _ohsumed_tree(root, sizes: dict[str, tuple[int, int]]) -> None:
    """A corpus in OHSUMED's layout: ``sizes[code]`` = (training, test) abstracts."""
    for code, (train, test) in sizes.items():
        for part, n in (("training", train), ("test", test)):
            folder = root / part / code
            folder.mkdir(parents=True)
            for i in range(n):
                (folder / f"{i:07d}").write_text(f"Title {code} {part} {i}.\n Abstract  text.\n")


def test_the_ohsumed_splits_keep_the_hospital_shape_and_never_share_an_abstract(tmp_path) -> None:
    sizes = {"C01": (150, 60), "C04": (90, 50), "C22": (9, 10), "C23": (60, 45)}
    _ohsumed_tree(tmp_path, sizes)
    private, labels, test, test_labels = bench.ohsumed_hospital_split(tmp_path)
    counts = Counter(labels)
    names = bench.MESH_CATEGORIES
    assert counts == {names["C01"]: 40, names["C04"]: 40, names["C22"]: 9, names["C23"]: 40}
    assert Counter(test_labels) == {
        names["C01"]: 40,
        names["C04"]: 40,
        names["C22"]: 10,
        names["C23"]: 40,
    }
    assert all(" training " in t for t in private) and all(" test " in t for t in test)
    assert private[0] == " ".join(private[0].split())  # one line, single spaces
    assert private == bench.ohsumed_hospital_split(tmp_path)[0]  # seeded
    # the tuning split: only categories with ≥ 80 spare training abstracts, none reported
    t_private, t_labels, t_test, t_test_labels = bench.ohsumed_tune_split(tmp_path)
    assert Counter(t_labels) == {names["C01"]: 20}  # C04 has 50 spare, C23 20 (< 60)
    assert Counter(t_test_labels) == {names["C01"]: 40}
    assert not (set(t_private) | set(t_test)) & (set(private) | set(test))
    assert not set(t_private) & set(t_test)


def test_a_missing_ohsumed_corpus_names_where_it_was_looked_for(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="KEYSEED_OHSUMED"):
        bench.ohsumed_hospital_split(tmp_path / "absent")


def test_the_real_ohsumed_splits_if_present() -> None:
    if not (bench.OHSUMED / "training").is_dir():
        pytest.skip(f"OHSUMED is not at {bench.OHSUMED}")
    private, labels, test, test_labels = bench.ohsumed_hospital_split()
    assert len(set(labels)) == 23 and max(Counter(labels).values()) == 40
    assert 800 <= len(private) <= 920 and set(test_labels) == set(labels)
    t_private, t_labels, t_test, _ = bench.ohsumed_tune_split()
    assert len(set(t_labels)) == 12 and set(Counter(t_labels).values()) == {20}
    assert not (set(t_private) | set(t_test)) & (set(private) | set(test))


def _newsgroups_tree(root, sizes: dict[str, tuple[int, int]]) -> None:
    """A corpus in the 20 Newsgroups' "bydate" layout: ``sizes[group]`` = (train, test)."""
    for group, (train, test) in sizes.items():
        for part, n in (("train", train), ("test", test)):
            folder = root / f"20news-bydate-{part}" / group
            folder.mkdir(parents=True)
            for i in range(n):
                (folder / f"{i:05d}").write_text(
                    f"From: someone@{group}\nSubject: post {i}\nLines: 2\n\n"
                    f"Body of {group} {part} {i}.\n\n  Second   paragraph.\n"
                )


def test_the_newsgroups_splits_drop_headers_and_never_share_a_post(tmp_path) -> None:
    sizes = {"sci.med": (120, 50), "rec.autos": (100, 30), "alt.atheism": (60, 45)}
    _newsgroups_tree(tmp_path, sizes)
    topics = bench.NEWSGROUP_TOPICS
    private, labels, test, test_labels = bench.newsgroups_hospital_split(tmp_path)
    assert Counter(labels) == {topics[g]: 45 for g in sizes}
    assert Counter(test_labels) == {topics["sci.med"]: 40, topics["rec.autos"]: 30,
                                    topics["alt.atheism"]: 40}  # fmt: skip
    # the header block (sender, subject) is gone; the body keeps both paragraphs
    assert all(t.startswith("Body of ") and t.endswith("Second paragraph.") for t in private)
    assert not any("From:" in t or "Subject:" in t for t in private + test)
    assert all(" train " in t for t in private) and all(" test " in t for t in test)
    assert private == bench.newsgroups_hospital_split(tmp_path)[0]  # seeded
    # the tuning twin: the training posts the reported split leaves, 45 + at most 40 a group
    t_private, t_labels, t_test, t_test_labels = bench.newsgroups_tune_split(tmp_path)
    assert Counter(t_labels) == {
        topics["sci.med"]: 45,
        topics["rec.autos"]: 45,
        topics["alt.atheism"]: 15,
    }  # fmt: skip  (60 − 45 spare)
    assert Counter(t_test_labels) == {topics["sci.med"]: 30, topics["rec.autos"]: 10}
    assert not (set(t_private) | set(t_test)) & (set(private) | set(test))
    assert not set(t_private) & set(t_test)
    with pytest.raises(FileNotFoundError, match="KEYSEED_NEWSGROUPS"):
        bench.newsgroups_hospital_split(tmp_path / "absent")


def test_the_real_newsgroups_splits_if_present() -> None:
    if not (bench.NEWSGROUPS / "20news-bydate-train").is_dir():
        pytest.skip(f"the 20 Newsgroups are not at {bench.NEWSGROUPS}")
    private, labels, test, test_labels = bench.newsgroups_hospital_split()
    assert set(Counter(labels).values()) == {45} and len(set(labels)) == 20
    assert set(Counter(test_labels).values()) == {40} and set(test_labels) == set(labels)
    t_private, t_labels, t_test, _ = bench.newsgroups_tune_split()
    assert set(Counter(t_labels).values()) == {45} and len(t_test) == 800
    assert not (set(t_private) | set(t_test)) & (set(private) | set(test))
