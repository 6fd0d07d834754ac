"""llama.cpp's C API, from the prebuilt CPU library of the ``llama-cpp-cffi`` wheel.

The batched engine (:mod:`workers.llm.engine`) calls llama.cpp's C functions directly.
They come from ``llama-cpp-cffi``, whose manylinux wheel ships llama.cpp compiled for the
portable x86-64 set (SSE3, AVX, AVX2, F16C, FMA, BMI2; no AVX-512, no AMX, so no
illegal instruction on a VM whose CPU reports more than its kernel grants) as a cffi
extension, ``llama/_llama_cpp_cpu``: nothing is compiled at install.

It is loaded here by file, not by ``import llama``:

* the package's ``__init__`` imports transformers and huggingface-hub (its chat
  formatter and model downloader, which keyseed does not use) and probes for CUDA and
  Vulkan to pick one of its three libraries; the CPU one is the only one keyseed wants;
* the library was linked against a newer libstdc++ than Debian 12's and names one
  symbol it lacks, ``__cxa_call_terminate`` (GCC 14's, called only while the C++
  runtime is already terminating the process). Python opens extensions with
  ``RTLD_NOW``, which refuses the library for that one name; opened with
  ``RTLD_LAZY`` a function is bound when first called, so the library loads and runs.

:func:`llama` returns ``(lib, ffi)`` once per process, with the backend initialised and
llama.cpp's log silenced (``verbose=True`` leaves it on stderr). ``lib`` releases the GIL
around every C call, so lanes decode while other threads tokenise and serve HTTP.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
from pathlib import Path
from typing import Any

PACKAGE = "llama"  # the import name of the llama-cpp-cffi distribution
CPU_LIBRARY = "_llama_cpp_cpu"

_lock = threading.Lock()
_loaded: tuple[Any, Any] | None = None


class LlamaCppMissing(ImportError):
    """llama-cpp-cffi's CPU library is not installed (or not for this platform)."""


def library_path() -> Path:
    """The CPU library's file in the installed ``llama`` package folder."""
    spec = importlib.util.find_spec(PACKAGE)  # finds the folder; runs no __init__
    if spec is None or not spec.submodule_search_locations:
        raise LlamaCppMissing("llama.cpp is not installed (pip install llama-cpp-cffi)")
    folder = Path(next(iter(spec.submodule_search_locations)))
    found = sorted(folder.glob(f"{CPU_LIBRARY}.*.so"))
    if not found:
        raise LlamaCppMissing(f"llama-cpp-cffi has no CPU library in {folder}")
    return found[0]


def _load(path: Path) -> tuple[Any, Any]:
    spec = importlib.util.spec_from_file_location(CPU_LIBRARY, path)
    if spec is None or spec.loader is None:
        raise LlamaCppMissing(f"cannot load {path.name}")
    flags = sys.getdlopenflags()
    sys.setdlopenflags(os.RTLD_LAZY | (flags & ~os.RTLD_NOW))
    try:
        module = importlib.util.module_from_spec(spec)  # dlopen() happens here
        spec.loader.exec_module(module)
    finally:
        sys.setdlopenflags(flags)
    return module.lib, module.ffi


def llama(*, verbose: bool | None = None) -> tuple[Any, Any]:
    """``(lib, ffi)``: llama.cpp's C API, loaded and initialised once per process.

    ``verbose`` False silences llama.cpp's log, True sends it to stderr, None (the
    default) leaves it as it is; it starts silenced.
    """
    global _loaded
    loaded = _loaded
    if loaded is not None and verbose is None:
        return loaded
    with _lock:
        if _loaded is None:
            lib, ffi = _load(library_path())

            @ffi.def_extern(name="llama_cpp_cffi_ggml_log_callback")  # type: ignore[untyped-decorator]
            def _quiet(level: Any, text: Any, user_data: Any) -> None:
                return None

            lib.llama_log_set(lib.llama_cpp_cffi_ggml_log_callback, ffi.NULL)
            lib.llama_backend_init()
            _loaded = lib, ffi
        lib, ffi = _loaded
        if verbose is not None:  # the callback drops every line; NULL restores stderr
            callback = ffi.NULL if verbose else lib.llama_cpp_cffi_ggml_log_callback
            lib.llama_log_set(callback, ffi.NULL)
        return _loaded
