"""The sharded DP-KPS run (issue 65, workers/methods/dpkps/shards.py).

One job split by privacy unit across shards, each returning exact additive aggregates,
one reduce adding the noise: the totals (and so the releases, for the same noise) do not
depend on the split or the shards' order; the run makes the releases a run in one process
makes, in the same ledger order, on the same sums; rows are read lazily; the sample of
units (``embed_sample``) does not depend on the split. The stochastic check on neighbouring
corpora is tests/core/privacy/test_sharded_neighbouring.py.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest

from tests.core.dpkps import config
from tests.core.dpkps.test_pipeline import TOPICS, corpus
from tests.core.privacy.test_sharded_neighbouring import HashEmbedder as Hashed
from workers.errors import ConfigError, InputDataError
from workers.methods.dpkps import stages
from workers.methods.dpkps.config import EMBEDDING_DIMENSION, GenerationConfig
from workers.methods.dpkps.density.centroid import class_sum, moment_rows, unit_vectors
from workers.methods.dpkps.density.common import within_unit_ball
from workers.methods.dpkps.pipeline import generate_sequences
from workers.methods.dpkps.plan import plan
from workers.methods.dpkps.shards import (
    FIXED_BITS,
    Row,
    ShardedRun,
    add_parts,
    decode,
    from_fixed,
    shard_of,
    shardable,
    to_fixed,
)
from workers.privacy import noise as samplers
from workers.privacy.units import pool
from workers.text.vocabulary import Vocabulary

KEY = bytes(range(32))
LABELS = list(TOPICS)
PHRASES = [w for words in TOPICS.values() for w in words] + ["zz unrelated"]
VOCABULARY = Vocabulary.from_phrases("t", PHRASES)


class HashEmbedder(Hashed):
    """A deterministic stand-in of the sentence model's shape (384 dimensions, unit
    rows): a text's vector is a function of the text alone, whatever batch it is in,
    so that sums can be compared bit for bit. Records what it was asked to embed."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def encode(self, texts: Sequence[str], *, batch_size: int = 256) -> Any:
        self.texts.extend(texts)
        return super().encode(texts, batch_size=batch_size)


def rows_of(per_class: int, *, units: bool, seed: int = 0) -> list[Row]:
    """The topics corpus, with a unit column whose units hold documents of several
    classes (each row's unit drawn among ``per_class`` ids: two or three documents a
    unit, of any classes, majorities and ties alike)."""
    texts, labels = corpus(per_class=per_class, seed=seed)
    owner = np.random.default_rng(seed + 1).integers(0, per_class, size=len(texts))
    return [
        (t, label, f"p{owner[i]}" if units else None)
        for i, (t, label) in enumerate(zip(texts, labels, strict=True))
    ]


def sharded(rows: Sequence[Row], shards: int, key: bytes = KEY) -> list[list[Row]]:
    """The rows of each shard, in row order, as the service splits them."""
    out: list[list[Row]] = [[] for _ in range(shards)]
    for i, row in enumerate(rows):
        out[shard_of(row[2], i, key=key, shards=shards)].append(row)
    return out


def make_run(cfg: GenerationConfig, embedder: Any = None, **kwargs: Any) -> ShardedRun:
    options: dict[str, Any] = {"cache": None, "planned": None, "key": KEY, **kwargs}
    return ShardedRun(
        config=cfg, label_set=LABELS, vocabulary=VOCABULARY, embedder=embedder or HashEmbedder(),
        **options,
    )  # fmt: skip


def run_rounds(
    run: ShardedRun, rows: Sequence[Row], shards: int, *, order: Sequence[int] | None = None
) -> tuple[bytes, dict[str, list[bytes]]]:
    """Every round of ``run`` over ``rows`` split in ``shards``, the parts reduced in
    ``order``; the final state and each round's parts."""
    parts: dict[str, list[bytes]] = {}
    state = None
    split = sharded(rows, shards)
    for name in run.rounds:
        mapped = [run.map(name, iter(split[s]), state) for s in range(shards)]
        parts[name] = [mapped[s] for s in (order or range(shards))]
        state = run.reduce(name, parts[name], state)
    return state, parts


@pytest.fixture
def no_noise(monkeypatch: pytest.MonkeyPatch) -> None:
    """The OpenDP samplers replaced by the identity (tests only): a release is then its
    raw aggregate, so two releases compare bit for bit."""

    def identity(values: Any, *, scale: float) -> Any:
        return np.array(values, dtype=np.float64, copy=True)

    monkeypatch.setattr(samplers, "gaussian_noise", identity)


# ------------------------------------------------------------------ the interface


def test_shards_keep_a_units_documents_together_and_spread_rows() -> None:
    got = {shard_of("patient-7", row, key=KEY, shards=5) for row in range(50)}
    assert len(got) == 1  # the unit id decides, not the row
    spread = np.bincount([shard_of(None, row, key=KEY, shards=5) for row in range(5000)])
    assert spread.size == 5 and spread.min() > 850  # about 1000 each
    other = [shard_of(None, row, key=bytes(32), shards=5) for row in range(200)]
    assert other != [shard_of(None, row, key=KEY, shards=5) for row in range(200)]
    with pytest.raises(ConfigError):
        shard_of(None, 0, key=b"short", shards=2)
    with pytest.raises(ConfigError):
        shard_of(None, 0, key=KEY, shards=0)


def test_which_runs_shard_and_their_rounds_are_functions_of_the_config() -> None:
    cfg = config(epsilon=2.0).for_classes(3)  # the default job: class centroids, public Ṽ
    assert shardable(cfg) and make_run(cfg).rounds == ("counts", "sums")  # 4,000 a class
    whole = config(epsilon=2.0, embed_sample=0).for_classes(3)
    assert shardable(whole) and make_run(whole).rounds == ("sums",)
    sampled = config(epsilon=2.0, embed_sample=100).for_classes(3)
    assert shardable(sampled) and make_run(sampled).rounds == ("counts", "sums")
    cells = config(epsilon=6.0, centroid_cells=4, embed_sample=0).for_classes(3)
    assert make_run(cells).rounds == ("sums", "cells")
    assert make_run(config(kde_method="moments", embed_sample=0)).rounds == ("sums",)
    total = config(epsilon=2.0, total=90, per_class=None)
    assert make_run(total).rounds == ("counts", "sums")  # by default a sample of 4,000 a class
    whole = config(epsilon=2.0, total=90, per_class=None, embed_sample=0)
    assert make_run(whole).rounds == ("sums",)  # the counts released from the sums' tallies
    for other in (
        config(kde_method="exact"),
        config(noise="laplace", delta=0.0, kde_method="random_features"),
    ):
        assert not shardable(other.for_classes(3))
        with pytest.raises(ConfigError):
            make_run(other)


def test_rounds_come_in_order_and_parts_of_another_round_are_refused() -> None:
    run = make_run(config(epsilon=2.0, embed_sample=5))
    rows = rows_of(4, units=False)
    with pytest.raises(ConfigError):
        run.map("sums", iter(rows), None)  # the counts come first
    counts = run.map("counts", iter(rows), None)
    with pytest.raises(ConfigError):
        run.reduce("sums", [counts], None)
    state = run.reduce("counts", [counts], None)
    with pytest.raises(ConfigError):
        run.finish(state)  # the sums are not done
    with pytest.raises(InputDataError):
        run.map("sums", iter([("text", "no such label", None)]), state)


# ------------------------------------------------------------------ exact sums


def test_fixed_point_rounds_towards_zero_and_never_grows_a_norm() -> None:
    rng = np.random.default_rng(1)
    rows = rng.normal(size=(500, 384))
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    fixed = to_fixed(rows)
    back = from_fixed(fixed)
    assert (np.abs(back) <= np.abs(rows)).all()
    assert (np.linalg.norm(back, axis=1) <= np.linalg.norm(rows, axis=1)).all()
    assert np.abs(back - rows).max() < 2.0**-FIXED_BITS
    assert (to_fixed(np.array([-0.75, 0.75, -(2.0**-40)])) == [-(3 << 30), 3 << 30, 0]).all()


@pytest.mark.parametrize("units", [False, True], ids=["rows", "unit column"])
def test_totals_are_bit_identical_for_any_split_and_order(units: bool, no_noise: None) -> None:
    rows = rows_of(30, units=units)
    run = make_run(config(epsilon=2.0, total=60, per_class=None))
    states, totals = [], []
    for shards, order in ((1, None), (2, [1, 0]), (5, [3, 0, 4, 2, 1]), (5, None)):
        state, parts = run_rounds(run, rows, shards, order=order)
        states.append(decode(state))
        totals.append(add_parts("sums", parts["sums"]))
    first = totals[0]
    assert first["sums"].dtype == np.int64 and first["sums"].any()
    for other in totals[1:]:
        assert other.keys() == first.keys()
        for name in first:
            assert np.array_equal(other[name], first[name]), name
    # with the noise fixed, the releases (the counts and the class sums) are identical too
    (meta, arrays) = states[0]
    for other_meta, other_arrays in states[1:]:
        assert np.array_equal(other_arrays["noisy_sums"], arrays["noisy_sums"])
        assert other_meta["counts"] == meta["counts"] and other_meta["owner"] == meta["owner"]
    # each unit once, in the class pool() gives it; the sums are those of its rounded vector
    pooled = pool([r[1] for r in rows], [r[2] for r in rows] if units else None, label_set=LABELS)
    assert first["class_units"].tolist() == [sum(u.label == c for u in pooled) for c in LABELS]
    assert len(pooled) < len(rows) or not units
    assert not units or sum(len(u.documents) for u in pooled) < len(rows)  # some set aside
    encoded = HashEmbedder().encode([r[0] for r in rows])
    vectors = unit_vectors([(i,) for i in range(len(rows))], encoded)
    expected = np.zeros_like(first["sums"])
    for u in pooled:
        if units:  # the exact mean of the unit's rounded document vectors
            mean = to_fixed(vectors[list(u.documents)]).sum(axis=0) / 2.0**FIXED_BITS
            vector = within_unit_ball((mean / len(u.documents))[None, :])[0]
        else:
            vector = within_unit_ball(vectors[list(u.documents)])[0]
        expected[LABELS.index(u.label)] += to_fixed(vector)
    assert np.array_equal(first["sums"], expected)


def test_the_sample_does_not_depend_on_the_split() -> None:
    rows = rows_of(60, units=False) + [
        (r[0] + " again", r[1], r[2]) for r in rows_of(60, units=False)
    ]
    cfg = config(epsilon=4.0, embed_sample=20, centroid_cells=1)
    run = make_run(cfg)
    counts = run.reduce("counts", [run.map("counts", iter(rows), None)], None)
    rates = run._class_counts(decode(counts)[0]).rates
    assert rates is not None and all(r < 0.5 for r in rates.values())  # 120 units a class
    kept: list[dict[str, np.ndarray]] = []
    for shards in (1, 3, 5):
        embedder = HashEmbedder()
        split_run = make_run(cfg, embedder)
        parts = [split_run.map("sums", iter(s), counts) for s in sharded(rows, shards)]
        kept.append(add_parts("sums", parts))
        # only the sampled units were embedded: about 20 a class, never the 360 rows
        assert 20 <= len(embedder.texts) <= 3 * 20 + 45
    for other in kept[1:]:
        assert all(np.array_equal(other[name], kept[0][name]) for name in kept[0])
    # a unit column: a unit is kept or dropped whole, in the same way for every split
    unit_rows = rows_of(60, units=True)
    unit_counts = run.reduce("counts", [run.map("counts", iter(unit_rows), None)], None)
    sums = [
        add_parts("sums", [run.map("sums", iter(s), unit_counts) for s in sharded(unit_rows, n)])
        for n in (1, 4)
    ]
    assert np.array_equal(sums[0]["sums"], sums[1]["sums"]) and sums[0]["sums"].any()


# ------------------------------------------------------------------ the same run as in one process


@pytest.mark.slow
@pytest.mark.parametrize("units", [False, True], ids=["rows", "unit column"])
def test_the_sharded_run_matches_the_run_in_one_process(
    units: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from workers.text.embeddings import SentenceEmbedder

    embedder = SentenceEmbedder()
    rows = rows_of(12, units=units)
    texts, labels = [r[0] for r in rows], [r[1] for r in rows]
    ids = [r[2] for r in rows] if units else None
    for cfg in (
        config(epsilon=2.0, public_vocabulary_size=16, sequence_length=3, total=60, per_class=None),
        config(epsilon=6.0, public_vocabulary_size=16, sequence_length=3, centroid_cells=3),
    ):
        resolved = cfg.for_classes(3)
        the_plan = plan(cfg, LABELS, len(VOCABULARY))
        run = make_run(cfg, embedder, planned=the_plan, unit_name="patient" if units else None)
        # the class sums before noise: the shards' exact totals against the in-process ones
        state, parts = run_rounds(run, rows, 3)
        sharded_sums = from_fixed(add_parts("sums", parts["sums"])["sums"])
        pooled = pool(labels, ids, label_set=LABELS)
        vectors, row_labels = stages.embedded_units(
            texts, pooled, ids, rates=None, basis=None, embedder=embedder, config=resolved,
            progress=lambda s, f: None,
        )  # fmt: skip
        for n, label in enumerate(LABELS):
            mine = vectors[[i for i, c in enumerate(row_labels) if c == label]]
            np.testing.assert_allclose(sharded_sums[n], class_sum(mine, 384), atol=1e-6)
        result = run.finish(state)
        plain = generate_sequences(
            texts, labels, label_set=LABELS, vocabulary=VOCABULARY, config=cfg,
            embedder=embedder, units=ids, unit_name="patient" if units else None,
            planned=the_plan,
        )  # fmt: skip
        # the same releases, at the same cost, in the same ledger order
        assert result.report.as_planned and plain.report.as_planned
        got, want = result.report.events, plain.report.events
        assert [(e.mechanism, e.name, e.partition, e.noise) for e in got] == [
            (e.mechanism, e.name, e.partition, e.noise) for e in want
        ]
        for a, b in zip(got, want, strict=True):
            assert a.scale == pytest.approx(b.scale, rel=1e-12)
            assert a.sensitivity == pytest.approx(b.sensitivity, rel=1e-12)
        assert result.report.epsilon == plain.report.epsilon
        assert result.owner_diagnostics == plain.owner_diagnostics
        assert result.private_vocabulary == plain.private_vocabulary
        assert (result.config, result.vocabulary, result.embedding_model, result.unit) == (
            plain.config, plain.vocabulary, plain.embedding_model, plain.unit,
        )  # fmt: skip
        assert result.manifest().keys() == plain.manifest().keys()

    # with the noise fixed, both paths draw the same sequences from the same sums
    def identity(values: Any, *, scale: float) -> Any:
        return np.array(values, dtype=np.float64, copy=True)

    monkeypatch.setattr(samplers, "gaussian_noise", identity)
    cfg = config(epsilon=2.0, public_vocabulary_size=16, sequence_length=3)
    run = make_run(cfg, embedder, unit_name="patient" if units else None)
    result = run.finish(run_rounds(run, rows, 2)[0])
    plain = generate_sequences(
        texts, labels, label_set=LABELS, vocabulary=VOCABULARY, config=cfg, embedder=embedder,
        units=ids, unit_name="patient" if units else None,
    )  # fmt: skip
    assert result.sequences == plain.sequences and result.drawn == plain.drawn


# ------------------------------------------------------------------ memory


def test_map_reads_its_rows_lazily_one_batch_at_a_time() -> None:
    pulled = 0
    rows = rows_of(200, units=False)

    def stream() -> Iterator[Row]:
        nonlocal pulled
        for row in rows:
            pulled += 1
            yield row

    class Watching(HashEmbedder):
        def encode(self, texts: Sequence[str], *, batch_size: int = 256) -> Any:
            # never more than one batch read ahead of what was embedded
            assert pulled <= len(self.texts) + len(texts) + 1
            return super().encode(texts, batch_size=batch_size)

    embedder = Watching()
    run = make_run(config(epsilon=2.0, embed_sample=0), embedder, batch=50)
    run.map("sums", stream(), None)
    assert pulled == len(rows) == len(embedder.texts)


def test_map_memory_is_flat_in_the_number_of_rows() -> None:
    class Constant(HashEmbedder):
        def encode(self, texts: Sequence[str], *, batch_size: int = 256) -> Any:
            out = np.zeros((len(texts), self.dim), dtype=np.float32)
            out[:, 0] = 1.0
            return out

    run = make_run(config(epsilon=2.0, embed_sample=0), Constant(), batch=256)

    def peak(n: int) -> int:
        texts = ((f"note {i} about the heart", LABELS[i % 3], None) for i in range(n))
        tracemalloc.start()
        run.map("sums", texts, None)
        _, top = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return top

    peak(100)  # warm: Ṽ's matcher and the like
    small, large = peak(2_000), peak(20_000)
    assert large < small + 512 * 1024, (small, large)  # ten times the rows, not the memory


def test_parts_and_states_are_plain_data_and_damage_is_refused() -> None:
    run = make_run(config(epsilon=2.0, embed_sample=0))
    part = run.map("sums", iter(rows_of(3, units=False)), None)
    meta, arrays = decode(part)
    assert meta["kind"] == "part" and meta["round"] == "sums"
    assert {a.dtype for a in arrays.values()} == {np.dtype(np.int64)}
    assert arrays["sums"].shape == (3, EMBEDDING_DIMENSION)
    state = run.reduce("sums", [part], None)
    meta, arrays = decode(state)
    assert meta["kind"] == "state" and meta["done"] == ["sums"]
    assert set(meta["owner"]) >= {"documents", "units", "units_per_class"}  # apart, raw
    assert arrays["noisy_sums"].dtype == np.float64
    for damaged in (part[:-8], b"\x80\x04pickle" + part, part[:30], b""):
        with pytest.raises(ConfigError):
            run.reduce("sums", [damaged], None)


def test_rows_grouped_by_unit_give_the_same_totals_with_units_closed_early() -> None:
    rows = rows_of(40, units=True)
    ordered = sorted(rows, key=lambda r: str(r[2]))  # as ``ORDER BY unit`` would read them
    for cfg in (config(epsilon=2.0), config(epsilon=4.0, embed_sample=10, centroid_cells=1)):
        run = make_run(cfg, batch=7)
        state = None
        if run.rounds[0] == "counts":
            state = run.reduce("counts", [run.map("counts", iter(rows), None)], None)
        loose = add_parts("sums", [run.map("sums", iter(rows), state)])
        tight = add_parts("sums", [run.map("sums", iter(ordered), state, grouped=True)])
        assert all(np.array_equal(loose[name], tight[name]) for name in loose)
    # a unit that comes back after another is refused, not counted twice
    with pytest.raises(ConfigError):
        make_run(config(epsilon=2.0, embed_sample=0)).map("sums", iter(rows), None, grouped=True)


def test_map_calls_its_cancel_check_and_stops_when_it_raises() -> None:
    calls = 0

    class Cancelled(Exception):
        pass

    def tick() -> None:
        nonlocal calls
        calls += 1
        if calls > 3:
            raise Cancelled

    run = make_run(config(epsilon=2.0, embed_sample=0), batch=64)
    with pytest.raises(Cancelled):
        run.map("sums", iter(rows_of(400, units=False)), None, tick=tick)
    assert calls == 4


def test_the_key_stays_out_of_the_runs_repr() -> None:
    run = make_run(config(epsilon=2.0))
    assert "secret" in repr(run) and KEY.hex() not in repr(run) and str(KEY) not in repr(run)


@pytest.mark.parametrize(
    "overrides",
    [{"kde_method": "moments", "consistency_filter": False}, {"epsilon": 6.0, "centroid_cells": 3}],
    ids=["moments", "cells"],
)
def test_moments_and_cells_are_exact_sums_too(overrides: dict[str, Any], no_noise: None) -> None:
    rows = rows_of(20, units=True)
    if "centroid_cells" in overrides:  # three kinds of note a class, enough for three cells
        rows += [
            (f"{label} note of kind {i // 3 % 3}", label, f"q{i}")
            for i in range(900)
            for label in LABELS[i % 3 : i % 3 + 1]
        ]
    run = make_run(config(**{"epsilon": 2.0, **overrides}))
    results = [
        run_rounds(run, rows, shards, order=order)
        for shards, order in ((1, None), (4, [2, 0, 3, 1]))
    ]
    last = run.rounds[-1]
    totals = [add_parts(last, parts[last]) for _, parts in results]
    assert all(np.array_equal(totals[0][name], totals[1][name]) for name in totals[0])
    if last == "cells":  # every unit in one cell of its class: the cells add up to the sums
        sums = add_parts("sums", results[0][1]["sums"])["sums"]
        assert np.array_equal(totals[0]["cells"].sum(axis=1), sums)
        assert (np.count_nonzero(totals[0]["cells"].any(axis=2), axis=1) > 1).all()
    else:  # each unit's x and upper triangle of x xᵀ, rounded towards zero, added
        pooled = pool([r[1] for r in rows], [r[2] for r in rows], label_set=LABELS)
        encoded = HashEmbedder().encode([r[0] for r in rows])
        vectors = unit_vectors([(i,) for i in range(len(rows))], encoded)
        expected = np.zeros_like(totals[0]["sums"])
        for u in pooled:
            mean = to_fixed(vectors[list(u.documents)]).sum(axis=0) / 2.0**FIXED_BITS
            vector = within_unit_ball((mean / len(u.documents))[None, :])
            expected[LABELS.index(u.label)] += to_fixed(moment_rows(vector))[0]
        assert np.array_equal(totals[0]["sums"], expected)
    # the releases agree too, and the run finishes with the planned releases
    states = [decode(state) for state, _ in results]
    assert np.array_equal(states[0][1]["noisy_sums"], states[1][1]["noisy_sums"])
    assert run.finish(results[1][0]).report.as_planned
