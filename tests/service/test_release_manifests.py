"""A release's manifest is built once, from the job's method's registry entry: each
method's manifest is what it was when DP-KPS and the LLM methods had builders of their own
(the JSON below was produced by those builders, on the same jobs)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from app.config import Settings
from app.models import Job
from app.releases import service as releases
from workers.methods.registry import METHODS

REF = {
    "kind": "builtin",
    "id": "medical",
    "name": "medical",
    "size": 5000,
    "fingerprint": "ab" * 32,
}
PRIVACY = {
    "accountant": "pld",
    "delta": 1e-6,
    "events": [{"mechanism": "kde"}],
    "unit": "row",
    "planned": {"events": [{"mechanism": "kde"}]},
}
SERVICE_PRIVACY = {
    "accountant": "pld",
    "adjacency": "one row of the uploaded file added or removed",
    "delta": 1e-06,
    "epsilon_by_mechanism": {"kde": 1.0},
    "epsilon_charged": 1.0,
    "events_charged": [{"mechanism": "kde"}],
    "events_released": [{"mechanism": "kde"}],
    "unit": "row",
}
JOB_ID = uuid.UUID(int=7)


def _costs(method: str) -> dict[str, Any]:
    return {
        "calls": 3,
        "completion_tokens": 0,
        "method": method,
        "prompt_tokens": 0,
        "wall_seconds": 0.0,
    }


def _manifest(
    settings: Settings, spec: dict[str, Any], ran: dict[str, Any] | None, saved: int
) -> dict[str, Any]:
    job = Job(
        id=JOB_ID,
        spec=spec,
        manifest=ran,
        epsilon=1.0,
        epsilon_by_mechanism={"kde": 1.0},
        llm_costs={"calls": 3},
        sequences_total=saved,
    )
    found = releases.manifest(job, settings, 5, 2)
    assert found.pop("created_at")
    return found


def test_a_dpkps_release_manifest(settings: Settings) -> None:
    spec = {
        "method": "dpkps",
        "vocabulary": "medical",
        "llm": "vllm",
        "document_type": "note",
        "epsilon": 1.0,
        "delta": 1e-6,
        "few_shot": ["an example"],
        "template": None,
        "vocabulary_ref": REF,
    }
    ran = {
        "method": "x",
        "parameters": {"consistency_filter": True},
        "embedding_model": "emb-x",
        "privacy": PRIVACY,
        "sequences": 9,
        "sequences_drawn": 12,
        "utility": {"accuracy": 0.5},
        "audit": {"seed": 1},
    }
    found = _manifest(settings, spec, ran, 9)
    assert found.pop("method").startswith("DP-KPS (Nagesh et al., 2024) with DP-KDE by the exact")
    assert found.pop("parameters")["consistency_filter"] is True  # as the engine ran it
    assert found == {
        "density": {"bandwidth": 0.3, "kernel": "gaussian", "method": "exact"},
        "documents": 5,
        "job_id": str(JOB_ID),
        "llm_costs": _costs("dpkps"),
        "method_id": "dpkps",
        "models": {
            "embedding": {"name": "emb-x"},
            "llm": {"endpoint": "vllm", "model": "open-model"},
        },
        "privacy": SERVICE_PRIVACY,
        "prompt": {"document_type": "note", "few_shot_examples": 1, "template": None},
        "sequences_drawn": 12,
        "utility": {"accuracy": 0.5},
        "vocabulary": {
            "fingerprint": "ab" * 32,
            "fingerprint_algorithm": "sha256 of the normalised phrases joined by newlines",
            "id": "medical",
            "name": "medical",
            "size": 5000,
            "source": "built in",
        },
    }


@pytest.mark.parametrize("applied", [True, False])
def test_a_dpkps_release_says_what_became_of_a_removed_lever(
    settings: Settings, applied: bool
) -> None:
    # a job stored asking for a lever since removed from the engine (issue 64): run before
    # the removal, it ran with it (its manifest's parameters say so); run after, it ran
    # without it (its manifest's settings_not_applied say so)
    spec = {
        "vocabulary": "medical",
        "llm": "none",
        "document_type": "note",
        "epsilon": 1.0,
        "delta": 1e-6,
        "noise": "gaussian",
        "label_prior_lead": 32.0,
        "document_window": 0,
        "vocabulary_ref": REF,
    }
    parameters = {"label_prior_lead": 32.0, "document_window": 0} if applied else {}
    ran: dict[str, Any] = {"parameters": parameters, "privacy": PRIVACY, "sequences": 9}
    if not applied:
        ran["settings_not_applied"] = {"label_prior_lead": 32.0}
    found = _manifest(settings, spec, ran, 9)
    assert found["parameters"].get("label_prior_lead") == (32.0 if applied else None)
    assert "document_window" not in found["parameters"]
    assert found.get("settings_not_applied") == (None if applied else {"label_prior_lead": 32.0})


def test_a_dpkps_job_without_an_engine_manifest_counts_its_saved_sequences_as_drawn(
    settings: Settings,
) -> None:
    spec = {
        "vocabulary": "medical",
        "llm": "local",
        "document_type": "note",
        "epsilon_kde": 0.5,
        "epsilon_vocab": 0.5,
        "kde_method": "random_features",
        "vocabulary_ref": REF,
    }
    found = _manifest(settings, spec, None, 3)
    assert found["sequences_drawn"] == 3 and found["utility"] is None
    assert found["density"]["method"] == "random_features"
    assert set(found["density"]) == {
        "method",
        "kernel",
        "bandwidth",
        "num_features",
        "contribution_bound",
    }
    assert found["models"]["llm"]["endpoint"] == "local"  # the packaged model
    assert found["models"]["embedding"]["name"] == "all-MiniLM-L6-v2"  # the packaged default
    assert found["privacy"] == {
        **SERVICE_PRIVACY,
        "accountant": "exact-sum",
        "delta": 0.0,
        "events_charged": [],
        "events_released": [],
    }


@pytest.mark.parametrize("method", ["aug-pe", "pate-tutor", "dp-eda"])
def test_an_llm_method_release_manifest(settings: Settings, method: str) -> None:
    spec = {"method": method, "llm": "vllm", "document_type": "note", "epsilon": 1.0}
    ran = {
        "description": "what ran",
        "parameters": {"population": 4},
        "labels": ["a", "b"],
        "noise": {"sigma": 1.0},
        "released_per_class": {"a": 2},
        "models": {"llm": "m1", "embedding": "e1"},
        "privacy": PRIVACY,
        "decoder": {"k": 1},  # a key of the method's own: shown as recorded
        "documents": 99,  # and one the service writes: the service's
    }
    assert _manifest(settings, spec, ran, 4) == {
        "decoder": {"k": 1},
        "documents": 5,
        "job_id": str(JOB_ID),
        "labels": ["a", "b"],
        "llm_costs": _costs(method),
        "method": "what ran",
        "method_id": method,
        "models": {"embedding": {"name": "e1"}, "llm": {"endpoint": "vllm", "model": "m1"}},
        "noise": {"sigma": 1.0},
        "parameters": {"population": 4},
        "privacy": SERVICE_PRIVACY,
        "prompt": {"document_type": "note"},
        "released_per_class": {"a": 2},
    }
    bare = _manifest(settings, {"method": method, "llm": "vllm"}, {}, 0)
    assert bare["method"] == METHODS[method].description
    assert bare["parameters"] == {} and bare["labels"] == [] and bare["noise"] == {}
    assert bare["models"]["llm"] == {"endpoint": "vllm", "model": "open-model"}
    assert bare["models"]["embedding"]["name"] == "all-MiniLM-L6-v2"  # the packaged default
