"""DP-KPS's entry points in the methods registry's shape (:mod:`workers.methods.registry`).

:func:`plan_dpkps` gives the events of a run from its public parameters, label set and
vocabulary size, so the whole (ε, δ) is reserved before the first private read;
:func:`run_dpkps` runs it: the pipeline's steps 1-6 (:func:`generate_sequences`) on a
labelled private corpus, its keyphrase sequences released with their privacy report;
:func:`dpkps_outcome` gives that result in the shape every method's is saved in, and
:func:`dpkps_release` DP-KPS's part of a release's manifest, from the job's stored spec.
Prompting an LLM with the sequences is post-processing of the release, outside the run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from workers.errors import ConfigError
from workers.methods.dpkps.config import GenerationConfig, method_description
from workers.methods.dpkps.params import ENGINE_FIELDS, DPKPSParams, retired_settings
from workers.methods.dpkps.plan import Plan, plan
from workers.methods.outcome import RunOutcome
from workers.privacy.events import PrivacyEvent

if TYPE_CHECKING:  # types only: the pipeline loads numpy and torch
    from workers.methods.dpkps.pipeline import GenerationResult
    from workers.methods.dpkps.stages import ProgressFn
    from workers.text.embeddings import Embedder, EmbeddingCache
    from workers.text.vocabulary import Vocabulary

VOCABULARY_SOURCES = {"builtin": "built in", "uploaded": "uploaded"}
FINGERPRINT = "sha256 of the normalised phrases joined by newlines"

DESCRIPTION = (
    "DP-KPS (Nagesh et al., 2024): DP keyphrase sequences from per-class density releases, "
    "optionally written out by an LLM"
)


def plan_dpkps(
    params: DPKPSParams, label_set: Sequence[str], vocabulary_size: int | None = None
) -> list[PrivacyEvent]:
    """Every release of a run of ``params`` (public inputs only: the label set and the
    size of the vocabulary the run reads)."""
    return list(plan_of(params, label_set, vocabulary_size).events)


def plan_of(params: DPKPSParams, label_set: Sequence[str], vocabulary_size: int | None) -> Plan:
    """:func:`plan_dpkps` with the (ε, δ) the events compose to."""
    if vocabulary_size is None:
        raise ConfigError("DP-KPS plans with its vocabulary's size", field="vocabulary")
    return plan(params.generation_config(), label_set, vocabulary_size)


def run_dpkps(
    documents: Sequence[str],
    labels: Sequence[str],
    *,
    label_set: Sequence[str],
    units: Sequence[str] | None,
    params: DPKPSParams,
    vocabulary: Vocabulary,
    embedder: Embedder,
    cache: EmbeddingCache | None = None,
    progress: ProgressFn | None = None,
    unit_name: str | None = None,
    device: str | None = None,
    planned: Plan | None = None,
) -> GenerationResult:
    """A run of ``params`` on ``device`` (None: the GPU if torch sees one); ``planned``
    is the plan the ledger reserved (computed by the run if None)."""
    from workers.methods.dpkps.pipeline import generate_sequences

    return generate_sequences(
        documents,
        labels,
        label_set=label_set,
        vocabulary=vocabulary,
        config=params.generation_config(device),
        embedder=embedder,
        cache=cache,
        progress=progress,
        units=units,
        unit_name=unit_name,
        planned=planned,
    )


def dpkps_outcome(
    result: GenerationResult,
    params: DPKPSParams,
    label_set: Sequence[str],
    unit_name: str | None = None,
) -> RunOutcome:
    """A run's result as a :class:`RunOutcome`: its sequences in a seeded random order
    (classes interleaved), no texts yet (an LLM writes them afterwards, or each is its
    keyphrases), its manifest and privacy report as the engine gives them."""
    from workers.methods.dpkps.pipeline import shuffled

    ordered = shuffled(result.sequences, params.seed)
    manifest = result.manifest()
    if params.settings_not_applied:  # a stored spec's retired levers (RETIRED_LEVERS)
        manifest["settings_not_applied"] = params.settings_not_applied
    return RunOutcome(
        sequences=[(s.label, s.keyphrases) for s in ordered],
        texts=None,
        manifest=manifest,
        epsilon_by_mechanism=result.report.by_mechanism(),
        epsilon=float(result.report.epsilon),
        as_planned=result.report.as_planned,
        private_vocabulary=result.private_vocabulary,
    )


def stored_config(
    spec: Mapping[str, Any], ran: Mapping[str, Any] | None = None
) -> GenerationConfig:
    """A job's engine configuration, from its stored spec (validated at submission); a
    setting the spec left to the engine's default is read from what the engine says it ran
    (its manifest's parameters, ``ran``), so a later change of that default does not
    rewrite how an earlier job is described."""
    values = {name: spec[name] for name in ENGINE_FIELDS if name in spec}
    parameters = (ran or {}).get("parameters") or {}
    if values.get("consistency_filter") is None and isinstance(
        parameters.get("consistency_filter"), bool
    ):  # on with cells since the twenty-eighth session, off before
        values["consistency_filter"] = parameters["consistency_filter"]
    values.setdefault("subspace", 0)  # a job from before the option ran in the whole space
    values.setdefault("consistency_filter", False)  # and one from before this kept every draw
    return GenerationConfig(**values)


def density(config: GenerationConfig) -> dict[str, Any]:
    """How the class densities were estimated and released."""
    described: dict[str, Any] = {
        "method": config.density_method,
        "kernel": "gaussian",
        "bandwidth": config.bandwidth,
    }
    if config.density_method == "random_features":
        described["num_features"] = config.num_features
        described["contribution_bound"] = config.contribution_bound
    return described


def vocabulary_block(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The public vocabulary the job drew from: built in or uploaded, and its fingerprint
    (the service's ``vocabulary_ref``, resolved at submission)."""
    ref = spec["vocabulary_ref"]
    return {
        "source": VOCABULARY_SOURCES[ref["kind"]],
        "id": ref["id"],
        "name": ref["name"],
        "size": ref["size"],
        "fingerprint": ref["fingerprint"],
        "fingerprint_algorithm": FINGERPRINT,
    }


def dpkps_release(
    spec: Mapping[str, Any], ran: Mapping[str, Any], classes: int, saved: int
) -> dict[str, Any]:
    """DP-KPS's part of the manifest of a release of a job with the stored ``spec``, whose
    run recorded the manifest ``ran`` and saved ``saved`` sequences, on ``classes``
    declared labels: the method and density that ran, every parameter (the defaults that
    depend on the label set resolved, and a retired lever a run from before its removal
    ran with), the settings a stored spec asked for that its run no longer applied, the
    vocabulary, the prompt, the holdout's figure and the sequences drawn. Public: settings
    and DP outputs."""
    config = stored_config(spec, ran).for_classes(classes)  # default subspace: by labels
    resolved = config.to_dict()  # the defaults that depend on the mode, resolved
    parameters = {name: resolved[name] for name in ENGINE_FIELDS}
    parameters |= retired_settings(ran.get("parameters") or {})
    not_applied = ran.get("settings_not_applied")  # dpkps_outcome's
    return {
        "method": method_description(config),
        "parameters": parameters,
        **({"settings_not_applied": not_applied} if not_applied else {}),
        "density": density(config),
        "vocabulary": vocabulary_block(spec),
        "prompt": {
            "document_type": spec.get("document_type"),
            "few_shot_examples": len(spec.get("few_shot") or []),
            "template": spec.get("template"),
        },
        # the held-out slice's noisy accuracy (docs/utility.md): DP outputs, public key
        "utility": ran.get("utility"),
        # drawn from the releases before the consistency filter kept some (post-processing)
        "sequences_drawn": int(ran.get("sequences_drawn", saved)),
    }
