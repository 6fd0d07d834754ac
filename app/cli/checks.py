"""What ``keyseed generate`` checks before it loads the engine, with the engine's own rules.

Every check here imports the standard library and pydantic at most: the options'
ranges (each method's parameter model; DP-KPS's,
:class:`workers.methods.dpkps.params.DPKPSParams`, maps them to its engine's
configuration, which checks the options that go together), the output's name and
folder, the declared labels, and the input file (it exists, is UTF-8, has the named
columns, no row without a label, only declared labels: :func:`check_input`, one pass over
the file that holds one row at a time, :class:`workers.text.corpus.LabelledRows` and
``check_labels``). A mistake is reported
in one line that names the option, with exit code 2, before torch and the embedding
model take their seconds to load.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.cli.options import (
    DPKPS_ONLY,
    METHOD_PREFIX,
    SHARED_OPTIONS,
    method_dest,
    methods_of_fields,
    option_name,
    optional_type,
)
from workers.errors import ConfigError, InputDataError, KeyseedError
from workers.methods.catalog import DPKPS, METHOD_PARAMS, check_vocabulary, vocabulary_of
from workers.methods.dpkps.params import DPKPSParams

LLM_CONCURRENCY = (1, 256)  # workers.settings.CoreSettings.llm_concurrency's range


def fail(exc: KeyseedError) -> int:
    """Report ``exc`` in one line naming its option; the exit code of a usage error."""
    print(f"error: {option_name(exc.field)}: {exc.message}", file=sys.stderr)
    return 2


def check_run_options(args: argparse.Namespace) -> None:
    """Options of every method: none of another method's, the output, the LLM limits."""
    refuse_other_methods_options(args)
    if args.output.suffix.lower() != ".jsonl":
        raise ConfigError("must name a .jsonl file", field="output")
    if not args.output.parent.is_dir():
        raise ConfigError(f"folder {args.output.parent} does not exist", field="output")
    low, high = LLM_CONCURRENCY
    if args.llm_concurrency is not None and not low <= args.llm_concurrency <= high:
        raise ConfigError(f"must be between {low} and {high}", field="llm_concurrency")
    if args.max_llm_calls is not None and args.max_llm_calls < 1:
        raise ConfigError("must be ≥ 1", field="max_llm_calls")


def refuse_other_methods_options(args: argparse.Namespace) -> None:
    """An option of another method is a mistake, never silently ignored."""
    for dest, (field, methods) in _methods_options().items():
        if args.method not in methods and getattr(args, dest) is not None:
            raise ConfigError(
                f"an option of --method {' or '.join(methods)}, not of {args.method}",
                field=field,
            )


def _methods_options() -> dict[str, tuple[str, list[str]]]:
    """Each option that some methods take and others do not, by its dest: the field an
    error names it by, and the methods that take it (DP-KPS's own first)."""
    options = {name: (name, [DPKPS]) for name in DPKPS_ONLY}
    for name, methods in methods_of_fields().items():
        options[METHOD_PREFIX + name] = (method_dest(name), methods)
    return options


def declared_labels(args: argparse.Namespace) -> list[str]:
    if args.labels is None:
        raise ConfigError(
            "declare the label set (public schema), e.g. --labels World,Sports; the labels "
            "found in the data are private and are never used",
            field="declared_labels",
        )
    label_set = list(dict.fromkeys(x.strip() for x in args.labels.split(",") if x.strip()))
    if not label_set:
        raise ConfigError("declare at least one label", field="declared_labels")
    if len(label_set) < 2:
        raise ConfigError("a labelled corpus needs at least two labels", field="declared_labels")
    return label_set


# What DPKPSParams records as the vocabulary of a run that reads a file (``--vocabulary
# PATH``): the model's ``vocabulary`` names a built-in or uploaded one (at most 64
# characters, as a job spec's), while a path may be longer; the command line checks the
# file itself when it reads it (:func:`workers.text.vocabulary.load_vocabulary`).
FILE_VOCABULARY = "file"


def run_params(args: argparse.Namespace) -> Any:
    """The run's parameters, validated by ``--method``'s own model, from the options given
    (:data:`PARAMETER_READERS`: DP-KPS's options are one typed option per field, the
    others' generated from their models); errors name the option."""
    return PARAMETER_READERS[args.method](args)


def dpkps_params(args: argparse.Namespace) -> DPKPSParams:
    """The run's :class:`~workers.methods.dpkps.params.DPKPSParams` from the options given
    (one per field, :func:`app.cli.options._dpkps_options`); errors name the option, a
    value out of its range as the engine words it (``must be between 0.001 and 100``)."""
    from workers.text.vocabulary import BUILTIN_VOCABULARIES

    data = {
        name: getattr(args, name)
        for name in DPKPSParams.model_fields
        if name != "vocabulary" and getattr(args, name) is not None
    }
    builtin = args.vocabulary.strip() in BUILTIN_VOCABULARIES
    data["vocabulary"] = args.vocabulary.strip() if builtin else FILE_VOCABULARY
    params: DPKPSParams = _validated(DPKPSParams, data, args.method, dest=str, ranges=True)
    return params


def method_params(args: argparse.Namespace) -> Any:
    """The run's parameters for ``--method`` from the options given; errors name the
    option."""
    model = METHOD_PARAMS[args.method]
    data: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        dest = SHARED_OPTIONS.get(name, METHOD_PREFIX + name)
        value = getattr(args, dest)
        if value is None:
            continue  # the model's default (or its "field required")
        if isinstance(value, str) and optional_type(info.annotation)[1] and value.lower() == "none":
            value = None
        data[name] = value
    return _validated(model, data, args.method)


# How each method's parameters are read from the options (by the methods' ids, as in
# the registry).
PARAMETER_READERS: dict[str, Callable[[argparse.Namespace], Any]] = {
    DPKPS: dpkps_params,
    **dict.fromkeys(METHOD_PARAMS, method_params),
}


def read_vocabulary(args: argparse.Namespace, params: Any) -> Any:
    """The public vocabulary of ``--vocabulary`` where the run of ``params`` reads one,
    loaded and checked against what the parameters ask of it (None where it reads none)."""
    from workers.text.vocabulary import load_vocabulary

    if vocabulary_of(args.method, params) is None:
        return None
    vocabulary = load_vocabulary(args.vocabulary)
    check_vocabulary(args.method, params, vocabulary.name, len(vocabulary))
    return vocabulary


def _validated(
    model: Any,
    data: dict[str, Any],
    method: str,
    *,
    dest: Callable[[str], str] = method_dest,
    ranges: bool = False,
) -> Any:
    """``model`` validated from ``data``, or a ``ConfigError`` naming the first wrong
    field's option (``dest``: its option's, as a field name); with ``ranges``, a value out
    of range says the field's whole range."""
    from pydantic import ValidationError

    try:
        return model.model_validate(data, strict=False)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = str(error["loc"][0]) if error["loc"] else ""
        option = dest(field) if field else None
        message = str(error["msg"]).removeprefix("Value error, ")
        if error["type"] == "missing":
            message = f"required with --method {method}"
        elif ranges and error["type"] in ("greater_than_equal", "less_than_equal"):
            low, high = _closed_range(model.model_fields[field])
            if low is not None and high is not None:
                message = f"must be between {low:g} and {high:g} (got {error['input']})"
        raise ConfigError(message, field=option) from None


def _closed_range(info: Any) -> tuple[float | None, float | None]:
    """A field's inclusive bounds (``ge``, ``le``; of its ``Annotated`` type too, in
    ``X | None``), None where it has none."""
    metadata = list(info.metadata)
    kind, _ = optional_type(info.annotation)
    for extra in getattr(kind, "__metadata__", ()):
        metadata.extend(getattr(extra, "metadata", ()))
    low = next((m.ge for m in metadata if hasattr(m, "ge")), None)
    high = next((m.le for m in metadata if hasattr(m, "le")), None)
    return low, high


def read_few_shot(path: Path | None) -> tuple[str, ...]:
    if path is None:
        return ()
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputDataError(f"cannot read {path} as UTF-8 text", field="few_shot") from exc
    return tuple(line.strip() for line in lines if line.strip())


def check_input(args: argparse.Namespace, label_set: list[str]) -> Any:
    """The private corpus of ``--input`` as rows read from the file at each pass
    (:class:`~workers.text.corpus.LabelledRows`), checked in one pass that holds one row
    at a time (errors name rows, never text)."""
    from workers.text.corpus import LabelledRows, check_labels

    rows = LabelledRows(
        args.input,
        text_columns=args.text_columns,
        label_column=args.label_column,
        unit_column=args.unit_column,
    )
    check_labels((label for _, label, _ in rows), label_set)
    return rows
