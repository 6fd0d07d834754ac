"""PATE-tutor end to end: :func:`run_pate_tutor` (pate-tutor.md §7, the pipeline of its end).

1. **Public pools** (before any private read, rule 6): per class, from the prompt that
   names only the document type and the label, pool A (``negatives`` texts, the
   teachers' negatives), pool B (exactly Q = ``queries`` texts, the only texts the
   teachers see) and pool C (``candidates`` texts, scored for the release). Every pool
   is split evenly over the classes; the three are disjoint LLM generations.
2. **First private read**: the tutor's noisy class counts (Gaussian on counts, rounded,
   clipped at 0 and normalised by their own sum: the true N is never used, rule 5).
3. **Teachers and votes**: units go to M teachers by a keyed hash (key drawn per run and
   kept in the checkpoints); teacher m is a logistic regression of its units' sentence
   embeddings against pool A; the Q noisy votes on pool B give the pseudo-labels ŷ. The
   teachers and the clean sums are discarded there (rule 9).
4. **Student and selection** (post-processing): a logistic regression on (pool B, ŷ)
   scores pool C by P(private | x); per class the n_c best are kept, n_c = n·P̃(c) by
   largest remainders (at most the class's pool C).
5. **Release**: (label, text) pairs, shuffled with the public seed.

Privacy: the two releases and their σ come from
:func:`~workers.methods.pate_tutor.accounting.noise_plan`, computed from public parameters;
the run records exactly the planned events. Nothing is tuned on private data (rule 8);
vote sums, margins or teacher agreement are never saved, logged or put in the manifest.

Checkpoints hold the run's identity, the teacher key, the three pools, the noisy tutor
counts and the noisy pseudo-labels with their events, and LLM costs: DP outputs, public
texts and the data-independent key only. A re-run loads them instead of spending again.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from workers.errors import LLMError
from workers.llm.client import LLMCosts, LLMEndpoint
from workers.methods.aug_pe.prompts import random_messages
from workers.methods.checkpoints import Checkpoints
from workers.methods.common import (
    MethodResult,
    check_inputs,
    checkpoint_json,
    claim_checkpoints,
    complete_texts,
    load_costs,
    no_progress,
    random_source,
    run_identity,
    save_costs,
)
from workers.methods.pate_tutor.accounting import (
    ACCOUNTANT_NOTE,
    NoisePlan,
    noise_plan,
    tutor_release,
    vote_release,
)
from workers.methods.pate_tutor.mechanism import (
    assign_teachers,
    fit_classifier,
    new_key,
    noisy_votes,
    private_probability,
    pseudo_labels,
    record_identity,
    train_teachers,
    tutor_counts,
    vote_sums,
)
from workers.methods.pate_tutor.params import PateTutorParams
from workers.methods.progress import ticker
from workers.methods.proportions import allocate
from workers.privacy.accountant import compose
from workers.privacy.events import PrivacyEvent
from workers.privacy.units import pool
from workers.text.embeddings import Embedder

METHOD = "pate-tutor"
DESCRIPTION = (
    "PATE discriminator with a DP label tutor (Song et al. 2024), keyseed variant: "
    "linear teachers and student on sentence embeddings, keyed-hash partition, Q fixed "
    "votes and tutor counts under one data-independent Gaussian accounting"
)
RANDOM_ROUNDS = 3  # rounds of re-requests for failed generations before giving up
POOLS = ("negatives", "queries", "candidates")  # pools A, B, C
ProgressFn = Callable[[str, float], None]

RUN_KEY = "pate-tutor-run"
TEACHER_KEY = "pate-tutor-teacher-key"
TUTOR_KEY = "pate-tutor-counts"
VOTES_KEY = "pate-tutor-votes"
COSTS_KEY = "pate-tutor-llm-costs"

_SHUFFLE, _TIES = range(2)  # seeded public random streams


def pool_key(name: str) -> str:
    return f"pate-tutor-pool-{name}"


@dataclass(frozen=True)
class Pool:
    """Public generated texts with their prompt labels."""

    texts: tuple[str, ...]
    labels: tuple[str, ...]

    def to_bytes(self) -> bytes:
        return checkpoint_json({"texts": self.texts, "labels": self.labels})

    @classmethod
    def from_bytes(cls, raw: bytes) -> Pool:
        data = json.loads(raw)
        return cls(tuple(data["texts"]), tuple(data["labels"]))


PateTutorResult = MethodResult


def run_pate_tutor(
    documents: Sequence[str],
    labels: Sequence[str],
    *,
    label_set: Sequence[str],
    units: Sequence[str] | None,
    params: PateTutorParams,
    llm: LLMEndpoint,
    embedder: Embedder,
    checkpoints: Checkpoints,
    progress: ProgressFn | None = None,
) -> PateTutorResult:
    """Run PATE-tutor on a labelled private corpus (module docstring).

    ``units`` (one id per document, e.g. a patient) makes the unit the privacy unit: all
    its documents go to one teacher and it is counted once by the tutor, in the class
    most of its documents carry (:func:`workers.privacy.units.pool`). Bad input raises
    before anything private is read; LLM failures end a run before the first private
    read (:class:`~workers.errors.LLMError`), and a re-run with the same ``checkpoints``
    resumes it without spending again.
    """
    declared, endpoint = check_inputs(documents, labels, label_set, units, llm, params)
    plan = noise_plan(params, declared)
    run = _Run(params, declared, plan, endpoint, embedder, checkpoints, progress or no_progress)
    run.claim(unit_level=units is not None)
    return run.execute(documents, labels, units)


@dataclass
class _Run:
    params: PateTutorParams
    labels: tuple[str, ...]
    plan: NoisePlan
    endpoint: LLMEndpoint
    embedder: Embedder
    checkpoints: Checkpoints
    progress: ProgressFn
    costs: LLMCosts = field(default_factory=LLMCosts)
    unit_level: bool = False

    # ------------------------------------------------------------ checkpoints

    def claim(self, *, unit_level: bool) -> None:
        """Tie the checkpoints to this run's public configuration (refuse another's)."""
        self.unit_level = unit_level
        identity = run_identity(METHOD, self, unit_level=unit_level)
        claim_checkpoints(self.checkpoints, RUN_KEY, identity)
        saved = load_costs(self.checkpoints, COSTS_KEY)
        if saved is not None:
            self.costs = LLMCosts(**saved)

    def teacher_key(self) -> bytes:
        """The run's secret hash key: drawn once, kept with the checkpoints."""
        stored = self.checkpoints.load(TEACHER_KEY)
        if stored is not None:
            return stored
        key = new_key()
        self.checkpoints.save(TEACHER_KEY, key)
        return key

    def _save_costs(self) -> None:
        save_costs(self.checkpoints, COSTS_KEY, self.costs)

    def rng(self, *stream: int) -> np.random.Generator:
        return np.random.default_rng([self.params.seed, *stream])

    # ------------------------------------------------------------ the run

    def execute(
        self, documents: Sequence[str], labels: Sequence[str], units: Sequence[str] | None
    ) -> PateTutorResult:
        p = self.params
        self.progress("public_pools", 0.0)
        pools = {name: self.public_pool(name, getattr(p, name)) for name in POOLS}
        self.progress("public_pools", 1.0)
        self.progress("tutor", 0.0)
        key = self.teacher_key()
        events: list[PrivacyEvent] = []
        proportions = self.tutor(labels, units, events)  # first private read
        self.progress("tutor", 1.0)
        self.progress("votes", 0.0)
        answers = self.votes(documents, labels, units, key, pools, events)
        self.progress("votes", 1.0)
        self.progress("release", 0.0)
        records = self.select(pools, answers, proportions)
        if events != list(self.plan.events):
            raise RuntimeError("the run's events differ from its plan")  # a bug, never data
        self.progress("release", 1.0)
        return PateTutorResult(
            records=records,
            events=events,
            manifest=self.manifest(events, records),
            llm_costs=self.costs,
        )

    # ------------------------------------------------------------ public work (LLM)

    def public_pool(self, name: str, size: int) -> Pool:
        """``size`` texts split evenly over the classes, from public prompts only."""
        stored = self.checkpoints.load(pool_key(name))
        if stored is not None:
            return Pool.from_bytes(stored)
        shares = allocate(size, {label: 1.0 for label in self.labels})
        wanted = [label for label in self.labels for _ in range(shares[label])]
        texts: list[str | None] = [None] * len(wanted)
        for _ in range(RANDOM_ROUNDS):
            missing = [i for i, text in enumerate(texts) if text is None]
            if not missing:
                break
            requests = [
                random_messages(document_type=self.params.document_type, label=wanted[i])
                for i in missing
            ]
            answers = complete_texts(
                requests,
                endpoint=self.endpoint,
                concurrency=self.params.concurrency,
                costs=self.costs,
                sources=[
                    random_source(f"pate_tutor/pool/{name}/{i}", self.params, wanted[i])
                    for i in missing
                ],
                tick=ticker(self.progress),
            )
            for i, answer in zip(missing, answers, strict=True):
                texts[i] = answer
        self._save_costs()
        failures = sum(text is None for text in texts)
        if failures:
            raise LLMError(
                f"the LLM failed {failures} of {len(texts)} requests for pool {name!r} "
                f"{RANDOM_ROUNDS} times; re-run to resume",
                field="llm",
            )
        made = Pool(tuple(t for t in texts if t is not None), tuple(wanted))
        self.checkpoints.save(pool_key(name), made.to_bytes())
        return made

    def embed(self, texts: Sequence[str]) -> NDArray[np.float32]:
        return np.asarray(self.embedder.encode(list(texts)), dtype=np.float32)

    # ------------------------------------------------------------ private reads

    def tutor(
        self, labels: Sequence[str], units: Sequence[str] | None, events: list[PrivacyEvent]
    ) -> dict[str, float]:
        """The tutor's class weights: noisy unit counts clipped at 0 (saved once)."""
        planned = self.plan.tutor_event()
        if planned is None:  # one class
            return {self.labels[0]: 1.0}
        stored = self.checkpoints.load(TUTOR_KEY)
        if stored is not None:
            data = json.loads(stored)
            events.append(PrivacyEvent.from_dict(data["event"]))
            noisy = data["noisy"]
        else:
            assert self.plan.tutor_sigma is not None
            index = {label: i for i, label in enumerate(self.labels)}
            pooled = pool(labels, units, label_set=self.labels)
            classes = np.array([index[u.label] for u in pooled], dtype=np.int64)
            counts = tutor_counts(
                classes, num_classes=len(self.labels), sigma=self.plan.tutor_sigma
            )
            del classes, pooled
            event = tutor_release(self.plan.tutor_sigma, len(self.labels))
            if event != planned:
                raise RuntimeError("the tutor counts differ from the plan")
            noisy = {label: int(counts[i]) for i, label in enumerate(self.labels)}
            self.checkpoints.save(
                TUTOR_KEY, checkpoint_json({"noisy": noisy, "event": event.to_dict()})
            )
            events.append(event)
        return {label: max(float(noisy[label]), 0.0) for label in self.labels}

    def votes(
        self,
        documents: Sequence[str],
        labels: Sequence[str],
        units: Sequence[str] | None,
        key: bytes,
        pools: Mapping[str, Pool],
        events: list[PrivacyEvent],
    ) -> NDArray[np.int64]:
        """The Q pseudo-labels of pool B from the teachers' noisy votes (saved once)."""
        stored = self.checkpoints.load(VOTES_KEY)
        if stored is not None:
            data = json.loads(stored)
            events.append(PrivacyEvent.from_dict(data["event"]))
            return np.asarray(data["labels"], dtype=np.int64)
        p = self.params
        negatives = self.embed(pools["negatives"].texts)
        queries = self.embed(pools["queries"].texts)
        pooled = pool(labels, units, label_set=self.labels)
        # pool() lists units in order of first appearance, as dict.fromkeys does
        unit_ids = list(dict.fromkeys(units)) if units is not None else None
        identities = [
            record_identity(
                unit=unit_ids[i] if unit_ids is not None else None,
                label=u.label,
                text=documents[u.documents[0]],
            )
            for i, u in enumerate(pooled)
        ]
        teacher_of_unit = assign_teachers(identities, key=key, teachers=p.teachers)
        rows = [d for u in pooled for d in u.documents]
        owner = np.array(
            [teacher_of_unit[i] for i, u in enumerate(pooled) for _ in u.documents],
            dtype=np.int64,
        )
        positives = self.embed([documents[d] for d in rows])
        models = train_teachers(
            positives,
            owner,
            teachers=p.teachers,
            negatives=negatives,
            regularization=p.regularization,
        )
        sums = vote_sums(models, queries)
        del models, positives, owner, identities, pooled
        noisy = noisy_votes(sums, sigma=self.plan.vote_sigma)
        del sums
        answers = pseudo_labels(noisy)
        event = vote_release(self.plan.vote_sigma, p.queries)
        if event != self.plan.vote_event():
            raise RuntimeError("the votes differ from the plan")
        self.checkpoints.save(
            VOTES_KEY, checkpoint_json({"labels": answers.tolist(), "event": event.to_dict()})
        )
        events.append(event)
        return answers

    # ------------------------------------------------------------ post-processing

    def select(
        self, pools: Mapping[str, Pool], answers: NDArray[np.int64], weights: Mapping[str, float]
    ) -> list[tuple[str, str]]:
        """Student on (pool B, ŷ); per class the n_c best of pool C by P(private | x)."""
        p = self.params
        student = fit_classifier(
            self.embed(pools["queries"].texts), answers, regularization=p.regularization
        )
        candidates = pools["candidates"]
        constant = float(answers[0]) if answers.size else 0.0  # all ŷ alike: no student
        scores = private_probability(student, self.embed(candidates.texts), default=constant)
        ties = self.rng(_TIES).random(len(scores))  # public tie-break
        want = allocate(p.num_released, dict(weights))
        records: list[tuple[str, str]] = []
        for label in self.labels:
            own = np.array(
                [i for i, x in enumerate(candidates.labels) if x == label], dtype=np.int64
            )
            order = own[np.lexsort((ties[own], -scores[own]))]
            records += [(label, candidates.texts[i]) for i in order[: want[label]].tolist()]
        shuffle = self.rng(_SHUFFLE).permutation(len(records))
        return [records[i] for i in shuffle]

    # ------------------------------------------------------------ manifest

    def manifest(
        self, events: Sequence[PrivacyEvent], records: Sequence[tuple[str, str]]
    ) -> dict[str, Any]:
        """Public facts only: parameters, models, noise, events, released sizes, costs."""
        per_class = {label: 0 for label in self.labels}
        for label, _ in records:
            per_class[label] += 1
        costs: dict[str, Any] = dict(self.costs.as_dict())
        costs["planned_calls"] = self.params.planned_calls()
        return {
            "method": METHOD,
            "description": DESCRIPTION,
            "parameters": self.params.to_dict(),
            "labels": list(self.labels),
            "adjacency": (
                "add/remove one unit (all documents with one unit id go to one teacher; "
                "the tutor counts it once, in the class most of its documents carry)"
                if self.unit_level
                else "add/remove one document"
            ),
            "class_named_prompts": True,
            "models": {
                "llm": self.endpoint.model,
                "embedding": self.embedder.name,
                "teachers_and_student": "logistic regression on sentence embeddings",
            },
            "noise": {
                "vote_sigma": self.plan.vote_sigma,
                "tutor_sigma": self.plan.tutor_sigma,
                "accountant": ACCOUNTANT_NOTE,
            },
            "privacy": compose(events).to_dict(delta=self.params.delta),
            "released": len(records),
            "released_per_class": per_class,
            "llm_costs": costs,
        }
