"""The methods registry (workers.methods.registry): DP-KPS is an entry like the LLM
methods, its parameter model is the engine's configuration field for field, less the research levers
(docs/parameters.md), and a DP-KPS job stored before it had one, or while the levers were
public, reads and plans as it did; one that names a lever since removed from the engine
reads and plans as the engine now runs, and says which settings it no longer applies."""

from __future__ import annotations

import dataclasses
from decimal import Decimal

import pytest
from pydantic import ValidationError

from app.jobs import holdout
from app.jobs.schemas import JOB_SPEC, JobSpec
from app.jobs.stages import job_spec
from workers.errors import ConfigError
from workers.methods.aug_pe.params import AugPEParams
from workers.methods.catalog import METHOD_PARAMS
from workers.methods.dp_eda.params import DPEDAParams
from workers.methods.dpkps.config import GenerationConfig, method_description
from workers.methods.dpkps.params import (
    ENGINE_FIELDS,
    PUBLIC_FIELDS,
    RESEARCH_FIELDS,
    DPKPSParams,
)
from workers.methods.dpkps.plan import plan
from workers.methods.registry import DPKPS, LLM_CANARY_WORDS, LLM_METHODS, METHODS

LABELS = ["cardio", "ortho", "neuro"]
SPEC = {"vocabulary": "medical", "document_type": "note", "epsilon": 1.0, "delta": 1e-6}


def test_every_method_is_an_entry_and_dpkps_is_the_first() -> None:
    assert list(METHODS) == [DPKPS, *METHOD_PARAMS]
    assert list(LLM_METHODS) == list(METHOD_PARAMS)
    assert METHODS[DPKPS].params is DPKPSParams and not METHODS[DPKPS].writes_texts
    for method_id, params in METHOD_PARAMS.items():
        assert METHODS[method_id].params is params and METHODS[method_id].writes_texts


def test_the_parameter_model_is_the_engine_configuration_less_the_research_levers() -> None:
    engine = {f.name: f.default for f in dataclasses.fields(GenerationConfig)}
    assert set(DPKPSParams.model_fields) == {"vocabulary", *PUBLIC_FIELDS}
    assert set(PUBLIC_FIELDS) == set(ENGINE_FIELDS) - RESEARCH_FIELDS
    assert set(ENGINE_FIELDS) == set(engine) - {"device"}
    defaults = DPKPSParams(vocabulary="english").engine_parameters()  # noise: by delta
    assert defaults == {name: engine[name] for name in ENGINE_FIELDS}
    assert set(DPKPSParams.model_fields) <= set(JobSpec.model_fields)


def test_the_dpkps_entry_plans_and_describes_as_the_engine() -> None:
    params = DPKPSParams.model_validate({k: v for k, v in SPEC.items() if k != "document_type"})
    entry = METHODS[DPKPS]
    config = params.generation_config()
    assert entry.plan(params, LABELS, 30_000) == list(plan(config, LABELS, 30_000).events)
    assert entry.described(params, len(LABELS)) == method_description(
        config.for_classes(len(LABELS))
    )
    assert entry.vocabulary(params) == "medical"
    assert entry.planned_calls(params, 3) == entry.max_released(params, 3) == 300
    assert entry.released_field(params) == "per_class"
    with pytest.raises(ConfigError):
        entry.plan(params, LABELS)  # DP-KPS plans with its vocabulary's size


def test_a_job_stored_before_the_registry_reads_and_plans_as_before() -> None:
    stored = {  # a stored DP-KPS spec: no method, per-mechanism ε, the resolved vocabulary
        "vocabulary": "medical",
        "llm": "none",
        "document_type": "note",
        "epsilon_vocab": 0.5,
        "epsilon_kde": 0.5,
        "vocabulary_size": 200,
        "vocabulary_ref": {"kind": "builtin", "id": "medical", "name": "medical"},
    }
    spec = job_spec(stored)
    assert isinstance(spec, JobSpec) and spec.method == DPKPS
    fields = {k: v for k, v in stored.items() if k in ENGINE_FIELDS}
    # stored before embed_sample existed: every unit embedded, as the run was reserved
    config = GenerationConfig(**fields, embed_sample=0).validate()
    assert spec.params().generation_config() == config
    assert METHODS[spec.method].plan(spec.params(), LABELS, 5_000) == list(
        plan(config, LABELS, 5_000).events
    )
    assert JOB_SPEC.validate_python(spec.model_dump(mode="json")) == spec  # round trip


def test_a_job_stored_with_research_levers_reads_and_runs_with_them() -> None:
    # Stored while the levers were public: the spec recorded every one of them (a
    # model_dump), here at values no default reaches, and moments (a retired value).
    stored = {
        **SPEC,
        "llm": "none",
        "noise": "gaussian",
        "kde_method": "moments",
        "noise_floor": 1.0,
        "class_contrast": 2.0,
        "distinct": True,
        "vocabulary_ref": {"kind": "builtin", "id": "medical", "name": "medical"},
    }
    spec = job_spec(stored)
    assert isinstance(spec, JobSpec) and spec.method == DPKPS
    fields = {k: v for k, v in stored.items() if k in ENGINE_FIELDS}
    # stored before embed_sample existed: every unit embedded, as the run was reserved
    config = GenerationConfig(**fields, embed_sample=0).validate()
    params = spec.params()
    assert params.generation_config() == config  # the run's configuration, levers included
    assert (config.kde_method, config.noise_floor, config.class_contrast) == ("moments", 1.0, 2.0)
    assert METHODS[DPKPS].plan(params, LABELS, 30_000) == list(plan(config, LABELS, 30_000).events)
    assert METHODS[DPKPS].described(params, 3) == method_description(config.for_classes(3))
    resolved = METHODS[DPKPS].resolved(params, 3)
    assert resolved is not None and resolved["noise_floor"] == 1.0  # the dry run shows them
    assert "cell_share" not in resolved  # and no lever the spec did not record


# Removed from the engine (issue 64): each at the value a model_dump of a spec stored while
# they were job options recorded, and at values a submitter could have asked for.
REMOVED_AT_DEFAULTS = {
    "document_window": 0,
    "label_prior_lead": 0.0,
    "public_extension": 0,
    "extension_ratio": 15.0,
}
REMOVED_ASKED = {
    "document_window": 128,
    "label_prior_lead": 32.0,
    "public_extension": 100_000,
    "extension_ratio": 10.0,
}


@pytest.mark.parametrize(
    ("removed", "not_applied"),
    [
        (REMOVED_AT_DEFAULTS, {}),
        ({**REMOVED_AT_DEFAULTS, "extension_ratio": 10.0}, {}),  # read with an extension only
        (REMOVED_ASKED, REMOVED_ASKED),
        ({"document_window": 128}, {"document_window": 128}),
    ],
)
def test_a_job_stored_with_a_removed_lever_reads_and_plans_as_the_engine_now_runs(
    removed: dict[str, object], not_applied: dict[str, object]
) -> None:
    stored = {**SPEC, "llm": "none", "noise": "gaussian", "per_class": None, "total": 600}
    ref = {"vocabulary_ref": {"kind": "builtin", "id": "medical", "name": "medical"}}
    fresh = job_spec({**stored, **ref}).params()
    params = job_spec({**stored, **removed, **ref}).params()
    assert params.generation_config() == fresh.generation_config()
    assert params.settings_not_applied == not_applied
    entry = METHODS[DPKPS]
    assert entry.plan(params, LABELS, 30_000) == entry.plan(fresh, LABELS, 30_000)
    assert entry.described(params, 3) == entry.described(fresh, 3)
    assert entry.resolved(params, 3) == entry.resolved(fresh, 3)  # the dry run names none


def test_a_stored_spec_with_a_research_value_plans_its_releases_as_submitted() -> None:
    # the moments density and the thresholded vocabulary (Gaussian, exact kernel): the
    # planned releases of a job stored with them, their dimension and δ_thr as before
    # (every job stored before the default sample of 2026-12-08 recorded embed_sample 0)
    stored_moments = {**SPEC, "noise": "gaussian", "kde_method": "moments", "embed_sample": 0}
    moments = job_spec(stored_moments).params()
    (kde,) = {e.dimension for e in METHODS[DPKPS].plan(moments, LABELS, 30_000)}
    assert kde == 384 + 384 * 385 // 2
    stored = {**SPEC, "noise": "gaussian", "kde_method": "exact", "vocabulary_method": "threshold"}
    events = METHODS[DPKPS].plan(job_spec(stored).params(), LABELS, 30_000)
    assert [(e.mechanism, e.delta) for e in events if e.delta is not None] == [
        ("vocabulary", Decimal("5E-7"))
    ]


def test_a_job_stored_before_the_default_sample_plans_as_it_was_reserved() -> None:
    # a spec stored before embed_sample existed (no such key) or while its default was 0
    # embedded every unit: no count release; one submitted now stores null, the sample
    centroid = {**SPEC, "noise": "gaussian", "kde_method": "centroid"}
    entry = METHODS[DPKPS]
    for stored in (centroid, {**centroid, "embed_sample": 0}):
        events = entry.plan(job_spec(stored).params(), LABELS, 30_000)
        assert {e.mechanism for e in events} == {"kde"}
    submitted = JobSpec.model_validate({**centroid, "llm": "none"}).model_dump(mode="json")
    assert submitted["embed_sample"] is None
    events = entry.plan(job_spec(submitted).params(), LABELS, 30_000)
    assert {e.mechanism for e in events} == {"class_counts", "kde"}


def test_a_new_spec_naming_a_research_lever_is_refused_naming_it() -> None:
    for extra, kind in (
        ({"noise_floor": 0.0}, "research_option"),
        ({"kde_method": "moments"}, "research_option"),
        ({"bandwidth": 0.3}, "research_option"),
        ({"document_window": 0}, "retired_option"),  # removed from the engine, even at 0
    ):
        with pytest.raises(ValidationError) as caught:
            JobSpec.model_validate({**SPEC, **extra})
        (error,) = caught.value.errors()
        assert error["loc"] == (next(iter(extra)),) and error["type"] == kind
    new = DPKPSParams.model_validate({k: v for k, v in SPEC.items() if k != "document_type"})
    assert METHODS[DPKPS].resolved(new, 3).keys() == set(PUBLIC_FIELDS)  # type: ignore[union-attr]


@pytest.mark.parametrize("method", ["aug-pe", "pate-tutor", "dp-eda"])
def test_an_llm_method_s_dry_run_shows_its_holdout_s_cost(method: str) -> None:
    """An LLM method's job spec takes a holdout and canaries (neither reaches its
    parameters); its dry run's utility block costs the slice in parallel with the run."""
    from app.jobs.service import planned_run

    spec = {k: v for k, v in SPEC.items() if k != "vocabulary"}
    key = {"fraction": 0.2, "key": "registry-test-key"}
    job = JOB_SPEC.validate_python({**spec, "method": method, "holdout": key})
    assert job.audit_canaries == 64 and job.holdout is not None
    params = job.params().to_dict()
    assert "holdout" not in params and "audit_canaries" not in params
    generation = planned_run(job, LABELS, None)
    the_plan = holdout.plan(job, generation, len(LABELS))
    assert the_plan.epsilon == generation.epsilon  # ε_eval defaults to the generation's
    block = holdout.dry_run_block(job, the_plan, generation, 1_000, len(LABELS))
    assert block is not None and block["holdout"] is True and block["extra_epsilon"] == 0.0
    assert "the same as the generation alone" in block["cost"]
    assert block["expected_slice_units"] == 200
    off = JOB_SPEC.validate_python({**spec, "method": method, "audit_canaries": 0})
    assert off.holdout is None and off.audit_canaries == 0
    assert holdout.dry_run_block(off, generation, generation, None, 3)["holdout"] is False  # type: ignore[index]
    for bad in (True, -1, 1001):
        with pytest.raises(ValidationError):
            JOB_SPEC.validate_python({**spec, "method": method, "audit_canaries": bad})


def test_what_each_entry_says_its_run_takes() -> None:
    dpkps = METHODS[DPKPS]
    assert dpkps.supports_holdout and dpkps.takes_unit_and_device
    assert dpkps.canary_phrases is not None
    params = DPKPSParams.model_validate({k: v for k, v in SPEC.items() if k != "document_type"})
    config = params.generation_config()
    public = config.vocabulary_selection == "public"
    assert dpkps.canary_phrases(params, 5_000) == (config.candidate_count if public else 5_000)
    for method in LLM_METHODS.values():
        assert method.supports_holdout and not method.takes_unit_and_device
        assert method.canary_phrases is not None and method.canary_words_from == "english"
    # Aug-PE and PATE-tutor read no vocabulary: their canaries take the rare half of the
    # first LLM_CANARY_WORDS English words; DP-EDA's the vocabulary its decoder reads
    aug_pe = AugPEParams(document_type="note", epsilon=1.0, delta=1e-5)
    assert METHODS["aug-pe"].canary_phrases(aug_pe, 300_000) == LLM_CANARY_WORDS  # type: ignore[misc]
    assert METHODS["aug-pe"].canary_phrases(aug_pe, 2_000) == 2_000  # type: ignore[misc]
    eda = DPEDAParams(document_type="note", epsilon=1.0, delta=1e-5, vocabulary="medical")
    assert METHODS["dp-eda"].vocabulary(eda) == "medical"
    assert METHODS["dp-eda"].canary_phrases(eda, 90_000) == 90_000  # type: ignore[misc]


def test_an_llm_method_result_is_saved_as_its_texts_with_the_unit_and_the_planned_events() -> None:
    from types import SimpleNamespace

    from workers.llm.client import LLMCosts
    from workers.methods.aug_pe.params import AugPEParams
    from workers.privacy.accountant import compose, epsilon_by_mechanism

    entry = METHODS["aug-pe"]
    params = AugPEParams(document_type="note", epsilon=1.0, delta=1e-5)
    events = entry.plan(params, LABELS)
    result = SimpleNamespace(
        records=[("cardio", "a text"), ("ortho", "another")],
        events=events,
        manifest={"description": "ran", "privacy": {"epsilon": 1.0}},
        llm_costs=LLMCosts(),
    )
    found = entry.outcome(result, params, LABELS, "patient")
    assert found.as_planned and found.texts == ["a text", "another"]
    assert found.sequences == [("cardio", ()), ("ortho", ())]
    assert found.released() == [("cardio", "a text"), ("ortho", "another")]
    assert found.epsilon_by_mechanism == epsilon_by_mechanism(events, 1e-5)
    assert found.epsilon == float(compose(events).epsilon(1e-5))
    assert found.manifest["privacy"] == {
        "epsilon": 1.0,
        "unit": "patient",
        "planned": {"events": [e.to_dict() for e in events]},
    }
    assert found.llm_costs is result.llm_costs and found.private_vocabulary is None
    other = entry.outcome(
        SimpleNamespace(**{**vars(result), "events": events[:-1]}), params, LABELS, None
    )
    assert not other.as_planned and other.manifest["privacy"]["unit"] == "row"
