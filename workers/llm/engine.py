"""Continuous batching on llama.cpp: several chat completions decoded in one batch.

llama-cpp-python's own server holds a lock around one ``Llama`` object, so it generates
one completion at a time however many arrive together. A decoding step of a small model
on a CPU costs nearly the same for one sequence as for eight (the weights are read once
per step either way), so :class:`BatchEngine` keeps ``slots`` sequences in one llama.cpp
context (one KV-cache stream per slot, ``n_seq_max = slots``) and, at every step, puts
into a single ``llama_decode`` call the next token of every slot that is generating and
the prompt tokens of every slot that is starting (prompts are cut to fit the batch).
A request that finishes frees its slot at once for the next one in the queue: the
"continuous batching" of llama.cpp's ``llama-server --parallel N``, written here on
llama-cpp-python's low-level API (``llama_batch``, ``llama_decode``, samplers, memory),
because no package on PyPI ships a ``llama-server`` that runs on a generic x86-64 CPU.

Only the scheduler thread touches the llama.cpp context; other threads tokenise (the
vocabulary is read-only) and hand requests over through a queue, getting a
``concurrent.futures.Future`` back.

Sampling follows llama-cpp-python's chat completions (same defaults, same chain order):
repetition penalties over the last 64 tokens, top-k 40, top-p 0.95, min-p 0.05,
temperature, then a draw with the request's seed (random when none); temperature 0 is
greedy. Chat prompts use the template stored in the gguf file (SmolLM2: ChatML), applied
by llama.cpp's ``llama_chat_apply_template``.

Nothing here logs a prompt or a completion; llama.cpp's own log is silenced unless
``verbose``.
"""

from __future__ import annotations

import ctypes
import logging
import os
import queue
import random
import tempfile
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

DEFAULT_SLOTS = 8
DEFAULT_CTX_PER_SLOT = 2048
DEFAULT_BATCH = 512
DEFAULT_WEIGHT_TYPE = os.environ.get("WT", "f16") or None  # TEMP
PENALTY_LAST_N = 64


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
    """Counters of a running engine (read without a lock: monotone ints)."""

    slots: int
    busy: int = 0
    max_busy: int = 0
    queued: int = 0
    requests: int = 0
    decode_calls: int = 0
    reused_tokens: int = 0  # prompt tokens served from a slot's cache
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "slots": self.slots,
            "busy": self.busy,
            "max_busy": self.max_busy,
            "queued": self.queued,
            "requests": self.requests,
            "decode_calls": self.decode_calls,
            "reused_tokens": self.reused_tokens,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
        }


@dataclass
class _Request:
    prompt: list[int]
    params: SamplingParams
    future: Future[Generation]


@dataclass
class _Slot:
    """A request being served by sequence ``seq_id`` of the context."""

    seq_id: int
    request: _Request
    sampler: Any  # llama_sampler_p
    prefilled: int = 0  # prompt tokens already in this sequence's KV cache or batch
    n_past: int = 0  # tokens in this sequence's KV cache
    pending: int | None = None  # sampled token still to be decoded
    reused: int = 0  # prompt tokens found in the KV cache from the slot's last request
    generated: list[int] = field(default_factory=list)
    pieces: bytearray = field(default_factory=bytearray)
    logits_at: int = -1  # batch index of this slot's logits in the current step

    @property
    def prefilling(self) -> bool:
        return self.prefilled < len(self.request.prompt)


WEIGHT_TYPES = {
    "f16": "LLAMA_FTYPE_MOSTLY_F16",
    "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0",
    "q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0",
}


def convert_weights(source: Path, weight_type: str, cache_dir: Path) -> Path:
    """``source`` re-encoded as ``weight_type`` (a file in ``cache_dir``, made once).

    llama.cpp's CPU backend has matrix-matrix kernels (llamafile's tinyBLAS, repacked
    layouts) for F16, Q8_0 and Q4_0 but none for Q4_1, the packaged SmolLM2's type: a
    batch of eight sequences then costs eight single-sequence steps. Converting Q4_1 to
    F16 is exact up to F16 rounding of the dequantised weights; the file is written
    next to nothing private (it is the public model) and reused while the source's
    size and modification time are unchanged.
    """
    import llama_cpp

    if weight_type not in WEIGHT_TYPES:
        raise ValueError(f"weight_type must be one of {sorted(WEIGHT_TYPES)}")
    stat = source.stat()
    target = cache_dir / f"{source.stem}.{stat.st_size}-{int(stat.st_mtime)}.{weight_type}.gguf"
    if target.is_file():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, WEIGHT_TYPES[weight_type])
    params.allow_requantize = True
    params.nthread = 1
    try:
        code = llama_cpp.llama_model_quantize(str(source).encode(), str(partial).encode(), params)
        if code != 0:
            raise EngineError(f"llama.cpp could not convert the model to {weight_type}")
        os.replace(partial, target)  # atomic: a concurrent starter sees all or nothing
    finally:
        partial.unlink(missing_ok=True)
    return target


def default_threads() -> int:
    """Half the CPUs, at least one: llama.cpp's threads spin at barriers, so on cores
    shared with other work more threads can be much slower (one per physical core is
    llama.cpp's own rule of thumb)."""
    return max(1, (os.cpu_count() or 2) // 2)


class BatchEngine:
    """A gguf model decoding up to ``slots`` chat completions at once.

    ``start()`` loads the model and starts the scheduler thread; ``close()`` stops it
    (requests still waiting fail with :class:`EngineError`) and frees the model.
    """

    def __init__(
        self,
        model_path: Path | str,
        *,
        slots: int = DEFAULT_SLOTS,
        ctx_per_slot: int = DEFAULT_CTX_PER_SLOT,
        threads: int | None = None,
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
        if batch_size < 32:
            raise ValueError("batch_size must be at least 32")
        if weight_type is not None and weight_type not in WEIGHT_TYPES:
            raise ValueError(f"weight_type must be one of {sorted(WEIGHT_TYPES)} or None")
        self.model_path = Path(model_path)
        self.slots = slots
        self.ctx_per_slot = ctx_per_slot
        self.threads = threads or default_threads()
        self.batch_size = batch_size
        self.weight_type = weight_type
        self.cache_dir = cache_dir
        self.verbose = verbose
        self.stats = EngineStats(slots=slots)
        self._queue: queue.Queue[_Request | None] = queue.Queue()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._model: Any = None
        self._ctx: Any = None
        self._vocab: Any = None
        self._memory: Any = None
        self._batch: Any = None
        self._template: bytes | None = None
        self._n_vocab = 0
        self._active: dict[int, _Slot] = {}
        self._cached: list[list[int]] = [[] for _ in range(slots)]  # tokens in each KV stream

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> BatchEngine:
        import llama_cpp

        if self._thread is not None:
            return self
        if not self.verbose:
            from llama_cpp import _logger

            _logger.set_verbose(False)  # llama.cpp's log goes to stderr only at ERROR
        llama_cpp.llama_backend_init()
        path = self.model_path
        if self.weight_type is not None:
            temporary = Path(tempfile.gettempdir()) / "keyseed-llm"
            try:
                path = convert_weights(path, self.weight_type, self.cache_dir or temporary)
            except OSError:  # a read-only cache folder: convert into the temporary one
                path = convert_weights(path, self.weight_type, temporary)
        model_params = llama_cpp.llama_model_default_params()
        model_params.n_gpu_layers = 0
        model_params.use_mlock = False  # locking fails under container memlock limits
        model = llama_cpp.llama_model_load_from_file(str(path).encode(), model_params)
        if not model:
            raise EngineError(f"llama.cpp could not load {self.model_path.name}")
        self._model = model
        ctx_params = llama_cpp.llama_context_default_params()
        ctx_params.n_ctx = self.slots * self.ctx_per_slot
        ctx_params.n_batch = self.batch_size
        ctx_params.n_ubatch = self.batch_size
        ctx_params.n_seq_max = self.slots
        ctx_params.n_threads = self.threads
        ctx_params.n_threads_batch = self.threads
        ctx_params.kv_unified = os.environ.get("KVU") == "1"  # TEMP
        ctx_params.no_perf = True
        ctx = llama_cpp.llama_init_from_model(model, ctx_params)
        if not ctx:
            llama_cpp.llama_model_free(model)
            self._model = None
            raise EngineError("llama.cpp could not create a context")
        self._ctx = ctx
        self._vocab = llama_cpp.llama_model_get_vocab(model)
        self._n_vocab = llama_cpp.llama_vocab_n_tokens(self._vocab)
        self._memory = llama_cpp.llama_get_memory(ctx)
        self._batch = llama_cpp.llama_batch_init(self.batch_size, 0, 1)
        self._template = llama_cpp.llama_model_chat_template(model, None)
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="llm-batch-engine", daemon=True)
        self._thread.start()
        logger.info(
            "batch engine: %d slots × %d tokens, %d thread(s)",
            self.slots,
            self.ctx_per_slot,
            self.threads,
        )
        return self

    def close(self) -> None:
        import llama_cpp

        thread = self._thread
        if thread is not None:
            self._stopping.set()
            self._queue.put(None)  # wakes an idle scheduler
            thread.join()
            self._thread = None
        while True:  # nobody serves what is still queued
            try:
                request = self._queue.get_nowait()
            except queue.Empty:
                break
            if request is not None and request.future.set_running_or_notify_cancel():
                request.future.set_exception(EngineError("the engine stopped"))
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx is not None:
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
        if self._model is not None:
            llama_cpp.llama_model_free(self._model)
            self._model = None

    def __enter__(self) -> BatchEngine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- requests

    def chat_prompt(self, messages: Sequence[dict[str, str]]) -> list[int]:
        """The tokens of ``messages`` rendered with the model's chat template."""
        import llama_cpp

        if self._model is None:
            raise EngineError("the engine is not running")
        chat = (llama_cpp.llama_chat_message * len(messages))()
        keep = []  # the encoded strings must outlive the call
        for i, message in enumerate(messages):
            role = message["role"].encode()
            content = message["content"].encode()
            keep += [role, content]
            chat[i].role = role
            chat[i].content = content
        size = max(1024, 2 * sum(len(b) for b in keep) + 256)
        for _ in range(2):
            buffer = ctypes.create_string_buffer(size)
            length = llama_cpp.llama_chat_apply_template(
                self._template, chat, len(messages), True, buffer, size
            )
            if length < 0:
                raise EngineError("the model's chat template is not supported by llama.cpp")
            if length <= size:
                return self.tokenize(buffer.raw[:length], special=True)
            size = length + 1
        raise EngineError("the chat template output kept growing")

    def tokenize(self, text: bytes, *, special: bool) -> list[int]:
        import llama_cpp

        capacity = len(text) + 16
        tokens = (llama_cpp.llama_token * capacity)()
        count = llama_cpp.llama_tokenize(
            self._vocab, text, len(text), tokens, capacity, True, special
        )
        if count < 0:  # never for bytes → tokens, but llama.cpp asks us to check
            capacity = -count
            tokens = (llama_cpp.llama_token * capacity)()
            count = llama_cpp.llama_tokenize(
                self._vocab, text, len(text), tokens, capacity, True, special
            )
        return list(tokens[:count])

    def submit(self, prompt: list[int], params: SamplingParams) -> Future[Generation]:
        """Queue a completion of ``prompt`` (tokens); its future resolves when done."""
        if self._thread is None or self._stopping.is_set():
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
        self.stats.queued = self._queue.qsize()
        return future

    # ----------------------------------------------------------------- scheduler

    def _run(self) -> None:
        reason = "the engine stopped"
        try:
            while not self._stopping.is_set():
                self._admit()
                if self._active:
                    self._step()
        except Exception as exc:  # a llama.cpp failure: fail what is in flight, stop serving
            logger.error("batch engine stopped: %s", type(exc).__name__)
            reason = "the engine failed"
            self._stopping.set()
        finally:
            for slot in list(self._active.values()):
                self._forget(slot.seq_id)
                self._release(slot, error=EngineError(reason))

    def _forget(self, seq_id: int) -> None:
        import llama_cpp

        llama_cpp.llama_memory_seq_rm(self._memory, seq_id, -1, -1)
        self._cached[seq_id].clear()

    def _admit(self) -> None:
        """Move queued requests into free slots (block while there is nothing to do)."""
        while len(self._active) < self.slots:
            try:
                block = not self._active
                request = self._queue.get(block=block, timeout=0.5 if block else None)
            except queue.Empty:
                break
            if request is None:  # close() woke us
                break
            if not request.future.set_running_or_notify_cancel():
                continue  # the client gave up while queued
            self._assign(request)
        self.stats.busy = len(self._active)
        self.stats.max_busy = max(self.stats.max_busy, self.stats.busy)
        self.stats.queued = self._queue.qsize()

    def _assign(self, request: _Request) -> None:
        """Serve ``request`` in the free slot whose cached tokens share the longest prefix
        with its prompt (llama-server's prompt cache): only the rest is decoded again."""
        import llama_cpp

        prompt = request.prompt
        best, shared = -1, -1
        for seq_id in range(self.slots):
            if seq_id in self._active:
                continue
            common = _common_prefix(self._cached[seq_id], prompt)
            if common > shared:
                best, shared = seq_id, common
        shared = min(shared, len(prompt) - 1)  # the last prompt token is decoded for logits
        llama_cpp.llama_memory_seq_rm(self._memory, best, shared, -1)
        del self._cached[best][shared:]
        slot = _Slot(best, request, self._sampler(request.params))
        slot.prefilled = slot.n_past = slot.reused = shared
        self._active[best] = slot
        self.stats.requests += 1
        self.stats.reused_tokens += shared

    def _sampler(self, params: SamplingParams) -> Any:
        import llama_cpp

        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        add = llama_cpp.llama_sampler_chain_add
        add(
            chain,
            llama_cpp.llama_sampler_init_penalties(
                self._n_vocab,
                PENALTY_LAST_N,
                params.repeat_penalty,
                params.frequency_penalty,
                params.presence_penalty,
            ),
        )
        if params.temperature <= 0.0:
            add(chain, llama_cpp.llama_sampler_init_greedy())
            return chain
        seed = params.seed if params.seed is not None else random.getrandbits(32)
        add(chain, llama_cpp.llama_sampler_init_top_k(params.top_k))
        add(chain, llama_cpp.llama_sampler_init_top_p(params.top_p, 1))
        add(chain, llama_cpp.llama_sampler_init_min_p(params.min_p, 1))
        add(chain, llama_cpp.llama_sampler_init_temp(params.temperature))
        add(chain, llama_cpp.llama_sampler_init_dist(seed & 0xFFFFFFFF))
        return chain

    def _step(self) -> None:
        """One ``llama_decode`` over every active slot, then one token per slot."""
        import llama_cpp

        batch = self._batch
        n = 0
        for slot in list(self._active.values()):
            slot.logits_at = -1
            if slot.pending is not None:  # generating: its last sampled token
                batch.token[n] = slot.pending
                batch.pos[n] = slot.n_past
                batch.n_seq_id[n] = 1
                batch.seq_id[n][0] = slot.seq_id
                batch.logits[n] = True
                slot.logits_at = n
                slot.n_past += 1
                self._cached[slot.seq_id].append(slot.pending)
                slot.pending = None
                n += 1
        for slot in self._active.values():  # prompts fill what is left of the batch
            prompt = slot.request.prompt
            while slot.prefilling and n < self.batch_size:
                batch.token[n] = prompt[slot.prefilled]
                batch.pos[n] = slot.n_past
                batch.n_seq_id[n] = 1
                batch.seq_id[n][0] = slot.seq_id
                self._cached[slot.seq_id].append(prompt[slot.prefilled])
                slot.prefilled += 1
                slot.n_past += 1
                last = not slot.prefilling
                batch.logits[n] = last
                if last:
                    slot.logits_at = n
                n += 1
        if n == 0:
            return
        batch.n_tokens = n
        code = llama_cpp.llama_decode(self._ctx, batch)
        self.stats.decode_calls += 1
        if code != 0:
            for slot in list(self._active.values()):
                self._forget(slot.seq_id)
                self._release(slot, error=EngineError(f"llama_decode returned {code}"))
            return
        for slot in list(self._active.values()):
            if slot.logits_at >= 0:
                self._advance(
                    slot, llama_cpp.llama_sampler_sample(slot.sampler, self._ctx, slot.logits_at)
                )

    def _advance(self, slot: _Slot, token: int) -> None:
        import llama_cpp

        params = slot.request.params
        if llama_cpp.llama_vocab_is_eog(self._vocab, token):
            self._finish(slot, "stop")
            return
        slot.generated.append(token)
        slot.pieces += self._piece(token)
        if params.stop:
            text = slot.pieces.decode("utf-8", errors="ignore")
            cut = min((text.find(s) for s in params.stop if s and s in text), default=-1)
            if cut >= 0:
                self._finish(slot, "stop", text=text[:cut])
                return
        full = slot.n_past + 1 >= self.ctx_per_slot
        if len(slot.generated) >= params.max_tokens or full:
            self._finish(slot, "length")
            return
        slot.pending = token

    def _piece(self, token: int) -> bytes:
        import llama_cpp

        size = 64
        while True:
            buffer = ctypes.create_string_buffer(size)
            length = llama_cpp.llama_token_to_piece(self._vocab, token, buffer, size, 0, False)
            if length >= 0:
                return buffer.raw[:length]
            size = -length

    def _finish(self, slot: _Slot, reason: str, *, text: str | None = None) -> None:
        prompt_tokens = len(slot.request.prompt)
        completion_tokens = len(slot.generated)
        if text is None:
            text = slot.pieces.decode("utf-8", errors="replace")
        self.stats.prompt_tokens += prompt_tokens
        self.stats.completion_tokens += completion_tokens
        self._release(slot, result=Generation(text, prompt_tokens, completion_tokens, reason))

    def _release(
        self,
        slot: _Slot,
        *,
        result: Generation | None = None,
        error: BaseException | None = None,
    ) -> None:
        import llama_cpp

        llama_cpp.llama_sampler_free(slot.sampler)
        del self._active[slot.seq_id]
        self.stats.busy = len(self._active)
        future = slot.request.future
        if error is not None:
            future.set_exception(error)
        elif result is not None:
            future.set_result(result)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
