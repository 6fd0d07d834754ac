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


def test_the_larger_newsgroups_split_draws_only_posts_no_other_split_uses(tmp_path) -> None:
    sizes = {"sci.med": (200, 50), "rec.autos": (160, 30)}
    _newsgroups_tree(tmp_path, sizes)
    topics = bench.NEWSGROUP_TOPICS
    private, labels, test, test_labels = bench.newsgroups_larger_split(tmp_path, per_group=50)
    # 200 − 45 − 85 = 70 spare sci.med posts, 160 − 130 = 30 rec.autos ones
    assert Counter(labels) == {topics["sci.med"]: 50, topics["rec.autos"]: 30}
    hospital = bench.newsgroups_hospital_split(tmp_path)
    tune = bench.newsgroups_tune_split(tmp_path)
    assert not set(private) & (set(hospital[0]) | set(tune[0]) | set(tune[2]))
    assert (test, test_labels) == (hospital[2], hospital[3])  # the hospital's test posts
    assert private == bench.newsgroups_larger_split(tmp_path, per_group=50)[0]  # seeded
    # its tuning twin: 40 test posts a group outside the hospital's, its private posts
    # from what no split uses (sci.med: 20 spare training posts + 50 − 40 − 40 test ones)
    w_private, w_labels, w_test, w_test_labels = bench.newsgroups_larger_tune_split(
        tmp_path, per_group=50
    )
    assert Counter(w_test_labels) == {topics["sci.med"]: 10}  # 50 − 40 test posts
    assert Counter(w_labels) == {topics["sci.med"]: 20}  # 70 − 50 spare training posts
    used = set(private) | set(test) | set(hospital[0]) | set(tune[0]) | set(tune[2])
    assert not (set(w_private) | set(w_test)) & used and not set(w_private) & set(w_test)


def test_the_real_newsgroups_splits_if_present() -> None:
    if not (bench.NEWSGROUPS / "20news-bydate-train").is_dir():
        pytest.skip(f"the 20 Newsgroups are not at {bench.NEWSGROUPS}")
    private, labels, test, test_labels = bench.newsgroups_hospital_split()
    assert set(Counter(labels).values()) == {45} and len(set(labels)) == 20
    assert set(Counter(test_labels).values()) == {40} and set(test_labels) == set(labels)
    t_private, t_labels, t_test, _ = bench.newsgroups_tune_split()
    assert set(Counter(t_labels).values()) == {45} and len(t_test) == 800
    assert not (set(t_private) | set(t_test)) & (set(private) | set(test))
    l_private, l_labels, _, _ = bench.newsgroups_larger_split()
    assert set(Counter(l_labels).values()) == {bench.NEWSGROUPS_LARGER}
    assert not set(l_private) & (set(private) | set(t_private) | set(t_test))
    w_private, w_labels, w_test, _ = bench.newsgroups_larger_tune_split()
    assert set(Counter(w_labels).values()) == {bench.NEWSGROUPS_LARGER} and len(w_test) == 800
    used = set(private) | set(test) | set(t_private) | set(t_test) | set(l_private)
    assert not (set(w_private) | set(w_test)) & used


def _medical_csv(path, sizes: dict[str, int]) -> None:
    """A file in the medical abstracts' layout: ``sizes[condition_label]`` abstracts."""
    rows = ["condition_label,medical_abstract"]
    for label, n in sizes.items():
        rows += [f'{label},"Abstract {label}-{i}:  spaced\n  text, quoted."' for i in range(n)]
    rows += [f'{label},"Shared by two classes: spaced text, quoted."' for label in ("1", "3")]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")


def test_the_medical_abstracts_split_keeps_each_class_share_and_never_shares_one(
    tmp_path,
) -> None:
    source = tmp_path / "medical.csv"
    _medical_csv(source, {"1": 100, "3": 41, "5": 10})
    names = bench.CONDITIONS
    private, labels, test, test_labels = bench.medical_abstracts_split(source)
    # a seeded fifth of each class is test (rounded), the rest private
    assert Counter(test_labels) == {names["1"]: 20, names["3"]: 8, names["5"]: 2}
    assert Counter(labels) == {names["1"]: 80, names["3"]: 33, names["5"]: 8}
    # an abstract filed under two classes is dropped; none is in both parts
    assert not set(private) & set(test) and len(set(private) | set(test)) == 151
    assert not any(t.startswith("Shared") for t in private + test)
    assert all(t.endswith("spaced text, quoted.") for t in private + test)  # whitespace folded
    code = {name: key for key, name in names.items()}  # each abstract under its own class
    assert all(t.startswith(f"Abstract {code[y]}-") for t, y in zip(private, labels, strict=True))
    assert (private, test) == bench.medical_abstracts_split(source)[::2]  # seeded
    with pytest.raises(FileNotFoundError, match="KEYSEED_MEDICAL_ABSTRACTS"):
        bench.medical_abstracts_split(tmp_path / "absent.csv")


def test_the_real_medical_abstracts_split_if_present() -> None:
    if not bench.MEDICAL_ABSTRACTS.is_file():
        pytest.skip(f"the medical abstracts are not at {bench.MEDICAL_ABSTRACTS}")
    private, labels, test, test_labels = bench.medical_abstracts_split()
    assert (len(private), len(test)) == (2126, 531) and len(set(labels)) == 5
    assert set(test_labels) == set(labels) == set(bench.CONDITIONS.values())
    assert not set(private) & set(test)
    if (bench.OHSUMED / "training").is_dir():  # its tuning twin, from OHSUMED
        t_private, _, t_test, _ = bench.medical_tune_split()
        assert (len(t_private), len(t_test)) == (2236, 558)
        assert not (set(t_private) | set(t_test)) & (set(private) | set(test))


def test_the_medical_tuning_split_leaves_out_both_reported_corpora(tmp_path) -> None:
    # OHSUMED with its five large categories (and one more), and a medical abstracts' file
    # that shares two of its abstracts (the two corpora are both MEDLINE)
    _ohsumed_tree(tmp_path, {"C04": (60, 30), "C14": (50, 20), "C23": (45, 10), "C01": (70, 5)})
    hospital = bench.ohsumed_hospital_split(tmp_path)
    drawn = set(hospital[0]) | set(hospital[2])
    shared = [  # one abstract of each of two categories that the hospital split leaves
        next(t for i in range(60) if (t := f"Title {c} {part} {i}. Abstract text.") not in drawn)
        for c, part in (("C04", "training"), ("C14", "training"))
    ]
    source = tmp_path / "medical.csv"
    _medical_csv(source, {"1": 10})
    with open(source, "a", encoding="utf-8") as handle:
        handle.writelines(f'1,"{t}"\n' for t in shared)
    private, labels, test, test_labels = bench.medical_tune_split(tmp_path, source)
    names = bench.MESH_CATEGORIES
    reported = drawn | set(shared)
    assert not (set(private) | set(test)) & reported
    assert set(labels) == set(test_labels) == {names[c] for c in ("C04", "C14", "C23")}
    # everything else of those categories, both parts, a fifth of each as test
    whole = Counter(labels) + Counter(test_labels)
    assert whole == {names["C04"]: 90 - 40 - 30 - 1, names["C14"]: 70 - 40 - 20 - 1,
                     names["C23"]: 55 - 40 - 10}  # fmt: skip
    assert Counter(test_labels) == {label: round(0.2 * n) for label, n in whole.items()}
    assert not set(private) & set(test)
