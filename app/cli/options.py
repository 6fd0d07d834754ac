"""The options of ``keyseed generate`` and ``keyseed evaluate``, declared without the engine.

Building the parser imports the standard library, pydantic and the parameter modules
(:mod:`workers.methods.dpkps.params`, :mod:`workers.methods.catalog`) only, so every
command of ``keyseed`` starts at once. What a newcomer needs is in the first group of
``--help``; the rest is under "expert options".

Every method's options are generated from its parameter model (a field
``variation_folds`` is ``--variation-folds``), each field's ``description`` its help, so
each model is the one list of its options and its errors name the option. DP-KPS's
(:class:`~workers.methods.dpkps.params.DPKPSParams`) are typed and placed in the help's
groups (:data:`DPKPS_GROUPS`); the LLM methods' ``temperature`` and ``concurrency`` are
the LLM's, ``--llm-temperature`` and ``--llm-concurrency``, and a field two methods share
is one option.
"""

from __future__ import annotations

import argparse
import types
import typing
from pathlib import Path
from typing import Any

from workers.methods.dpkps.params import PUBLIC_FIELDS

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
# Where DP-KPS's options (one per field of DPKPSParams, generated) stand in ``--help``
# beyond the first group's --epsilon, --delta, --per-class and --total, and --vocabulary.
DPKPS_GROUPS = {
    "privacy": (
        "noise",
        "share_vocab",
        "share_kde",
        "share_count",
        "epsilon_vocab",
        "epsilon_kde",
        "epsilon_count",
    ),
    "engine": (
        "sequence_length",
        "mode",
        "ensemble",
        "vocabulary_size",
        "max_matches_per_document",
        "num_features",
        "kde_method",
        "vocabulary_method",
        "public_vocabulary_size",
        "centroid_cells",
        "sequence_selection",
        "consistency_filter",
        "subspace",
        "embed_sample",
        "temperature",
        "seed",
    ),
}
# The command line's own help where it differs from a job spec's (which names an
# uploaded vocabulary by its id; here a file is read).
DPKPS_HELP = {
    "vocabulary": "public phrases: english, medical, or a UTF-8 file with one phrase a line",
}
# A DP-KPS option the LLM methods share (SHARED_OPTIONS) defaults to its field's default,
# which every method then reads; --vocabulary to this (a job spec names its own). The
# others default to None (the field keeps the model's default), so a given one is known,
# and refused with another --method.
DEFAULT_VOCABULARY = "english"
# Options of DP-KPS alone, refused with another --method when given: its parameters that
# no LLM method shares, and its prompting's.
DPKPS_ONLY = (
    *(name for name in ("vocabulary", *PUBLIC_FIELDS) if name not in SHARED_OPTIONS.values()),
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
    _dpkps_options(basic, "epsilon", "delta")
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
    _dpkps_options(basic, "per_class", "total", prefix="dpkps: ")
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
    _dpkps_options(io, "vocabulary")
    _dpkps_options(
        gen.add_argument_group(
            "expert options: privacy (dpkps; a total --epsilon [--delta], or per-mechanism ε)"
        ),
        *DPKPS_GROUPS["privacy"],
    )
    eng = gen.add_argument_group("expert options: the dpkps engine")
    _dpkps_options(eng, *DPKPS_GROUPS["engine"])
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


def _dpkps_options(group: Any, *fields: str, prefix: str = "") -> None:
    """One option per field of :class:`~workers.methods.dpkps.params.DPKPSParams`
    (module docstring): ``--field-name``, its type, choices or ``--[no-]`` switch from the
    field's annotation, its help the field's description (:data:`DPKPS_HELP` where the
    command line differs from a job spec). Left out, an option is None and its field
    keeps the model's default (those the LLM methods share: :data:`DEFAULT_VOCABULARY`)."""
    from workers.methods.dpkps.params import DPKPSParams

    for name in fields:
        info = DPKPSParams.model_fields[name]
        kind, _ = optional_type(info.annotation)
        default = info.default if name in SHARED_OPTIONS.values() else None
        options: dict[str, Any] = {
            "dest": name,
            "default": DEFAULT_VOCABULARY if name == "vocabulary" else default,
        }
        if kind is bool:
            options["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(kind) is typing.Literal:
            options["choices"] = typing.get_args(kind)
        elif kind is not str:
            options["type"] = kind
        text = DPKPS_HELP.get(name) or (info.description or "").strip().rstrip(".")
        group.add_argument(option_name(name), help=prefix + text.replace("%", "%%"), **options)


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
