"""Aug-PE end to end: :func:`run_aug_pe` (aug-pe.md §2, with the keyseed rules of §6).

Steps of one run (T = ``params.iterations``, N = ``params.population``):

1. **Class counts** (with more than one class): DP counts of the privacy units per
   declared class (Gaussian, OpenDP). Every class's share of the N seeds and of
   the released documents is allocated from them once shrunk towards their mean by their
   own σ (:func:`workers.methods.proportions.split_by_counts`, as DP-KPS splits a total);
   raw counts are never used (caveat A1). With one class there is nothing to count.
2. **Initial population**, per class: its share of N texts from the RANDOM_API (document
   type and label only), then f_0 VARIATION_API variations of each.
3. **Iterations t = 1 … T**: embed every candidate (lookahead d > 0: the mean embedding of
   d variations of it); each class's units vote for their k nearest candidates of the
   class; Gaussian noise on every bin (OpenDP); threshold; selection (rank or sample);
   for t < T, f variations of every selected text, plus the selected texts themselves
   with ``keep_selected``, make the next population.
4. **Release**: the texts selected at iteration T, (label, text) pairs, shuffled with the
   public seed. The variations the library makes of the last selection are not made: the
   paper evaluates only the selected texts.

Privacy. Private data enter in two places only, both in :mod:`.mechanism` and
:func:`_Run.class_counts`: the class counts and the vote histograms. Every release has
its σ from :func:`~workers.methods.aug_pe.accounting.noise_plan`, computed from public
parameters before the first private read, and the run records exactly the planned
events. Nothing after the first private read branches on private data: empty classes
vote nothing and are noised all the same, and LLM failures depend on public prompts only.
Clean counts and histograms are local variables of the functions that noise them.
Prompts hold the document type, the label (public schema, caveat A10) and synthetic
texts; never a private document.

Checkpoints (:mod:`workers.methods.checkpoints`). Every DP output is saved as soon as it
is drawn and before anything derived from it leaves the process (an LLM prompt, the
result): the noisy class counts; per iteration the noisy histograms, their
post-processed scores, the selection and the events; and every population with its
texts, labels and parent indices. That is the whole allow-list (caveat A3): no clean
count, no embedding of a private document, no private text. A re-run with the same
checkpoints loads what is there instead of drawing noise again: it resumes at the next
iteration and records each event once. A crash between drawing noise and saving it loses
a draw that nothing outside the process saw, so drawing it again is a first release.
LLM costs are saved with the populations and add up across resumptions.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Unpack

import numpy as np
from numpy.typing import NDArray

from workers.llm.attestation import VARIATION, Source
from workers.methods.aug_pe import prompts
from workers.methods.aug_pe.accounting import (
    NoisePlan,
    count_release,
    histogram_release,
    noise_plan,
)
from workers.methods.aug_pe.mechanism import (
    nearest_candidates,
    post_process,
    release_histogram,
    select,
    vote_histogram,
)
from workers.methods.aug_pe.params import AugPEParams
from workers.methods.common import MethodResult, checkpoint_json, random_source
from workers.methods.progress import ticker
from workers.methods.proportions import split_by_counts
from workers.methods.skeleton import MethodRun, RunInputs
from workers.privacy.events import PrivacyEvent
from workers.privacy.noise import gaussian_noise
from workers.privacy.units import group_units
from workers.text.embeddings import encode_in_chunks

METHOD = "aug-pe"
DESCRIPTION = (
    "Aug-PE (Xie et al., ICML 2024): Private Evolution for text, with DP class counts, "
    "OpenDP Gaussian vote histograms and exact GDP accounting"
)
COUNTS_KEY = "aug-pe-counts"

# Stage codes that separate the seeded random streams of a run.
_RANDOM, _SELECT, _VARY, _LOOKAHEAD, _SHUFFLE = range(5)


def population_key(iteration: int) -> str:
    return f"aug-pe-population-{iteration}"


def histogram_key(iteration: int) -> str:
    return f"aug-pe-histogram-{iteration}"


@dataclass(frozen=True)
class Population:
    """Candidates: text, label, and the index of the parent in the previous population
    (−1 for a RANDOM_API text)."""

    texts: tuple[str, ...]
    labels: tuple[str, ...]
    parents: tuple[int, ...]

    def indices_of(self, label: str) -> NDArray[np.int64]:
        return np.array([i for i, x in enumerate(self.labels) if x == label], dtype=np.int64)

    def to_bytes(self) -> bytes:
        data = {"texts": self.texts, "labels": self.labels, "parents": self.parents}
        return json.dumps(data, ensure_ascii=False).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> Population:
        data = json.loads(raw)
        return cls(tuple(data["texts"]), tuple(data["labels"]), tuple(data["parents"]))


AugPEResult = MethodResult


@dataclass
class _Private:
    """Embeddings of the voting private documents, their units and classes (memory only)."""

    embeddings: NDArray[np.float32]
    units: NDArray[np.int64]
    classes: NDArray[np.int64]


def run_aug_pe(
    documents: Sequence[str],
    labels: Sequence[str],
    *,
    params: AugPEParams,
    **inputs: Unpack[RunInputs],
) -> AugPEResult:
    """Run Aug-PE on a labelled private corpus (module docstring; ``inputs``:
    :class:`~workers.methods.skeleton.RunInputs`).

    ``units`` (one id per document, e.g. a patient) makes the unit the privacy unit:
    each unit is assigned to the class most of its documents carry and votes there with
    norm 1 (:func:`~workers.privacy.units.group_units`). Bad input raises
    before anything private is read; after that only LLM failures can end a run
    (:class:`~workers.errors.LLMError`), and a re-run with the same
    ``checkpoints`` resumes it without spending again.
    """
    return _Run.start(noise_plan, documents, labels, params, inputs)


@dataclass
class _Run(MethodRun[AugPEParams, NoisePlan]):
    method = METHOD
    description = DESCRIPTION
    failed: int = 0  # variation requests that fell back to their parent text

    def counters(self) -> dict[str, int]:
        return {"failed_requests": self.failed}

    def restore_counters(self, saved: dict[str, Any]) -> None:
        self.failed = int(saved.pop("failed_requests"))

    # ------------------------------------------------------------ the run

    def execute(
        self, documents: Sequence[str], labels: Sequence[str], units: Sequence[str] | None
    ) -> AugPEResult:
        p = self.params
        events: list[PrivacyEvent] = []
        with self.stage("class_counts"):
            counts = self.class_counts(labels, units, events)  # first private read
            seeds = self.allocation(p.population, counts)
            released = self.allocation(p.num_released, counts)
        with self.stage("initial_population"):
            population = self.initial_population(seeds)
        self.progress("iteration", 0.0)
        private: _Private | None = None
        selected: dict[str, list[int]] = {}
        for t in range(1, p.iterations + 1):
            stored = self.checkpoints.load(histogram_key(t))
            if stored is None:
                if private is None:
                    private = self.private_side(documents, labels, units)
                want = seeds if t < p.iterations else released
                record = self.release(t, population, private, want)
            else:
                record = json.loads(stored)
            events.extend(PrivacyEvent.from_dict(e) for e in record["events"])
            selected = {label: list(record["selected"][label]) for label in self.labels}
            if t < p.iterations:
                population = self.next_population(t, population, selected)
            self.progress("iteration", t / p.iterations)
        del private
        with self.stage("release"):
            records = [
                (label, population.texts[i]) for label in self.labels for i in selected[label]
            ]
            order = self.rng(_SHUFFLE).permutation(len(records))
            records = [records[i] for i in order]
            self.check_plan(events)
        return AugPEResult(
            records=records,
            events=events,
            manifest=self.manifest(events, records),
            llm_costs=self.costs,
        )

    def allocation(self, total: int, counts: Mapping[str, int] | None) -> dict[str, int]:
        """``total`` split among the classes by their noisy counts, shrunk towards their
        mean as DP-KPS does (:func:`workers.methods.proportions.split_by_counts`)."""
        if counts is None:  # one class
            return {self.labels[0]: total}
        assert self.plan.count_sigma is not None  # counts are released with σ
        return split_by_counts(total, counts, self.plan.count_sigma)  # in self.labels' order

    # ------------------------------------------------------------ private reads

    def class_counts(
        self, labels: Sequence[str], units: Sequence[str] | None, events: list[PrivacyEvent]
    ) -> dict[str, int] | None:
        """Noisy counts of units per class (Gaussian, Δ₂ = 1; rounded), saved once."""
        planned = self.plan.count_event()
        if planned is None:
            return None
        saved = self.saved_release(COUNTS_KEY, events)
        if saved is not None:
            return {label: int(saved["noisy"][label]) for label in self.labels}
        assert self.plan.count_sigma is not None
        _, class_of_unit, _ = group_units(labels, units, self.labels)
        clean = np.bincount(class_of_unit, minlength=len(self.labels)).astype(np.float64)
        noisy = gaussian_noise(clean, scale=self.plan.count_sigma)
        del clean, class_of_unit
        event = count_release(self.plan.count_sigma, len(self.labels))
        if event != planned:
            raise RuntimeError("the class counts differ from the plan")
        result = {label: round(float(noisy[i])) for i, label in enumerate(self.labels)}
        self.save_release(COUNTS_KEY, {"noisy": result}, event, events)
        return result

    def private_side(
        self, documents: Sequence[str], labels: Sequence[str], units: Sequence[str] | None
    ) -> _Private:
        """Embed the documents that vote (each unit's documents of its class)."""
        unit_of, class_of_unit, votes = group_units(labels, units, self.labels)
        rows = np.flatnonzero(votes)
        embeddings = encode_in_chunks(
            self.embedder, [documents[i] for i in rows.tolist()], tick=ticker(self.progress)
        )
        return _Private(
            embeddings=np.asarray(embeddings, dtype=np.float32),
            units=unit_of[rows],
            classes=class_of_unit[unit_of[rows]],
        )

    def release(
        self, t: int, population: Population, private: _Private, want: Mapping[str, int]
    ) -> dict[str, Any]:
        """Iteration t's noisy histograms, scores and selection, saved before any use."""
        p = self.params
        candidates = self.candidate_embeddings(t, population)
        size = len(population.texts)
        rng = self.rng(_SELECT, t)
        record: dict[str, Any] = {
            "iteration": t,
            "noisy": {},
            "scores": {},
            "selected": {},
            "events": [],
        }
        for c, label in enumerate(self.labels):
            own = population.indices_of(label)
            rows = np.flatnonzero(private.classes == c)
            neighbours = nearest_candidates(
                private.embeddings[rows],
                candidates[own],
                k=p.nearest_neighbors,
                distance=p.distance,
            )
            clean = vote_histogram(neighbours, private.units[rows], size, candidate_index=own)
            noisy = release_histogram(clean, sigma=self.plan.histogram_sigma)
            del clean, neighbours, rows
            event = histogram_release(self.plan.histogram_sigma, size, t, label)
            if event != self.plan.histogram_event(t, label):
                raise RuntimeError("a histogram differs from the plan")
            scores = post_process(noisy[own], p.histogram_threshold)
            chosen = own[select(scores, want[label], mode=p.selection, rng=rng)]
            record["noisy"][label] = noisy.tolist()
            record["scores"][label] = scores.tolist()
            record["selected"][label] = chosen.tolist()
            record["events"].append(event.to_dict())
        self.checkpoints.save(histogram_key(t), checkpoint_json(record))
        return record

    # ------------------------------------------------------------ public work (LLM)

    def variations(self, texts: Sequence[str], labels: Sequence[str], *stream: int) -> list[str]:
        """One VARIATION_API text per input; a failed request keeps its input text."""
        p = self.params
        rng = self.rng(*stream)
        requests = [
            prompts.variation_messages(
                text,
                document_type=p.document_type,
                label=label,
                variation=p.variation,
                blank_probability=p.blank_probability,
                words=prompts.target_words(
                    text, std=p.word_count_std, minimum=p.min_word_count, rng=rng
                ),
                rng=rng,
            )
            for text, label in zip(texts, labels, strict=True)
        ]
        stream_name = ".".join(map(str, stream))
        sources = [
            Source(
                key=f"aug_pe/variation/{stream_name}/{k}",
                kind=VARIATION,
                inputs={"sample": text},  # a synthetic text: post-processing of DP selections
                refs={
                    "document_type": p.document_type,
                    "label": label,
                    "variation": p.variation,
                    "stream": list(stream),
                },
            )
            for k, (text, label) in enumerate(zip(texts, labels, strict=True))
        ]
        answers = self.generate(requests, sources)
        self.failed += sum(a is None for a in answers)
        return [a if a is not None else text for a, text in zip(answers, texts, strict=True)]

    def initial_population(self, seeds: Mapping[str, int]) -> Population:
        stored = self.checkpoints.load(population_key(0))
        if stored is not None:
            return Population.from_bytes(stored)
        labels = [label for label in self.labels for _ in range(seeds[label])]
        seeds_texts = self.complete_all(
            len(labels),
            lambda i: prompts.random_messages(
                document_type=self.params.document_type, label=labels[i]
            ),
            lambda i: random_source(f"aug_pe/random/{i}", self.params, labels[i]),
            what="initial requests",
        )
        all_texts, all_labels, parents = list(seeds_texts), list(labels), [-1] * len(labels)
        for fold in range(self.params.initial_variation_folds):
            all_texts += self.variations(seeds_texts, labels, _RANDOM, fold)
            all_labels += labels
            parents += [-1] * len(labels)
        population = Population(tuple(all_texts), tuple(all_labels), tuple(parents))
        self.checkpoints.save(population_key(0), population.to_bytes())
        self.save_costs()
        return population

    def next_population(
        self, t: int, population: Population, selected: Mapping[str, list[int]]
    ) -> Population:
        """f variations of every selected text (and the selected, with keep_selected)."""
        stored = self.checkpoints.load(population_key(t))
        if stored is not None:
            return Population.from_bytes(stored)
        chosen = [i for label in self.labels for i in selected[label]]
        texts = [population.texts[i] for i in chosen]
        labels = [population.labels[i] for i in chosen]
        all_texts: list[str] = []
        all_labels: list[str] = []
        parents: list[int] = []
        for fold in range(self.params.variation_folds):
            all_texts += self.variations(texts, labels, _VARY, t, fold)
            all_labels += labels
            parents += chosen
        if self.params.keep_selected:
            all_texts += texts
            all_labels += labels
            parents += chosen
        new = Population(tuple(all_texts), tuple(all_labels), tuple(parents))
        self.checkpoints.save(population_key(t), new.to_bytes())
        self.save_costs()
        return new

    def candidate_embeddings(self, t: int, population: Population) -> NDArray[np.float32]:
        """Each candidate's embedding, or with lookahead d the mean of d variations'."""
        d = self.params.lookahead_degree
        if d == 0:
            return np.asarray(self.embedder.encode(list(population.texts)), dtype=np.float32)
        total = np.zeros((len(population.texts), self.embedder.dim), dtype=np.float64)
        for j in range(d):
            texts = self.variations(population.texts, population.labels, _LOOKAHEAD, t, j)
            total += self.embedder.encode(texts)
        self.save_costs()
        return (total / d).astype(np.float32)

    # ------------------------------------------------------------ manifest

    def manifest(
        self, events: Sequence[PrivacyEvent], records: Sequence[tuple[str, str]]
    ) -> dict[str, Any]:
        """Public facts only: parameters, models, noise, events, released sizes, costs."""
        return {
            **self.describe(
                unit_adjacency="add/remove one unit (all documents with one unit id; each unit "
                "votes in the class most of its documents carry)"
            ),
            "models": self.models(),
            "noise": {
                "histogram_sigma": self.plan.histogram_sigma,
                "count_sigma": self.plan.count_sigma,
            },
            **self.release_summary(events, records, planned_calls=self.params.planned_calls()),
        }
