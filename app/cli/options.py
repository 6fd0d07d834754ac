"""The options of ``keyseed generate`` and ``keyseed evaluate``, declared without the engine.

Building the parser imports the standard library, pydantic and the parameter modules
(:mod:`workers.methods.dpkps.config`, :mod:`workers.methods.catalog`) only, so every
command of ``keyseed`` starts at once. What a newcomer needs is in the first group of
``--help``; the rest is under "expert options".

The LLM methods' options are generated from their parameter models (a field
``variation_folds`` is ``--variation-folds``; ``temperature`` and ``concurrency`` are the
LLM's, ``--llm-temperature`` and ``--llm-concurrency``; a field two methods share is one
option), each field's ``description`` its help, so each model is the one list of its
options and its errors name the option.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from pathlib import Path
from typing import Any

from workers.methods.dpkps.config import (
    CELLS_FROM_EPSILON,
    DEFAULT_CELLS,
    DEFAULT_SELECTION,
    DEFAULT_TEMPERATURE,
    KDE_METHODS,
    PUBLIC_VOCABULARY_DEFAULTS,
    SUBSPACE_FROM_CLASSES,
    SUGGESTED_SUBSPACE,
    VOCABULARY_METHODS,
)
from workers.privacy.limits import DELTA_CEILING, EPSILON_CEILING, EPSILON_FLOOR

METHODS = ("dpkps", "aug-pe", "pate-tutor", "dp-eda")  # workers.methods.registry's, in order
DESCRIPTION = (
    "Make a differentially private synthetic corpus from a labelled private one (CSV or "
    "JSONL) with one of four methods: dpkps (DP keyphrase prompt seeding, the default; "
    "keyphrase sequences, optionally written out by an LLM), aug-pe (Private Evolution for "
    "text), pate-tutor (a PATE discriminator with a DP label tutor) or dp-eda (DP evolution "
    "of embeddings). The last three need --llm local or openai. Writes OUT.jsonl and "
    "OUT.manifest.json (parameters, privacy events, composed (ε, δ))."
)

# Fields of the LLM methods' parameters that reuse an option DP-KPS already has (same
# meaning), by option dest.
SHARED_OPTIONS = {
    "epsilon": "epsilon",
    "delta": "delta",
    "seed": "seed",
    "document_type": "document_type",
    "concurrency": "llm_concurrency",
    "vocabulary": "vocabulary",
}
# Fields whose option name says they are the LLM's (DP-KPS's --temperature is τ).
RENAMED_OPTIONS = {"temperature": "llm_temperature"}
METHOD_PREFIX = "method_"  # dest of a generated option: method_<field>
# DP-KPS options without a default value, refused with another --method when given.
DPKPS_ONLY = (
    "epsilon_vocab",
    "epsilon_kde",
    "epsilon_count",
    "per_class",
    "total",
    "few_shot",
    "max_llm_calls",
)


def option_name(field: str | None) -> str:
    """The command-line option of a configuration field (``epsilon_kde`` -> ``--epsilon-kde``)."""
    if not field:
        return "keyseed"
    known = {
        "documents": "--input",
        "labels": "--label-column",
        "declared_labels": "--labels",
        "phrases": "--vocabulary",
    }
    if field in known:
        return known[field]
    return "--" + field.replace("_", "-")


def method_dest(field: str) -> str:
    """The option, as a field name, of an LLM method's field (``temperature`` ->
    ``llm_temperature``): what a ConfigError names so that :func:`option_name` prints it."""
    return SHARED_OPTIONS.get(field) or RENAMED_OPTIONS.get(field) or field


def optional_type(annotation: Any) -> tuple[Any, bool]:
    """``(X, True)`` for ``X | None``, else ``(annotation, False)``."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(annotation)) == 2:
            return args[0], True
    return annotation, False


def methods_of_fields() -> dict[str, list[str]]:
    """Each LLM-method field not already an option, with the methods that take it."""
    from workers.methods.catalog import METHOD_PARAMS

    fields: dict[str, list[str]] = {}
    for method, params in METHOD_PARAMS.items():
        for name in params.model_fields:
            if name not in SHARED_OPTIONS:
                fields.setdefault(name, []).append(method)
    return fields


def public_choices(field: str, values: tuple[str, ...]) -> tuple[str, ...]:
    """The values of ``field`` a user may choose: the research ones left out."""
    from workers.methods.dpkps.params import RESEARCH_VALUES

    return tuple(v for v in values if v not in RESEARCH_VALUES.get(field, ()))


def dpkps_defaults() -> dict[str, Any]:
    from workers.methods.dpkps.config import GenerationConfig

    return {
        f.name: f.default
        for f in dataclasses.fields(GenerationConfig)
        if f.default is not dataclasses.MISSING
    }


def register(sub: Any) -> None:
    from app.cli import evaluate

    _register_generate(sub)
    evaluate.register(sub)


def _register_generate(sub: Any) -> None:
    gen = sub.add_parser(
        "generate",
        help="make a DP synthetic corpus from a labelled CSV or JSONL file",
        description=DESCRIPTION,
    )
    gen.set_defaults(handler="app.cli.generate:generate")
    d = dpkps_defaults()
    basic = gen.add_argument_group("options (the ones most runs need)")
    basic.add_argument(
        "--input", required=True, type=Path, help="the private labelled CSV or JSONL file"
    )
    basic.add_argument(
        "--text-column",
        action="append",
        required=True,
        dest="text_columns",
        help="column holding the text; repeat to join several with '. '",
    )
    basic.add_argument(
        "--label-column", required=True, help="column holding each row's label (never empty)"
    )
    basic.add_argument(
        "--labels",
        default=None,
        help="declared label set, comma-separated (public schema; required: the labels found "
        "in the data are private, one added row could add a class)",
    )
    basic.add_argument(
        "--method",
        choices=METHODS,
        default="dpkps",
        help="dpkps: DP keyphrase sequences, optionally written out by an LLM (default); "
        "aug-pe: Private Evolution for text; pate-tutor: PATE discriminator with a DP label "
        "tutor; dp-eda: DP evolution of embeddings (the last three need --llm)",
    )
    basic.add_argument(
        "--epsilon",
        type=float,
        default=None,
        help=f"the run's total privacy budget ε ({EPSILON_FLOOR:g} to {EPSILON_CEILING:g} "
        "per mechanism), split among the mechanisms",
    )
    basic.add_argument(
        "--delta",
        type=float,
        default=0.0,
        help=f"the run's total δ (at most {DELTA_CEILING:g}; e.g. 1e-6): > 0 selects Gaussian "
        "noise, 0 (the default) Laplace noise and pure ε-DP; the LLM methods need δ > 0",
    )
    basic.add_argument(
        "--llm",
        choices=("none", "local", "openai"),
        default="none",
        help="none: keyphrase sequences only; local: the packaged SmolLM2; "
        "openai: the endpoint in KEYSEED_LLM_BASE_URL/_MODEL/_API_KEY",
    )
    basic.add_argument(
        "--output", required=True, type=Path, help="OUT.jsonl, in an existing folder"
    )
    basic.add_argument(
        "--per-class",
        type=int,
        default=None,
        help=f"dpkps: synthetic samples per declared label (default {d['per_class']})",
    )
    basic.add_argument(
        "--total",
        type=int,
        default=None,
        help="dpkps: synthetic samples in all, split by noisy class counts (with --epsilon-count "
        "or a total --epsilon)",
    )
    basic.add_argument(
        "--dry-run",
        action="store_true",
        help="print the planned releases, their noise and the composed (ε, δ) as JSON, "
        "without reading --input",
    )

    io = gen.add_argument_group("expert options: input")
    io.add_argument(
        "--unit-column",
        default=None,
        help="privacy unit column (e.g. a patient id): every mechanism bounds one unit's "
        "documents together; default: one row is one unit",
    )
    io.add_argument(
        "--vocabulary",
        default="english",
        help="public phrases: english, medical, or a UTF-8 file with one phrase a line",
    )

    priv = gen.add_argument_group(
        "expert options: privacy (dpkps; a total --epsilon [--delta], or per-mechanism ε)"
    )
    priv.add_argument(
        "--noise",
        choices=("laplace", "gaussian"),
        default=None,
        help="default: gaussian when --delta > 0, else laplace",
    )
    share_help = {
        "vocab": "the private vocabulary's share of a total --epsilon",
        "kde": "the keyphrase densities' share of a total --epsilon",
        "count": "with --total, the noisy class counts' share of a total --epsilon",
    }
    for name, text in share_help.items():
        priv.add_argument(
            f"--share-{name}",
            type=float,
            default=d[f"share_{name}"],
            help=f"{text} (of ε for Laplace, of μ² for Gaussian noise; default "
            f"{d[f'share_{name}']:g})",
        )
    priv.add_argument(
        "--epsilon-vocab",
        type=float,
        default=None,
        help="ε of the private vocabulary's release (instead of a total --epsilon)",
    )
    priv.add_argument(
        "--epsilon-kde",
        type=float,
        default=None,
        help="ε of the keyphrase densities' release (instead of a total --epsilon)",
    )
    priv.add_argument(
        "--epsilon-count",
        type=float,
        default=None,
        help="spend this ε on noisy class counts and split --total by them",
    )

    eng = gen.add_argument_group("expert options: the dpkps engine")
    eng.add_argument(
        "--sequence-length",
        type=int,
        default=d["sequence_length"],
        help=f"keyphrases per sequence, L (default {d['sequence_length']})",
    )
    eng.add_argument(
        "--mode",
        choices=("independent", "iterative"),
        default=d["mode"],
        help="independent: each phrase drawn from the class density; iterative: each phrase "
        "conditioned on the ones before (random Fourier features)",
    )
    eng.add_argument(
        "--ensemble",
        choices=("log", "linear"),
        default=d["ensemble"],
        help="iterative mode: how many prefix structures share the density's ε (log: "
        "⌈log₂ L⌉ + 1; linear: L)",
    )
    eng.add_argument(
        "--vocabulary-size",
        type=int,
        default=d["vocabulary_size"],
        help=f"phrases in the private vocabulary Ṽ, N (default {d['vocabulary_size']})",
    )
    eng.add_argument(
        "--max-matches-per-document",
        type=int,
        default=d["max_matches_per_document"],
        help="phrases a document counts at most in the vocabulary histogram (its "
        f"sensitivity, S; default {d['max_matches_per_document']})",
    )
    eng.add_argument(
        "--num-features",
        type=int,
        default=d["num_features"],
        help=f"random Fourier features, I (default {d['num_features']})",
    )
    eng.add_argument(
        "--kde-method",
        choices=public_choices("kde_method", KDE_METHODS),
        default=d["kde_method"],
        help="independent mode: class centroids of the document embeddings (the default "
        "for a Gaussian budget), or the exact kernel on Ṽ (the default for Laplace); "
        "random Fourier features (the iterative mode's)",
    )
    eng.add_argument(
        "--vocabulary-method",
        choices=public_choices("vocabulary_method", VOCABULARY_METHODS),
        default=d["vocabulary_method"],
        help="how Ṽ is chosen: noisy histogram over the vocabulary, or the first "
        "--public-vocabulary-size phrases, no release (default: public for centroid, else "
        "histogram)",
    )
    eng.add_argument(
        "--public-vocabulary-size",
        type=int,
        default=d["public_vocabulary_size"],
        help=f"|Ṽ| of a public Ṽ (default {PUBLIC_VOCABULARY_DEFAULTS})",
    )
    eng.add_argument(
        "--centroid-cells",
        type=int,
        default=d["centroid_cells"],
        help="cells per class with class centroids: the class sum places up to this many, "
        f"a second release gives their sums (1: none; default {DEFAULT_CELLS} from "
        f"--epsilon {CELLS_FROM_EPSILON:g} on, else 1)",
    )
    eng.add_argument(
        "--sequence-selection",
        type=int,
        default=d["sequence_selection"],
        help="with class centroids: draw this many times the sequences and keep those whose "
        "phrases lie nearest their class's (or cell's) released direction (1: keep every "
        f"draw; default {DEFAULT_SELECTION} with cells, else 1)",
    )
    eng.add_argument(
        "--consistency-filter",
        action=argparse.BooleanOptionalAction,
        default=d["consistency_filter"],
        help="with class centroids: keep a sequence only where its own class's released "
        "direction (with cells: one of its class's cells) is the nearest to its embedding "
        "(fewer sequences than asked for; default on with class centroids, else off)",
    )
    eng.add_argument(
        "--subspace",
        type=int,
        default=d["subspace"],
        help="with class centroids: release each class sum in this many top principal "
        "directions of the public phrases' embeddings (same noise and budget; 0: the whole "
        f"embedding space; default {SUGGESTED_SUBSPACE} with {SUBSPACE_FROM_CLASSES} or more "
        "declared labels and one cell per class, else the whole space)",
    )
    eng.add_argument(
        "--embed-sample",
        type=int,
        default=d["embed_sample"],
        help="with class centroids: embed a Poisson sample of about this many "
        "units a class (rate from the released class counts; 0: every unit)",
    )
    eng.add_argument(
        "--temperature",
        type=float,
        default=d["temperature"],
        help="τ of p ∝ score^(1/τ) (default: "
        + ", ".join(f"{k} {v:g}" for k, v in DEFAULT_TEMPERATURE.items())
        + ")",
    )
    eng.add_argument(
        "--seed",
        type=int,
        default=d["seed"],
        help="public randomness (features, sampling); DP noise is never seeded",
    )
    eng.add_argument("--device", default=None, help="cpu, cuda (default: GPU if available)")

    llm = gen.add_argument_group("expert options: the language model")
    llm.add_argument(
        "--document-type",
        default="document",
        help="public name of the kind of text, e.g. 'news article'",
    )
    llm.add_argument(
        "--few-shot",
        type=Path,
        default=None,
        help="dpkps: public example texts from the data recipient, one per line",
    )
    llm.add_argument(
        "--llm-concurrency",
        type=int,
        default=None,
        help="LLM requests in flight at once, 1 to 256 (default: KEYSEED_LLM_CONCURRENCY, 8)",
    )
    llm.add_argument(
        "--max-llm-calls",
        type=int,
        default=None,
        help="dpkps: LLM requests at most, retries included (default: KEYSEED_LLM_MAX_CALLS)",
    )
    _register_llm_methods(gen)


def _register_llm_methods(gen: Any) -> None:
    """One option per field of the LLM methods' parameters not already an option (module
    docstring); a field two methods share (``--iterations``) is one option, its help the
    first method's description.

    Values stay strings (``none`` for an optional field left empty) and are validated by
    the method's model itself, so a bad value is reported as ``--option: what is wrong``.
    """
    from workers.methods.catalog import METHOD_PARAMS

    group = gen.add_argument_group(
        "expert options: the LLM methods (--method aug-pe, pate-tutor or dp-eda; also "
        "--epsilon, --delta, --seed, --document-type, --llm-concurrency, and --vocabulary "
        "for dp-eda)"
    )
    for name, methods in methods_of_fields().items():
        infos = [METHOD_PARAMS[m].model_fields[name] for m in methods]
        kind, optional = optional_type(infos[0].annotation)
        options: dict[str, Any] = {"dest": METHOD_PREFIX + name, "default": None}
        if kind is bool:
            options["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(kind) is typing.Literal:
            choices = [c for i in infos for c in typing.get_args(optional_type(i.annotation)[0])]
            options["choices"] = tuple(dict.fromkeys(choices))
        else:
            options["metavar"] = kind.__name__.upper() + ("|none" if optional else "")
        group.add_argument(
            option_name(method_dest(name)), help=_field_help(methods, infos), **options
        )


def _field_help(methods: list[str], infos: list[Any]) -> str:
    """A generated option's help: each method's description of its field (the field's
    ``description``, which the API docs show too), once where only the default differs."""
    described = [
        (m, (i.description or "").strip().rstrip(".")) for m, i in zip(methods, infos, strict=True)
    ]
    texts = {text for _, text in described}
    if len(texts) == 1:
        return f"{', '.join(methods)}: {texts.pop()}"
    bases = {text.split(". Default")[0] for _, text in described}
    if len(bases) == 1:
        defaults = ", ".join(f"{m} {i.default}" for m, i in zip(methods, infos, strict=True))
        return f"{', '.join(methods)}: {bases.pop()} (default: {defaults})"
    return "; ".join(f"{m}: {text}" for m, text in described)
