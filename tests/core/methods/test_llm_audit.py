"""The one-run canary audit (workers/privacy/audit.py) on the LLM methods (issue 66, item 3).

An LLM method's canaries join its private input as a DP-KPS run's do, and the membership
test reads the released texts alone: a canary's rare suffix words in its class's released
texts. Whether a canary can show there depends on what the method releases: Aug-PE
releases LLM texts *selected* by noisy nearest-neighbour votes, so a canary can reach the
release only by pulling the selection towards candidates that hold its words.

The test LLM here makes that possible on purpose (:class:`WordPool`): asked for a new text
of a class it writes one word of the public word pool the canaries draw from (each class
gets every word in turn), asked for a variation it echoes its prompt's text. A run with
OpenDP's noise switched off then selects, for every included canary, the candidates that
are its words, and the audit's bound exceeds the claimed ε; the real mechanism at the
same ε selects through noise that drowns one canary's vote, and the bound stays at or
below the claim.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from tests.core.methods import news
from tests.fake_llm import FakeLLM, Turns, asked_class, echoed_text, last_message
from workers.methods.aug_pe import run_aug_pe
from workers.methods.aug_pe.params import AugPEParams
from workers.methods.checkpoints import MemoryCheckpoints
from workers.methods.skeleton import RunInputs
from workers.privacy.audit import AuditResult, CanarySet, make_canaries, rare_words, run_audit

pytestmark = pytest.mark.slow

CLAIMED = 1.0
CANARIES = 64
COPIES = 100  # DP-EDA: copies of the news corpus, enough votes for LimitedDomain at ε = 1
WORD = re.compile(r"[a-z]{3,}")
# what every method's run here takes alike: news articles, the claimed ε, δ, the LLM calls
RUN: dict[str, Any] = {
    "document_type": "news article",
    "epsilon": CLAIMED,
    "delta": 1e-5,
    "concurrency": 8,
    "max_tokens": 16,
}


def _pool() -> list[str]:
    """800 English words of middling rank (public): the canaries draw from the rare half
    (:func:`workers.privacy.audit.rare_words`), which the test LLM writes too."""
    from workers.text.vocabulary import load_vocabulary

    words = [w for w in load_vocabulary("english").phrases[25_000:27_000] if WORD.fullmatch(w)]
    return words[:800]


class WordPool:
    """The test LLM's answers (a ``content_fn`` of :class:`tests.fake_llm.FakeLLM`): a new
    text of a class is the next word of ``words`` for that class; a variation echoes the
    text of its prompt (blanks dropped)."""

    def __init__(self, words: list[str]) -> None:
        self.words = words
        self.turns = Turns()

    def __call__(self, body: Any) -> str:
        user = last_message(body)
        example = re.search(r"\n\nExample: (.*)$", user, re.S)
        if example is not None:  # a prompt with an example (only a broken run's): echoed
            return example.group(1)
        phrases = re.search(r"using these phrases: (.*?)\.(?: Improve|$)", user, re.S)
        if phrases is not None:  # DP-EDA's decoder: the phrases it was given, echoed
            return " ".join(p.strip() for p in phrases.group(1).split(";"))
        label = asked_class(user)
        if label is not None:
            return self.words[self.turns.next(label) % len(self.words)]
        echoed = echoed_text(user)
        text = echoed.replace("_", " ") if echoed is not None else ""
        return " ".join(text.split()) or self.words[0]


@pytest.fixture(scope="module")
def words() -> list[str]:
    return _pool()


@pytest.fixture(scope="module")
def llm(words: list[str]) -> Iterator[FakeLLM]:
    with FakeLLM(content_fn=WordPool(rare_words(words))) as fake:
        yield fake


@pytest.fixture(scope="module")
def embedder() -> Any:
    from workers.text.embeddings import SentenceEmbedder

    return SentenceEmbedder()


def _input(
    words: list[str], label_set: list[str] = news.LABEL_SET
) -> tuple[CanarySet, list[str], list[str]]:
    """64 canaries of ``words`` over ``label_set`` and the run's input: the news corpus
    (of those classes), then the canaries whose coin came up heads (as the worker adds
    them)."""
    canaries = make_canaries(
        phrases=words,
        labels=label_set,
        count=CANARIES,
        seed=int(np.random.default_rng().integers(2**62)),
        document_type="news article",
    )
    added = canaries.included_canaries
    corpus = [("Sports", d) for d in news.SPORTS] + [("Business", d) for d in news.BUSINESS]
    kept = [(label, d) for label, d in corpus if label in label_set]
    documents = [*(d for _, d in kept), *(c.text for c in added)]
    return canaries, documents, [*(label for label, _ in kept), *(c.label for c in added)]


def _run(
    runner: Any,
    documents: list[str],
    labels: list[str],
    params: Any,
    label_set: list[str],
    llm: FakeLLM,
    embedder: Any,
    **extra: Any,
) -> Any:
    """``runner`` (an LLM method's entry point) on ``documents`` with the fake ``llm``,
    no units and its checkpoints in memory (``extra``: the method's own inputs)."""
    inputs: RunInputs = {
        "label_set": label_set,
        "units": None,
        "llm": llm.endpoint(),
        "embedder": embedder,
        "checkpoints": MemoryCheckpoints(),
    }
    return runner(documents, labels, params=params, **inputs, **extra)


def _audit(canaries: CanarySet, result: Any) -> AuditResult:
    """The audit of ``result``'s release, at the ε it claims (checked to be CLAIMED)."""
    claimed = float(result.manifest["privacy"]["epsilon"])
    assert claimed == pytest.approx(CLAIMED, abs=1e-6)
    return run_audit(canaries, result.records, claimed_epsilon=claimed, delta=1e-5)


def _aug_pe_audit(words: list[str], llm: FakeLLM, embedder: Any) -> AuditResult:
    """One Aug-PE run (ε = 1, one iteration, 800 one-word candidates, 120 released) on
    the news corpus with 64 canaries of ``words`` added by their coins, and its audit."""
    canaries, documents, labels = _input(words)
    params = AugPEParams(
        **RUN,
        iterations=1,
        population=800,
        initial_variation_folds=0,
        num_released=120,
        nearest_neighbors=3,
    )
    result = _run(run_aug_pe, documents, labels, params, news.LABEL_SET, llm, embedder)
    return _audit(canaries, result)


def _assert_caught(broken: AuditResult) -> None:
    """The audit of a broken run: its bound exceeds the claimed ε, and its words warn."""
    assert broken.epsilon_lower_bound > CLAIMED, broken
    assert broken.exceeds_claim and "WARNING" in broken.in_words()


def test_the_audit_catches_aug_pe_with_its_noise_switched_off(
    monkeypatch: pytest.MonkeyPatch, words: list[str], llm: FakeLLM, embedder: Any
) -> None:
    from workers.privacy import noise as samplers

    monkeypatch.setattr(samplers, "_add", lambda noise, data, scale: list(data.tolist()))
    broken = _aug_pe_audit(words, llm, embedder)
    assert broken.copied_as_documents == 0  # released texts are LLM candidates, not canaries
    _assert_caught(broken)


# -- PATE-tutor ------------------------------------------------------------------------------
#
# PATE-tutor releases candidates of a public pool chosen by a student trained on the
# teachers' noisy votes. Its noise switched off is not enough for one canary to show: a
# canary is in one teacher of M, and the vote sums of M teachers move by at most one
# teacher's (the sample-and-aggregate of PATE), so the broken variant caught here is the
# bug PATE-tutor's design rules out: private documents in the pools' prompts (as few-shot
# examples), which an LLM echoes into the candidates.


def _leaky_prompts(
    monkeypatch: pytest.MonkeyPatch,
    module: Any,
    name: str,
    documents: list[str],
    labels: list[str],
) -> None:
    """``module.<name>`` (a prompt builder taking the class as ``label``) with a document
    of the run's input of the prompt's class (one in turn) appended as an example: the
    non-private variant."""
    original = getattr(module, name)
    by_class = {label: [d for d, x in zip(documents, labels, strict=True) if x == label]
                for label in set(labels)}  # fmt: skip
    turns: Counter[str] = Counter()

    def leaky(**kwargs: Any) -> Any:
        messages = original(**kwargs)
        own = by_class[kwargs["label"]]
        example = own[turns[kwargs["label"]] % len(own)]
        turns[kwargs["label"]] += 1
        user = {**messages[-1], "content": f"{messages[-1]['content']}\n\nExample: {example}"}
        return [*messages[:-1], user]

    monkeypatch.setattr(module, name, leaky)


def _pate_audit(
    words: list[str],
    llm: FakeLLM,
    embedder: Any,
    monkeypatch: pytest.MonkeyPatch | None = None,
    label_set: list[str] = news.LABEL_SET,
) -> AuditResult:
    """One PATE-tutor run (ε = 1, 4 teachers, 200 candidates) on the news corpus of
    ``label_set`` with 64 canaries, and its audit. The real run releases 160 candidates;
    with ``monkeypatch`` the pools' prompts carry the run's input documents
    (:func:`_leaky_prompts`) and every candidate is released (the student ranks identical
    echoes alike, so a partial release could drop a canary's every copy)."""
    from workers.methods.pate_tutor import run_pate_tutor
    from workers.methods.pate_tutor import runner as pate_runner
    from workers.methods.pate_tutor.params import PateTutorParams

    canaries, documents, labels = _input(words, label_set)
    if monkeypatch is not None:
        _leaky_prompts(monkeypatch, pate_runner, "random_messages", documents, labels)
    params = PateTutorParams(
        **RUN,
        teachers=4,
        queries=80,
        negatives=80,
        candidates=200,
        num_released=160 if monkeypatch is None else 200,
    )
    result = _run(run_pate_tutor, documents, labels, params, label_set, llm, embedder)
    return _audit(canaries, result)


def test_the_audit_catches_pate_tutor_with_private_documents_in_its_prompts(
    monkeypatch: pytest.MonkeyPatch, words: list[str], llm: FakeLLM, embedder: Any
) -> None:
    # one class: the tutor's noisy shares cannot hold back part of the echoed pool
    broken = _pate_audit(words, llm, embedder, monkeypatch, ["Sports"])
    assert broken.copied_as_documents > 0  # canaries echoed whole into released texts
    _assert_caught(broken)


# -- DP-EDA ------------------------------------------------------------------------------------
#
# DP-EDA releases texts decoded from parents that LimitedDomain selected among public
# population members: a member needs a count above the (K+1)-th count plus a gap of
# 1 + ln(1/δ)/ε_s (about 50 votes at the real test's ε_s = 0.25) to be selected, so one
# canary's single vote cannot show (the δ part of its guarantee). The broken variant is
# LimitedDomain with its Gumbel noise switched off and that gap cut to half a vote (an
# exact top k of the members with a vote): every member a canary votes for is a parent,
# and the decoder (with an LLM that echoes the nearest vocabulary phrase it is given)
# writes it out.


def _eda_audit(words: list[str], llm: FakeLLM, embedder: Any, **levers: Any) -> AuditResult:
    """One DP-EDA run (ε = 1, one iteration, LLM reconstruction from the word
    vocabulary, ``levers`` changed) on COPIES copies of the news corpus with 64 canaries,
    and its audit."""
    from workers.methods.dp_eda import run_dp_eda
    from workers.methods.dp_eda.params import DPEDAParams
    from workers.text.vocabulary import Vocabulary

    canaries, documents, labels = _input(words)
    news_rows = len(news.SPORTS) + len(news.BUSINESS)
    documents = [*(documents[:news_rows] * COPIES), *documents[news_rows:]]
    labels = [*(labels[:news_rows] * COPIES), *labels[news_rows:]]
    values: dict[str, Any] = {
        **RUN,
        "vocabulary": "audit-words",
        "iterations": 1,
        "domain": 8,
        "parents": 4,
        "initial_population": 40,
        "offspring": 16,
        "top_r": 2,
        "nearest_phrases": 3,
        "candidates": 1,
        "rounds": 1,
        "perplexity_percentile": 100.0,
    }
    params = DPEDAParams(**{**values, **levers})
    vocabulary = Vocabulary.from_phrases("audit-words", words)
    result = _run(
        run_dp_eda, documents, labels, params, news.LABEL_SET, llm, embedder, vocabulary=vocabulary
    )
    assert all(c["released"] for c in result.manifest["classes"].values())  # a release to audit
    return _audit(canaries, result)


def test_the_audit_catches_dp_eda_with_its_noise_and_threshold_switched_off(
    monkeypatch: pytest.MonkeyPatch, words: list[str], llm: FakeLLM, embedder: Any
) -> None:
    from workers.methods.dp_eda import limited_domain

    def exact(scores: Any, *, k: int, **noise: Any) -> Any:
        return np.argsort(-np.asarray(scores), kind="stable")[:k]

    monkeypatch.setattr(limited_domain, "noisy_top_k", exact)
    # ⊥ half a vote above the (K+1)-th count: every member with a vote comes before it
    monkeypatch.setattr(limited_domain.Calibration, "gap", lambda self, size: 0.5)
    # every one of the 400 words of a class is a member; up to 100 parents, one phrase each
    broken = _eda_audit(
        words, llm, embedder, initial_population=400, domain=100, parents=100, offspring=101,
        nearest_phrases=1,
    )  # fmt: skip
    _assert_caught(broken)


# -- each method, real -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "audit", [_aug_pe_audit, _pate_audit, _eda_audit], ids=["aug_pe", "pate_tutor", "dp_eda"]
)
def test_the_real_method_at_the_same_epsilon_stays_within_its_claim(
    audit: Any, words: list[str], llm: FakeLLM, embedder: Any
) -> None:
    # one run, real OpenDP noise: a valid audit exceeds the truth with probability ≤ 5 %
    # (Aug-PE: one canary's vote, norm 1, is drowned by σ ≈ 4 on every candidate)
    honest = audit(words, llm, embedder)
    assert honest.epsilon_lower_bound <= CLAIMED, honest
    assert not honest.exceeds_claim and honest.copied_as_documents == 0
