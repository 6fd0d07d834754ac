"""One DP-KPS run split across workers by privacy unit (issue 65, "Sharded").

A run whose private reads are class sums of unit vectors (class centroids or moments
over a public Ṽ: :func:`shardable`) splits into rounds of map and reduce:

==========  ======================================  =====================================
round       :meth:`ShardedRun.map` (PRIVATE ROWS)   :meth:`ShardedRun.reduce` (releases)
==========  ======================================  =====================================
``counts``  each class's units (embed_sample only)  the class counts (the sampling rates)
``sums``    each class's sum of unit vectors        the class sums (and the counts, if
                                                    released and not released yet)
``cells``   each class's sums in its cells          the cells (``centroid_cells`` > 1)
==========  ======================================  =====================================

then :meth:`ShardedRun.finish` post-processes the releases as
:func:`~workers.methods.dpkps.pipeline.generate_sequences` does (the same functions).

**Shards.** :func:`shard_of` puts every document of a unit in one shard (a keyed hash of
the unit id; of the row number for row units), so a shard pools its units as
:func:`workers.privacy.units.pool` does (a unit in its majority class, ties to the first
declared label, only its documents of that class counted) and adds ONE vector per unit
(norm ≤ 1) to its class: the shards' aggregates are disjoint parts of the aggregates one
process would compute, and their sum is theirs.

**Exact sums.** A shard's aggregate is additive and exact: unit counts are integers, and
unit vectors are added in fixed point, int64 multiples of 2^-:data:`FIXED_BITS`, each
coordinate rounded TOWARDS ZERO (a unit's norm never grows, so L2 Δ = 1 holds for the
rounded vectors; :func:`to_fixed`). Integer addition is associative: every split of the
corpus into shards and every order of the shards give bit-identical totals, and so the
same release for the same noise. Headroom: a coordinate of a unit's vector is at most 1,
i.e. 2^32 in fixed point, so a class sum stays below 2^63 for fewer than 2^31 ≈ 2.1·10⁹
units a class (10⁷ units use 1/200 of it); a unit's own sum of document embeddings
likewise for fewer than 2^31 documents. The rounding costs at most 2^-32 per unit and
coordinate: 2.3·10^-3 on a class of 10⁷ units, against a noise σ of order 1. Floats
appear once, in :meth:`ShardedRun.reduce`, before the release. (Bit-identical *vectors*
need a deterministic embedder: a transformer's output may move in its last bits with the
batch it is computed in, which moves a sum by ~1e-7, far below the noise.)

**Sampling** (``embed_sample``): a unit is in the Poisson sample iff its keyed hash under
the job's key is below its class's rate (workers/privacy/sampling.py), the rates being a
function of the ``counts`` round's DP release. The decision is a function of the unit
alone, not of the split. A row unit's id is a hash of its text and label: distinct rows
with the same text and label are kept or dropped together; the argument of
``sampling.py`` holds as it stands (no amplification is claimed), as a neighbour's added
row is kept with probability q or with its twin, a mixture either way.

**Memory.** Rows are streamed: a shard holds at most one batch of documents
(:data:`~workers.methods.dpkps.density.centroid.EMBED_BATCH`) and, with a unit column,
per unit a class tally and (where the unit may be in the sample) an int64 sum per class
of its documents' embeddings (3 KiB), until the shard's end (a unit's class is known only
then); or, when the caller reads the rows grouped by unit (``map(..., grouped=True)``),
until the unit's last row, so that only a batch's units are open (and the ids of the
finished ones, to refuse a unit that comes back).

What leaves a shard (:meth:`ShardedRun.map`) is RAW, and so is a state's ``owner`` part
(the owner's diagnostics): stored and moved as private data is, never logged or shown.
A state's releases are DP outputs: everything :meth:`ShardedRun.finish` reads but the
owner's diagnostics.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from workers.errors import ConfigError, InputDataError
from workers.methods.dpkps import stages
from workers.methods.dpkps.config import EMBEDDING_DIMENSION, GenerationConfig, moments_dimension
from workers.methods.dpkps.density.cells import CellMixture, nearest_cells
from workers.methods.dpkps.density.centroid import (
    EMBED_BATCH,
    CentroidKDE,
    moment_rows,
    unit_vectors,
)
from workers.methods.dpkps.density.common import within_unit_ball
from workers.methods.dpkps.pipeline import GenerationResult, OwnerDiagnostics, finish_sequences
from workers.methods.dpkps.plan import CLASS_COUNTS, Plan, plan
from workers.methods.dpkps.proportions import released_class_counts
from workers.methods.dpkps.stages import ProgressFn
from workers.methods.dpkps.subspace import project_units
from workers.methods.progress import TICK_EVERY
from workers.privacy.events import PrivacyEvent
from workers.privacy.sampling import KEY_BYTES, PoissonSample
from workers.text.embeddings import Embedder, EmbeddingCache, encode_in_chunks, select_device
from workers.text.extraction import KeyphraseExtractor
from workers.text.vocabulary import Vocabulary

Row = tuple[str, str, str | None]  # (text, label, unit id or None), as the service reads them
COUNTS, SUMS, CELLS = "counts", "sums", "cells"
FIXED_BITS = 32  # unit vectors are added as int64 multiples of 2^-32 (module docstring)
_FIXED = float(2**FIXED_BITS)
_FORMAT = "keyseed.dpkps.shards/1"
MIN_KEY_BYTES, MAX_KEY_BYTES = 16, 64  # BLAKE2b's key: the job's secret
MOMENT_CHUNK = 64  # units whose outer products are formed at a time (74,688 floats each)
# documents a map embeds between two ticks: about a second of one CPU thread's MiniLM on
# AG-size documents, so a cancel stops a shard within seconds even mid-batch
TICK_DOCUMENTS = 32


def _noop(stage: str, fraction: float) -> None:
    return None


def shardable(config: GenerationConfig) -> bool:
    """Whether a run of ``config`` (resolved by :meth:`GenerationConfig.for_classes`) can
    go through the sharded path: class centroids (cells included) or moments over a public
    Ṽ, with or without ``embed_sample``. A function of the public configuration."""
    return (
        config.embeds_documents
        and config.vocabulary_selection == "public"
        and config.noise == "gaussian"
        and config.mode == "independent"
    )


def rounds_of(config: GenerationConfig) -> tuple[str, ...]:
    """The rounds a sharded run of ``config`` makes, in order (public)."""
    out = [COUNTS] if config.samples_units else []
    out.append(SUMS)
    if config.cells > 1:
        out.append(CELLS)
    return tuple(out)


def _subkey(key: bytes, purpose: bytes) -> bytes:
    """A 32-byte key for one use of the job's secret ``key`` (independent uses)."""
    if not isinstance(key, (bytes, bytearray)) or not MIN_KEY_BYTES <= len(key) <= MAX_KEY_BYTES:
        raise ConfigError(
            f"the job's key must be {MIN_KEY_BYTES} to {MAX_KEY_BYTES} bytes", field="key"
        )
    return hashlib.blake2b(purpose, key=bytes(key), digest_size=KEY_BYTES).digest()


def shard_of(unit: str | None, row: int, *, key: bytes, shards: int) -> int:
    """The shard, in ``[0, shards)``, of a document: a keyed hash (BLAKE2b under the job's
    secret ``key``) of its unit id, or of its row number when it has none, so that every
    document of a unit lands in one shard.

    >>> key = bytes(32)
    >>> shard_of("p1", 0, key=key, shards=4) == shard_of("p1", 99, key=key, shards=4)
    True
    """
    if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
        raise ConfigError("must be an integer ≥ 1", field="shards")
    name = f"u:{unit}" if unit is not None else f"r:{int(row)}"
    digest = hashlib.blake2b(
        name.encode("utf-8"), key=_subkey(key, b"keyseed/shard"), digest_size=8
    ).digest()
    return int.from_bytes(digest, "big") % shards


def sampling_id(text: str, label: str, unit: str | None) -> str:
    """The id a unit is sampled by (hashed again under the job's key): its unit id, or for
    a row unit a digest of its text and label (module docstring), so split-independent."""
    if unit is not None:
        return f"u:{unit}"
    digest = hashlib.blake2b(
        label.encode("utf-8") + b"\x00" + text.encode("utf-8"), digest_size=16
    ).hexdigest()
    return f"r:{digest}"


# --- Exact sums ----------------------------------------------------------------------------


def to_fixed(values: NDArray[np.floating[Any]]) -> NDArray[np.int64]:
    """RAW in, RAW out: ``values`` (each |x| ≤ 1) as int64 multiples of 2^-FIXED_BITS,
    rounded towards zero (so no norm grows). Exact: scaling by a power of two is."""
    scaled = np.trunc(np.asarray(values, dtype=np.float64) * _FIXED)
    out: NDArray[np.int64] = scaled.astype(np.int64)
    return out


def from_fixed(total: NDArray[np.int64]) -> NDArray[np.float64]:
    """An exact fixed-point total as float64 (once, before its release)."""
    out: NDArray[np.float64] = np.asarray(total, dtype=np.int64).astype(np.float64) / _FIXED
    return out


_MAGIC = b"keyseed-shards\x00"
_DTYPES = {"<i8": np.int64, "<f8": np.float64}  # the only arrays a part or a state holds


def encode(meta: dict[str, Any], arrays: dict[str, NDArray[Any]]) -> bytes:
    """A part or a state as bytes: a magic, the length of a JSON header (``meta`` and
    each array's name, dtype, shape), then the arrays' raw little-endian bytes. No
    pickle, nothing executable; int64 and float64 arrays only."""
    described, blobs, offset = [], [], 0
    for name, value in arrays.items():
        data = np.ascontiguousarray(value)
        dtype = data.dtype.newbyteorder("<").str
        if dtype not in _DTYPES:
            raise ConfigError(f"cannot store a {data.dtype} array", field="state")
        blob = data.astype(dtype, copy=False).tobytes()
        described.append([name, dtype, list(data.shape), offset, len(blob)])
        blobs.append(blob)
        offset += len(blob)
    header = json.dumps({"meta": meta, "arrays": described}, sort_keys=True).encode("utf-8")
    return b"".join([_MAGIC, len(header).to_bytes(8, "little"), header, *blobs])


def decode(data: bytes) -> tuple[dict[str, Any], dict[str, NDArray[Any]]]:
    """The inverse of :func:`encode`, checked: a part or a state, else a ConfigError."""
    view = memoryview(data)
    start = len(_MAGIC) + 8
    if bytes(view[: len(_MAGIC)]) != _MAGIC or len(view) < start:
        raise ConfigError("not a sharded DP-KPS part or state", field="state")
    size = int.from_bytes(view[len(_MAGIC) : start], "little")
    try:
        header = json.loads(bytes(view[start : start + size]).decode("utf-8"))
        meta, described = header["meta"], header["arrays"]
        body = view[start + size :]
        arrays: dict[str, NDArray[Any]] = {}
        for name, dtype, shape, offset, length in described:
            count = int(np.prod(shape, dtype=np.int64))
            if offset < 0 or offset + length > len(body) or length != count * 8:
                raise ValueError("an array outside the data")
            raw = np.frombuffer(body, dtype=_DTYPES[dtype], count=count, offset=offset)
            arrays[str(name)] = raw.reshape(shape).copy()
    except (ValueError, KeyError, TypeError) as exc:  # json's errors are ValueErrors
        raise ConfigError("a damaged sharded DP-KPS part or state", field="state") from exc
    if not isinstance(meta, dict) or meta.get("format") != _FORMAT:
        raise ConfigError("not a sharded DP-KPS part or state", field="state")
    return meta, arrays


def add_parts(round: str, parts: Sequence[bytes]) -> dict[str, NDArray[np.int64]]:
    """RAW: the exact sum of the shards' aggregates of ``round`` (integers: the same for
    any split and order of the shards)."""
    total: dict[str, NDArray[np.int64]] = {}
    for part in parts:
        meta, arrays = decode(part)
        if meta.get("kind") != "part" or meta.get("round") != round:
            raise ConfigError(f"a part of another round than {round!r}", field="parts")
        if total and set(arrays) != set(total):
            raise ConfigError("the parts hold different aggregates", field="parts")
        for name, value in arrays.items():
            if value.dtype != np.int64:
                raise ConfigError("a part's aggregate is not int64", field="parts")
            if name in total:
                if total[name].shape != value.shape:
                    raise ConfigError("the parts' aggregates differ in shape", field="parts")
                total[name] = total[name] + value
            else:
                total[name] = value.copy()
    return total


# --- A shard's stream of unit vectors ----------------------------------------------------------


@dataclass
class _Open:
    """One unit of a unit column while its shard is read: RAW."""

    tally: list[int]
    uniform: float
    embedded: bool  # whether its documents are embedded (it may be in the sample)
    sums: dict[int, NDArray[np.int64]] = field(default_factory=dict)  # class → Σ fixed embeddings
    matched: set[int] = field(default_factory=set)  # classes of its documents with a phrase of Ṽ


@dataclass
class _Facts:
    """A shard's raw counts (RAW: the class tallies are released, the rest is the owner's)."""

    classes: int
    documents: int = 0
    set_aside: int = 0
    without_phrase: int = 0
    class_units: NDArray[np.int64] = field(init=False)

    def __post_init__(self) -> None:
        self.class_units = np.zeros(self.classes, dtype=np.int64)

    def arrays(self) -> dict[str, NDArray[np.int64]]:
        return {
            "class_units": self.class_units,
            "owner": np.array([self.documents, self.set_aside, self.without_phrase], np.int64),
        }


class _UnitStream:
    """READS PRIVATE ROWS: one shard's rows pooled into units as
    :func:`workers.privacy.units.pool` does, each kept unit's vector (the mean of its
    documents' embeddings, in the release's space, norm ≤ 1) yielded in batches with its
    class; the raw facts counted in ``facts``."""

    def __init__(
        self,
        run: ShardedRun,
        *,
        embed: bool,
        rates: dict[str, float] | None,
        tick: Callable[[], None] | None,
    ) -> None:
        self.run = run
        self.embed = embed  # False: only the class tallies (the counts round)
        self.rates = None if rates is None else [rates[label] for label in run.label_set]
        self.sample = None if rates is None else PoissonSample(_subkey(run._key, b"keyseed/sample"))
        self.tick = tick
        self.facts = _Facts(len(run.label_set))
        self.extractor = run.extractor() if embed else None

    def _keeps(self, uniform: float, c: int) -> bool:
        return self.rates is None or self.rates[c] >= 1.0 or uniform < self.rates[c]

    def _uniform(self, text: str, label: str, unit: str | None) -> float:
        return 0.0 if self.sample is None else self.sample.uniform(sampling_id(text, label, unit))

    def _matches(self, text: str) -> bool:
        return self.extractor is not None and bool(self.extractor.extract(text, limit=1))

    def _encoded(self, texts: list[str]) -> NDArray[np.float64]:
        """The documents' embeddings scaled into the unit ball (as :func:`unit_vectors`)."""
        encoded = encode_in_chunks(self.run.embedder, texts, tick=self.tick, chunk=TICK_DOCUMENTS)
        return unit_vectors([(i,) for i in range(len(texts))], encoded)

    def vectors(
        self, rows: Iterable[Row], *, grouped: bool = False
    ) -> Iterator[tuple[NDArray[np.int64], NDArray[Any]]]:
        """``(classes, vectors)`` of the kept units, a batch at a time; ``rows`` read once,
        lazily (at most one batch of documents held). With a unit column, a unit is
        finished at the shard's end, or (``grouped``: each unit's rows contiguous) as soon
        as the next unit starts."""
        position = self.run.position
        facts = self.facts
        batch = self.run.batch
        pending_rows: list[tuple[int, str]] = []  # row units to embed
        pending_docs: list[tuple[_Open, int, str]] = []  # a unit column's documents to embed
        units: dict[str, _Open] = {}  # open units
        closing: list[_Open] = []  # units whose last row was read (grouped)
        seen: set[str] = set()  # units finished (grouped): one must not come back
        current: str | None = None
        finished = _Finished(self)
        max_rate = 1.0 if self.rates is None else max(self.rates, default=1.0)
        for n, (text, label, unit) in enumerate(rows):
            if self.tick is not None and n % TICK_EVERY == 0:
                self.tick()
            c = position.get(label)
            if c is None:
                raise InputDataError(
                    "a document carries a label outside the declared set", field="labels"
                )
            facts.documents += 1
            if unit is None:  # a row is its own unit, in its own class
                facts.class_units[c] += 1
                if self.embed:
                    facts.without_phrase += not self._matches(text)
                    if self._keeps(self._uniform(text, label, None), c):
                        pending_rows.append((c, text))
                        if len(pending_rows) >= batch:
                            yield self._rows_batch(pending_rows)
                            pending_rows = []
                continue
            if grouped and unit != current:
                if current is not None:
                    done = units.pop(current)
                    seen.add(current)
                    if done.embedded:  # its documents may wait in the batch
                        closing.append(done)
                    else:
                        yield from finished.add([done])
                if unit in seen:
                    raise ConfigError(
                        "the rows were given as grouped by unit, and are not", field="grouped"
                    )
                current = unit
            open_unit = units.get(unit)
            if open_unit is None:
                uniform = self._uniform(text, label, unit)
                embedded = self.embed and (max_rate >= 1.0 or uniform < max_rate)
                open_unit = _Open([0] * len(position), uniform, embedded)
                units[unit] = open_unit
            open_unit.tally[c] += 1
            if self.embed and self._matches(text):
                open_unit.matched.add(c)
            if open_unit.embedded:
                pending_docs.append((open_unit, c, text))
                if len(pending_docs) >= batch:
                    self._add_documents(pending_docs)
                    pending_docs = []
            if closing and not pending_docs:  # their documents are all added
                yield from finished.add(closing)
                closing = []
        if pending_rows:
            yield self._rows_batch(pending_rows)
        if pending_docs:
            self._add_documents(pending_docs)
        del pending_rows, pending_docs
        yield from finished.add(closing)
        yield from finished.add(units.pop(key) for key in list(units))
        yield from finished.flush()

    def _rows_batch(
        self, pending: list[tuple[int, str]]
    ) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
        classes = np.array([c for c, _ in pending], dtype=np.int64)
        return classes, self.run.finalised(self._encoded([t for _, t in pending]))

    def _add_documents(self, pending: list[tuple[_Open, int, str]]) -> None:
        """Each document's fixed-point embedding added to its unit's sum for its class
        (exact: a unit's mean does not depend on its documents' order)."""
        fixed = to_fixed(self._encoded([t for _, _, t in pending]))
        for (open_unit, c, _), row in zip(pending, fixed, strict=True):
            if c in open_unit.sums:
                open_unit.sums[c] += row
            else:
                open_unit.sums[c] = row.copy()


class _Finished:
    """READS the pooled units of a unit column once complete: each in its majority class
    (ties: the first declared), its documents of other classes set aside; the kept ones'
    mean vectors yielded a batch at a time. RAW."""

    def __init__(self, stream: _UnitStream) -> None:
        self.stream = stream
        self.classes: list[int] = []
        self.means: list[NDArray[np.float64]] = []
        self.count = 0

    def add(
        self, units: Iterable[_Open]
    ) -> Iterator[tuple[NDArray[np.int64], NDArray[np.float64]]]:
        stream, facts = self.stream, self.stream.facts
        for open_unit in units:
            self.count += 1
            if stream.tick is not None and self.count % TICK_EVERY == 0:
                stream.tick()
            c = int(np.argmax(open_unit.tally))  # the first maximum: the declared order
            facts.class_units[c] += 1
            facts.set_aside += sum(open_unit.tally) - open_unit.tally[c]
            facts.without_phrase += stream.embed and c not in open_unit.matched
            if open_unit.embedded and stream._keeps(open_unit.uniform, c):
                self.classes.append(c)
                self.means.append(open_unit.sums[c] / _FIXED / open_unit.tally[c])
                if len(self.classes) >= stream.run.batch:
                    yield from self.flush()
            open_unit.sums.clear()

    def flush(self) -> Iterator[tuple[NDArray[np.int64], NDArray[np.float64]]]:
        if self.classes:
            classes = np.array(self.classes, dtype=np.int64)
            means = self.stream.run.finalised(np.stack(self.means))
            self.classes, self.means = [], []
            yield classes, means


# --- The run ---------------------------------------------------------------------------------


class ShardedRun:
    """One DP-KPS run as rounds of :meth:`map` (per shard, PRIVATE ROWS) and :meth:`reduce`
    (the DP releases), then :meth:`finish` (post-processing). Built the same way in every
    worker from public inputs and the job's secret ``key`` (which decides the shards and
    the sample; never stored, logged or shown). Everything but :meth:`map` and
    :meth:`reduce` reads public inputs and DP outputs only."""

    def __init__(
        self,
        *,
        config: GenerationConfig,
        label_set: Sequence[str],
        vocabulary: Vocabulary,
        embedder: Embedder,
        cache: EmbeddingCache | None,
        planned: Plan | None,
        key: bytes,
        unit_name: str | None = None,
        device: str = "cpu",
        batch: int = EMBED_BATCH,
        progress: ProgressFn | None = None,
    ) -> None:
        config.validate()
        self.label_set = list(label_set)
        self.config = config.for_classes(len(self.label_set))
        if not shardable(self.config):
            raise ConfigError(
                "a sharded run takes class centroids or moments over a public vocabulary",
                field="kde_method",
            )
        if not self.label_set or len(set(self.label_set)) != len(self.label_set):
            raise InputDataError("the label set is empty or repeats a label", field="labels")
        self.config.check_vocabulary(vocabulary.name, len(vocabulary))
        if embedder.dim != EMBEDDING_DIMENSION:
            raise ConfigError(
                f"class centroids are planned in {EMBEDDING_DIMENSION} dimensions; the "
                f"embedding model has {embedder.dim}",
                field="kde_method",
            )
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ConfigError("must be an integer ≥ 1", field="batch")
        _subkey(key, b"check")
        self.vocabulary, self.embedder, self.cache = vocabulary, embedder, cache
        self._key, self.unit_name, self.batch = bytes(key), unit_name, batch
        self.device = select_device(device)
        self.progress = progress or _noop
        self.the_plan = planned or plan(self.config, self.label_set, len(vocabulary))
        self.rounds: tuple[str, ...] = rounds_of(self.config)
        self.position = {label: i for i, label in enumerate(self.label_set)}
        # Ṽ: the public vocabulary's first phrases (no release, no private read)
        private = stages.private_vocabulary(
            [], vocabulary_size=len(vocabulary), config=self.config, the_plan=self.the_plan,
            progress=_noop,
        )  # fmt: skip
        if private.event is not None:
            raise ConfigError("a sharded run takes a public vocabulary", field="vocabulary_method")
        self.indices = private.indices
        self.phrases = [vocabulary.phrases[i] for i in private.indices]
        self._embeddings: torch.Tensor | None = None
        self._basis: NDArray[np.float64] | None = None
        self._extractor: KeyphraseExtractor | None = None

    def __repr__(self) -> str:  # the key stays out of every log and traceback
        return f"ShardedRun(rounds={self.rounds!r}, <secret key>)"

    # -- public inputs, computed once when needed

    def embeddings(self) -> torch.Tensor:
        """USES ONLY PUBLIC INPUTS: Ṽ's embeddings (the public model, cached)."""
        if self._embeddings is None:
            self._embeddings = stages.embed(
                self.vocabulary, self.indices, embedder=self.embedder, cache=self.cache,
                device=self.device, progress=self.progress,
            )  # fmt: skip
            self._basis = stages.release_space(self._embeddings, config=self.config)
        return self._embeddings

    def basis(self) -> NDArray[np.float64] | None:
        """USES ONLY PUBLIC INPUTS: the release's public subspace, or None (the whole
        space; then Ṽ is not embedded for it)."""
        if self.config.release_dimension >= EMBEDDING_DIMENSION:
            return None
        self.embeddings()
        return self._basis

    def extractor(self) -> KeyphraseExtractor:
        """Ṽ's phrase matcher (for the owner's count of units without a phrase of Ṽ)."""
        if self._extractor is None:
            self._extractor = KeyphraseExtractor(Vocabulary.from_phrases("private", self.phrases))
        return self._extractor

    def finalised(self, means: NDArray[np.float64]) -> NDArray[np.float64]:
        """RAW: units' mean vectors in the release's space (projected on the public basis
        and rescaled to their own norm, if any), scaled into the unit ball."""
        basis = self.basis()
        rows = means if basis is None else project_units(means, basis)
        return within_unit_ball(rows)

    def _dimension(self) -> int:
        """Coordinates of one class's aggregate (sums, or sums and moments)."""
        if self.config.density_method == "centroid":
            return self.config.release_dimension
        return moments_dimension(EMBEDDING_DIMENSION)

    # -- rounds

    def _check_round(self, round: str, state: bytes | None) -> dict[str, Any] | None:
        if round not in self.rounds:
            raise ConfigError(f"this run's rounds are {', '.join(self.rounds)}", field="round")
        done: list[str] = []
        meta = None
        if state is not None:
            meta, _ = decode(state)
            if meta.get("kind") != "state":
                raise ConfigError("not a sharded DP-KPS state", field="state")
            done = list(meta["done"])
        if done != list(self.rounds[: self.rounds.index(round)]):
            raise ConfigError(f"round {round!r} comes after {done!r}", field="round")
        return meta

    def _rates(self, meta: dict[str, Any] | None) -> dict[str, float] | None:
        if not self.config.samples_units:
            return None
        assert meta is not None and "counts" in meta
        return self._class_counts(meta).rates

    def map(
        self,
        round: str,
        rows: Iterable[Row],
        state: bytes | None,
        *,
        tick: Callable[[], None] | None = None,
        grouped: bool = False,
    ) -> bytes:
        """READS PRIVATE ROWS: one shard's (every row with the same :func:`shard_of`),
        streamed once; returns the shard's RAW, additive aggregate of ``round``, serialised
        (never logged, shown or sent where private data may not go). ``state``: what
        :meth:`reduce` returned for the previous round (None for the first). ``tick`` (a
        cancel check, which may raise) is called every few hundred rows and before every
        embedding chunk. ``grouped``: the caller promises each unit's rows contiguous (say,
        ordered by unit): a unit is then finished when the next starts, and the shard's
        memory no longer grows with its units (a unit that comes back is refused)."""
        meta = self._check_round(round, state)
        embed = round != COUNTS
        stream = _UnitStream(
            self, embed=embed, rates=self._rates(meta) if embed else None, tick=tick
        )
        k = len(self.label_set)
        arrays: dict[str, NDArray[np.int64]] = {}
        if round == COUNTS:
            for _ in stream.vectors(rows, grouped=grouped):
                pass  # no unit is embedded: the tallies only
        elif round == SUMS:
            moments = self.config.density_method != "centroid"
            sums = np.zeros((k, self._dimension()), dtype=np.int64)
            for classes, vectors in stream.vectors(rows, grouped=grouped):
                if moments:
                    for start in range(0, len(classes), MOMENT_CHUNK):
                        chunk = moment_rows(vectors[start : start + MOMENT_CHUNK])
                        np.add.at(sums, classes[start : start + MOMENT_CHUNK], to_fixed(chunk))
                else:
                    np.add.at(sums, classes, to_fixed(vectors))
            arrays["sums"] = sums
        else:
            assert meta is not None
            _, state_arrays = decode(state)  # type: ignore[arg-type]
            centres = [state_arrays[f"centres_{n}"] for n in range(k)]
            cells = np.zeros((k, self.config.cells, self._dimension()), dtype=np.int64)
            for classes, vectors in stream.vectors(rows, grouped=grouped):
                for c in np.unique(classes).tolist():
                    mine = vectors[classes == c]
                    np.add.at(cells[c], nearest_cells(mine, centres[c]), to_fixed(mine))
            arrays["cells"] = cells
        arrays.update(stream.facts.arrays())
        return encode({"format": _FORMAT, "kind": "part", "round": round}, arrays)

    def reduce(self, round: str, parts: Sequence[bytes], state: bytes | None) -> bytes:
        """READS the shards' RAW aggregates ``parts`` of ``round``: adds them exactly
        (:func:`add_parts`: any split, any order, the same totals) and draws the round's
        DP releases through the run's release functions (OpenDP noise, as planned).
        Returns the new state, serialised: the releases, and apart from them (``owner``)
        the owner's raw diagnostics."""
        meta = self._check_round(round, state)
        arrays: dict[str, NDArray[Any]] = {}
        if meta is None:
            meta = {"format": _FORMAT, "kind": "state", "done": []}
        else:
            _, arrays = decode(state)  # type: ignore[arg-type]
        total = add_parts(round, parts)
        k = len(self.label_set)
        if self.config.releases_class_counts and "counts" not in meta:
            # released once, from the first round's tallies (the same units in every round)
            noisy, event = released_class_counts(
                total["class_units"], label_set=self.label_set,
                planned=stages.planned_event(self.the_plan, CLASS_COUNTS),
            )  # fmt: skip
            meta["counts"] = {"noisy": noisy, "event": event.to_dict()}
        if round == SUMS:
            raws = [from_fixed(total["sums"][n]) for n in range(k)]
            centroids = stages.release_sums(
                raws, label_set=self.label_set, config=self.config, the_plan=self.the_plan
            )
            del raws
            arrays["noisy_sums"] = np.stack([c.noisy_sum for c in centroids])
            meta["sum_events"] = [c.event.to_dict() for c in centroids]
            documents, set_aside, without_phrase = (int(v) for v in total["owner"])
            meta["owner"] = {
                "documents": documents,
                "units": int(total["class_units"].sum()),
                "units_per_class": [int(v) for v in total["class_units"]],
                "set_aside": set_aside,
                "without_phrase": without_phrase,
            }
            if self.config.cells > 1:  # public post-processing of the class sums
                centres = stages.place_class_cells(
                    centroids, self._scored(), config=self.config, the_plan=self.the_plan
                )
                for n, placed in enumerate(centres):
                    arrays[f"centres_{n}"] = placed
        elif round == CELLS:
            centroids = self._centroids(meta, arrays)
            centres = [arrays[f"centres_{n}"] for n in range(k)]
            raws = [from_fixed(total["cells"][n]) for n in range(k)]
            mixtures = stages.release_cell_sums(
                raws, centroids, centres, config=self.config, the_plan=self.the_plan
            )
            del raws
            meta["cell_events"] = [m.event.to_dict() for m in mixtures]
            meta["cell_scales"] = [m.total_scale for m in mixtures]
            for n, m in enumerate(mixtures):
                arrays[f"directions_{n}"] = m.directions
                arrays[f"weights_{n}"] = m.weights
                arrays[f"total_{n}"] = m.total
        del total
        meta["done"] = [*meta["done"], round]
        return encode(meta, arrays)

    # -- post-processing

    def _class_counts(self, meta: dict[str, Any]) -> stages.ClassCounts:
        """USES ONLY DP OUTPUTS AND PUBLIC INPUTS: the class counts' release, as a run in
        one process takes it (:func:`stages.counts_from_release`)."""
        if "counts" not in meta:
            return stages.class_counts(
                [], label_set=self.label_set, config=self.config, the_plan=self.the_plan
            )
        counts = meta["counts"]
        return stages.counts_from_release(
            {label: float(counts["noisy"][label]) for label in self.label_set},
            PrivacyEvent.from_dict(counts["event"]),
            label_set=self.label_set,
            config=self.config,
        )

    def _centroids(
        self, meta: dict[str, Any], arrays: dict[str, NDArray[Any]]
    ) -> list[CentroidKDE]:
        return [
            CentroidKDE(label, np.asarray(arrays["noisy_sums"][n]), PrivacyEvent.from_dict(e))
            for n, (label, e) in enumerate(zip(self.label_set, meta["sum_events"], strict=True))
        ]

    def _scored(self) -> torch.Tensor:
        return stages.scored_embeddings(self.embeddings(), self.basis())

    def finish(self, state: bytes, *, progress: ProgressFn | None = None) -> GenerationResult:
        """USES ONLY DP OUTPUTS AND PUBLIC INPUTS (the owner's diagnostics passed on):
        the label prior, scores, sampling and filter of
        :func:`~workers.methods.dpkps.pipeline.generate_sequences`, on the final state; the
        same :class:`GenerationResult` (events in the same ledger order)."""
        report = progress or _noop
        meta, arrays = decode(state)
        if meta.get("kind") != "state" or list(meta["done"]) != list(self.rounds):
            raise ConfigError(
                f"the run's rounds {', '.join(self.rounds)} are not done", field="state"
            )
        counts = self._class_counts(meta)
        centroids = self._centroids(meta, arrays)
        mixtures: list[CellMixture] = []
        if CELLS in self.rounds:
            mixtures = [
                CellMixture(
                    label,
                    arrays[f"directions_{n}"],
                    arrays[f"weights_{n}"],
                    arrays[f"total_{n}"],
                    PrivacyEvent.from_dict(meta["cell_events"][n]),
                    float(meta["cell_scales"][n]),
                )
                for n, label in enumerate(self.label_set)
            ]
        report("dp_kde", 0.0)
        releases = stages.centroid_releases(
            self._scored(), centroids, mixtures, basis=self.basis(), progress=report
        )
        owner = meta["owner"]
        diagnostics = OwnerDiagnostics(
            documents=owner["documents"],
            documents_without_match=owner["without_phrase"],
            documents_per_class=dict(zip(self.label_set, owner["units_per_class"], strict=True)),
            documents_without_private_phrase=owner["without_phrase"],
            units=owner["units"],
            documents_set_aside=owner["set_aside"],
        )
        return finish_sequences(
            releases, counts, None, self.phrases, diagnostics, embedder=self.embedder,
            vocabulary=self.vocabulary, label_set=self.label_set, config=self.config,
            the_plan=self.the_plan, progress=report,
            unit="row" if self.unit_name is None else f"unit column {self.unit_name!r}",
        )  # fmt: skip
