"""``keyseed evaluate``: the paper's measure, run by the data recipient.

Train a classifier on the synthetic corpus, score it on real labelled texts, optionally
beside the same classifier trained on real texts. Errors name the option that supplied
the data (``--synthetic``, ``--test`` …).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from app.cli.checks import fail
from workers.errors import KeyseedError

HANDLER = "app.cli.evaluate"


def register(sub: Any) -> None:
    ev = sub.add_parser(
        "evaluate",
        help="accuracy of a classifier trained on a synthetic corpus",
        description="Train a classifier on a synthetic corpus and score it on real texts.",
    )
    ev.set_defaults(handler=f"{HANDLER}:evaluate")
    ev.add_argument("--synthetic", required=True, type=Path, help="OUT.jsonl of generate")
    ev.add_argument("--test", required=True, type=Path, help="real labelled CSV")
    ev.add_argument(
        "--text-column",
        action="append",
        required=True,
        dest="text_columns",
        help="text column of --test (and --train-real, --unlabeled); repeat to join several",
    )
    ev.add_argument("--label-column", required=True, help="label column of --test")
    ev.add_argument(
        "--train-real",
        type=Path,
        default=None,
        help="real labelled CSV: also report the classifier trained on it",
    )
    ev.add_argument(
        "--unlabeled",
        type=Path,
        default=None,
        help="the recipient's unlabelled texts (same text columns): CORAL",
    )
    ev.add_argument(
        "--classifier",
        choices=("embedding", "tfidf"),
        default=None,
        help="logistic regression on sentence embeddings (the default) or on TF-IDF",
    )
    ev.add_argument(
        "--coral-weight",
        type=float,
        default=None,
        help="weight of the CORAL term with --unlabeled (default 100)",
    )
    ev.add_argument("--seed", type=int, default=0, help="the classifier's seed (default 0)")


def _read_synthetic(path: Path) -> tuple[list[str], list[str]]:
    from workers.errors import InputDataError

    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError as exc:
        raise InputDataError(f"{path} does not exist", field="synthetic") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise InputDataError(f"cannot read {path} as UTF-8", field="synthetic") from exc
    texts: list[str] = []
    labels: list[str] = []
    for row, line in enumerate((x for x in lines if x.strip()), start=1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            raise InputDataError(f"row {row} is not valid JSON", field="synthetic") from None
        if not isinstance(record, dict) or "label" not in record:
            raise InputDataError(f"row {row} has no label", field="synthetic")
        text = record.get("text") or " ".join(record.get("keyphrases") or [])
        if not isinstance(text, str) or not text.strip():
            raise InputDataError(f"row {row} has neither text nor keyphrases", field="synthetic")
        texts.append(text)
        labels.append(str(record["label"]))
    if not texts:
        raise InputDataError(f"{path} holds no synthetic document", field="synthetic")
    return texts, labels


@contextmanager
def _fields_as(options: dict[str, str]) -> Iterator[None]:
    """Re-label an evaluation error's field as the option that supplied the data."""
    try:
        yield
    except KeyseedError as exc:
        if exc.field in options:
            exc.field = options[exc.field]
        raise


def evaluate(args: argparse.Namespace) -> int:
    try:
        return _evaluate(args)
    except KeyseedError as exc:
        return fail(exc)


def _evaluate(args: argparse.Namespace) -> int:
    from workers.evaluation.classifier import DEFAULT_CLASSIFIER, train_and_score
    from workers.text.corpus import read_labelled
    from workers.text.embeddings import SentenceEmbedder

    classifier = args.classifier or DEFAULT_CLASSIFIER
    texts, labels = _read_synthetic(args.synthetic)
    test = read_labelled(
        args.test, text_columns=args.text_columns, label_column=args.label_column, field="test"
    )
    unlabeled = None
    if args.unlabeled is not None:
        unlabeled = read_labelled(
            args.unlabeled, text_columns=args.text_columns, label_column=None, field="unlabeled"
        ).texts
    embedder = SentenceEmbedder() if classifier == "embedding" else None
    coral = {} if args.coral_weight is None else {"coral_weight": args.coral_weight}
    data = {
        "train_texts": "synthetic",
        "train_labels": "synthetic",
        "test_texts": "test",
        "test_labels": "test",
    }
    with _fields_as(data):
        synthetic = train_and_score(
            texts,
            labels,
            test.texts,
            test.labels,
            classifier=classifier,
            unlabeled=unlabeled,
            seed=args.seed,
            embedder=embedder,
            **coral,
        )
    out: dict[str, Any] = {**synthetic.to_dict()}
    if args.train_real is not None:
        real = read_labelled(
            args.train_real,
            text_columns=args.text_columns,
            label_column=args.label_column,
            field="train_real",
        )
        with _fields_as({**data, "train_texts": "train_real", "train_labels": "train_real"}):
            baseline = train_and_score(
                real.texts,
                real.labels,
                test.texts,
                test.labels,
                classifier=classifier,
                seed=args.seed,
                embedder=embedder,
            )
        out["accuracy_real"] = baseline.accuracy
        out["macro_f1_real"] = baseline.macro_f1
        out["relative_accuracy"] = (
            synthetic.accuracy / baseline.accuracy if baseline.accuracy else None
        )
    print(json.dumps(out))
    return 0
