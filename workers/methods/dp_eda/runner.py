"""DP-EDA end to end: :func:`run_dp_eda` (dp-eda.md §4 corrected Algorithm 1, per class).

Steps (T = ``params.iterations``):

1. **Initial population**, per class, from public inputs only: N_pb zero-shot LLM texts
   from the document type and the label, or the N_pb vocabulary phrases nearest to the
   embedded "document type + label"; embedded and normalised. The readability filter is
   fitted on these public texts (:class:`~.decoding.CharBigramPerplexity`).
2. **Iterations t = 1 … T**, per class: the class's units vote for their nearest member;
   LimitedDomain selects up to k parents (the only private read,
   :mod:`.limited_domain`); the parents are decoded, filtered, and the survivors, in
   the DP order, feed the Gaussian EDA (:mod:`.evolution`) which samples N_cld offspring.
   A class stops when LimitedDomain returns ∅, when no parent survives the filter, or
   with fewer than two survivors (fix 2): all functions of DP outputs.
3. **Release**: each class's decoded survivors of its last productive iteration.

Privacy. The plan (:func:`~.accounting.noise_plan`) fixes ε_s, δ_LD and every event
before the first private read; every planned event is recorded, early stops included
(nothing is refunded). Clean counts live in :func:`~.limited_domain.select_parents` only.

Checkpoints: the initial texts; per class and iteration the selection (saved before it
is used) and the decoded texts; the LLM costs. Populations are recomputed from them and
the public seed. A re-run resumes without drawing noise again and records each event once.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Unpack

import numpy as np
from numpy.typing import NDArray

from workers.errors import ConfigError
from workers.llm.attestation import POPULATION, RECONSTRUCTION, Source
from workers.methods.common import MethodResult, checkpoint_json
from workers.methods.dp_eda import decoding
from workers.methods.dp_eda.accounting import Plan, noise_plan, selection_event
from workers.methods.dp_eda.evolution import normalise, offspring
from workers.methods.dp_eda.limited_domain import select_parents, unit_means
from workers.methods.dp_eda.params import DPEDAParams
from workers.methods.skeleton import MethodRun, RunInputs
from workers.privacy.accountant import compose
from workers.privacy.events import PrivacyEvent
from workers.privacy.units import group_units
from workers.text.embeddings import EmbeddingCache
from workers.text.vocabulary import Vocabulary, load_vocabulary

METHOD = "dp-eda"
DECODERS = {
    "llm_reconstruction": "DP-EDA selection + LLM reconstruction (nearest public vocabulary "
    "phrases, candidates re-ranked by embedding similarity); decoded from DP-selected "
    "embeddings",
    "retrieval": "DP-EDA selection + retrieval of the nearest public-pool text; decoded "
    "from DP-selected embeddings",
}
DESCRIPTION = (
    "DP-EDA (Zhao, Song, Zhou): evolution of public embeddings with LimitedDomain "
    "selection (Durfee & Rogers 2019, OpenDP Gumbel noise), Gaussian EDA, decoding to text"
)
INITIAL_KEY = "dp-eda-initial"


def selection_key(c: int, t: int) -> str:
    return f"dp-eda-select-{c}-{t}"


def decode_key(c: int, t: int) -> str:
    return f"dp-eda-decode-{c}-{t}"


DPEDAResult = MethodResult


def run_dp_eda(
    documents: Sequence[str],
    labels: Sequence[str],
    *,
    params: DPEDAParams,
    vocabulary: Vocabulary | None = None,
    public_pool: Sequence[str] | None = None,
    cache: EmbeddingCache | None = None,
    **inputs: Unpack[RunInputs],
) -> DPEDAResult:
    """Run DP-EDA on a labelled private corpus (module docstring; ``inputs``:
    :class:`~workers.methods.skeleton.RunInputs`).

    ``vocabulary`` overrides ``params.vocabulary`` (a :func:`load_vocabulary` spec);
    ``cache`` keeps the embeddings of its phrases (public) across runs, as DP-KPS's do;
    ``public_pool`` is the retrieval decoder's pool (default: the initial population).
    Bad input raises before anything private is read.
    """
    return _Run.start(
        noise_plan,
        documents,
        labels,
        params,
        inputs,
        vocabulary=vocabulary,
        cache=cache,
        pool=None if public_pool is None else [str(t) for t in public_pool],
    )


@dataclass
class _Run(MethodRun[DPEDAParams, Plan]):
    method = METHOD
    description = DESCRIPTION
    vocabulary: Vocabulary | None = None
    cache: EmbeddingCache | None = None
    pool: list[str] | None = None
    _phrase_rows: NDArray[np.float32] | None = None
    _pool_rows: NDArray[np.float32] | None = None

    def prepare(self) -> None:
        """Load ``params.vocabulary`` unless one was given, where the decoder or the
        population reads one."""
        p = self.params
        if self.vocabulary is None and (
            p.decoder == "llm_reconstruction" or p.population_source == "vocabulary"
        ):
            self.vocabulary = load_vocabulary(p.vocabulary)

    def identity(self) -> dict[str, Any]:
        return {
            "vocabulary": None if self.vocabulary is None else self.vocabulary.fingerprint,
            "pool": None
            if self.pool is None
            else hashlib.sha256("\n".join(self.pool).encode()).hexdigest(),
        }

    # ------------------------------------------------------------ the run

    def execute(
        self, documents: Sequence[str], labels: Sequence[str], units: Sequence[str] | None
    ) -> DPEDAResult:
        p = self.params
        with self.stage("initial_population"):
            initial = self.initial_texts()
            public_texts = [t for label in self.labels for t in initial[label]]
            readability = decoding.CharBigramPerplexity(
                public_texts, percentile=p.perplexity_percentile
            )
        self.progress("iteration", 0.0)
        voters: dict[int, NDArray[np.float32]] | None = None
        drawn: dict[tuple[int, str], PrivacyEvent] = {}
        released: list[tuple[str, str]] = []
        stops: dict[str, dict[str, Any]] = {}
        for c, label in enumerate(self.labels):
            population = normalise(self.embedder.encode(initial[label]))
            last: list[str] = []
            reason = "completed"
            t_done = 0
            for t in range(1, p.iterations + 1):
                stored = self.checkpoints.load(selection_key(c, t))
                if stored is None:
                    if voters is None:
                        voters = self.private_voters(documents, labels, units)
                    record = self.select(c, t, label, voters[c], population)
                else:
                    record = json.loads(stored)
                drawn[(t, label)] = PrivacyEvent.from_dict(record["event"])
                selected = [int(i) for i in record["selected"]]
                t_done = t
                if not selected:
                    reason = "empty_selection"
                    break
                texts = self.decoded(c, t, label, population[selected])
                kept = [
                    (row, text)
                    for row, text in zip(selected, texts, strict=True)
                    if text is not None and readability.readable(text)
                ]
                if not kept:
                    reason = "no_parent_passed_the_filter"
                    break
                last = [text for _, text in kept]
                if len(kept) < 2:
                    reason = "fewer_than_two_parents"
                    break
                if t < p.iterations:
                    population = offspring(
                        population[[row for row, _ in kept]],
                        count=p.offspring,
                        alpha=p.alpha,
                        top_r=p.top_r,
                        rng=self.rng(c, t),
                    )
                self.progress(
                    "iteration", (c * p.iterations + t) / (len(self.labels) * p.iterations)
                )
            released += [(label, text) for text in last]
            stops[label] = {"iterations_run": t_done, "stop": reason, "released": len(last)}
        del voters
        with self.stage("release"):
            events = self.committed(drawn)
        return DPEDAResult(
            records=released,
            events=events,
            manifest=self.manifest(events, released, stops, readability.threshold),
            llm_costs=self.costs,
        )

    def committed(self, drawn: dict[tuple[int, str], PrivacyEvent]) -> list[PrivacyEvent]:
        """Every planned event, in plan order: drawn ones checked, the rest committed."""
        events: list[PrivacyEvent] = []
        for planned in self.plan.events:
            iteration = int((planned.name or "").split("=")[1].rstrip("]"))
            event = drawn.get((iteration, planned.partition or ""), planned)
            if event != planned:
                raise RuntimeError("a selection differs from the plan")  # a bug, never data
            events.append(event)
        return events

    # ------------------------------------------------------------ private reads

    def private_voters(
        self, documents: Sequence[str], labels: Sequence[str], units: Sequence[str] | None
    ) -> dict[int, NDArray[np.float32]]:
        """One row per unit and class: the embedding (mean for a unit), memory only."""
        unit_of, class_of_unit, votes = group_units(labels, units, self.labels)
        rows = np.flatnonzero(votes)
        embedded = np.asarray(
            self.embedder.encode([documents[i] for i in rows.tolist()]), dtype=np.float32
        )
        out: dict[int, NDArray[np.float32]] = {}
        for c in range(len(self.labels)):
            mine = np.flatnonzero(class_of_unit[unit_of[rows]] == c)
            out[c] = (
                unit_means(embedded[mine], unit_of[rows][mine])
                if len(mine)
                else (np.zeros((0, embedded.shape[1]), dtype=np.float32))
            )
        return out

    def select(
        self, c: int, t: int, label: str, voters: NDArray[np.float32], population: NDArray[Any]
    ) -> dict[str, Any]:
        """LimitedDomain on the class's votes; saved before anything uses it."""
        chosen = select_parents(voters, population, self.plan.calibration)
        event = selection_event(self.plan.calibration, t, label)
        if event != self.plan.event(t, label):
            raise RuntimeError("a selection differs from the plan")
        record = {"selected": chosen, "event": event.to_dict()}
        self.checkpoints.save(selection_key(c, t), checkpoint_json(record))
        return record

    # ------------------------------------------------------------ public work

    def initial_texts(self) -> dict[str, list[str]]:
        stored = self.checkpoints.load(INITIAL_KEY)
        if stored is not None:
            data = json.loads(stored)
            return {label: list(data[label]) for label in self.labels}
        p = self.params
        result: dict[str, list[str]] = {}
        if p.population_source == "vocabulary":
            rows = self.phrase_rows()
            assert self.vocabulary is not None
            for label in self.labels:
                target = normalise(self.embedder.encode([f"{p.document_type}: {label}"]))[0]
                chosen = decoding.nearest_rows(target, rows, p.initial_population)
                result[label] = [self.vocabulary.phrases[i] for i in chosen]
        else:
            for label in self.labels:
                result[label] = self.generated_population(label)
        if len(result[self.labels[0]]) < p.domain + 1:
            raise ConfigError("the vocabulary is smaller than K + 1", field="vocabulary")
        self.checkpoints.save(INITIAL_KEY, checkpoint_json(result))
        self.save_costs()
        return result

    def generated_population(self, label: str) -> list[str]:
        """N_pb zero-shot texts of class ``label``, from the document type and the label."""
        p = self.params
        message = decoding.population_messages(document_type=p.document_type, label=label)
        return self.complete_all(
            p.initial_population,
            lambda i: message,
            lambda i: Source(
                key=f"dp_eda/initial/{label}/{i}",
                kind=POPULATION,
                refs={"document_type": p.document_type, "label": label},
            ),
            what="initial-population requests",
        )

    def phrase_rows(self) -> NDArray[np.float32]:
        if self._phrase_rows is None:
            assert self.vocabulary is not None
            phrases = self.vocabulary.phrases
            if self.cache is not None:
                rows = self.cache.lookup(
                    phrases=phrases,
                    fingerprint=self.vocabulary.fingerprint,
                    indices=np.arange(len(phrases), dtype=np.int64),
                    embedder=self.embedder,
                )
            else:
                rows = self.embedder.encode(list(phrases))
            self._phrase_rows = normalise(rows)
        return self._phrase_rows

    def decoded(self, c: int, t: int, label: str, targets: NDArray[np.float32]) -> list[str | None]:
        stored = self.checkpoints.load(decode_key(c, t))
        if stored is not None:
            return list(json.loads(stored))
        if self.params.decoder == "retrieval":
            texts = self.retrieval(c, targets)
        else:
            texts = self.reconstruction(label, targets, f"{c}.{t}")
        self.checkpoints.save(decode_key(c, t), checkpoint_json(texts))
        self.save_costs()
        return texts

    def retrieval(self, c: int, targets: NDArray[np.float32]) -> list[str | None]:
        pool = self.pool
        if pool is None:
            pool = json.loads(self.checkpoints.load(INITIAL_KEY) or b"{}")[self.labels[c]]
            rows = normalise(self.embedder.encode(pool))
        else:
            if self._pool_rows is None:
                self._pool_rows = normalise(self.embedder.encode(pool))
            rows = self._pool_rows
        return [pool[decoding.retrieve(target, rows)] for target in targets]

    def reconstruction(
        self, label: str, targets: NDArray[np.float32], step: str
    ) -> list[str | None]:
        p = self.params
        assert self.vocabulary is not None
        rows = self.phrase_rows()
        phrases = [
            [self.vocabulary.phrases[i] for i in decoding.nearest_rows(e, rows, p.nearest_phrases)]
            for e in targets
        ]
        best: list[str | None] = [None] * len(targets)
        score = np.full(len(targets), -np.inf)
        for r in range(p.rounds):
            requests = [
                decoding.reconstruction_messages(
                    document_type=p.document_type, label=label, phrases=phrases[i], draft=best[i]
                )
                for i in range(len(targets))
                for _ in range(p.candidates)
            ]
            sources = [
                Source(
                    key=f"dp_eda/reconstruction/{step}/{r}/{i}/{k}",
                    kind=RECONSTRUCTION,
                    # public phrases nearest a DP target; a draft the LLM wrote from them
                    inputs={"phrases": phrases[i], "draft": best[i]},
                    refs={"document_type": p.document_type, "label": label},
                )
                for i in range(len(targets))
                for k in range(p.candidates)
            ]
            answers = self.generate(requests, sources)
            ok = [j for j, a in enumerate(answers) if a is not None]
            if not ok:
                continue
            embedded = normalise(self.embedder.encode([str(answers[j]) for j in ok]))
            for j, row in zip(ok, embedded, strict=True):
                i = j // p.candidates
                similarity = float(row @ targets[i])
                if similarity > score[i]:
                    score[i], best[i] = similarity, answers[j]
        return best

    # ------------------------------------------------------------ manifest

    def manifest(
        self,
        events: Sequence[PrivacyEvent],
        records: Sequence[tuple[str, str]],
        stops: dict[str, dict[str, Any]],
        threshold: float,
    ) -> dict[str, Any]:
        """Public facts only: parameters, models, calibration, events, DP-derived sizes."""
        p = self.params
        cal = self.plan.calibration
        privacy = compose(events).to_dict(delta=self.plan.delta)
        privacy["domain_delta"] = self.plan.domain_delta  # spent outright, within δ
        return {
            **self.describe(
                unit_adjacency="add/remove one unit (one vote per unit: the mean of its "
                "documents of the class most of them carry)",
                document_adjacency="add/remove one document (one vote per document)",
            ),
            "models": self.models(),
            "decoder": {"name": p.decoder, "description": DECODERS[p.decoder]},
            "filter": {
                "name": decoding.FILTER_NAME,
                "threshold": threshold,
                "percentile": p.perplexity_percentile,
            },
            "population_source": p.population_source,
            "limited_domain": {
                "calibration": p.adjacency,
                "epsilon_per_selection": cal.epsilon,
                "delta_per_call": cal.delta,
                "gumbel_scale": cal.scale,
                "threshold_gap": cal.gap(p.offspring),
                "domain": cal.domain,
                "parents": cal.parents,
            },
            "privacy": privacy,
            "classes": stops,
            "released": len(records),
            "llm_costs": self.llm_costs(),
        }
