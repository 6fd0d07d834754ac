"""The downstream measure: classifiers learn, are deterministic, and CORAL aligns domains.

Everything runs for real: the packaged all-MiniLM-L6-v2 embeds the texts, torch trains
the classifier, scikit-learn fits the TF-IDF baseline. The CORAL tests use hand-built
embeddings with a known domain shift, so what they assert can be derived on paper.
"""

from __future__ import annotations

import csv
import doctest
import json
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from workers.errors import ConfigError, InputDataError
from workers.evaluation import classifier as evaluation
from workers.evaluation.classifier import (
    CLASSIFIERS,
    DEFAULT_CLASSIFIER,
    EmbeddingClassifier,
    EvaluationResult,
    coral_loss,
    covariance,
    torch_threads,
    train_and_score,
)
from workers.text.embeddings import SentenceEmbedder

TOPICS = {
    "sport": "football goal striker match league coach tennis championship referee stadium",
    "cooking": "recipe oven flour garlic simmer bake sauce onion kitchen spices",
    "finance": "stocks investors bank interest shares market earnings bonds inflation profits",
}
FILLER = ["the", "a", "of", "today", "was", "we", "about", "after", "new", "with", "they", "report"]


def topic_texts(per_class: int, seed: int) -> tuple[list[str], list[str]]:
    """Short texts of three topics: four topic words and three shared filler words each."""
    rng = np.random.default_rng(seed)
    texts, labels = [], []
    for label, words in TOPICS.items():
        vocab = words.split()
        for _ in range(per_class):
            chosen = [*rng.choice(vocab, 4, replace=False), *rng.choice(FILLER, 3)]
            texts.append(" ".join(rng.permutation(chosen)))
            labels.append(label)
    return texts, labels


@pytest.fixture(scope="module")
def embedder() -> SentenceEmbedder:
    return SentenceEmbedder(device="cpu")


@pytest.fixture(scope="module")
def topics() -> tuple[list[str], list[str], list[str], list[str]]:
    train, train_labels = topic_texts(20, seed=1)
    test, test_labels = topic_texts(10, seed=2)
    return train, train_labels, test, test_labels


# --- the CORAL term ---------------------------------------------------------------------


def test_doctests_hold() -> None:
    assert doctest.testmod(evaluation, raise_on_error=True).attempted >= 2


def test_coral_loss_exact_value() -> None:
    # C_S = [[1, 0], [0, 1]] (rows ±1 on each axis, n = 4, divisor n − 1 = 3 → 2/3 each)
    source = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0]], dtype=torch.float64)
    # C_T = [[4, 0], [0, 0]] (rows ±√6 on x: variance 2·6/3 = 4)
    target = torch.tensor([[math.sqrt(6), 0.0], [-math.sqrt(6), 0.0]], dtype=torch.float64)
    target = torch.cat([target, torch.zeros(2, 2, dtype=torch.float64)])
    assert torch.allclose(covariance(source), torch.eye(2, dtype=torch.float64) * 2 / 3)
    assert torch.allclose(
        covariance(target), torch.diag(torch.tensor([4.0, 0.0], dtype=torch.float64))
    )
    # ‖C_S − C_T‖²_F = (2/3 − 4)² + (2/3)² = 100/9 + 4/9 = 104/9, and 4d² = 16.
    assert float(coral_loss(source, target)) == pytest.approx(104 / 9 / 16, rel=1e-12)


def test_coral_loss_is_zero_for_equal_covariances() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(50, 8, generator=g, dtype=torch.float64)
    shuffled = x[torch.randperm(50, generator=g)]
    assert float(coral_loss(x, x)) == 0.0
    assert float(coral_loss(x, shuffled + 3.0)) == pytest.approx(0.0, abs=1e-24)
    assert float(coral_loss(x, -x)) == pytest.approx(0.0, abs=1e-24)  # covariance is even
    assert float(coral_loss(x, 2 * x)) > 0


def test_coral_loss_gradients_flow_and_are_correct() -> None:
    g = torch.Generator().manual_seed(1)
    source = torch.randn(6, 3, generator=g, dtype=torch.float64, requires_grad=True)
    target = torch.randn(5, 3, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(coral_loss, (source, target))
    loss = coral_loss(source, target)
    torch.autograd.backward(loss)
    assert source.grad is not None and target.grad is not None
    assert float(source.grad.abs().sum()) > 0 and float(target.grad.abs().sum()) > 0
    # A descent step on the source alone shrinks the gap.
    with torch.no_grad():
        stepped = source - 10.0 * source.grad
    assert float(coral_loss(stepped, target.detach())) < float(loss.detach())


@pytest.mark.parametrize(
    ("source", "target"),
    [((4, 3), (4, 2)), ((1, 3), (4, 3)), ((4, 3), (1, 3)), ((4,), (4,))],
)
def test_coral_loss_rejects_bad_shapes(source: tuple[int, ...], target: tuple[int, ...]) -> None:
    with pytest.raises(ConfigError) as err:
        coral_loss(torch.ones(source), torch.ones(target))
    assert err.value.field == "features"


# --- both classifiers learn and are deterministic ----------------------------------------


def test_tfidf_learns_topics_and_is_deterministic(
    topics: tuple[list[str], list[str], list[str], list[str]],
) -> None:
    train, train_labels, test, test_labels = topics
    first = train_and_score(train, train_labels, test, test_labels, classifier="tfidf", seed=3)
    again = train_and_score(train, train_labels, test, test_labels, classifier="tfidf", seed=3)
    assert first.accuracy >= 0.9  # chance is 1/3
    assert first.macro_f1 >= 0.9
    assert first.to_dict() == again.to_dict()
    assert (first.n_train, first.n_test, first.classifier, first.coral) == (60, 30, "tfidf", False)
    assert set(first.per_class_accuracy) == set(TOPICS)


def test_embedding_learns_topics_and_is_deterministic(
    topics: tuple[list[str], list[str], list[str], list[str]], embedder: SentenceEmbedder
) -> None:
    train, train_labels, test, test_labels = topics
    args = (train, train_labels, test, test_labels)
    first = train_and_score(*args, embedder=embedder, seed=5, device="cpu")
    again = train_and_score(*args, embedder=embedder, seed=5, device="cpu")
    assert first.accuracy >= 0.9
    assert first.macro_f1 >= 0.9
    assert first.to_dict() == again.to_dict()
    assert (first.classifier, first.coral) == ("embedding", False)
    adapted = train_and_score(*args, embedder=embedder, unlabeled=test, coral_weight=10.0)
    assert adapted.coral and adapted.accuracy >= 0.9
    off = train_and_score(*args, embedder=embedder, unlabeled=test, coral_weight=0.0)
    assert not off.coral


def test_training_is_seeded_and_leaves_global_state_alone() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((80, 12)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    labels = ["pos" if v > 0 else "neg" for v in x[:, 0]]
    unlabeled = x[::-1].copy() * 0.5
    torch.manual_seed(1234)
    before, threads = torch.get_rng_state(), torch.get_num_threads()

    def fit(seed: int) -> EmbeddingClassifier:
        return EmbeddingClassifier(seed=seed, min_steps=50, threads=1).fit(
            x, labels, unlabeled=unlabeled
        )

    a, b, c = fit(7), fit(7), fit(8)
    assert torch.equal(a.hidden_features(x), b.hidden_features(x))
    assert a.predict(x) == b.predict(x)
    assert not torch.equal(a.hidden_features(x), c.hidden_features(x))
    assert torch.equal(torch.get_rng_state(), before)
    assert torch.get_num_threads() == threads
    assert a.classes_ == ["neg", "pos"] and a.coral_


def test_torch_threads_restores_the_count() -> None:
    threads = torch.get_num_threads()
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == threads


def test_labels_missing_from_training_count_as_errors() -> None:
    train, train_labels = topic_texts(15, seed=4)
    keep = [i for i, label in enumerate(train_labels) if label != "finance"]
    test, test_labels = topic_texts(10, seed=5)
    result = train_and_score(
        [train[i] for i in keep],
        [train_labels[i] for i in keep],
        test,
        test_labels,
        classifier="tfidf",
    )
    assert result.per_class_accuracy["finance"] == 0.0
    assert result.accuracy <= 2 / 3
    assert result.accuracy == pytest.approx(
        sum(result.per_class_accuracy.values()) / 3  # balanced test set
    )
    assert result.macro_f1 < result.accuracy + 0.01
    assert json.loads(json.dumps(result.to_dict())) == result.to_dict()


def test_result_to_dict_round_trips() -> None:
    result = EvaluationResult(
        accuracy=0.5,
        macro_f1=0.4,
        n_train=10,
        n_test=4,
        classifier="tfidf",
        per_class_accuracy={"a": 1.0, "b": 0.0},
        coral=False,
    )
    data = result.to_dict()
    assert EvaluationResult(**data) == result
    data["per_class_accuracy"]["a"] = 0.0
    assert result.per_class_accuracy["a"] == 1.0  # a copy, not the result's own dict


# --- CORAL under a domain shift -----------------------------------------------------------


def shifted_domain(
    n: int, rng: np.random.Generator, *, source: bool
) -> tuple[np.ndarray, list[str]]:
    """Unit vectors in 16-d with a label signal on axis 0 (noisy, in both domains).

    In the source (the synthetic corpus) axis 1 carries a small, almost noise-free copy
    of the label: a shortcut the classifier learns. In the target (the recipient's real
    texts) axis 1 is large and unrelated to the label. The shortcut inflates the target
    variance of every hidden unit that reads axis 1, which is exactly what CORAL's
    covariance term penalises.
    """
    y = rng.integers(0, 2, n)
    sign = 2.0 * y - 1.0
    x = 0.3 * rng.standard_normal((n, 16))
    x[:, 0] += 0.5 * sign
    if source:
        x[:, 1] = 0.3 * sign + 0.02 * rng.standard_normal(n)
    else:
        x[:, 1] = 1.5 * rng.standard_normal(n)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x.astype(np.float32), ["neg" if v == 0 else "pos" for v in y]


def relative_gap(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖C_a − C_b‖_F / ‖C_a‖_F: the covariance gap, blind to a rescaling of the features."""
    ca = covariance(a.double())
    return float(torch.linalg.norm(ca - covariance(b.double())) / torch.linalg.norm(ca))


@pytest.fixture(scope="module")
def shift_runs() -> Iterator[list[dict[str, float]]]:
    runs = []
    for seed in range(3):
        rng = np.random.default_rng(seed)
        xs, ys = shifted_domain(400, rng, source=True)
        xu, _ = shifted_domain(400, rng, source=False)
        xt, yt = shifted_domain(400, rng, source=False)
        row: dict[str, float] = {}
        for name, weight in (("plain", 0.0), ("coral", 1000.0)):
            model = EmbeddingClassifier(coral_weight=weight, seed=seed, device="cpu")
            model.fit(xs, ys, unlabeled=xu)
            hs, ht = model.hidden_features(xs), model.hidden_features(xt)
            row[f"{name}_acc"] = float(np.mean(np.array(model.predict(xt)) == np.array(yt)))
            row[f"{name}_gap"] = float(coral_loss(hs, ht))
            row[f"{name}_rel"] = relative_gap(hs, ht)
        runs.append(row)
    yield runs


def test_coral_shrinks_the_hidden_covariance_gap(shift_runs: list[dict[str, float]]) -> None:
    for row in shift_runs:
        assert row["coral_gap"] < row["plain_gap"] / 5, row
        # not merely by shrinking every feature: the scale-free gap shrinks too
        assert row["coral_rel"] < 0.7 * row["plain_rel"], row


def test_coral_raises_target_accuracy_under_the_shift(shift_runs: list[dict[str, float]]) -> None:
    gains = [row["coral_acc"] - row["plain_acc"] for row in shift_runs]
    assert all(g > 0.03 for g in gains), gains
    assert float(np.mean(gains)) > 0.05, gains


# --- input validation -----------------------------------------------------------------


GOOD = (["a b", "c d", "e f"], ["x", "y", "x"], ["a c"], ["x"])


@pytest.mark.parametrize(
    ("change", "error", "field"),
    [
        ({"train_texts": []}, InputDataError, "train_texts"),
        ({"train_labels": ["x", "y"]}, InputDataError, "train_labels"),
        ({"test_texts": [], "test_labels": []}, InputDataError, "test_texts"),
        ({"test_labels": ["x", "y"]}, InputDataError, "test_labels"),
        ({"train_labels": ["x", "x", "x"]}, InputDataError, "train_labels"),
        ({"train_texts": ["a", None, "c"]}, InputDataError, "train_texts"),
        ({"test_labels": [3]}, InputDataError, "test_labels"),
        ({"classifier": "bert"}, ConfigError, "classifier"),
        ({"classifier": "tfidf", "unlabeled": ["u", "v"]}, ConfigError, "unlabeled"),
        ({"unlabeled": ["only one"]}, InputDataError, "unlabeled"),
        ({"unlabeled": ["u", 5]}, InputDataError, "unlabeled"),
        ({"coral_weight": -1.0}, ConfigError, "coral_weight"),
        ({"coral_weight": math.nan}, ConfigError, "coral_weight"),
        ({"seed": -1}, ConfigError, "seed"),
    ],
)
def test_bad_inputs_name_the_field(
    change: dict[str, object], error: type[Exception], field: str
) -> None:
    args: dict[str, object] = dict(
        zip(("train_texts", "train_labels", "test_texts", "test_labels"), GOOD, strict=True)
    )
    args.update(change)
    with pytest.raises(error) as err:
        train_and_score(**args)  # type: ignore[arg-type]
    assert getattr(err.value, "field", None) == field


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"dropout": 1.0}, "dropout"),
        ({"batch_size": 1}, "batch_size"),
        ({"hidden": 0}, "hidden"),
        ({"learning_rate": 0.0}, "learning_rate"),
        ({"coral_weight": math.inf}, "coral_weight"),
    ],
)
def test_bad_classifier_settings_name_the_field(params: dict[str, object], field: str) -> None:
    x = np.eye(4, dtype=np.float32)
    with pytest.raises(ConfigError) as err:
        EmbeddingClassifier(**params).fit(x, ["a", "b", "a", "b"])  # type: ignore[arg-type]
    assert err.value.field == field


def test_classifier_checks_embedding_shapes() -> None:
    x = np.eye(4, dtype=np.float32)
    with pytest.raises(InputDataError) as err:
        EmbeddingClassifier().fit(x, ["a", "b", "a"])
    assert err.value.field == "train_labels"
    model = EmbeddingClassifier(min_steps=5).fit(x, ["a", "b", "a", "b"])
    with pytest.raises(InputDataError) as err:
        model.predict(np.ones((2, 3), dtype=np.float32))
    assert err.value.field == "test_texts"
    assert CLASSIFIERS == ("tfidf", "embedding") and DEFAULT_CLASSIFIER in CLASSIFIERS


# --- real text ----------------------------------------------------------------------------


@pytest.mark.slow
def test_both_classifiers_on_ag_news(ag_news_path: Path, embedder: SentenceEmbedder) -> None:
    with open(ag_news_path, encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle))[:2500]
    texts = [f"{row['title']}. {row['description']}" for row in rows]
    labels = [row["class"] for row in rows]
    split = (texts[:2000], labels[:2000], texts[2000:], labels[2000:])
    for classifier in CLASSIFIERS:
        result = train_and_score(*split, classifier=classifier, embedder=embedder)
        assert result.accuracy >= 0.80, (classifier, result.to_dict())
        assert (result.n_train, result.n_test) == (2000, 500)
        assert len(result.per_class_accuracy) == 4
