"""What ``keyseed generate`` checks before it loads the engine, with the engine's own rules.

Every check here imports the standard library and pydantic at most: the options'
ranges (:class:`workers.methods.dpkps.config.GenerationConfig` for DP-KPS, each LLM
method's parameter model), the output's name and folder, the declared labels, and the
input file (it exists, is UTF-8, has the named columns, no row without a label, only
declared labels; :func:`workers.text.corpus.read_labelled` and ``check_corpus``). A
mistake is reported in one line that names the option, with exit code 2, before torch
and the embedding model take their seconds to load.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from app.cli.options import (
    DPKPS_ONLY,
    METHOD_PREFIX,
    SHARED_OPTIONS,
    dpkps_defaults,
    method_dest,
    methods_of_fields,
    option_name,
    optional_type,
)
from workers.errors import ConfigError, InputDataError, KeyseedError

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
    if args.method != "dpkps":
        given = [name for name in DPKPS_ONLY if getattr(args, name) is not None]
        if given:
            raise ConfigError(f"an option of --method dpkps, not of {args.method}", field=given[0])
    for name, methods in methods_of_fields().items():
        if args.method not in methods and getattr(args, METHOD_PREFIX + name) is not None:
            raise ConfigError(
                f"an option of --method {' or '.join(methods)}", field=method_dest(name)
            )


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
    return label_set


def dpkps_config(args: argparse.Namespace) -> Any:
    """The validated :class:`GenerationConfig` of the options: every DP-KPS parameter
    (:data:`~workers.methods.dpkps.params.ENGINE_FIELDS`) that has an option of its own
    name, the others at their defaults."""
    from workers.methods.dpkps.config import GenerationConfig
    from workers.methods.dpkps.params import ENGINE_FIELDS

    values = {name: getattr(args, name) for name in ENGINE_FIELDS if hasattr(args, name)}
    if args.total is None and args.per_class is None:
        values["per_class"] = dpkps_defaults()["per_class"]
    values["noise"] = args.noise or ("gaussian" if args.delta else "laplace")
    return GenerationConfig(**values, device=args.device).validate()


def method_params(args: argparse.Namespace) -> Any:
    """The run's parameters for ``--method`` from the options given; errors name the
    option."""
    from pydantic import ValidationError

    from workers.methods.catalog import METHOD_PARAMS

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
    try:
        return model.model_validate(data, strict=False)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = str(error["loc"][0]) if error["loc"] else ""
        option = method_dest(field) if field else None
        message = str(error["msg"]).removeprefix("Value error, ")
        if error["type"] == "missing":
            message = f"required with --method {args.method}"
        raise ConfigError(message, field=option) from None


def read_few_shot(path: Path | None) -> tuple[str, ...]:
    if path is None:
        return ()
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputDataError(f"cannot read {path} as UTF-8 text", field="few_shot") from exc
    return tuple(line.strip() for line in lines if line.strip())


def read_input(args: argparse.Namespace, label_set: list[str]) -> Any:
    """The private corpus of ``--input``, checked against the declared labels: the
    file exists, is UTF-8 CSV or JSONL, has the named columns and no row without a label
    (or unit), and every label is a declared one (errors name rows, never text)."""
    from workers.text.corpus import check_corpus, read_labelled

    corpus = read_labelled(
        args.input,
        text_columns=args.text_columns,
        label_column=args.label_column,
        unit_column=args.unit_column,
    )
    check_corpus(corpus.texts, corpus.labels, label_set)  # what the run checks again
    return corpus
