"""The engine end to end on a small corpus: sequences, manifest, and exact accounting.

The accounting test does not trust the report: it records every OpenDP measurement the
run actually constructs (the real ``make_laplace`` still runs; the spy only writes down
its scale and its privacy map at the sensitivity the code declared) and recomputes the
run's ε from those by basic composition: sequential over the whole corpus, parallel over
the per-class structures.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch

from workers.errors import ConfigError, InputDataError
from workers.methods.dpkps.config import DEFAULT_TEMPERATURE, GenerationConfig
from workers.methods.dpkps.pipeline import generate_sequences
from workers.privacy import noise as samplers
from workers.text.embeddings import SentenceEmbedder
from workers.text.vocabulary import Vocabulary

TOPICS = {
    "cardiology": ["heart failure", "chest pain", "arrhythmia", "blood pressure", "stent"],
    "neurology": ["seizure", "migraine", "stroke", "tremor", "memory loss"],
    "dermatology": ["rash", "eczema", "itching", "skin lesion", "psoriasis"],
}
FILLER = ["patient", "follow up", "clinic", "history"]


def corpus(per_class: int = 40, seed: int = 0) -> tuple[list[str], list[str]]:
    rng = np.random.default_rng(seed)
    texts, labels = [], []
    for label, words in TOPICS.items():
        for _ in range(per_class):
            picked = [*rng.choice(words, size=3, replace=False), str(rng.choice(FILLER))]
            texts.append("The patient reports " + ", ".join(picked) + ".")
            labels.append(label)
    return texts, labels


def run_on_topics(cfg: GenerationConfig, *, per_class: int) -> tuple[Any, Vocabulary]:
    """A run on :func:`corpus` over a vocabulary of the topics' phrases and one unrelated
    phrase; the result and that vocabulary."""
    phrases = [w for words in TOPICS.values() for w in words] + ["zz unrelated"]
    vocabulary = Vocabulary.from_phrases("t", phrases)
    texts, labels = corpus(per_class=per_class)
    result = generate_sequences(
        texts, labels, label_set=list(TOPICS), vocabulary=vocabulary, config=cfg,
        embedder=SentenceEmbedder(),
    )  # fmt: skip
    return result, vocabulary


def own_phrase_shares(cfg: GenerationConfig, *, runs: int) -> tuple[list[float], list[Any]]:
    """Over ``runs`` runs of :func:`run_on_topics` (12 documents a class, fresh DP noise
    each), each run's mean share of a class's drawn phrases that are its own topic's; the
    results."""
    shares, results = [], []
    for _ in range(runs):
        result, _ = run_on_topics(cfg, per_class=12)
        results.append(result)
        run = []
        for label, words in TOPICS.items():
            mine = [p for s in result.sequences if s.label == label for p in s.keyphrases]
            run.append(sum(p in words for p in mine) / len(mine))
        shares.append(float(np.mean(run)))
    return shares, results


def assert_same_releases(plain: list[Any], changed: list[Any]) -> None:
    """Two sets of runs made the same releases at the same cost, as planned: what they
    differ by is post-processing."""
    for a, b in zip((r.report for r in plain), (r.report for r in changed), strict=True):
        assert a.as_planned and b.as_planned
        assert [(e.mechanism, e.scale) for e in a.events] == [
            (e.mechanism, e.scale) for e in b.events
        ]
        assert a.epsilon == b.epsilon


@pytest.fixture(scope="module")
def vocabulary() -> Vocabulary:
    phrases = [p for words in TOPICS.values() for p in words] + FILLER
    phrases += [f"unrelated term {i}" for i in range(200)]
    return Vocabulary.from_phrases("test-clinical", phrases)


def config(**overrides: Any) -> GenerationConfig:
    base: dict[str, Any] = dict(
        epsilon_vocab=4.0,
        epsilon_kde=8.0,
        per_class=30,
        vocabulary_size=30,
        max_matches_per_document=4,
        sequence_length=3,
        num_features=256,
        bandwidth=0.5,
        temperature=0.5,
        seed=1,
    )
    base.update(overrides)
    return GenerationConfig(**base)


class NoiseSpy:
    """Records every noise draw of the shared OpenDP samplers: the noise, scale and size."""

    def __init__(self) -> None:
        self.built: list[dict[str, Any]] = []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for noise_name in ("laplace", "gaussian", "discrete_laplace", "discrete_gaussian"):
            attribute = f"{noise_name}_noise"
            real = getattr(samplers, attribute)

            def spied(values: Any, *, scale: float, _real: Any = real, _n: str = noise_name) -> Any:
                self.built.append({"noise": _n, "scale": scale, "size": int(np.size(values))})
                return _real(values, scale=scale)

            monkeypatch.setattr(samplers, attribute, spied)


@pytest.mark.parametrize(
    ("mode", "ensemble", "kde_method", "structures_per_class"),
    [
        ("independent", "log", None, 1),  # the exact kernel on Ṽ
        ("independent", "log", "random_features", 1),
        ("iterative", "log", None, 3),
        ("iterative", "linear", None, 3),
    ],
)
def test_reported_spend_equals_the_mechanisms_built(
    monkeypatch: pytest.MonkeyPatch,
    vocabulary: Vocabulary,
    embedder: SentenceEmbedder,
    mode: str,
    ensemble: str,
    kde_method: str | None,
    structures_per_class: int,
) -> None:
    spy = NoiseSpy()
    spy.install(monkeypatch)
    texts, labels = corpus()
    cfg = config(mode=mode, ensemble=ensemble, kde_method=kde_method, contribution_bound=0.7)
    result = generate_sequences(
        texts, labels, label_set=list(TOPICS), vocabulary=vocabulary, config=cfg, embedder=embedder
    )
    classes = len(TOPICS)
    assert len(spy.built) == 1 + classes * structures_per_class
    vocab_built, kde_built = spy.built[0], spy.built[1:]
    # the vocabulary histogram: sensitivity S, noised on every public phrase
    assert vocab_built["noise"] == "discrete_laplace" and vocab_built["size"] == len(vocabulary)
    assert vocab_built["scale"] == pytest.approx(cfg.max_matches_per_document / cfg.epsilon_vocab)
    # each KDE: sensitivity c·I for random features, the largest column sum of the
    # kernel over Ṽ for the exact kernel (plus the float margin); scale that over ε_share
    share = cfg.epsilon_kde / structures_per_class
    if cfg.density_method == "exact":
        vectors = torch.as_tensor(embedder.encode(result.private_vocabulary), dtype=torch.float64)
        kernel = torch.exp(-torch.cdist(vectors, vectors).pow(2) / cfg.bandwidth**2)
        sensitivity = float(kernel.sum(dim=0).max())
        assert 1.0 <= sensitivity < 0.7 * cfg.num_features
    else:
        sensitivity = 0.7 * cfg.num_features
    for built in kde_built:
        assert built["noise"] == "laplace"
        assert built["scale"] == pytest.approx(sensitivity / share, rel=1e-5)
    report = result.report
    assert report.as_planned
    events = [e for e in report.events if e.mechanism == "kde"]
    assert len(events) == len(kde_built)
    for event in events:
        assert event.sensitivity == pytest.approx(sensitivity, rel=1e-5)
        assert float(event.epsilon) == pytest.approx(share, rel=1e-9)
    assert report.accountant == "exact-sum"
    assert float(report.epsilon) == pytest.approx(cfg.epsilon_vocab + cfg.epsilon_kde, rel=1e-9)
    manifest = result.manifest()
    assert manifest["privacy"]["epsilon"] == float(report.epsilon)
    assert manifest["privacy"]["unit"] == "row"
    assert len(manifest["privacy"]["events"]) == len(spy.built)


def test_class_counts_are_charged_and_drive_the_split(
    monkeypatch: pytest.MonkeyPatch,
    vocabulary: Vocabulary,
    embedder: SentenceEmbedder,
) -> None:
    spy = NoiseSpy()
    spy.install(monkeypatch)
    texts, labels = corpus()
    # an uneven corpus: cardiology three times as large
    texts, labels = texts + texts[:80], labels + labels[:80]
    cfg = config(per_class=None, epsilon_count=5.0, total=120, mode="independent")
    result = generate_sequences(
        texts, labels, label_set=list(TOPICS), vocabulary=vocabulary, config=cfg, embedder=embedder
    )
    counts = [b for b in spy.built if b["size"] == len(TOPICS)]
    assert len(counts) == 1 and counts[0]["scale"] == pytest.approx(1 / 5.0)
    assert float(result.report.epsilon) == pytest.approx(4.0 + 8.0 + 5.0)
    split = Counter(s.label for s in result.sequences)
    assert sum(split.values()) == 120
    assert split["cardiology"] > split["dermatology"]


@pytest.mark.parametrize("kde_method", ["exact", "random_features"])
def test_a_total_gaussian_budget_is_met_and_every_release_recorded(
    vocabulary: Vocabulary, embedder: SentenceEmbedder, kde_method: str
) -> None:
    texts, labels = corpus()
    cfg = config(
        epsilon_vocab=None,
        epsilon_kde=None,
        epsilon=1.0,
        delta=1e-6,
        noise="gaussian",
        per_class=None,
        total=60,
        kde_method=kde_method,
    )
    result = generate_sequences(
        texts, labels, label_set=list(TOPICS), vocabulary=vocabulary, config=cfg, embedder=embedder
    )
    report = result.report
    assert report.as_planned
    assert report.accountant.startswith("pld(dp-accounting")
    assert float(report.epsilon) <= 1.0 and report.delta == 1e-6
    noises = {e.mechanism: e.noise for e in report.events}
    assert noises == {
        "vocabulary": "gaussian",
        "class_counts": "gaussian",
        "kde": "gaussian",
    }
    kde = [e for e in report.events if e.mechanism == "kde"]
    assert {e.partition for e in kde} == set(TOPICS)
    if kde_method == "random_features":  # L2 bound c·√I, not c·I
        assert kde[0].sensitivity == pytest.approx(0.5 * math.sqrt(256), rel=1e-5)
    assert len(result.sequences) == 60


def test_units_pool_a_patients_documents(
    vocabulary: Vocabulary, embedder: SentenceEmbedder
) -> None:
    texts, labels = corpus()
    units = [f"p{i // 4}" for i in range(len(texts))]  # four notes per patient
    cfg = config(per_class=None, epsilon_count=5.0, total=40)
    result = generate_sequences(
        texts,
        labels,
        label_set=list(TOPICS),
        vocabulary=vocabulary,
        config=cfg,
        embedder=embedder,
        units=units,
        unit_name="patient",
    )
    assert result.owner_diagnostics.units == len(set(units))
    assert result.manifest()["privacy"]["unit"] == "unit column 'patient'"
    assert result.report.as_planned


def test_sequences_follow_their_class(vocabulary: Vocabulary, embedder: SentenceEmbedder) -> None:
    texts, labels = corpus(per_class=200)
    cfg = config(epsilon_kde=50.0, epsilon_vocab=20.0, mode="independent", vocabulary_size=20)
    result = generate_sequences(
        texts, labels, label_set=list(TOPICS), vocabulary=vocabulary, config=cfg, embedder=embedder
    )
    assert len(result.sequences) == 30 * len(TOPICS)
    on_topic = sum(sum(p in TOPICS[s.label] for p in s.keyphrases) for s in result.sequences) / sum(
        len(s.keyphrases) for s in result.sequences
    )
    assert on_topic > 0.6  # 5 of 20 private phrases belong to each class: chance is 0.25
    for s in result.sequences:
        assert len(s.keyphrases) == 3 and len(set(s.keyphrases)) == 3


def test_owner_diagnostics_stay_out_of_the_manifest(
    vocabulary: Vocabulary, embedder: SentenceEmbedder
) -> None:
    texts, labels = corpus()
    texts[0] = "nothing from the vocabulary here"
    result = generate_sequences(
        texts,
        labels,
        label_set=list(TOPICS),
        vocabulary=vocabulary,
        config=config(mode="independent"),
        embedder=embedder,
    )
    assert result.owner_diagnostics.documents_without_match == 1
    flat = repr(result.manifest())
    assert "documents_without_match" not in flat and "documents_per_class" not in flat
    # no corpus size before the counts: no number in the manifest is it (a substring test
    # failed on a kernel bound's digits, 1.95922712030263 holds '120', a public value)
    numbers = re.findall(r"(?<![\w.])\d+(?:\.\d+)?(?:e[-+]?\d+)?", flat.split("'sequences': ")[0])
    assert numbers and all(float(n) != len(texts) for n in numbers)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"epsilon_vocab": 0.0}, "epsilon_vocab"),
        ({"epsilon_kde": math.inf}, "epsilon_kde"),
        ({"epsilon_kde": math.nan}, "epsilon_kde"),
        ({"vocabulary_size": 10_000}, "vocabulary_size"),
        ({"mode": "greedy"}, "mode"),
        ({"temperature": 0.0}, "temperature"),
        ({"kde_method": "histogram"}, "kde_method"),
        ({"mode": "iterative", "kde_method": "exact"}, "kde_method"),
        ({"class_contrast": -1.0}, "class_contrast"),
        ({"class_contrast": math.inf}, "class_contrast"),
        ({"contribution_bound": 2.0}, "contribution_bound"),
        ({"sequence_length": 40}, "sequence_length"),
    ],
)
def test_bad_configuration_names_the_field(
    vocabulary: Vocabulary, embedder: SentenceEmbedder, overrides: dict[str, Any], field: str
) -> None:
    texts, labels = corpus(per_class=5)
    with pytest.raises(ConfigError) as err:
        generate_sequences(
            texts,
            labels,
            label_set=list(TOPICS),
            vocabulary=vocabulary,
            config=config(**overrides),
            embedder=embedder,
        )
    assert err.value.field == field


def test_corpus_without_any_match_runs_and_tells_the_owner_only(
    vocabulary: Vocabulary, embedder: SentenceEmbedder
) -> None:
    # No data-dependent failure after the private read: the mechanisms run on all-zero
    # aggregates (still DP) and the fact stays in the owner-only diagnostics.
    result = generate_sequences(
        ["nothing here", "or here"],
        ["cardiology", "neurology"],
        label_set=list(TOPICS),
        vocabulary=vocabulary,
        config=config(),
        embedder=embedder,
    )
    assert result.owner_diagnostics.documents_without_match == 2
    assert {s.label for s in result.sequences} == set(TOPICS)
    assert "documents" not in json.dumps(result.manifest())


def test_undeclared_labels_are_named_by_row(
    vocabulary: Vocabulary, embedder: SentenceEmbedder
) -> None:
    texts, labels = corpus(per_class=2)
    labels[3] = "oncology"
    with pytest.raises(InputDataError, match=r"rows 4\b") as err:
        generate_sequences(
            texts,
            labels,
            label_set=list(TOPICS),
            vocabulary=vocabulary,
            config=config(),
            embedder=embedder,
        )
    assert err.value.field == "labels"
    assert texts[3] not in str(err.value)


def test_a_declared_class_without_documents_still_gets_sequences(
    vocabulary: Vocabulary, embedder: SentenceEmbedder
) -> None:
    """Its structure is pure noise, but it is released like the others: whether a class
    is empty must not show in the output's shape."""
    texts, labels = corpus(per_class=20)
    keep = [i for i, label in enumerate(labels) if label != "dermatology"]
    result = generate_sequences(
        [texts[i] for i in keep],
        [labels[i] for i in keep],
        label_set=list(TOPICS),
        vocabulary=vocabulary,
        config=config(mode="independent"),
        embedder=embedder,
    )
    assert Counter(s.label for s in result.sequences)["dermatology"] == 30


def test_density_method_and_temperature_default_by_mode() -> None:
    independent = GenerationConfig(epsilon_vocab=1.0, epsilon_kde=1.0).validate()
    assert independent.density_method == "exact"
    assert independent.sampling_temperature == DEFAULT_TEMPERATURE["exact"]
    iterative = GenerationConfig(epsilon_vocab=1.0, epsilon_kde=1.0, mode="iterative")
    assert iterative.density_method == "random_features"
    assert iterative.sampling_temperature == DEFAULT_TEMPERATURE["random_features"]
    chosen = GenerationConfig(
        epsilon_vocab=1.0, epsilon_kde=1.0, kde_method="random_features", temperature=0.7
    ).validate()
    assert (chosen.density_method, chosen.sampling_temperature) == ("random_features", 0.7)
    # the exact kernel is computed in blocks, but |Ṽ| is bounded; random features are not
    with pytest.raises(ConfigError) as err:
        GenerationConfig(epsilon_vocab=1.0, epsilon_kde=1.0, vocabulary_size=20_001).validate()
    assert err.value.field == "vocabulary_size" and "random_features" in str(err.value)
    GenerationConfig(
        epsilon_vocab=1.0, epsilon_kde=1.0, vocabulary_size=20_001, kde_method="random_features"
    ).validate()
    # what a manifest records is what ran, not "default"
    recorded = independent.to_dict()
    assert recorded["kde_method"] == "exact"
    assert recorded["temperature"] == DEFAULT_TEMPERATURE["exact"]
    assert GenerationConfig(**recorded).validate().to_dict() == recorded
