"""llama.cpp from llama-cpp-cffi's prebuilt CPU library (``workers.llm.llamacpp``).

What is shown: the library loads on this machine (Debian 12's libstdc++ lacks one symbol
it names; it is opened lazily) without importing the ``llama`` package, once per process;
it is the portable x86-64 build (AVX2, FMA, F16C; no AVX-512, which would stop with
SIGILL where the kernel does not grant it); a missing install is a clear error naming the
package; and asking for llama-cpp-python's reference server where it is not installed is
a ConfigError naming the field.
"""

from __future__ import annotations

import importlib.util
import sys

import pytest

from workers.errors import ConfigError
from workers.llm import llamacpp
from workers.llm.local import LocalLLMServer


def test_the_prebuilt_library_loads_once_without_its_package() -> None:
    lib, ffi = llamacpp.llama()
    assert llamacpp.llama() == (lib, ffi)
    assert "llama" not in sys.modules  # its __init__ imports transformers and probes GPUs
    assert llamacpp.library_path().name.startswith("_llama_cpp_cpu.")
    params = lib.llama_context_default_params()
    assert params.n_ctx > 0 and params.n_seq_max >= 1


def test_it_is_the_portable_cpu_build() -> None:
    lib, ffi = llamacpp.llama()
    info = ffi.string(lib.llama_print_system_info()).decode()
    for feature in ("AVX2 = 1", "FMA = 1", "F16C = 1"):
        assert feature in info
    assert "AVX512" not in info and "AMX" not in info


def test_a_missing_install_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == llamacpp.PACKAGE else real(name, *a),
    )
    with pytest.raises(llamacpp.LlamaCppMissing, match="pip install llama-cpp-cffi"):
        llamacpp.library_path()


@pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is not None, reason="llama-cpp-python is installed"
)
def test_the_reference_server_needs_its_extra() -> None:
    with pytest.raises(ConfigError) as caught:
        LocalLLMServer(engine="llama-cpp-python", slots=1)
    assert caught.value.field == "engine" and "[reference]" in caught.value.message
