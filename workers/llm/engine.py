"""Continuous batching on llama.cpp: several chat completions decoded together.

llama-cpp-python's own server holds a lock around one ``Llama`` object, so it generates
one completion at a time however many arrive together. :class:`BatchEngine` serves
``slots`` completions at once instead, the way llama.cpp's ``llama-server --parallel N``
does, written on llama.cpp's C API (``llama_batch``, ``llama_decode``, samplers, the KV
cache), from the prebuilt library of the ``llama-cpp-cffi`` wheel
(:mod:`workers.llm.llamacpp`: nothing is compiled at install), because no PyPI package
we found ships a ``llama-server`` that runs here (README, "The local LLM"):

* **Batched decoding.** The slots of a *lane* are the sequences of one llama.cpp context
  (``n_seq_max`` = its slots, sharing the context's KV cache). Every step puts into a single
  ``llama_decode`` the next token of each slot that is generating and the prompt tokens
  of each slot that is starting (cut to fit the batch), then samples one token per slot.
* **Continuous batching.** A finished request frees its slot at once; the next queued
  request takes it at the following step, while the other slots go on.
* **Prompt cache.** A slot keeps the tokens of its last request's prompt in the KV cache;
  a new request goes to the free slot sharing the longest prefix with its prompt and only
  the rest is decoded (every DP-KPS prompt starts with the same system message and
  template).
* **Shared prefixes.** The slots' sequences share one KV store (llama.cpp of
  llama-cpp-cffi 0.4.42 has no per-sequence streams), where every token's attention runs
  over every slot's cells, masked. A prompt whose prefix another sequence holds takes
  those cells (``llama_kv_self_seq_cp`` tags them with its sequence too: nothing is
  computed), and one that arrives with others waits a step for the earliest to decode
  what they share. The common system message and template are then decoded once and held
  once, not once per slot; with a finished slot's completion cells dropped, the cells
  every step attends over fell from about 640 to about 300 for 8 DP-KPS slots, and the
  CPU per generated token by a fifth (benchmarks/notes/2026-12-07-llm-calls-parity.md).
* **Batches in sequence order.** A step's tokens are put in the batch slot by slot in
  ``seq_id`` order: llama.cpp (as built for llama-cpp-python 0.3, one KV stream per
  sequence) decoded a batch whose sequences came out of order about 2.5× slower
  (measured: 8 tokens of 8 sequences, 2 threads, 59 ms against 23 ms).
* **Threads that give way.** llama.cpp's worker threads meet at a busy-wait barrier
  after every operation. On idle cores one context on every core is fastest (here, 8
  slots: one context on 2 threads 7.5-8.3 calls/s, two single-threaded contexts
  6.0-6.3), but a thread that loses its core to another process stalls the others at
  each barrier. Each lane's :class:`ThreadGovernor` therefore reads, four times a
  second, how many CPUs other processes keep busy and runs the next steps on the CPUs
  they leave free (``llama_set_n_threads`` between steps). ``lanes`` independent
  contexts (each with its scheduler thread, sharing the weights and one request queue;
  ``llama_decode`` releases the GIL) remain for machines with many cores.
* **Weights the CPU can batch.** llama.cpp's CPU backend has matrix-matrix kernels
  (llamafile's tinyBLAS) for Q8_0, F16 and BF16 but none for Q4_1, the packaged
  SmolLM2's type. :func:`convert_weights` writes the model once as Q8_0 (145 MB): 8 bits
  hold the 4-bit weights with next to no loss (perplexity on 3,228 AG News tokens: Q4_1
  as packaged 75.34, Q8_0 75.44, F16 75.01, BF16 75.06; Q4_0, faster, 92.30, so it is
  not offered), and it streams half the bytes of F16 per step. Measured on 2 shared
  cores (CPU time of one ``llama_decode``, per token, batch of 8 against batch of 1):
  Q8_0 0.45-0.7×, BF16 0.37-0.45×, F16 0.5×, Q4_1 0.6-1.0×; batches of 2 cost as much
  per token as single steps. The figures move by ±30 % with the machine's load.

Sampling follows llama-cpp-python's chat completions (same defaults, same chain order):
repetition penalties over the last 64 tokens, top-k 40, top-p 0.95, min-p 0.05,
temperature, then a draw with the request's seed (random when none); temperature 0 is
greedy. Chat prompts use the template stored in the gguf file (SmolLM2: ChatML), applied
by llama.cpp's ``llama_chat_apply_template``.

Only a lane's scheduler thread touches its context; other threads tokenise (the
vocabulary is read-only) and hand requests over through the queue, getting a
``concurrent.futures.Future`` back. Nothing here logs a prompt or a completion, and
llama.cpp's own log is silenced unless ``verbose``.
"""

from __future__ import annotations

import logging
import os
import queue
import random
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workers.llm.llamacpp import llama

logger = logging.getLogger(__name__)

DEFAULT_SLOTS = 8
DEFAULT_LANES = 1
DEFAULT_CTX_PER_SLOT = 2048
DEFAULT_BATCH = 512
DEFAULT_WEIGHT_TYPE = "q8_0"
PENALTY_LAST_N = 64
MIN_SHARED = 8  # a prompt waits for another slot to decode a common prefix at least this long
WEIGHT_TYPES = {
    "f16": "LLAMA_FTYPE_MOSTLY_F16",
    "bf16": "LLAMA_FTYPE_MOSTLY_BF16",
    "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0",
}


class EngineError(Exception):
    """The engine could not serve a request (its message never quotes text)."""


class RequestTooLong(EngineError):
    """The prompt does not fit in a slot's context."""


@dataclass(frozen=True)
class SamplingParams:
    """How one completion is sampled; the defaults are llama-cpp-python's."""

    max_tokens: int = 256
    temperature: float = 0.8
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    repeat_penalty: float = 1.1
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class Generation:
    """A finished completion and what it cost."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" (end of generation or a stop string) or "length"


@dataclass
class EngineStats:
    """Counters of a running engine, summed over its lanes."""

    slots: int
    lanes: int
    busy: int = 0  # slots serving a request now
    max_busy: int = 0  # the most slots ever busy at once
    queued: int = 0
    requests: int = 0
    decode_calls: int = 0
    reused_tokens: int = 0  # prompt tokens found in a slot's cache, not decoded again
    shared_tokens: int = 0  # of those, tokens another sequence decoded (its cells shared)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    threads: int = 0  # llama.cpp threads the lanes use now (their governors' choice)
    thread_switches: int = 0

    def as_dict(self) -> dict[str, int]:
        return {name: int(value) for name, value in vars(self).items()}


@dataclass
class _Request:
    prompt: list[int]
    params: SamplingParams
    future: Future[Generation]


@dataclass
class _Slot:
    """A request being served by sequence ``seq_id`` of a lane's context."""

    seq_id: int
    request: _Request
    sampler: Any  # llama_sampler_p
    order: int = 0  # admission order in its lane: a slot only waits for earlier ones
    prefilled: int = 0  # prompt tokens already in this sequence's KV cache or batch
    n_past: int = 0  # tokens in this sequence's KV cache
    pending: int | None = None  # sampled token still to be decoded
    generated: list[int] = field(default_factory=list)
    pieces: bytearray = field(default_factory=bytearray)
    logits_at: int = -1  # batch index of this slot's logits in the current step

    @property
    def prefilling(self) -> bool:
        return self.prefilled < len(self.request.prompt)


def convert_weights(source: Path, weight_type: str, cache_dir: Path) -> Path:
    """``source`` re-encoded as ``weight_type`` (a file in ``cache_dir``, made once).

    The file is the public model in another encoding; it is reused while the source's
    size and modification time are unchanged and written atomically, so engines that
    start together never read half a file.
    """
    lib, ffi = llama()

    if weight_type not in WEIGHT_TYPES:
        raise ValueError(f"weight_type must be one of {sorted(WEIGHT_TYPES)}")
    stat = source.stat()
    target = cache_dir / f"{source.stem}.{stat.st_size}-{int(stat.st_mtime)}.{weight_type}.gguf"
    if target.is_file():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    params = ffi.new(
        "struct llama_model_quantize_params *", lib.llama_model_quantize_default_params()
    )
    params.ftype = getattr(lib, WEIGHT_TYPES[weight_type])
    params.allow_requantize = True
    params.nthread = 1
    try:
        code = lib.llama_model_quantize(str(source).encode(), str(partial).encode(), params)
        if code != 0:
            raise EngineError(f"llama.cpp could not convert the model to {weight_type}")
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target


def default_threads() -> int:
    """Every CPU: a lane's :class:`ThreadGovernor` uses fewer while other work takes some."""
    return max(1, os.cpu_count() or 1)


class CpuMeter:
    """How many CPUs other processes kept busy since the last reading (Linux ``/proc``).

    The machine's busy time (``/proc/stat``: user, system, irq, softirq, steal) minus
    this process's own (``os.times``), over the wall time between two readings. ``None``
    where ``/proc/stat`` cannot be read.

    ``nice`` time (the user time of processes at a niceness above 0) counts when this
    process is niced itself (``count_niced`` None, the default, decides so from its own
    niceness): such processes then compete on equal terms, and this process's own user
    time is in that column too. Unniced, it is left out: those processes give way to ours.
    """

    def __init__(self, path: Path = Path("/proc/stat"), *, count_niced: bool | None = None) -> None:
        self.path = path
        self.ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.count_niced = _niced() if count_niced is None else count_niced
        self._last = self._read()

    def _read(self) -> tuple[float, float, float] | None:
        try:
            with open(self.path, "rb") as file:
                fields = file.readline().split()
        except OSError:
            return None
        if len(fields) < 9 or fields[0] != b"cpu":
            return None
        user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[1:9])
        busy = user + system + irq + softirq + steal + (nice if self.count_niced else 0)
        own = os.times()
        return time.monotonic(), busy / self.ticks, own.user + own.system

    def others(self) -> float | None:
        """CPUs' worth of work other processes did since the previous call."""
        now, last = self._read(), self._last
        self._last = now
        if now is None or last is None or now[0] <= last[0]:
            return None
        return max(0.0, (now[1] - last[1]) - (now[2] - last[2])) / (now[0] - last[0])


class ThreadGovernor:
    """A lane's llama.cpp thread count, from the CPUs other processes leave free.

    llama.cpp's threads wait for each other at a spinning barrier after every operation,
    so a context with more threads than free cores loses a whole scheduler time slice at
    each barrier its descheduled thread reaches late (here, with one core taken by another
    process, 8 slots: 2.3-2.8 calls/s on two threads, 4.0-4.3 on one; on two busy cores 48
    tokens took 6.4 s with two threads and 0.7-1.0 s with one). Every ``interval`` seconds
    the governor reads :class:`CpuMeter` and gives the lane its share of the free CPUs,
    rounded, at least one thread and at most ``most`` (the lane's share of ``cpus``). The
    reading is smoothed over two intervals; while nothing can be read the lane keeps
    ``most``. Costs a clock read per step and a file read per interval.
    """

    def __init__(
        self,
        most: int,
        *,
        cpus: int | None = None,
        meter: CpuMeter | None = None,
        interval: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if most < 1:
            raise ValueError("most must be at least 1")
        self.most = most
        self.cpus = cpus or os.cpu_count() or 1
        self.meter = meter if meter is not None else CpuMeter()
        self.interval = interval
        self.clock = clock
        self.current = most
        self.others: float | None = None  # smoothed CPUs other processes use
        self.switches = 0
        self._next = clock() + interval

    def choose(self) -> int:
        """The thread count for the next step."""
        if self.most == 1:
            return 1
        now = self.clock()
        if now < self._next:
            return self.current
        self._next = now + self.interval
        reading = self.meter.others()
        if reading is None:
            return self.current
        self.others = reading if self.others is None else (self.others + reading) / 2
        free = max(0.0, self.cpus - self.others)
        choice = min(self.most, max(1, round(free * self.most / self.cpus)))
        if choice != self.current:
            self.switches += 1
            self.current = choice
        return choice


class BatchEngine:
    """A gguf model decoding up to ``slots`` chat completions at once on ``threads`` lanes.

    ``start()`` loads the model and starts the lanes; ``close()`` stops them (requests in
    flight or still queued fail with :class:`EngineError`) and frees the model.
    """

    def __init__(
        self,
        model_path: Path | str,
        *,
        slots: int = DEFAULT_SLOTS,
        ctx_per_slot: int = DEFAULT_CTX_PER_SLOT,
        threads: int | None = None,
        lanes: int = DEFAULT_LANES,
        batch_size: int = DEFAULT_BATCH,
        weight_type: str | None = DEFAULT_WEIGHT_TYPE,
        cache_dir: Path | None = None,
        verbose: bool = False,
    ) -> None:
        if not 1 <= slots <= 64:
            raise ValueError("slots must be between 1 and 64")
        if ctx_per_slot < 256:
            raise ValueError("ctx_per_slot must be at least 256")
        if threads is not None and threads < 1:
            raise ValueError("threads must be at least 1")
        if lanes < 1:
            raise ValueError("lanes must be at least 1")
        if batch_size < 32:
            raise ValueError("batch_size must be at least 32")
        if weight_type is not None and weight_type not in WEIGHT_TYPES:
            raise ValueError(f"weight_type must be one of {sorted(WEIGHT_TYPES)} or None")
        self.model_path = Path(model_path)
        self.slots = slots
        self.ctx_per_slot = ctx_per_slot
        self.threads = threads or default_threads()  # llama.cpp threads over all lanes
        self.lanes = min(lanes, slots, self.threads)
        self.batch_size = batch_size
        self.weight_type = weight_type
        self.cache_dir = cache_dir
        self.verbose = verbose
        self._queue: queue.Queue[_Request | None] = queue.Queue()
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # the counters
        self._stats = EngineStats(slots=slots, lanes=self.lanes)
        self._lanes: list[_Lane] = []
        self._model: Any = None
        self._vocab: Any = None
        self._template: bytes | None = None

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> BatchEngine:
        if self._lanes:
            return self
        lib, ffi = llama(verbose=self.verbose)  # llama.cpp's log is silenced unless verbose
        path = self.model_path
        if self.weight_type is not None:
            temporary = Path(tempfile.gettempdir()) / "keyseed-llm"
            try:
                path = convert_weights(path, self.weight_type, self.cache_dir or temporary)
            except OSError:  # a read-only cache folder: convert into the temporary one
                path = convert_weights(path, self.weight_type, temporary)
        model_params = lib.llama_model_default_params()
        model_params.n_gpu_layers = 0
        model_params.use_mlock = False  # locking fails under container memlock limits
        model = lib.llama_model_load_from_file(str(path).encode(), model_params)
        if model == ffi.NULL:
            raise EngineError(f"llama.cpp could not load {self.model_path.name}")
        self._model = model
        self._vocab = lib.llama_model_get_vocab(model)
        self._template = lib.llama_model_chat_template(model, ffi.NULL)
        self._stopping.clear()
        sizes = _shares(self.slots, self.lanes)
        threads = _shares(self.threads, self.lanes)
        try:
            self._lanes = [
                _Lane(self, number, size, threads[number]) for number, size in enumerate(sizes)
            ]
        except EngineError:
            self.close()
            raise
        for lane in self._lanes:
            lane.start()
        logger.info(
            "batch engine: %d slots × %d tokens on %d lane(s), %d thread(s), %s weights",
            self.slots,
            self.ctx_per_slot,
            self.lanes,
            self.threads,
            self.weight_type or "packaged",
        )
        return self

    def close(self) -> None:
        self._stopping.set()
        for _ in self._lanes:
            self._queue.put(None)  # wakes an idle lane
        for lane in self._lanes:
            lane.join()
        while True:  # nobody serves what is still queued
            try:
                request = self._queue.get_nowait()
            except queue.Empty:
                break
            if request is not None and request.future.set_running_or_notify_cancel():
                request.future.set_exception(EngineError("the engine stopped"))
        for lane in self._lanes:
            lane.free()
        self._lanes = []
        if self._model is not None:
            lib, _ = llama()
            lib.llama_model_free(self._model)
            self._model = None

    def __enter__(self) -> BatchEngine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def stats(self) -> EngineStats:
        with self._lock:
            snapshot = EngineStats(**vars(self._stats))
        snapshot.queued = self._queue.qsize()
        snapshot.threads = sum(lane.governor.current for lane in self._lanes)
        snapshot.thread_switches = sum(lane.governor.switches for lane in self._lanes)
        return snapshot

    # ----------------------------------------------------------------- requests

    def chat_prompt(self, messages: Sequence[dict[str, str]]) -> list[int]:
        """The tokens of ``messages`` rendered with the model's chat template."""
        lib, ffi = llama()
        if self._model is None:
            raise EngineError("the engine is not running")
        chat = ffi.new("struct llama_chat_message[]", len(messages))
        keep = []  # the encoded strings must outlive the call
        for i, message in enumerate(messages):
            role = ffi.new("char[]", message["role"].encode())
            content = ffi.new("char[]", message["content"].encode())
            keep += [role, content]
            chat[i].role = role
            chat[i].content = content
        size = 2 * sum(len(b) for b in keep) + 1024
        for _ in range(2):
            buffer = ffi.new("char[]", size)
            length = lib.llama_chat_apply_template(
                self._template, chat, len(messages), True, buffer, size
            )
            if length < 0:
                raise EngineError("the model's chat template is not supported by llama.cpp")
            if length <= size:
                return self.tokenize(ffi.buffer(buffer, length)[:], special=True)
            size = length + 1
        raise EngineError("the chat template output kept growing")

    def tokenize(self, text: bytes, *, special: bool) -> list[int]:
        """Tokens of ``text`` (with the model's BOS if it adds one)."""
        lib, ffi = llama()
        capacity = len(text) + 16
        tokens = ffi.new("llama_token[]", capacity)
        count = lib.llama_tokenize(self._vocab, text, len(text), tokens, capacity, True, special)
        if count < 0:  # not for bytes → tokens in practice, but llama.cpp asks us to check
            capacity = -count
            tokens = ffi.new("llama_token[]", capacity)
            count = lib.llama_tokenize(
                self._vocab, text, len(text), tokens, capacity, True, special
            )
        return list(ffi.unpack(tokens, count))

    def submit(self, prompt: list[int], params: SamplingParams) -> Future[Generation]:
        """Queue a completion of ``prompt`` (tokens); its future resolves when done."""
        if not self._lanes or self._stopping.is_set():
            raise EngineError("the engine is not running")
        if not prompt:
            raise RequestTooLong("the prompt is empty")
        if len(prompt) >= self.ctx_per_slot:
            raise RequestTooLong(
                f"the prompt has {len(prompt)} tokens; a slot holds {self.ctx_per_slot}"
            )
        if params.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        future: Future[Generation] = Future()
        self._queue.put(_Request(list(prompt), params, future))
        return future

    # ----------------------------------------------------------------- for the lanes

    def _count(self, **increments: int) -> None:
        with self._lock:
            for name, value in increments.items():
                setattr(self._stats, name, getattr(self._stats, name) + value)
            self._stats.max_busy = max(self._stats.max_busy, self._stats.busy)

    def _sampler(self, params: SamplingParams) -> Any:
        lib, _ = llama()
        chain = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
        add = lib.llama_sampler_chain_add
        add(
            chain,
            lib.llama_sampler_init_penalties(
                PENALTY_LAST_N,
                params.repeat_penalty,
                params.frequency_penalty,
                params.presence_penalty,
            ),
        )
        if params.temperature <= 0.0:
            add(chain, lib.llama_sampler_init_greedy())
            return chain
        seed = params.seed if params.seed is not None else random.getrandbits(32)
        add(chain, lib.llama_sampler_init_top_k(params.top_k))
        add(chain, lib.llama_sampler_init_top_p(params.top_p, 1))
        add(chain, lib.llama_sampler_init_min_p(params.min_p, 1))
        add(chain, lib.llama_sampler_init_temp(params.temperature))
        add(chain, lib.llama_sampler_init_dist(seed & 0xFFFFFFFF))
        return chain

    def _piece(self, token: int) -> bytes:
        lib, ffi = llama()
        size = 64
        while True:
            buffer = ffi.new("char[]", size)
            length = lib.llama_token_to_piece(self._vocab, token, buffer, size, 0, False)
            if length >= 0:
                return bytes(ffi.buffer(buffer, length))
            size = -length


class _Lane:
    """One llama.cpp context serving ``size`` slots from the shared queue on up to
    ``threads`` threads (fewer while other processes take CPUs: its governor)."""

    def __init__(self, engine: BatchEngine, number: int, size: int, threads: int) -> None:
        lib, ffi = llama()
        self.engine = engine
        self.size = size
        self.governor = ThreadGovernor(threads)
        params = lib.llama_context_default_params()
        params.n_ctx = size * engine.ctx_per_slot
        params.n_batch = engine.batch_size
        params.n_ubatch = engine.batch_size
        params.n_seq_max = size
        params.n_threads = threads
        params.n_threads_batch = threads
        # the slots share one KV cache: defragment it past 10 % holes (llama-server's
        # default), so a prompt's batch still finds its cells as requests come and go
        params.defrag_thold = 0.1
        params.no_perf = True
        self.ctx = lib.llama_init_from_model(engine._model, params)
        if self.ctx == ffi.NULL:
            raise EngineError("llama.cpp could not create a context")
        self.batch = lib.llama_batch_init(engine.batch_size, 0, 1)
        self.active: dict[int, _Slot] = {}
        self.cached: list[list[int]] = [[] for _ in range(size)]  # each sequence's KV tokens
        self.admitted = 0  # requests assigned so far (a slot's order)
        self.thread = threading.Thread(target=self._run, name=f"llm-lane-{number}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def join(self) -> None:
        if self.thread.is_alive():
            self.thread.join()

    def free(self) -> None:
        lib, _ = llama()
        lib.llama_batch_free(self.batch)
        lib.llama_free(self.ctx)

    # ----------------------------------------------------------------- scheduling

    def _run(self) -> None:
        engine = self.engine
        reason = "the engine stopped"
        try:
            while not engine._stopping.is_set():
                self._admit()
                if self.active:
                    self._step()
        except Exception as exc:  # a llama.cpp failure: fail what is in flight, stop serving
            logger.error("batch engine lane stopped: %s", type(exc).__name__)
            reason = "the engine failed"
            engine._stopping.set()
        finally:
            for slot in list(self.active.values()):
                self._forget(slot.seq_id)
                self._release(slot, error=EngineError(reason))

    def _admit(self) -> None:
        """Move queued requests into free slots (block while there is nothing to do)."""
        while len(self.active) < self.size:
            try:
                idle = not self.active
                request = self.engine._queue.get(block=idle, timeout=0.5 if idle else None)
            except queue.Empty:
                return
            if request is None:  # close() woke us
                return
            if request.future.set_running_or_notify_cancel():
                self._assign(request)
            # else: the client gave up while it was queued

    def _assign(self, request: _Request) -> None:
        """Serve ``request`` in the free slot whose cached tokens share the longest prefix
        with its prompt (llama-server's prompt cache): only the rest is decoded."""
        lib, _ = llama()
        prompt = request.prompt
        best, shared = -1, -1
        for seq_id in range(self.size):
            if seq_id not in self.active:
                common = _common_prefix(self.cached[seq_id], prompt)
                if common > shared:
                    best, shared = seq_id, common
        shared = min(shared, len(prompt) - 1)  # the last prompt token is decoded for logits
        lib.llama_kv_self_seq_rm(self.ctx, best, shared, -1)
        del self.cached[best][shared:]
        self.admitted += 1
        slot = _Slot(best, request, self.engine._sampler(request.params), order=self.admitted)
        slot.prefilled = slot.n_past = shared
        self.active[best] = slot
        self.engine._count(requests=1, busy=1, reused_tokens=shared)

    def _share_prefixes(self, slots: list[_Slot]) -> set[int]:
        """Give each prompt the prefix another sequence already holds; return the slots
        that wait this step for an earlier slot to decode a prefix they share.

        The slots share one KV store, where a cell may belong to several sequences:
        ``llama_kv_self_seq_cp`` adds this slot's sequence to the donor's cells of the
        common prefix (nothing is computed or copied), so the prefix is decoded once and
        held once, and each step's attention runs over that many fewer cells. Requests
        that arrive together (a job's first eight) would otherwise each decode the same
        system message and template: a later one waits for the earliest to have decoded
        what they share, then takes it.
        """
        lib, _ = llama()
        waiting: set[int] = set()
        for slot in slots:
            if not slot.prefilling:
                continue
            prompt = slot.request.prompt
            last = len(prompt) - 1  # the last prompt token is decoded for its logits
            donor, reach = -1, slot.prefilled
            for seq_id, tokens in enumerate(self.cached):  # decoded tokens of each sequence
                if seq_id != slot.seq_id and len(tokens) > reach:
                    common = min(_common_prefix(tokens, prompt), last)
                    if common > reach:
                        donor, reach = seq_id, common
            if donor >= 0:
                lib.llama_kv_self_seq_cp(self.ctx, donor, slot.seq_id, slot.prefilled, reach)
                self.cached[slot.seq_id].extend(prompt[slot.prefilled : reach])
                gained = reach - slot.prefilled
                self.engine._count(reused_tokens=gained, shared_tokens=gained)
                slot.prefilled = slot.n_past = reach
            for other in slots:
                if other.order < slot.order and other.prefilling:
                    common = min(_common_prefix(other.request.prompt, prompt), last)
                    if common >= slot.prefilled + MIN_SHARED and other.prefilled < common:
                        waiting.add(slot.seq_id)
                        break
        return waiting

    def _step(self) -> None:
        """One ``llama_decode`` over every active slot, then one token per slot."""
        lib, _ = llama()
        batch, n = self.batch, 0
        slots = [self.active[seq_id] for seq_id in sorted(self.active)]
        waiting = self._share_prefixes(slots)
        # generating slots first claim one token each; prompts fill what is left
        room = self.engine.batch_size - sum(slot.pending is not None for slot in slots)
        for slot in slots:  # in sequence order: llama.cpp decodes an unsorted batch ~2× slower
            slot.logits_at = -1
            if slot.pending is not None:
                self._put(n, slot, slot.pending, logits=True)
                slot.pending = None
                n += 1
                continue
            if slot.seq_id in waiting:
                continue
            prompt = slot.request.prompt
            while slot.prefilling and room > 0:
                slot.prefilled += 1
                self._put(n, slot, prompt[slot.prefilled - 1], logits=not slot.prefilling)
                n += 1
                room -= 1
        if n == 0:
            return
        batch.n_tokens = n
        before = self.governor.current
        threads = self.governor.choose()
        if threads != before:
            lib.llama_set_n_threads(self.ctx, threads, threads)
        code = lib.llama_decode(self.ctx, batch)
        self.engine._count(decode_calls=1)
        if code != 0:
            for slot in list(self.active.values()):
                self._forget(slot.seq_id)
                self._release(slot, error=EngineError(f"llama_decode returned {code}"))
            return
        for slot in list(self.active.values()):
            if slot.logits_at >= 0:
                token = lib.llama_sampler_sample(slot.sampler, self.ctx, slot.logits_at)
                self._advance(slot, token)

    def _put(self, index: int, slot: _Slot, token: int, *, logits: bool) -> None:
        batch = self.batch
        batch.token[index] = token
        batch.pos[index] = slot.n_past
        batch.n_seq_id[index] = 1
        batch.seq_id[index][0] = slot.seq_id
        batch.logits[index] = logits
        if logits:
            slot.logits_at = index
        slot.n_past += 1
        self.cached[slot.seq_id].append(token)

    def _advance(self, slot: _Slot, token: int) -> None:
        lib, _ = llama()
        params = slot.request.params
        if lib.llama_vocab_is_eog(self.engine._vocab, token):
            self._finish(slot, "stop")
            return
        slot.generated.append(token)
        slot.pieces += self.engine._piece(token)
        if params.stop:
            text = slot.pieces.decode("utf-8", errors="ignore")
            cut = min((text.find(s) for s in params.stop if s and s in text), default=-1)
            if cut >= 0:
                self._finish(slot, "stop", text=text[:cut])
                return
        full = slot.n_past + 1 >= self.engine.ctx_per_slot
        if len(slot.generated) >= params.max_tokens or full:
            self._finish(slot, "length")
            return
        slot.pending = token

    def _finish(self, slot: _Slot, reason: str, *, text: str | None = None) -> None:
        prompt_tokens = len(slot.request.prompt)
        completion_tokens = len(slot.generated)
        if text is None:
            text = slot.pieces.decode("utf-8", errors="replace")
        self.engine._count(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
        # the prompt stays cached for the next request; the completion's cells would only
        # lengthen every other slot's attention span (no prompt continues a completion)
        lib, _ = llama()
        lib.llama_kv_self_seq_rm(self.ctx, slot.seq_id, prompt_tokens, -1)
        del self.cached[slot.seq_id][prompt_tokens:]
        self._release(slot, result=Generation(text, prompt_tokens, completion_tokens, reason))

    def _forget(self, seq_id: int) -> None:
        lib, _ = llama()
        lib.llama_kv_self_seq_rm(self.ctx, seq_id, -1, -1)
        self.cached[seq_id].clear()

    def _release(
        self, slot: _Slot, *, result: Generation | None = None, error: BaseException | None = None
    ) -> None:
        lib, _ = llama()
        lib.llama_sampler_free(slot.sampler)
        del self.active[slot.seq_id]
        self.engine._count(busy=-1)
        if error is not None:
            slot.request.future.set_exception(error)
        elif result is not None:
            slot.request.future.set_result(result)


def _niced() -> bool:
    """Whether this process runs at a niceness above 0 (``nice -n 10 ...``)."""
    try:
        return os.getpriority(os.PRIO_PROCESS, 0) > 0
    except (AttributeError, OSError):
        return False


def _shares(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` near-equal whole shares, larger ones first."""
    return [total // parts + (i < total % parts) for i in range(parts)]


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
