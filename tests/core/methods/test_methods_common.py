"""What every LLM method's run shares (``workers/methods/common.py``): the run's identity
that ties its checkpoints to its public configuration."""

from __future__ import annotations

import doctest
import hashlib
import json
from types import SimpleNamespace

import pytest

from workers.errors import ConfigError
from workers.llm.client import LLMEndpoint
from workers.methods import common
from workers.methods.checkpoints import MemoryCheckpoints
from workers.methods.common import MethodParams, claim_checkpoints, run_identity

PARAMS = MethodParams(document_type="discharge note", epsilon=1.0, delta=1e-6, concurrency=8)


def identity(params: MethodParams = PARAMS, **extra: object) -> dict[str, object]:
    run = SimpleNamespace(
        params=params,
        labels=("Cardiology", "Oncology"),
        endpoint=LLMEndpoint(base_url="http://127.0.0.1:9", model="gpt-x"),
        embedder=SimpleNamespace(name="minilm"),
    )
    return run_identity("aug-pe", run, unit_level=False, **extra)


def test_doctests_hold() -> None:
    assert doctest.testmod(common, raise_on_error=True).attempted >= 3


# the identity each runner built inline before run_identity existed: checkpoints written
# then carry its fingerprint
INLINE = {
    "method": "aug-pe",
    "parameters": {"document_type": "discharge note", "epsilon": 1.0, "delta": 1e-6, "seed": 0},
    "labels": ["Cardiology", "Oncology"],
    "unit_level": False,
    "llm_model": "gpt-x",
    "embedding_model": "minilm",
}


def test_the_identity_is_the_public_configuration_without_concurrency() -> None:
    assert identity() == INLINE
    assert identity(pool="abc") == {**INLINE, "pool": "abc"}


def test_checkpoints_written_before_the_shared_identity_stay_valid() -> None:
    checkpoints = MemoryCheckpoints()
    digest = hashlib.sha256(json.dumps(INLINE, sort_keys=True).encode()).hexdigest()
    checkpoints.save("run", json.dumps({"method": "aug-pe", "fingerprint": digest}).encode())
    claim_checkpoints(checkpoints, "run", identity())  # accepted: a resume is not refused


def test_a_resume_may_change_concurrency_but_not_the_parameters() -> None:
    checkpoints = MemoryCheckpoints()
    claim_checkpoints(checkpoints, "run", identity())
    claim_checkpoints(checkpoints, "run", identity(PARAMS.model_copy(update={"concurrency": 2})))
    with pytest.raises(ConfigError, match="other parameters"):
        claim_checkpoints(checkpoints, "run", identity(PARAMS.model_copy(update={"seed": 7})))
    with pytest.raises(ConfigError, match="other parameters"):
        claim_checkpoints(checkpoints, "run", identity(pool="another pool"))
