"""The HPO sample corpus: labels, sizes, stratified split, determinism, CLI."""

from __future__ import annotations

import csv
from collections import Counter
from pathlib import Path

import pytest

from workers.errors import ConfigError
from workers.samples import (
    Document,
    attribution,
    build_hpo_sample,
    clean_definition,
    hpo_documents,
    main,
    short_label,
    stratified_split,
)

LABELS = {
    "nervous system",
    "metabolism",
    "genitourinary system",
    "musculoskeletal system",
    "cardiovascular system",
    "eye",
}


def read(path: Path) -> list[dict[str, str]]:
    with open(path, encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle)
        assert reader.fieldnames == ["text", "label"]
        return list(reader)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return build_hpo_sample(tmp_path_factory.mktemp("hpo"))


def test_files_labels_and_sizes(built: tuple[Path, Path]) -> None:
    private_path, test_path = built
    assert private_path.name == "hpo_private.csv" and test_path.name == "hpo_test.csv"
    private, test = read(private_path), read(test_path)
    counts_private = Counter(r["label"] for r in private)
    counts_test = Counter(r["label"] for r in test)
    assert set(counts_private) == set(counts_test) == LABELS
    assert 5000 <= len(private) + len(test) <= 9000
    assert min(counts_private.values()) >= 400
    assert counts_private.most_common(1)[0][0] == "nervous system"
    # Stratified: every label keeps its 20 % share in the test part.
    for label in LABELS:
        total = counts_private[label] + counts_test[label]
        assert abs(counts_test[label] - round(0.2 * total)) <= 1
    assert abs(len(test) / (len(private) + len(test)) - 0.2) < 0.01


def test_texts_are_clean_and_disjoint(built: tuple[Path, Path]) -> None:
    private, test = (read(p) for p in built)
    texts = [r["text"] for r in private + test]
    assert len(set(texts)) == len(texts)  # no duplicates, so no leak between parts
    for text in texts:
        assert text and text == text.strip()
        assert not text.startswith('"') and not text.endswith('"')
        assert "orcid.org" not in text and not text.endswith("]")
        assert "  " not in text and "\n" not in text
    assert any(text.startswith("A reduction in the number of") for text in texts)


def test_split_is_deterministic_for_a_seed(tmp_path: Path, built: tuple[Path, Path]) -> None:
    again = build_hpo_sample(tmp_path / "same")
    for first, second in zip(built, again, strict=True):
        assert first.read_bytes() == second.read_bytes()
    other = build_hpo_sample(tmp_path / "other", seed=1)
    assert other[1].read_bytes() != built[1].read_bytes()
    assert len(read(other[1])) == len(read(built[1]))  # same sizes, other documents


def test_max_per_class_and_test_fraction(tmp_path: Path) -> None:
    private_path, test_path = build_hpo_sample(
        tmp_path, test_fraction=0.5, seed=3, max_per_class=40
    )
    private, test = read(private_path), read(test_path)
    assert Counter(r["label"] for r in private) == dict.fromkeys(LABELS, 20)
    assert Counter(r["label"] for r in test) == dict.fromkeys(LABELS, 20)


def test_stratified_split_keeps_every_label_in_both_parts() -> None:
    docs = [Document(f"HP:{i:07d}", f"text {i}", "big" if i < 50 else "small") for i in range(53)]
    private, test = stratified_split(docs, test_fraction=0.1, seed=0)
    assert Counter(d.label for d in test) == {"big": 5, "small": 1}
    assert Counter(d.label for d in private) == {"big": 45, "small": 2}
    assert {d.term_id for d in private} | {d.term_id for d in test} == {d.term_id for d in docs}
    # Independent of the input order.
    assert stratified_split(list(reversed(docs)), test_fraction=0.1, seed=0) == (private, test)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"test_fraction": 0.0}, "test_fraction"),
        ({"test_fraction": 1.0}, "test_fraction"),
        ({"test_fraction": float("nan")}, "test_fraction"),
        ({"max_per_class": 1}, "max_per_class"),
        ({"seed": 1.5}, "seed"),
    ],
)
def test_bad_parameters(tmp_path: Path, kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        build_hpo_sample(tmp_path, **kwargs)  # type: ignore[arg-type]
    assert info.value.field == field
    assert not list(tmp_path.iterdir())  # nothing written


def test_hpo_documents_label_each_term_once() -> None:
    documents, labels = hpo_documents(num_classes=3)
    assert labels == ["nervous system", "metabolism", "genitourinary system"]
    assert {d.label for d in documents} == set(labels)
    ids = [d.term_id for d in documents]
    assert len(ids) == len(set(ids)) and ids == sorted(ids)
    assert "HP:0000707" not in ids  # the branch term itself is not a document


def test_clean_definition() -> None:
    assert clean_definition("A  loss of\ngrip. ") == "A loss of grip."
    assert clean_definition("Grasp power [NCBI Books:NBK395]. More.") == "Grasp power. More."
    assert clean_definition("Meaning any longer [BirnLex].") == "Meaning any longer."
    assert clean_definition("On frontal [coronal] imaging.") == "On frontal [coronal] imaging."
    assert clean_definition("HCO3[-], in serum") == "HCO3[-], in serum"


def test_short_label() -> None:
    assert short_label("Abnormality of the nervous system") == "nervous system"
    assert short_label("Abnormality of metabolism/homeostasis") == "metabolism"
    assert short_label("Abnormality of head or neck") == "head or neck"
    assert short_label("Abnormal cellular phenotype") == "cellular phenotype"
    assert short_label("Neoplasm") == "neoplasm"


def test_cli_prints_the_two_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path), "--max-per-class", "10"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [str(tmp_path / "hpo_private.csv"), str(tmp_path / "hpo_test.csv")]
    assert len(read(Path(lines[0]))) == 6 * 8
    assert main([str(tmp_path), "--test-fraction", "2"]) == 2
    assert "test_fraction" in capsys.readouterr().err


def test_attribution_names_the_release() -> None:
    text = attribution()
    assert "Human Phenotype Ontology" in text and "hpo.jax.org/license" in text
    assert "release 20" in text
