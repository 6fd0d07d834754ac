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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Unpack

import numpy as np
from numpy.typing import NDArray

from workers.methods.aug_pe.prompts import random_messages
from workers.methods.common import MethodResult, checkpoint_json, random_source
from workers.methods.pate_tutor import mechanism
from workers.methods.pate_tutor.accounting import (
    ACCOUNTANT_NOTE,
    NoisePlan,
    noise_plan,
    tutor_release,
    vote_release,
)
from workers.methods.pate_tutor.params import PateTutorParams
from workers.methods.proportions import allocate
from workers.methods.skeleton import MethodRun, RunInputs
from workers.privacy.events import PrivacyEvent
from workers.privacy.units import pool

METHOD = "pate-tutor"
DESCRIPTION = (
    "PATE discriminator with a DP label tutor (Song et al. 2024), keyseed variant: "
    "linear teachers and student on sentence embeddings, keyed-hash partition, Q fixed "
    "votes and tutor counts under one data-independent Gaussian accounting"
)
POOLS = ("negatives", "queries", "candidates")  # pools A, B, C

TEACHER_KEY = "pate-tutor-teacher-key"
TUTOR_KEY = "pate-tutor-counts"
VOTES_KEY = "pate-tutor-votes"

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
    params: PateTutorParams,
    **inputs: Unpack[RunInputs],
) -> PateTutorResult:
    """Run PATE-tutor on a labelled private corpus (module docstring; ``inputs``:
    :class:`~workers.methods.skeleton.RunInputs`).

    ``units`` (one id per document, e.g. a patient) makes the unit the privacy unit: all
    its documents go to one teacher and it is counted once by the tutor, in the class
    most of its documents carry (:func:`workers.privacy.units.pool`). Bad input raises
    before anything private is read; LLM failures end a run before the first private
    read (:class:`~workers.errors.LLMError`), and a re-run with the same ``checkpoints``
    resumes it without spending again.
    """
    return _Run.start(noise_plan, documents, labels, params, inputs)


@dataclass
class _Run(MethodRun[PateTutorParams, NoisePlan]):
    method = METHOD
    description = DESCRIPTION

    def teacher_key(self) -> bytes:
        """The run's secret hash key: drawn once, kept with the checkpoints."""
        stored = self.checkpoints.load(TEACHER_KEY)
        if stored is not None:
            return stored
        key = mechanism.new_key()
        self.checkpoints.save(TEACHER_KEY, key)
        return key

    # ------------------------------------------------------------ the run

    def execute(
        self, documents: Sequence[str], labels: Sequence[str], units: Sequence[str] | None
    ) -> PateTutorResult:
        p = self.params
        with self.stage("public_pools"):
            pools = {name: self.public_pool(name, getattr(p, name)) for name in POOLS}
        events: list[PrivacyEvent] = []
        with self.stage("tutor"):
            key = self.teacher_key()
            proportions = self.tutor(labels, units, events)  # first private read
        with self.stage("votes"):
            answers = self.votes(documents, labels, units, key, pools, events)
        with self.stage("release"):
            records = self.select(pools, answers, proportions)
            self.check_plan(events)
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
        texts = self.complete_all(
            len(wanted),
            lambda i: random_messages(document_type=self.params.document_type, label=wanted[i]),
            lambda i: random_source(f"pate_tutor/pool/{name}/{i}", self.params, wanted[i]),
            what=f"requests for pool {name!r}",
        )
        self.save_costs()
        made = Pool(tuple(texts), tuple(wanted))
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
        saved = self.saved_release(TUTOR_KEY, events)
        if saved is not None:
            noisy = saved["noisy"]
        else:
            assert self.plan.tutor_sigma is not None
            index = {label: i for i, label in enumerate(self.labels)}
            pooled = pool(labels, units, label_set=self.labels)
            classes = np.array([index[u.label] for u in pooled], dtype=np.int64)
            counts = mechanism.tutor_counts(
                classes, num_classes=len(self.labels), sigma=self.plan.tutor_sigma
            )
            del classes, pooled
            event = tutor_release(self.plan.tutor_sigma, len(self.labels))
            if event != planned:
                raise RuntimeError("the tutor counts differ from the plan")
            noisy = {label: int(counts[i]) for i, label in enumerate(self.labels)}
            self.save_release(TUTOR_KEY, {"noisy": noisy}, event, events)
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
        saved = self.saved_release(VOTES_KEY, events)
        if saved is not None:
            return np.asarray(saved["labels"], dtype=np.int64)
        p = self.params
        negatives = self.embed(pools["negatives"].texts)
        queries = self.embed(pools["queries"].texts)
        pooled = pool(labels, units, label_set=self.labels)
        # pool() lists units in order of first appearance, as dict.fromkeys does
        unit_ids = list(dict.fromkeys(units)) if units is not None else None
        identities = [
            mechanism.record_identity(
                unit=unit_ids[i] if unit_ids is not None else None,
                label=u.label,
                text=documents[u.documents[0]],
            )
            for i, u in enumerate(pooled)
        ]
        teacher_of_unit = mechanism.assign_teachers(identities, key=key, teachers=p.teachers)
        rows = [d for u in pooled for d in u.documents]
        owner = np.array(
            [teacher_of_unit[i] for i, u in enumerate(pooled) for _ in u.documents],
            dtype=np.int64,
        )
        positives = self.embed([documents[d] for d in rows])
        models = mechanism.train_teachers(
            positives,
            owner,
            teachers=p.teachers,
            negatives=negatives,
            regularization=p.regularization,
        )
        sums = mechanism.vote_sums(models, queries)
        del models, positives, owner, identities, pooled
        noisy = mechanism.noisy_votes(sums, sigma=self.plan.vote_sigma)
        del sums
        answers = mechanism.pseudo_labels(noisy)
        event = vote_release(self.plan.vote_sigma, p.queries)
        if event != self.plan.vote_event():
            raise RuntimeError("the votes differ from the plan")
        self.save_release(VOTES_KEY, {"labels": answers.tolist()}, event, events)
        return answers

    # ------------------------------------------------------------ post-processing

    def select(
        self, pools: Mapping[str, Pool], answers: NDArray[np.int64], weights: Mapping[str, float]
    ) -> list[tuple[str, str]]:
        """Student on (pool B, ŷ); per class the n_c best of pool C by P(private | x)."""
        p = self.params
        student = mechanism.fit_classifier(
            self.embed(pools["queries"].texts), answers, regularization=p.regularization
        )
        candidates = pools["candidates"]
        constant = float(answers[0]) if answers.size else 0.0  # all ŷ alike: no student
        scores = mechanism.private_probability(
            student, self.embed(candidates.texts), default=constant
        )
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
        return {
            **self.describe(
                unit_adjacency="add/remove one unit (all documents with one unit id go to one "
                "teacher; the tutor counts it once, in the class most of its documents carry)"
            ),
            "class_named_prompts": True,
            "models": self.models(
                teachers_and_student="logistic regression on sentence embeddings"
            ),
            "noise": {
                "vote_sigma": self.plan.vote_sigma,
                "tutor_sigma": self.plan.tutor_sigma,
                "accountant": ACCOUNTANT_NOTE,
            },
            **self.release_summary(events, records, planned_calls=self.params.planned_calls()),
        }
