"""A release report: what a privacy officer signs, in words and figures (issue 66, item 1).

One model (:class:`ReleaseReport`) is built from the release, its manifest (method,
parameters, models, privacy block), the ledger (the dataset's spend after this release,
the organisation's budget) and the job's released documents; the JSON, the HTML page
and the PDF are three renderings of it. The words are generated from the data: the
unit of protection from the manifest's ``unit``, the meaning of (ε, δ) from the figures,
the parallel composition from the events' partitions.

Who sees what (docs/privacy.md): the report is built for a *view*:

* ``owner`` (the releasing organisation) sees everything below, and its dataset's raw
  counts (documents stored, rows skipped), which are not DP;
* ``platform`` (admins, auditors) sees every figure that is a function of DP outputs
  and public inputs: the guarantee, the ledger and the budget, the grantees, the
  documents asked and released per class; never a document (released corpora are read
  by the owner and the grantees only);
* ``grantee`` (a client organisation granted the release) sees the guarantee, the spend
  of this release, its own grant, the per-class counts and sample documents; not the
  owner's ledger or budget (which clients never read) nor the other grantees.

Every view gets the prompt log's attestation (``prompt_log``: how many prompts, the head
hash the log at ``/v1/releases/{id}/prompts`` must end on, and the command that checks
it: docs/attestation.md).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from decimal import Decimal
from math import exp
from typing import Any, Literal

from pydantic import BaseModel, Field
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.datasets import repository as datasets_repo
from app.errors import NotFound
from app.identity import repository as identity_repo
from app.identity.policy import Principal
from app.jobs import repository as jobs_repo
from app.jobs import service as jobs
from app.ledger import repository as ledger_repo
from app.ledger import service as ledger
from app.ledger.schemas import OrganisationBudgetOut
from app.models import Dataset, Job, KeyphraseSequence, Release
from app.releases import prompts as release_prompts
from app.releases import service as releases
from app.schemas import with_examples

View = Literal["owner", "grantee", "platform"]
NOT_RECORDED = "not recorded"
SAMPLES = 5  # sample documents at most: one a class, in the declared order
SAMPLE_CHARACTERS = 600  # of each sample's text
SPEND_NOTE = (
    "Each mechanism's ε is its releases composed alone; the job's ε is all of them "
    "composed by the accountant, which is less than their sum when noise is Gaussian."
)
VIEWS: dict[str, str] = {
    "owner": "The owner organisation's view: every figure, and its dataset's raw counts.",
    "grantee": (
        "A grantee's view: figures that are functions of the DP outputs and public inputs, "
        "this grant and sample documents; the owner's ledger and budget are not shown."
    ),
    "platform": (
        "A platform role's view (admin, auditor): figures that are functions of the DP "
        "outputs and public inputs; no released document."
    ),
}

# What the canaries cost (benchmarks/notes/2026-12-07-canary-audit.md): a constant
# statement, measured once, not a figure of this release.
CANARY_COST = (
    "Measured on AG News (3,000 private documents, 4 classes; the default DP-KPS run "
    "without LLM at ε = 1, δ = 1e-6), each run paired with one on the same noise without "
    "canaries: the 64 canaries (about 32 in the input, 8 a class) changed the downstream "
    "accuracy by at most one test text in 800 (mean difference 0.000 over 4 pairs). "
    "Their share of a class, and so their cost, grows where classes are small: 64 "
    "canaries over C classes add about 32/C public documents to each "
    "(benchmarks/notes/2026-12-07-canary-audit.md)."
)
_LLM_CANARY_SHARE = (
    " 64 canaries over C classes add about 32/C public documents to each class's private "
    "input (benchmarks/notes/2026-12-07-llm-method-audit.md)."
)
# What the canaries cost each LLM method's release, by method id (the note's sections of
# 2026-12-07 and 2026-12-08): constant statements, measured once, not figures of this release.
LLM_CANARY_COST: dict[str, str] = {
    "aug-pe": "Measured for Aug-PE on AG News (800 private documents, ε = 4, a public pool of "
    "3,000 AG News texts standing in for the LLM), each run paired with one on the same seeded "
    "noise without canaries: accuracy with minus without −0.046, 0.000 and +0.080 over 3 "
    "pairs (mean +0.011): no cost shows, but pairs this few cannot resolve one below about "
    "±0.05." + _LLM_CANARY_SHARE,
    "pate-tutor": "Measured for PATE-tutor on AG News (800 private documents, 15 teachers, "
    "240 of 800 candidates released, ε = 4, public AG News texts of each class standing in "
    "for the LLM), each run paired with one on the same seeded noise and teacher key without "
    "canaries: accuracy with minus without from −0.020 to +0.015 over 10 pairs (mean "
    "+0.003, sd 0.010): no cost shows; one of 0.01 or more would have." + _LLM_CANARY_SHARE,
    "dp-eda": "Measured for DP-EDA on AG News (3,000 private documents, one iteration, 40 "
    "public texts a class, K = 20, k = 4, 15 texts released, ε = 4, public AG News texts of "
    "each class standing in for the LLM), each run paired with one on the same seeded noise "
    "without canaries: in 6 of 10 pairs the canaries changed no released text; over the 10, "
    "accuracy with minus without from −0.048 to +0.055 (mean −0.002, sd 0.027): no cost "
    "shows, but a release this small cannot resolve one below about ±0.02." + _LLM_CANARY_SHARE,
}


def canary_cost(method_id: str) -> str:
    """What the audit's canaries were measured to cost, for the method that ran."""
    if method_id == "dpkps":
        return CANARY_COST
    return LLM_CANARY_COST.get(method_id, "Not measured for this method.")


# -- the model -------------------------------------------------------------------------


class Protection(BaseModel):
    unit: str = Field(description="The unit of protection as the manifest names it")
    unit_in_words: str = Field(description="What one neighbouring upload adds or removes")
    adjacency: str = Field(description="The neighbouring relation the guarantee is stated for")
    epsilon: float = Field(description="ε of the guarantee: all the job's releases composed")
    delta: float = Field(description="δ of the guarantee (0: pure ε-differential privacy)")
    guarantee_in_words: str = Field(description="What this (ε, δ) means for one unit")
    accountant: str = Field(description="The accountant that composed the job's releases")
    accountant_in_words: str = Field(description="How that accountant composes, in words")
    parallel_composition: str = Field(
        description="Which releases were made class by class, and why they compose in parallel"
    )


class MechanismSpend(BaseModel):
    mechanism: str = Field(description="The mechanism as the ledger's events name it")
    epsilon: float | None = Field(
        description="ε of this mechanism's releases composed alone (null: not recorded)"
    )
    events: int = Field(description="Noisy releases of this mechanism")
    per_class: bool = Field(description="Released class by class (composed in parallel)")
    delta_spent_outright: float = Field(
        default=0.0, description="The δ its releases spend outright, summed over its events"
    )


class DatasetSpend(BaseModel):
    epsilon_cap: float = Field(description="The dataset's ε cap")
    delta_cap: float = Field(description="The dataset's δ cap, at which its spend is composed")
    spent_after_this_release: float | None = Field(
        description="ε spent by the dataset's committed jobs up to and including this "
        "release's job, composed at the cap's δ (null: no finite ε)"
    )
    spent_now: float | None = Field(
        description="ε spent by all the dataset's committed jobs to date, composed at the "
        "cap's δ (null: no finite ε)"
    )
    reserved_now: float | None = Field(
        description="ε held for its queued and running jobs on top of spent_now (null: no finite ε)"
    )
    remaining_now: float | None = Field(
        description="ε the cap has left for new jobs (null: no finite ε)"
    )
    accountant: str = Field(description="What composed the dataset's spend")


class Spend(BaseModel):
    epsilon: float = Field(description="ε of this release: its job's releases composed")
    delta: float = Field(description="δ of this release")
    by_mechanism: list[MechanismSpend] = Field(
        description="This release's noisy releases, mechanism by mechanism"
    )
    dataset: DatasetSpend | None = Field(
        description="The dataset's ledger (owner and platform roles; null for a grantee)"
    )
    organisation_budget: OrganisationBudgetOut | None = Field(
        description="The owner organisation's budget (owner and platform roles; null for a grantee)"
    )
    note: str = Field(description="How the mechanisms' ε relate to the release's ε")


class Grantee(BaseModel):
    organisation_id: uuid.UUID = Field(description="The organisation")
    name: str = Field(description="The organisation's name ('not recorded' if it is gone)")


class ClassCount(BaseModel):
    label: str = Field(description="A declared class")
    asked: int | None = Field(
        description="Documents asked for the class (null: a total split by DP counts)"
    )
    drawn: int = Field(
        description="Keyphrase sequences the DP releases yielded for the class (a DP output)"
    )
    released: int = Field(description="Documents released for the class (a DP output)")
    flagged: bool = Field(description="The class received no documents")


class Released(BaseModel):
    release_id: uuid.UUID = Field(description="The release")
    name: str = Field(description="The release's name, as its owner gave it")
    job_id: uuid.UUID = Field(description="The job whose outputs were released")
    dataset_id: uuid.UUID = Field(description="The private dataset the job drew on")
    dataset_name: str = Field(description="That dataset's name")
    owner_organisation: Grantee = Field(
        description="The organisation that owns the dataset and made the release"
    )
    released_at: datetime = Field(description="When the release was made")
    released_by: str = Field(description="Who made the release (the actor's reference)")
    grantees: list[Grantee] = Field(
        description="The client organisations granted the release, by name (a grantee's "
        "view: its own grant only)"
    )
    documents_asked: int = Field(
        description="Documents the job spec asked for (a public input, not a DP output)"
    )
    documents_released: int = Field(description="Documents released over every class (a DP output)")
    classes: list[ClassCount] = Field(
        description="Asked, drawn and released per declared class, in the declared order"
    )
    classes_without_documents: list[str] = Field(
        description="The declared classes that received no documents"
    )
    summary: str = Field(description="The counts above in one sentence")
    dataset_raw_counts: dict[str, int] | None = Field(
        description="The upload's raw counts (not DP): the owner's view only"
    )


class ModelInfo(BaseModel):
    role: str = Field(description="What the model did: embedding, or writing the texts")
    name: str = Field(description="The model's name as the manifest records it")
    version: str = Field(description="Its version or revision ('not recorded' if absent)")
    file_digest: str = Field(description="Its file's digest ('not recorded' if absent)")
    endpoint: str | None = Field(
        default=None,
        description="The LLM endpoint that ran it ('none': no LLM; null: not an LLM)",
    )


class Provenance(BaseModel):
    method: str = Field(description="The generation method, in words")
    method_id: str = Field(description="The generation method's id")
    keyseed_version: str = Field(description="The keyseed version that built this report")
    models: list[ModelInfo] = Field(description="The embedding model and the LLM the job used")
    vocabulary: dict[str, Any] = Field(
        description="The public vocabulary the phrases came from: source, id, size and "
        "fingerprint, as the manifest records them"
    )
    density: dict[str, Any] | None = Field(
        description="The density estimator's method, kernel and bandwidth (null: not recorded)"
    )
    parameters: dict[str, Any] = Field(
        description="The job's parameters, resolved, as the manifest records them"
    )
    prompt: dict[str, Any] = Field(
        description="How the LLM was prompted: document type, few-shot examples, template"
    )


class Sample(BaseModel):
    label: str = Field(description="The document's class")
    text: str = Field(
        description="The released text, its first 600 characters (empty: no LLM wrote texts)"
    )
    keyphrases: list[str] = Field(description="The DP keyphrase sequence behind the text")


class PromptAttestation(BaseModel):
    recorded: bool = Field(
        description="Whether the job's prompts were recorded (false: no LLM, or a job run "
        "before prompts were logged)"
    )
    prompts: int = Field(description="Prompts in the job's log (a retried prompt counts once)")
    head: str = Field(description="The hash of the log's last record: what the log must end on")
    algorithm: str = Field(description="How each record's hash is computed")
    log: str = Field(description="Where the log is served (JSONL), relative to the API")
    verify: str = Field(description="The one command that checks the log against this report")
    in_words: str = Field(description="What the log attests, in words")


class EmpiricalAudit(BaseModel):
    claimed_epsilon: float = Field(description="The ε the release claims (its guarantee)")
    epsilon_lower_bound: float = Field(
        description="The audit's empirical lower bound on ε at the confidence below: the "
        "largest ε the release's membership test refutes (0: it refutes none)"
    )
    confidence: float = Field(description="The confidence of the lower bound, 1 − β")
    delta: float = Field(description="The δ the bound was computed at (0: pure ε)")
    canaries: int = Field(description="m: canary documents made for the audit")
    included: int = Field(description="Canaries whose fair coin put them in the generation input")
    guesses: int = Field(description="k: canaries the membership test guessed (in or out)")
    correct: int = Field(description="r: guesses that were right")
    largest_possible_bound: float = Field(
        description="The bound if all k guesses were right: the most this audit can show"
    )
    exceeds_claim: bool = Field(
        description="The lower bound is above the claimed ε: the release leaks more than claimed"
    )
    copied_as_documents: int = Field(
        description="Canaries found whole in a released document (0: none was copied)"
    )
    finding_in_words: str = Field(description="What the audit found, for a privacy officer")
    method: str = Field(description="How the audit was made")
    canaries_in_release: str = Field(
        description="Why no canary is released as data, and how one may influence a release"
    )
    utility_cost: str = Field(description="What the canaries cost the release's utility")


_EXAMPLE_OWNER = "4ed587f1-4b72-4b96-85a4-1c2b6dd79496"
_EXAMPLE: dict[str, Any] = {
    "report": "keyseed release report",
    "view": "owner",
    "view_in_words": VIEWS["owner"],
    "protection": {
        "unit": "row",
        "unit_in_words": "one row of the uploaded file (one document, e.g. one clinical note) "
        "added or removed; a person with several rows is protected note by note",
        "adjacency": "one row of the uploaded file added or removed",
        "epsilon": 1.0,
        "delta": 0.0,
        "guarantee_in_words": "Whether or not one document is in the private corpus, every "
        "output of this release is at most e^ε = 2.71828 times as likely (ε = 1), so no one "
        "who sees the release can tell with confidence whether that document was used. δ = "
        "0: the bound holds without exception (pure ε-differential privacy).",
        "accountant": "exact-sum",
        "accountant_in_words": "exact-sum: every release is pure ε-DP and their ε add up "
        "exactly (releases made class by class count once)",
        "parallel_composition": "kde is released once per class (2 classes). Each document "
        "belongs to exactly one class, so adding or removing one document changes the "
        "releases of one class only: the per-class releases compose in parallel and cost "
        "what one class's release costs, not the sum over classes.",
    },
    "spend": {
        "epsilon": 1.0,
        "delta": 0.0,
        "by_mechanism": [
            {
                "mechanism": "vocabulary",
                "epsilon": 0.5,
                "events": 1,
                "per_class": False,
                "delta_spent_outright": 0.0,
            },
            {
                "mechanism": "kde",
                "epsilon": 0.5,
                "events": 2,
                "per_class": True,
                "delta_spent_outright": 0.0,
            },
        ],
        "dataset": {
            "epsilon_cap": 5.0,
            "delta_cap": 0.0,
            "spent_after_this_release": 1.0,
            "spent_now": 1.0,
            "reserved_now": 0.0,
            "remaining_now": 4.0,
            "accountant": "exact-sum",
        },
        "organisation_budget": {
            "organisation_id": _EXAMPLE_OWNER,
            "budget": {"epsilon": 20.0, "delta": 1e-05},
            "allocated": {"epsilon": 5.0, "delta": 0.0},
            "remaining": {"epsilon": 15.0, "delta": 1e-05},
            "datasets": 1,
            "spent": 1.0,
            "reserved": 0.0,
            "accountant": "exact-sum",
        },
        "note": SPEND_NOTE,
    },
    "released": {
        "release_id": "3d50f1ed-2e4b-4cf4-b3cb-c34c30cf1892",
        "name": "cardio v1",
        "job_id": "55e1d8d7-6b80-4702-898f-b185ca2be515",
        "dataset_id": "bead0433-a019-410a-903c-3291301fcfb1",
        "dataset_name": "discharge notes 2025",
        "owner_organisation": {"organisation_id": _EXAMPLE_OWNER, "name": "St Mary's Hospital"},
        "released_at": "2026-12-07T06:13:37.095909Z",
        "released_by": "key:8a06c7f8-ac2f-437a-8fc2-1967492eb788",
        "grantees": [
            {"organisation_id": "90e0710c-dbe9-45bd-9b58-c00d518018e5", "name": "Research Lab"}
        ],
        "documents_asked": 4,
        "documents_released": 3,
        "classes": [
            {"label": "cardio", "asked": 2, "drawn": 2, "released": 2, "flagged": False},
            {"label": "ortho", "asked": 2, "drawn": 1, "released": 1, "flagged": False},
        ],
        "classes_without_documents": [],
        "summary": "3 documents released of 4 asked, over 2 classes; every class received "
        "documents",
        "dataset_raw_counts": {"documents": 1200, "skipped_empty": 3, "skipped_duplicate": 7},
    },
    "provenance": {
        "method": "DP-KPS (Nagesh et al., 2024) with DP-KDE by the exact Gaussian kernel "
        "density on the private vocabulary",
        "method_id": "dpkps",
        "keyseed_version": "0.1.0",
        "models": [
            {
                "role": "embedding model",
                "name": "all-MiniLM-L6-v2",
                "version": "not recorded",
                "file_digest": "not recorded",
                "endpoint": None,
            },
            {
                "role": "LLM that wrote the texts",
                "name": "SmolLM2-135M-Instruct",
                "version": "0.1.2",
                "file_digest": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
                "endpoint": "local",
            },
        ],
        "vocabulary": {
            "source": "built in",
            "id": "medical",
            "name": "medical",
            "size": 138930,
            "fingerprint": "b6d4a7e06f5d092b6f72eb409203b7525ac563737470d848c31f643aaf2a8fdf",
            "fingerprint_algorithm": "sha256 of the normalised phrases joined by newlines",
        },
        "density": {"method": "exact", "kernel": "gaussian", "bandwidth": 0.3},
        "parameters": {
            "epsilon_vocab": 0.5,
            "epsilon_kde": 0.5,
            "per_class": 2,
            "total": None,
            "delta": 0.0,
            "noise": "laplace",
            "vocabulary_size": 50,
            "sequence_length": 8,
            "bandwidth": 0.3,
            "temperature": 0.7,
            "seed": 0,
        },
        "prompt": {"document_type": "clinical note", "few_shot_examples": 0, "template": None},
    },
    "prompt_log": {
        "recorded": True,
        "prompts": 4,
        "head": "5d41c7e0b1f0c1ab8c5a42b6f7e0f3a1f9d7c2b4e8a6d3c1b5f7e9a2c4d6e8f0",
        "algorithm": release_prompts.ALGORITHM,
        "log": "/v1/releases/6f1c2d8e-93a4-4b1e-8f3a-2c9d7e5b1a40/prompts",
        "verify": "keyseed verify-prompts "
        "<server>/v1/releases/6f1c2d8e-93a4-4b1e-8f3a-2c9d7e5b1a40/prompts "
        "--head 5d41c7e0b1f0c1ab8c5a42b6f7e0f3a1f9d7c2b4e8a6d3c1b5f7e9a2c4d6e8f0",
        "in_words": "4 prompts were sent to the LLM for this release's job, each recorded "
        "before it was sent, with the SHA-256 of every input it was built from: DP outputs "
        "(the released keyphrase sequences, or synthetic texts selected by noisy votes) and "
        "public inputs (document type, template, few-shot examples, declared labels, the "
        "model). Each record holds the hash of the one before; the last one's hash is "
        "5d41c7e0b1f0c1ab8c5a42b6f7e0f3a1f9d7c2b4e8a6d3c1b5f7e9a2c4d6e8f0. The log at "
        "/v1/releases/6f1c2d8e-93a4-4b1e-8f3a-2c9d7e5b1a40/prompts must end on it: run the "
        "command below (with KEYSEED_API_KEY set), which checks the chain and renders every "
        "prompt of DP-KPS (and of the methods' public prompts) again from its inputs.",
    },
    "samples": [
        {
            "label": "cardio",
            "text": "Patient admitted with worsening heart failure and exertional chest "
            "pain; started on diuretics.",
            "keyphrases": ["heart failure", "chest pain"],
        }
    ],
    "what_the_data_is_good_for": "3 synthetic documents written by an LLM, each labelled "
    "with one of 2 declared classes, made by DP-KPS (Nagesh et al., 2024) with DP-KDE by the "
    "exact Gaussian kernel density on the private vocabulary. They are suited to training "
    "and testing text classifiers and to exploring the vocabulary of each class; they are "
    "not records of real patients and must not be used to make decisions about any "
    "individual. Their fidelity is limited by the privacy noise: rare phrases and small "
    "classes are the first to be blurred.",
    "empirical_audit": {
        "claimed_epsilon": 1.0,
        "epsilon_lower_bound": 0.0,
        "confidence": 0.95,
        "delta": 0.0,
        "canaries": 64,
        "included": 31,
        "guesses": 32,
        "correct": 17,
        "largest_possible_bound": 2.32,
        "exceeds_claim": False,
        "copied_as_documents": 0,
        "finding_in_words": "The audit found no evidence that ε exceeds 0 (95% confidence; "
        "claimed ε = 1). This is a lower bound, not a proof: it can catch a release that "
        "leaks more than claimed (noise missing or too small), but it cannot show that the "
        "claim is tight, and with this many guesses it could never show more than ε = 2.32.",
        "method": "one-run audit (Steinke, Nasr & Jagielski, NeurIPS 2023) with canaries",
        "canaries_in_release": "Canaries are public documents; never stored as dataset rows "
        "and never released as documents.",
        "utility_cost": CANARY_COST,
    },
}


class ClassUtility(BaseModel):
    label: str = Field(description="A declared class")
    accuracy: float | None = Field(
        description="The class's noisy accuracy on the slice (null where the noise is too large)"
    )
    interval: list[float] | None = Field(
        description="Its noise interval [low, high] at the figure's confidence (null likewise)"
    )
    units: int = Field(description="The class's evaluated units in the slice (a DP output)")
    why_not: str | None = Field(description="Why the class's accuracy is not shown, if it is not")


class Utility(BaseModel):
    """The held-out slice's accuracy (docs/utility.md): every figure a DP output."""

    accuracy: float | None = Field(
        description="Accuracy of a classifier trained on the released corpus, on the units "
        "held out from generation: noisy correct ÷ noisy total (null: nothing to divide)"
    )
    interval: list[float] = Field(
        description="[low, high]: holds the slice's exact accuracy with probability ≥ "
        "confidence over the noise (conservative; sampling error not included)"
    )
    confidence: float = Field(description="The interval's confidence")
    useful: bool = Field(description="Whether the interval is within ±0.05")
    slice_units: int = Field(description="The slice's evaluated units (a DP output)")
    fraction: float = Field(description="The share of the units held out (public)")
    epsilon: float = Field(description="ε of the noisy counts, on the slice's units only")
    classifier: str = Field(description="The classifier trained on the released corpus")
    per_class: list[ClassUtility] = Field(
        description="Each class's accuracy where the noise allows"
    )
    in_words: str = Field(description="The figure in one sentence")


class ReleaseReport(BaseModel):
    model_config = with_examples(_EXAMPLE)

    report: Literal["keyseed release report"] = Field(
        default="keyseed release report", description="What this document is"
    )
    view: View = Field(description="Whose view this is (owner, grantee or platform)")
    view_in_words: str = Field(description="What this view shows and leaves out")
    protection: Protection = Field(description="The privacy guarantee, in figures and words")
    spend: Spend = Field(
        description="The privacy this release spent and, for the owner and platform roles, "
        "the dataset's ledger and the organisation's budget"
    )
    released: Released = Field(description="What was released, when, by whom and to whom")
    provenance: Provenance = Field(
        description="How the documents were made: method, models, vocabulary, parameters"
    )
    prompt_log: PromptAttestation = Field(
        description="The attestation that the LLM saw only DP outputs and public inputs: "
        "the hash-chained log of every prompt sent for the job, and how to verify it"
    )
    samples: list[Sample] | None = Field(
        description="A few released documents (owner and grantees; null for platform roles)"
    )
    what_the_data_is_good_for: str = Field(
        description="What the released documents are suited to, and their limits"
    )
    utility: Utility | None = Field(
        default=None,
        description="The accuracy measured, with noise, on a slice of the private units "
        "held out from generation (null: the job held out none)",
    )
    empirical_audit: EmpiricalAudit | None = Field(
        default=None,
        description="Empirical privacy evidence: a one-run canary audit's lower bound on ε "
        "next to the claimed ε (null: the job ran without canaries)",
    )


# -- words -----------------------------------------------------------------------------


def unit_in_words(unit: str) -> str:
    """What one neighbouring upload adds or removes, from the manifest's unit."""
    if unit == "row":
        return (
            "one row of the uploaded file (one document, e.g. one clinical note) added or "
            "removed; a person with several rows is protected note by note"
        )
    return (
        f"one patient (all rows sharing a unit id, the unit column '{unit}') added or "
        "removed: every document of that patient at once"
    )


def _number(value: float) -> str:
    return f"{value:.6g}"


def guarantee_in_words(epsilon: float, delta: float, unit: str) -> str:
    who = "one document" if unit == "row" else "one patient"
    text = (
        f"Whether or not {who} is in the private corpus, every output of this release is "
        f"at most e^ε = {_number(exp(min(epsilon, 700)))} times as likely (ε = "
        f"{_number(epsilon)}), so no one who sees the release can tell with confidence "
        f"whether that {who.split()[1]} was used."
    )
    if delta > 0:
        text += (
            f" δ = {delta:.3g} is the probability, at most, that this bound fails; it is "
            "far below one in the number of people in any corpus."
        )
    else:
        text += " δ = 0: the bound holds without exception (pure ε-differential privacy)."
    return text


def accountant_in_words(accountant: str) -> str:
    if accountant == "exact-sum":
        return (
            "exact-sum: every release is pure ε-DP and their ε add up exactly (releases "
            "made class by class count once)"
        )
    return (
        f"{accountant}: a privacy-loss-distribution accountant, which composes the "
        "releases' noise exactly (tighter than adding ε up) and states ε at the δ asked"
    )


def parallel_in_words(by_mechanism: Sequence[MechanismSpend], unit: str, classes: int) -> str:
    per_class = [m.mechanism for m in by_mechanism if m.per_class]
    who = "document" if unit == "row" else "patient"
    if not per_class:
        return "No release of this job is made class by class: all of them compose in sequence."
    return (
        f"{', '.join(per_class)} {'is' if len(per_class) == 1 else 'are'} released once "
        f"per class ({classes} classes). Each {who} belongs to exactly one class"
        f"{'' if unit == 'row' else ' (a patient with notes of several classes is kept in one)'}"
        f", so adding or removing one {who} changes the "
        "releases of one class only: the per-class releases compose in parallel and cost "
        "what one class's release costs, not the sum over classes."
    )


# -- building --------------------------------------------------------------------------


def _view(principal: Principal, release: Release) -> View:
    if principal.platform:
        return "platform"
    if principal.organisation_id == release.organisation_id:
        return "owner"
    return "grantee"


def _float(value: Any, default: float = 0.0) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def _by_mechanism(job: Job, events: Sequence[Mapping[str, Any]]) -> list[MechanismSpend]:
    grouped: dict[str, list[Mapping[str, Any]]] = {}
    for event in events:
        grouped.setdefault(str(event.get("mechanism")), []).append(event)
    figures = job.epsilon_by_mechanism or {}
    names = list(dict.fromkeys([*figures, *grouped]))
    out = []
    for name in names:
        group = grouped.get(name, [])
        value = figures.get(name)
        out.append(
            MechanismSpend(
                mechanism=name,
                epsilon=None if value is None else _float(value),
                events=sum(int(e.get("count") or 1) for e in group),
                per_class=any(e.get("partition") is not None for e in group),
                delta_spent_outright=sum(
                    _float(e.get("delta")) * int(e.get("count") or 1) for e in group
                ),
            )
        )
    return out


def _shown(value: Decimal) -> float | None:
    return None if value.is_infinite() else float(value)


def _dataset_spend(session: Session, dataset: Dataset, job_id: uuid.UUID) -> DatasetSpend:
    now, entries = ledger.ledger_of(session, dataset)
    upto: list[Any] = []
    for entry in entries:
        upto.append(entry)
        if entry.job_id == job_id and entry.kind == "commit":
            break
    after = ledger.budget_from(ledger.cap_of(dataset), upto)
    return DatasetSpend(
        epsilon_cap=float(dataset.epsilon_cap),
        delta_cap=float(dataset.delta_cap),
        spent_after_this_release=_shown(after.spent),
        spent_now=_shown(now.spent),
        reserved_now=_shown(now.reserved),
        remaining_now=_shown(now.remaining),
        accountant=now.accountant,
    )


def _counts_by_label(session: Session, job_id: uuid.UUID, *, texts: bool) -> dict[str, int]:
    query = select(KeyphraseSequence.label, func.count()).where(KeyphraseSequence.job_id == job_id)
    if texts:
        query = query.where(KeyphraseSequence.text.is_not(None))
    query = query.group_by(KeyphraseSequence.label)
    return {label: int(count) for label, count in session.execute(query).all()}


def _classes(session: Session, job: Job, labels: Sequence[str]) -> tuple[list[ClassCount], int]:
    texts_only = job.spec.get("llm", "local") != "none"
    drawn = _counts_by_label(session, job.id, texts=False)
    released = _counts_by_label(session, job.id, texts=texts_only)
    per_class = job.spec.get("per_class")
    total = job.spec.get("total")
    asked_each = int(per_class) if per_class and total is None else None
    classes = [
        ClassCount(
            label=label,
            asked=asked_each,
            drawn=drawn.get(label, 0),
            released=released.get(label, 0),
            flagged=released.get(label, 0) == 0,
        )
        for label in labels
    ]
    asked = int(total) if total is not None else (asked_each or 0) * len(labels)
    return classes, asked


def _samples(session: Session, job: Job, labels: Sequence[str]) -> list[Sample]:
    texts_only = job.spec.get("llm", "local") != "none"
    found: list[Sample] = []
    for label in labels:
        if len(found) >= SAMPLES:
            break
        query = select(KeyphraseSequence).where(
            KeyphraseSequence.job_id == job.id, KeyphraseSequence.label == label
        )
        if texts_only:
            query = query.where(KeyphraseSequence.text.is_not(None))
        row = session.scalars(query.order_by(KeyphraseSequence.position).limit(1)).first()
        if row is not None:
            found.append(
                Sample(
                    label=row.label,
                    text=(row.text or "")[:SAMPLE_CHARACTERS],
                    keyphrases=list(row.keyphrases),
                )
            )
    return found


def _text(value: Any) -> str:
    return NOT_RECORDED if value in (None, "") else str(value)


def _model(role: str, found: Any, endpoint: str | None = None) -> ModelInfo:
    """A model as the manifest records it: a name, or an object with whatever of name
    (or model), version and file digest (or digest, sha256) it holds."""
    if isinstance(found, Mapping):
        return ModelInfo(
            role=role,
            name=_text(found.get("name") or found.get("model")),
            version=_text(found.get("version") or found.get("revision")),
            file_digest=_text(
                found.get("file_digest") or found.get("digest") or found.get("sha256")
            ),
            endpoint=found.get("endpoint") or endpoint,
        )
    return ModelInfo(
        role=role,
        name=_text(found),
        version=NOT_RECORDED,
        file_digest=NOT_RECORDED,
        endpoint=endpoint,
    )


def _models(manifest: Mapping[str, Any]) -> list[ModelInfo]:
    models = manifest.get("models") or {}
    out = [_model("embedding model", models.get("embedding"))]
    llm = models.get("llm")
    endpoint = llm.get("endpoint") if isinstance(llm, Mapping) else None
    if endpoint == "none":
        out.append(
            ModelInfo(
                role="LLM",
                name="none: the release is keyphrase sequences, no LLM wrote texts",
                version="-",
                file_digest="-",
                endpoint="none",
            )
        )
    else:
        out.append(_model("LLM that wrote the texts", llm, endpoint))
    return out


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("keyseed")
    except PackageNotFoundError:
        return NOT_RECORDED


def _good_for(method: str, classes: list[ClassCount], released: int, llm: bool) -> str:
    kind = "synthetic documents written by an LLM" if llm else "keyphrase sequences"
    text = (
        f"{released} {kind}, each labelled with one of {len(classes)} declared classes, "
        f"made by {method}. They are suited to training and testing text classifiers and "
        "to exploring the vocabulary of each class; they are not records of real patients "
        "and must not be used to make decisions about any individual. Their fidelity is "
        "limited by the privacy noise: rare phrases and small classes are the first to be "
        "blurred."
    )
    empty = [c.label for c in classes if c.flagged]
    if empty:
        text += (
            f" {len(empty)} class{'es' if len(empty) > 1 else ''} received no documents "
            f"({', '.join(empty)}): a model trained on this release cannot learn "
            f"{'them' if len(empty) > 1 else 'it'}."
        )
    return text


def prompt_attestation(
    session: Session, job: Job, release: Release, view: View, *, llm_used: bool
) -> PromptAttestation:
    """The report's prompt-log section: the head the log must end on, and how to check it."""
    count, head = release_prompts.head(session, job.id)
    path = f"/v1/releases/{release.id}/prompts"
    verify = f"keyseed verify-prompts <server>{path} --head {head}"
    if count:
        words = (
            f"{count} prompt{'s were' if count != 1 else ' was'} sent to the LLM for this "
            "release's job, each recorded before it was sent, with the SHA-256 of every input "
            "it was built from: DP outputs (the released keyphrase sequences, or synthetic "
            "texts selected by noisy votes) and public inputs (document type, template, "
            "few-shot examples, declared labels, the model). Each record holds the hash of "
            f"the one before; the last one's hash is {head}. The log at {path} must end on "
            "it: run the command below (with KEYSEED_API_KEY set), which checks the chain "
            "and renders every prompt of DP-KPS (and of the methods' public prompts) again "
            "from its inputs."
        )
        if view == "platform":
            words += " Platform roles get the records without the prompts in clear."
    elif llm_used:
        words = (
            "No prompt of this job was recorded (it ran before keyseed logged prompts): "
            "nothing here attests what the LLM saw."
        )
    else:
        words = "No LLM was used: no prompt was sent, and the log is empty."
    return PromptAttestation(
        recorded=bool(count),
        prompts=count,
        head=head,
        algorithm=release_prompts.ALGORITHM,
        log=path,
        verify=verify,
        in_words=words,
    )


def utility_of(found: Mapping[str, Any] | None) -> Utility | None:
    """The report's utility section from the job's stored figure (DP outputs only)."""
    if not found:
        return None
    low, high = (float(x) for x in found["interval"])
    accuracy = found.get("accuracy")
    confidence = float(found["confidence"])
    per_class = [
        ClassUtility(
            label=label,
            accuracy=row.get("accuracy"),
            interval=row.get("interval"),
            units=int(row.get("units", 0)),
            why_not=row.get("why_not"),
        )
        for label, row in (found.get("per_class") or {}).items()
    ]
    shown = sum(1 for c in per_class if c.accuracy is not None)
    words = (
        f"A classifier trained on the released documents labels {accuracy:.1%} of the "
        if accuracy is not None
        else "No accuracy could be computed on the "
    )
    words += (
        f"{found['slice_units']} private units held out from generation correctly "
        f"(between {low:.1%} and {high:.1%} with {confidence:.0%} confidence over the noise, "
        f"ε = {float(found['epsilon']):g} on those units alone); {shown} of {len(per_class)} "
        "classes have an accuracy of their own"
        + ("" if shown == len(per_class) else ", the others too few for the noise")
        + "."
    )
    return Utility(
        accuracy=accuracy,
        interval=[low, high],
        confidence=confidence,
        useful=bool(found.get("useful")),
        slice_units=int(found["slice_units"]),
        fraction=float(found["fraction"]),
        epsilon=float(found["epsilon"]),
        classifier=str(found.get("classifier", "tfidf")),
        per_class=per_class,
        in_words=words,
    )


def build(session: Session, principal: Principal, release_id: uuid.UUID) -> ReleaseReport:
    """The report of one release for ``principal`` (who must reach it: else 404)."""
    release, grantee_ids = releases.get_release(session, principal, release_id)
    job = jobs_repo.get(session, release.job_id)
    dataset = datasets_repo.get(session, release.dataset_id)
    if job is None or dataset is None:
        raise NotFound("no such release")
    view = _view(principal, release)
    manifest: dict[str, Any] = release.manifest or {}
    privacy: dict[str, Any] = manifest.get("privacy") or {}
    # the engine's manifest names the unit column it ran with; without one, the dataset's
    ran = ((job.manifest or {}).get("privacy") or {}).get("unit")
    unit = str(ran or dataset.unit_column or "row")
    epsilon = _float(privacy.get("epsilon_charged", job.epsilon))
    delta = _float(privacy.get("delta"))
    accountant = str(privacy.get("accountant") or NOT_RECORDED)
    labels = list(dataset.labels)
    # the releases the ledger charged the job (its commit, else its reservation)
    entries = ledger_repo.entries_of_job(session, job.id)
    charged = entries.get("commit") or entries.get("reserve")
    events = charged.events if charged is not None else privacy.get("events_charged") or []
    by_mechanism = _by_mechanism(job, events)

    shown_ids = grantee_ids if view != "grantee" else [principal.organisation_id]
    organisations = identity_repo.organisations_by_id(
        session, [release.organisation_id, *shown_ids]
    )

    def organisation(org_id: uuid.UUID) -> Grantee:
        found = organisations.get(org_id)
        return Grantee(organisation_id=org_id, name=found.name if found else NOT_RECORDED)

    classes, asked = _classes(session, job, labels)
    released_total = sum(c.released for c in classes)
    empty = [c.label for c in classes if c.flagged]
    summary = f"{released_total} documents released of {asked} asked, over {len(labels)} classes"
    summary += (
        f"; {len(empty)} class{'es' if len(empty) > 1 else ''} received none: {', '.join(empty)}"
        if empty
        else "; every class received documents"
    )

    owner_or_platform = view in ("owner", "platform")
    spend = Spend(
        epsilon=epsilon,
        delta=delta,
        by_mechanism=by_mechanism,
        dataset=_dataset_spend(session, dataset, job.id) if owner_or_platform else None,
        organisation_budget=(
            ledger.organisation_budget_out(
                ledger.get_organisation_budget(session, release.organisation_id)
            )
            if owner_or_platform
            else None
        ),
        note=SPEND_NOTE,
    )
    method = str(manifest.get("method") or jobs.method_of(job.spec))
    llm_used = job.spec.get("llm", "local") != "none"
    return ReleaseReport(
        view=view,
        view_in_words=VIEWS[view],
        protection=Protection(
            unit=unit,
            unit_in_words=unit_in_words(unit),
            adjacency=(
                releases.ADJACENCY if unit == "row" else f"one unit ({unit}) added or removed"
            ),
            epsilon=epsilon,
            delta=delta,
            guarantee_in_words=guarantee_in_words(epsilon, delta, unit),
            accountant=accountant,
            accountant_in_words=accountant_in_words(accountant),
            parallel_composition=parallel_in_words(by_mechanism, unit, len(labels)),
        ),
        spend=spend,
        released=Released(
            release_id=release.id,
            name=release.name,
            job_id=release.job_id,
            dataset_id=dataset.id,
            dataset_name=dataset.name,
            owner_organisation=organisation(release.organisation_id),
            released_at=release.created_at,
            released_by=release.created_by,
            grantees=sorted((organisation(g) for g in shown_ids), key=lambda g: g.name),
            documents_asked=asked,
            documents_released=released_total,
            classes=classes,
            classes_without_documents=empty,
            summary=summary,
            dataset_raw_counts=(
                {
                    "documents": dataset.documents,
                    "skipped_empty": dataset.skipped_empty,
                    "skipped_duplicate": dataset.skipped_duplicate,
                }
                if view == "owner"
                else None
            ),
        ),
        provenance=Provenance(
            method=method,
            method_id=str(manifest.get("method_id") or jobs.method_of(job.spec)),
            keyseed_version=_version(),
            models=_models(manifest),
            vocabulary=manifest.get("vocabulary") or {"source": NOT_RECORDED},
            density=manifest.get("density"),
            parameters=manifest.get("parameters") or {},
            prompt=manifest.get("prompt") or {},
        ),
        prompt_log=prompt_attestation(session, job, release, view, llm_used=llm_used),
        samples=None if view == "platform" else _samples(session, job, labels),
        what_the_data_is_good_for=_good_for(method, classes, released_total, llm_used),
        utility=utility_of((job.manifest or {}).get("utility")),
        empirical_audit=_empirical_audit(
            manifest.get("empirical_audit"),
            str(manifest.get("method_id") or jobs.method_of(job.spec)),
        ),
    )


def _empirical_audit(found: Any, method_id: str) -> EmpiricalAudit | None:
    """The release manifest's audit block as the report shows it (the canaries and
    their coins stay in the manifest), with what canaries cost ``method_id``'s runs."""
    if not isinstance(found, Mapping):
        return None
    return EmpiricalAudit(
        claimed_epsilon=_float(found.get("claimed_epsilon")),
        epsilon_lower_bound=_float(found.get("epsilon_lower_bound")),
        confidence=_float(found.get("confidence")),
        delta=_float(found.get("delta")),
        canaries=int(found.get("canaries") or 0),
        included=int(found.get("included") or 0),
        guesses=int(found.get("guesses") or 0),
        correct=int(found.get("correct") or 0),
        largest_possible_bound=_float(found.get("largest_possible_bound")),
        exceeds_claim=bool(found.get("exceeds_claim")),
        copied_as_documents=int(found.get("copied_as_documents") or 0),
        finding_in_words=str(found.get("in_words") or NOT_RECORDED),
        method=str(found.get("method") or NOT_RECORDED),
        canaries_in_release=str(found.get("canaries_in_release") or NOT_RECORDED),
        utility_cost=canary_cost(method_id),
    )
