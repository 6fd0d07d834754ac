"""The evaluation measure of the paper: accuracy of a classifier trained on synthetic text.

A synthetic corpus is worth what a model trained on it can do on real data. The paper
(Nagesh et al., 2024) trains a classifier on the released corpus and reports its
accuracy on held-out real labelled texts, beside the same classifier trained on the
real texts themselves. :func:`train_and_score` is that measure, with two classifiers:

* ``"tfidf"``: TF-IDF of word 1- and 2-grams (sublinear tf) and a logistic regression.
  No model to load, about a second for 6,000 texts, and on topic labels a strong
  baseline: on AG News it matched the embedding classifier both when trained on real
  texts and when trained on bags of eight keyphrases.
* ``"embedding"``: L2-normalised sentence embeddings of the public all-MiniLM-L6-v2
  (:class:`~workers.text.embeddings.SentenceEmbedder`) and a small torch network
  ``linear → ReLU hidden features → dropout → linear logits`` trained with Adam. It
  reads meaning rather than exact wording, so it does not need the synthetic texts to
  share n-grams with the real ones, and its hidden features give the domain adaptation
  below something to align. Embedding the texts dominates its cost.

Domain adaptation (method.md, "Client side"; paper App. C.1.2). Synthetic texts and the
recipient's real texts come from different distributions. Deep CORAL (Sun & Saenko,
2016) adds ``w · ‖C_S − C_T‖²_F / (4d²)`` to the loss, the distance between the
covariances of the hidden features of a synthetic (labelled) batch and of a batch of the
recipient's *unlabelled* texts. It runs on the recipient's side: it sees the released
corpus and the recipient's own texts, never a private document of the data owner, so it
costs no privacy budget. :func:`coral_loss` is the term as a pure function.

Everything is seeded: on the CPU, the same inputs and the same ``seed`` give the same
result. Nothing here changes torch's global state for good: the random state is forked
for training, and the thread count is set for training and restored afterwards.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn

from workers.errors import ConfigError, InputDataError
from workers.text.embeddings import Embedder, SentenceEmbedder, select_device

CLASSIFIERS = ("tfidf", "embedding")
# The 1/(4d²) normaliser makes the CORAL term ~1e-3 of the loss: weight 1 does nothing.
DEFAULT_CORAL_WEIGHT = 100.0
DEFAULT_CLASSIFIER = "embedding"
EMBED_BATCH = 128


@dataclass(frozen=True)
class EvaluationResult:
    """Scores of one classifier on the held-out real texts.

    ``accuracy`` and ``macro_f1`` are over the whole test set; test labels that never
    occur in training count as errors. ``macro_f1`` averages over the labels that occur
    in the test set or in the predictions (scikit-learn's convention). ``per_class_accuracy``
    maps every test label to the share of its test texts classified correctly (its
    recall). ``coral`` says whether the CORAL term was part of the training loss.
    """

    accuracy: float
    macro_f1: float
    n_train: int
    n_test: int
    classifier: str
    per_class_accuracy: dict[str, float]
    coral: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "accuracy": self.accuracy,
            "macro_f1": self.macro_f1,
            "n_train": self.n_train,
            "n_test": self.n_test,
            "classifier": self.classifier,
            "per_class_accuracy": dict(self.per_class_accuracy),
            "coral": self.coral,
        }


def covariance(features: torch.Tensor) -> torch.Tensor:
    """Unbiased covariance (d × d) of the rows of ``features`` (n × d, n ≥ 2)."""
    centred = features - features.mean(dim=0, keepdim=True)
    return centred.T @ centred / (features.shape[0] - 1)


def coral_loss(source: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Deep CORAL distance ``‖C_S − C_T‖²_F / (4d²)`` between two batches of features.

    ``source`` (n_S × d) and ``target`` (n_T × d) are hidden features of a labelled and
    an unlabelled batch; each needs at least two rows. Differentiable in both.

    >>> s = torch.tensor([[0.0, 0.0], [2.0, 2.0]])   # C_S = [[2, 2], [2, 2]]
    >>> t = torch.tensor([[0.0, 0.0], [2.0, 0.0]])   # C_T = [[2, 0], [0, 0]]
    >>> float(coral_loss(s, t))                       # (0 + 4 + 4 + 4) / (4 · 2²)
    0.75
    >>> float(coral_loss(s, s + 5.0))                 # a shift leaves covariances equal
    0.0
    """
    if source.ndim != 2 or target.ndim != 2 or source.shape[1] != target.shape[1]:
        raise ConfigError(
            f"need two n × d batches with the same d, got {tuple(source.shape)} "
            f"and {tuple(target.shape)}",
            field="features",
        )
    if source.shape[0] < 2 or target.shape[0] < 2:
        raise ConfigError("each batch needs at least two rows", field="features")
    d = source.shape[1]
    gap = covariance(source) - covariance(target)
    return (gap * gap).sum() / (4.0 * d * d)


class HiddenFeatureNet(nn.Module):
    """``linear → ReLU`` hidden features, then dropout and a linear layer to logits."""

    def __init__(self, dim: int, hidden: int, classes: int, dropout: float) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU())
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(hidden, classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.encoder(x)
        return out

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.dropout(hidden))
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits(self.features(x))


@contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Run with ``threads`` intra-op threads, restoring the previous count afterwards."""
    if threads is None:
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


class EmbeddingClassifier:
    """The ``"embedding"`` classifier on precomputed embeddings, with optional Deep CORAL.

    Parameters are stored as given and checked at :meth:`fit`; fitted state ends in
    ``_``. Inputs are L2-normalised embeddings; they are multiplied by ``√d`` so their
    coordinates have roughly unit variance. Training runs ``max(epochs, ⌈min_steps /
    batches per epoch⌉)`` epochs of shuffled mini-batches, so a small training set still
    gets enough optimisation steps. With unlabelled rows, every step draws one
    unlabelled batch of the same size (reshuffled each pass) and adds
    ``coral_weight · coral_loss`` between the hidden features of the two batches.

    ``threads`` is torch's intra-op thread count while training and predicting (restored
    afterwards; ``None`` leaves it alone). The default is 1: the network is small, and
    on shared, oversubscribed cores two threads made a 6,000-text fit 15× slower.

    Scale of the CORAL term: the ``1/(4d²)`` normaliser with ``d = hidden = 256`` makes
    it tiny next to the cross-entropy (about 1e-3 before adaptation), so a
    ``coral_weight`` of 1 barely moves the features; 100 to 1000 does. A ReLU network
    can also shrink the term by scaling its hidden features down and its head up, and a
    large weight does some of that: the tests check that the scale-free gap
    ``‖C_S − C_T‖_F / ‖C_S‖_F`` shrinks too, and that accuracy under a shift CORAL can
    see (a shortcut feature that is label-free and large in the target) goes up. On AG
    News, training on bags of eight keyphrases, weight 1000 raised accuracy on real texts
    by about half a point on average over seeds, less than the spread between seeds.
    """

    def __init__(
        self,
        *,
        hidden: int = 256,
        dropout: float = 0.3,
        learning_rate: float = 3e-4,
        weight_decay: float = 1e-4,
        batch_size: int = 64,
        epochs: int = 20,
        min_steps: int = 500,
        coral_weight: float = DEFAULT_CORAL_WEIGHT,
        seed: int = 0,
        device: str | None = None,
        threads: int | None = 1,
    ) -> None:
        self.hidden = hidden
        self.dropout = dropout
        self.learning_rate = learning_rate
        self.weight_decay = weight_decay
        self.batch_size = batch_size
        self.epochs = epochs
        self.min_steps = min_steps
        self.coral_weight = coral_weight
        self.seed = seed
        self.device = device
        self.threads = threads

    def _check(self) -> None:
        if self.threads is not None and self.threads < 1:
            raise ConfigError("must be a positive integer or None", field="threads")
        for name in ("hidden", "batch_size", "epochs"):
            if int(getattr(self, name)) < 1:
                raise ConfigError("must be a positive integer", field=name)
        if self.batch_size < 2:
            raise ConfigError("must be at least 2 (covariances need two rows)", field="batch_size")
        if self.min_steps < 0:
            raise ConfigError("must be ≥ 0", field="min_steps")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError("must be in [0, 1)", field="dropout")
        for name in ("learning_rate", "weight_decay", "coral_weight"):
            value = float(getattr(self, name))
            if not math.isfinite(value) or value < 0 or (name == "learning_rate" and value == 0):
                raise ConfigError("must be finite and ≥ 0 (learning_rate > 0)", field=name)
        _check_seed(self.seed)

    def _inputs(self, x: NDArray[np.floating[Any]], field: str) -> torch.Tensor:
        array = np.asarray(x, dtype=np.float32)
        if array.ndim != 2 or array.shape[0] == 0:
            raise InputDataError("must be a non-empty n × d array of embeddings", field=field)
        if hasattr(self, "dim_") and array.shape[1] != self.dim_:
            raise InputDataError(
                f"has dimension {array.shape[1]}, expected {self.dim_}", field=field
            )
        return torch.from_numpy(array * np.float32(math.sqrt(array.shape[1]))).to(self.device_)

    def fit(
        self,
        x: NDArray[np.floating[Any]],
        labels: Sequence[str],
        *,
        unlabeled: NDArray[np.floating[Any]] | None = None,
    ) -> EmbeddingClassifier:
        """Train on embeddings ``x`` with string ``labels``; ``unlabeled`` turns on CORAL."""
        self._check()
        for attr in ("dim_", "classes_", "model_", "coral_"):
            self.__dict__.pop(attr, None)
        self.device_ = select_device(self.device)
        train = self._inputs(x, "train_texts")
        if len(labels) != train.shape[0]:
            raise InputDataError(
                f"has {len(labels)} entries for {train.shape[0]} texts", field="train_labels"
            )
        self.classes_ = sorted(set(labels))
        if len(self.classes_) < 2:
            raise InputDataError(
                "training needs at least two distinct labels", field="train_labels"
            )
        index = {label: i for i, label in enumerate(self.classes_)}
        y = torch.tensor([index[label] for label in labels], dtype=torch.long, device=self.device_)
        self.dim_ = train.shape[1]
        target = None
        if unlabeled is not None:
            target = self._inputs(unlabeled, "unlabeled")
            if target.shape[0] < 2:
                raise InputDataError("needs at least two texts", field="unlabeled")
        self.coral_ = target is not None and self.coral_weight > 0

        n = train.shape[0]
        batch = min(self.batch_size, n)
        per_epoch = math.ceil(n / batch)
        epochs = max(self.epochs, math.ceil(self.min_steps / per_epoch))
        order = torch.Generator(device="cpu").manual_seed(self.seed)
        devices = [torch.device(self.device_).index or 0] if self.device_.startswith("cuda") else []
        with torch_threads(self.threads), torch.random.fork_rng(devices=devices):
            torch.manual_seed(self.seed)
            model = HiddenFeatureNet(self.dim_, self.hidden, len(self.classes_), self.dropout)
            model.to(self.device_)
            optimiser = torch.optim.Adam(
                model.parameters(), lr=self.learning_rate, weight_decay=self.weight_decay
            )
            model.train()
            target_batches = None
            if target is not None and self.coral_:
                target_batches = self._batches(target.shape[0], batch, order)
            for _ in range(epochs):
                for rows in torch.split(torch.randperm(n, generator=order), batch):
                    if rows.numel() < 2:  # a lone leftover row adds noise and no covariance
                        continue
                    rows = rows.to(self.device_)
                    hidden = model.features(train[rows])
                    loss = nn.functional.cross_entropy(model.logits(hidden), y[rows])
                    if target_batches is not None:
                        assert target is not None
                        other = model.features(target[next(target_batches)])
                        loss = loss + self.coral_weight * coral_loss(hidden, other)
                    optimiser.zero_grad(set_to_none=True)
                    torch.autograd.backward(loss)
                    optimiser.step()
            model.eval()
        self.model_ = model
        return self

    def _batches(self, n: int, size: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
        """Endless shuffled batches of the indices ``0..n-1``, at least two per batch."""
        size = min(size, n)
        while True:
            for chunk in torch.split(torch.randperm(n, generator=generator), size):
                if chunk.numel() >= 2:
                    yield chunk.to(self.device_)

    def _run(self, x: NDArray[np.floating[Any]], what: str, field: str) -> torch.Tensor:
        if not hasattr(self, "model_"):
            raise ConfigError("fit the classifier first", field="classifier")
        inputs = self._inputs(x, field)
        outputs = []
        with torch_threads(self.threads), torch.no_grad():
            for chunk in torch.split(inputs, 4096):
                hidden = self.model_.features(chunk)
                outputs.append(hidden if what == "features" else self.model_.logits(hidden))
        return torch.cat(outputs).cpu()

    def hidden_features(self, x: NDArray[np.floating[Any]]) -> torch.Tensor:
        """The ReLU hidden features (n × hidden) of embeddings ``x``, on the CPU."""
        return self._run(x, "features", "x")

    def predict(self, x: NDArray[np.floating[Any]]) -> list[str]:
        """The most likely label of each row of ``x``."""
        best = self._run(x, "logits", "test_texts").argmax(dim=1).tolist()
        return [self.classes_[i] for i in best]


def embed_texts(
    embedder: Embedder, texts: Sequence[str], *, batch_size: int = EMBED_BATCH
) -> NDArray[np.float32]:
    """Embeddings of ``texts`` in their order, each distinct text encoded once."""
    distinct = list(dict.fromkeys(texts))
    vectors = embedder.encode(distinct, batch_size=batch_size)
    where = {text: i for i, text in enumerate(distinct)}
    return vectors[[where[text] for text in texts]]


def tfidf_predict(
    train_texts: Sequence[str],
    train_labels: Sequence[str],
    test_texts: Sequence[str],
    *,
    seed: int = 0,
) -> list[str]:
    """The ``"tfidf"`` classifier: word 1-2-gram TF-IDF (sublinear tf) + logistic regression."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    vectoriser = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, strip_accents="unicode")
    features = vectoriser.fit_transform(list(train_texts))
    model = LogisticRegression(C=10.0, solver="saga", max_iter=2000, random_state=seed)
    model.fit(features, list(train_labels))
    return [str(label) for label in model.predict(vectoriser.transform(list(test_texts)))]


def score(
    predicted: Sequence[str],
    test_labels: Sequence[str],
    *,
    n_train: int,
    classifier: str,
    coral: bool,
) -> EvaluationResult:
    """Accuracy, macro F1 and per-class accuracy of ``predicted`` against ``test_labels``."""
    from sklearn.metrics import f1_score

    truth = np.asarray(list(test_labels), dtype=object)
    guess = np.asarray(list(predicted), dtype=object)
    correct = truth == guess
    per_class = {label: float(correct[truth == label].mean()) for label in sorted(set(test_labels))}
    return EvaluationResult(
        accuracy=float(correct.mean()),
        macro_f1=float(f1_score(truth, guess, average="macro", zero_division=0)),
        n_train=n_train,
        n_test=len(test_labels),
        classifier=classifier,
        per_class_accuracy=per_class,
        coral=coral,
    )


def _check_seed(seed: int) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise ConfigError("must be an integer in [0, 2**63)", field="seed")


def _check_strings(values: Sequence[str], field: str) -> None:
    for i, value in enumerate(values):
        if not isinstance(value, str):
            raise InputDataError(
                f"entry {i} is a {type(value).__name__}, not a string", field=field
            )


def _check_pair(texts: Sequence[str], labels: Sequence[str], which: str) -> None:
    if len(texts) == 0:
        raise InputDataError("is empty", field=f"{which}_texts")
    if len(labels) != len(texts):
        raise InputDataError(
            f"has {len(labels)} entries for {len(texts)} texts", field=f"{which}_labels"
        )
    _check_strings(texts, f"{which}_texts")
    _check_strings(labels, f"{which}_labels")


def train_and_score(
    train_texts: Sequence[str],
    train_labels: Sequence[str],
    test_texts: Sequence[str],
    test_labels: Sequence[str],
    *,
    classifier: str = DEFAULT_CLASSIFIER,
    unlabeled: Sequence[str] | None = None,
    coral_weight: float = DEFAULT_CORAL_WEIGHT,
    seed: int = 0,
    embedder: Embedder | None = None,
    device: str | None = None,
    threads: int | None = 1,
) -> EvaluationResult:
    """Train ``classifier`` on the (synthetic) training texts, score it on real test texts.

    ``unlabeled`` are the recipient's own unlabelled texts for Deep CORAL (``"embedding"``
    only); ``coral_weight`` is the weight of its term (0 switches it off). ``embedder``
    reuses a loaded sentence embedder (default: the packaged all-MiniLM-L6-v2, loaded on
    each call). ``device`` is ``cpu``, ``cuda`` or ``None`` for the GPU when there is
    one; ``threads`` sets torch's intra-op threads for training (see
    :class:`EmbeddingClassifier`; the sentence embedder keeps its own). Labels are arbitrary
    strings; a test label never seen in training counts as an error.
    """
    if classifier not in CLASSIFIERS:
        raise ConfigError(f"must be one of {', '.join(CLASSIFIERS)}", field="classifier")
    _check_pair(train_texts, train_labels, "train")
    _check_pair(test_texts, test_labels, "test")
    if len(set(train_labels)) < 2:
        raise InputDataError("training needs at least two distinct labels", field="train_labels")
    _check_seed(seed)
    if not math.isfinite(coral_weight) or coral_weight < 0:
        raise ConfigError("must be finite and ≥ 0", field="coral_weight")
    if unlabeled is not None:
        if classifier != "embedding":
            raise ConfigError(
                "CORAL adaptation needs the 'embedding' classifier", field="unlabeled"
            )
        if len(unlabeled) < 2:
            raise InputDataError("needs at least two texts", field="unlabeled")
        _check_strings(unlabeled, "unlabeled")

    if classifier == "tfidf":
        predicted = tfidf_predict(train_texts, train_labels, test_texts, seed=seed)
        return score(
            predicted, test_labels, n_train=len(train_texts), classifier=classifier, coral=False
        )

    encoder = embedder if embedder is not None else SentenceEmbedder(device=device)
    extra = list(unlabeled) if unlabeled is not None else []
    everything = embed_texts(encoder, [*train_texts, *test_texts, *extra])
    n_train, n_test = len(train_texts), len(test_texts)
    model = EmbeddingClassifier(
        coral_weight=coral_weight, seed=seed, device=device, threads=threads
    ).fit(
        everything[:n_train],
        train_labels,
        unlabeled=everything[n_train + n_test :] if unlabeled is not None else None,
    )
    predicted = model.predict(everything[n_train : n_train + n_test])
    return score(predicted, test_labels, n_train=n_train, classifier=classifier, coral=model.coral_)


__all__ = [
    "CLASSIFIERS",
    "DEFAULT_CLASSIFIER",
    "EmbeddingClassifier",
    "EvaluationResult",
    "HiddenFeatureNet",
    "coral_loss",
    "covariance",
    "embed_texts",
    "score",
    "tfidf_predict",
    "train_and_score",
]
