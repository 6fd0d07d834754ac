"""``keyseed generate`` and ``keyseed evaluate``: the engine on files, without the service.

``generate`` is for a data owner on their own machine: it reads a labelled CSV (or
JSONL), runs a method (``--method dpkps``, the default: DP-KPS, optionally prompting an
LLM; ``--method aug-pe`` (Private Evolution for text), ``pate-tutor`` (PATE
discriminator with a DP label tutor) or ``dp-eda`` (DP evolution of embeddings), which
need an LLM: :mod:`workers.methods.registry`), and writes
``OUT.jsonl`` (one synthetic document a line) and ``OUT.manifest.json`` (every
parameter, the models, the privacy events and their composed (ε, δ), LLM costs). Both
files appear only when the run succeeded: they are written under temporary names and
renamed at the end, so an interrupted or failed run leaves nothing that looks complete.

The LLM methods' options are generated from their parameter models (a field
``variation_folds`` is ``--variation-folds``; ``temperature`` and ``concurrency`` are
the LLM's, ``--llm-temperature`` and ``--llm-concurrency``; a field two methods share is
one option), so each model is the one list of its options and its errors name the
option; an option of another method is refused. Such a run keeps its DP outputs in
``OUT.checkpoints/`` as it goes: a killed run, started again with the same arguments,
resumes without drawing (or spending) again. The folder is removed once the outputs
are in place.

What reaches the terminal: progress bars and errors on stderr. Errors name the option
(``--epsilon-kde: must be finite and > 0``) or the row of the input, never a document's
text. A few warnings about the corpus itself (documents without any vocabulary phrase,
very small classes) are facts about the private data that only its owner sees here;
they are never written to the output or the manifest.

``evaluate`` is the paper's measure, run by the data recipient: train a classifier on
the synthetic corpus, score it on real labelled texts, optionally beside the same
classifier trained on real texts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import time
import types
import typing
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from workers.errors import ConfigError, KeyseedError
from workers.llm.client import LLMCosts
from workers.methods.dpkps.config import (
    CELLS_FROM_EPSILON,
    DEFAULT_CELLS,
    DEFAULT_EXTENSION_RATIO,
    DEFAULT_LABEL_PRIOR,
    DEFAULT_SELECTION,
    DEFAULT_TEMPERATURE,
    KDE_METHODS,
    KDE_WEIGHTINGS,
    PUBLIC_VOCABULARY_DEFAULTS,
    SUBSPACE_FROM_CLASSES,
    SUGGESTED_SUBSPACE,
    VOCABULARY_METHODS,
)
from workers.methods.progress import run_stages
from workers.progress_bars import StageBars

HANDLER = "workers.offline_cli"
SMALL_CLASS = 20  # fewer documents than this: warn the owner that the class is mostly noise
METHODS = ("dpkps", "aug-pe", "pate-tutor", "dp-eda")  # workers.methods.registry's, in order

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


def _option(field: str | None) -> str:
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


def _defaults() -> dict[str, Any]:
    from workers.methods.dpkps.config import GenerationConfig

    return {
        f.name: f.default
        for f in dataclasses.fields(GenerationConfig)
        if f.default is not dataclasses.MISSING
    }


def register(sub: Any) -> None:
    gen = sub.add_parser(
        "generate",
        help="make a DP synthetic corpus from a labelled CSV",
        description="Run DP-KPS on a labelled private corpus and write a synthetic one.",
    )
    gen.set_defaults(handler=f"{HANDLER}:generate")
    gen.add_argument(
        "--method",
        choices=METHODS,
        default="dpkps",
        help="dpkps: DP keyphrase sequences (optionally turned into text by an LLM); "
        "aug-pe: Private Evolution for text (Xie et al., 2024), needs --llm local|openai",
    )
    io = gen.add_argument_group("input and output")
    io.add_argument("--input", required=True, type=Path, help="labelled CSV or JSONL file")
    io.add_argument(
        "--text-column",
        action="append",
        required=True,
        dest="text_columns",
        help="text column; repeat to join several with '. '",
    )
    io.add_argument("--label-column", required=True)
    io.add_argument(
        "--labels",
        default=None,
        help="declared label set, comma-separated (public schema; required: the labels found "
        "in the data are private, one added row could add a class)",
    )
    io.add_argument(
        "--vocabulary",
        default="english",
        help="english, medical, or a UTF-8 file with one phrase a line",
    )
    io.add_argument("--output", required=True, type=Path, help="OUT.jsonl")
    io.add_argument(
        "--unit-column",
        default=None,
        help="privacy unit column (e.g. a patient id): every mechanism bounds one unit's "
        "documents together; default: one row is one unit",
    )
    d = _defaults()
    priv = gen.add_argument_group(
        "privacy (spent once per run): a total --epsilon [--delta], or per-mechanism ε"
    )
    priv.add_argument(
        "--epsilon",
        type=float,
        default=None,
        help="total ε, split among the mechanisms by the shares (see --share-*)",
    )
    priv.add_argument(
        "--delta",
        type=float,
        default=0.0,
        help="total δ; > 0 selects Gaussian noise (e.g. 1e-6), 0 Laplace (pure ε)",
    )
    priv.add_argument(
        "--noise",
        choices=("laplace", "gaussian"),
        default=None,
        help="default: gaussian when --delta > 0, else laplace",
    )
    for name in ("vocab", "kde", "count"):
        priv.add_argument(f"--share-{name}", type=float, default=d[f"share_{name}"])
    priv.add_argument("--epsilon-vocab", type=float, default=None, help="per-mechanism ε")
    priv.add_argument("--epsilon-kde", type=float, default=None, help="per-mechanism ε")
    priv.add_argument(
        "--epsilon-count",
        type=float,
        default=None,
        help="spend this ε on noisy class counts and split --total by them",
    )
    priv.add_argument(
        "--dry-run",
        action="store_true",
        help="print the planned releases, their noise and the composed (ε, δ) as JSON, "
        "without reading --input",
    )
    eng = gen.add_argument_group("engine")
    eng.add_argument(
        "--per-class",
        type=int,
        default=None,
        help=f"sequences per declared label (default {d['per_class']})",
    )
    eng.add_argument(
        "--total", type=int, default=None, help="sequences in all, split by noisy class counts"
    )
    eng.add_argument("--sequence-length", type=int, default=d["sequence_length"])
    eng.add_argument("--mode", choices=("independent", "iterative"), default=d["mode"])
    eng.add_argument("--ensemble", choices=("log", "linear"), default=d["ensemble"])
    eng.add_argument("--vocabulary-size", type=int, default=d["vocabulary_size"])
    eng.add_argument("--max-matches-per-document", type=int, default=d["max_matches_per_document"])
    eng.add_argument("--max-phrases-per-document", type=int, default=d["max_phrases_per_document"])
    eng.add_argument("--num-features", type=int, default=d["num_features"])
    eng.add_argument("--bandwidth", type=float, default=d["bandwidth"])
    eng.add_argument(
        "--kde-method",
        choices=KDE_METHODS,
        default=d["kde_method"],
        help="independent mode: class centroids (the default for a Gaussian budget) or "
        "moments of the document embeddings (Gaussian noise), or the exact kernel on Ṽ "
        "(the default for Laplace); random Fourier features (the iterative mode's)",
    )
    eng.add_argument(
        "--vocabulary-method",
        choices=VOCABULARY_METHODS,
        default=d["vocabulary_method"],
        help="how Ṽ is chosen: noisy histogram over the vocabulary, thresholded Gaussian "
        "histogram over the phrases that occur (Gaussian noise; spends half of δ outright), "
        "or the first --public-vocabulary-size phrases, no release (default: public for "
        "centroid and moments, else histogram)",
    )
    eng.add_argument(
        "--kde-weighting",
        choices=KDE_WEIGHTINGS,
        default=d["kde_weighting"],
        help="a document's weights in the exact kernel: l1 (default) or l2 (Gaussian noise)",
    )
    eng.add_argument(
        "--public-vocabulary-size",
        type=int,
        default=d["public_vocabulary_size"],
        help=f"|Ṽ| of a public Ṽ (default {PUBLIC_VOCABULARY_DEFAULTS})",
    )
    eng.add_argument(
        "--public-extension",
        type=int,
        default=d["public_extension"],
        help="with class centroids, one cell and --total: a class whose released count is at "
        "least --extension-ratio times its sum's noise σ samples from this many public phrases "
        "(0, the default: off)",
    )
    eng.add_argument(
        "--extension-ratio",
        type=float,
        default=d["extension_ratio"],
        help="the released class count over σ from which a class samples from "
        f"--public-extension's phrases (default {DEFAULT_EXTENSION_RATIO:g})",
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
        "--label-prior",
        type=float,
        default=d["label_prior"],
        help="with class centroids: how far the declared label names pull each class's "
        f"released direction when the released sums agree with them (0: off; default "
        f"{DEFAULT_LABEL_PRIOR:g})",
    )
    eng.add_argument(
        "--label-prior-lead",
        type=float,
        default=d["label_prior_lead"],
        help="with class centroids: how far the label names may lead each class's released "
        "direction as the released sums' agreement with them grows from 1 to 2 noise "
        "standard deviations (default 0: none)",
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
        "--document-window",
        type=int,
        default=d["document_window"],
        help="with class centroids or moments: embed a document longer than this many words "
        "in windows of it, averaged, so the whole document counts (0: the embedding model's "
        "first tokens only)",
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
        "--class-contrast",
        type=float,
        default=d["class_contrast"],
        help="independent mode: favour the phrases a class owns; 0 turns it off",
    )
    eng.add_argument(
        "--seed",
        type=int,
        default=d["seed"],
        help="public randomness (features, sampling); DP noise is never seeded",
    )
    eng.add_argument("--device", default=None, help="cpu, cuda (default: GPU if available)")
    llm = gen.add_argument_group("language model")
    llm.add_argument(
        "--llm",
        choices=("none", "local", "openai"),
        default="none",
        help="none: keyphrase sequences only; local: the packaged SmolLM2; "
        "openai: the endpoint in KEYSEED_LLM_BASE_URL/_MODEL/_API_KEY",
    )
    llm.add_argument(
        "--document-type",
        default="document",
        help="public name of the kind of text, e.g. 'news article'",
    )
    llm.add_argument(
        "--few-shot",
        type=Path,
        default=None,
        help="public example texts from the data recipient, one per line",
    )
    llm.add_argument("--llm-concurrency", type=int, default=None)
    llm.add_argument("--max-llm-calls", type=int, default=None)
    _register_llm_methods(gen)

    ev = sub.add_parser(
        "evaluate",
        help="accuracy of a classifier trained on a synthetic corpus",
        description="Train a classifier on a synthetic corpus and score it on real texts.",
    )
    ev.set_defaults(handler=f"{HANDLER}:evaluate")
    ev.add_argument("--synthetic", required=True, type=Path, help="OUT.jsonl of generate")
    ev.add_argument("--test", required=True, type=Path, help="real labelled CSV")
    ev.add_argument("--text-column", action="append", required=True, dest="text_columns")
    ev.add_argument("--label-column", required=True)
    ev.add_argument(
        "--train-real",
        type=Path,
        default=None,
        help="real labelled CSV: also report the classifier trained on it",
    )
    ev.add_argument(
        "--unlabeled",
        type=Path,
        default=None,
        help="the recipient's unlabelled texts (same text columns): CORAL",
    )
    ev.add_argument("--classifier", choices=("embedding", "tfidf"), default=None)
    ev.add_argument(
        "--coral-weight",
        type=float,
        default=None,
        help="weight of the CORAL term with --unlabeled (default 100)",
    )
    ev.add_argument("--seed", type=int, default=0)


def _method_dest(field: str) -> str:
    """The option, as a field name, of an LLM method's field (``temperature`` ->
    ``llm_temperature``): what a ConfigError names so that :func:`_option` prints it."""
    return SHARED_OPTIONS.get(field) or RENAMED_OPTIONS.get(field) or field


def _optional(annotation: Any) -> tuple[Any, bool]:
    """``(X, True)`` for ``X | None``, else ``(annotation, False)``."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(annotation)) == 2:
            return args[0], True
    return annotation, False


def _methods_of_fields() -> dict[str, list[str]]:
    """Each LLM-method field not already an option, with the methods that take it."""
    from workers.methods.registry import LLM_METHODS

    fields: dict[str, list[str]] = {}
    for method in LLM_METHODS.values():
        for name in method.params.model_fields:
            if name not in SHARED_OPTIONS:
                fields.setdefault(name, []).append(method.id)
    return fields


def _register_llm_methods(gen: Any) -> None:
    """One option per field of the LLM methods' parameters not already an option (module
    docstring); a field two methods share (``--iterations``) is one option.

    Values stay strings (``none`` for an optional field left empty) and are validated by
    the method's model itself, so a bad value is reported as ``--option: what is wrong``.
    """
    from workers.methods.registry import LLM_METHODS

    group = gen.add_argument_group(
        "LLM methods (--method aug-pe, pate-tutor or dp-eda; also --epsilon, --delta, --seed, "
        "--document-type, --llm-concurrency, and --vocabulary for dp-eda)"
    )
    for name, methods in _methods_of_fields().items():
        infos = [LLM_METHODS[m].params.model_fields[name] for m in methods]
        kind, optional = _optional(infos[0].annotation)
        defaults = ", ".join(
            f"{m}: {'required' if i.is_required() else i.default}"
            for m, i in zip(methods, infos, strict=True)
        )
        options: dict[str, Any] = {"dest": METHOD_PREFIX + name, "default": None}
        if kind is bool:
            options["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(kind) is typing.Literal:
            choices = [c for i in infos for c in typing.get_args(_optional(i.annotation)[0])]
            options["choices"] = tuple(dict.fromkeys(choices))
        else:
            options["metavar"] = kind.__name__.upper() + ("|none" if optional else "")
        group.add_argument(_option(_method_dest(name)), help=f"{name} ({defaults})", **options)


def _method_params(args: argparse.Namespace) -> Any:
    """The run's parameters for ``--method`` from the options given; errors name the
    option."""
    from pydantic import ValidationError

    from workers.methods.registry import LLM_METHODS

    model = LLM_METHODS[args.method].params
    data: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        dest = SHARED_OPTIONS.get(name, METHOD_PREFIX + name)
        value = getattr(args, dest)
        if value is None:
            continue  # the model's default (or its "field required")
        if isinstance(value, str) and _optional(info.annotation)[1] and value.lower() == "none":
            value = None
        data[name] = value
    try:
        return model.model_validate(data, strict=False)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = str(error["loc"][0]) if error["loc"] else ""
        option = _method_dest(field) if field else None
        message = str(error["msg"]).removeprefix("Value error, ")
        if error["type"] == "missing":
            message = f"required with --method {args.method}"
        raise ConfigError(message, field=option) from None


def _refuse_other_methods_options(args: argparse.Namespace) -> None:
    """An option of another method is a mistake, never silently ignored."""
    if args.method != "dpkps":
        given = [name for name in DPKPS_ONLY if getattr(args, name) is not None]
        if given:
            raise ConfigError(f"an option of --method dpkps, not of {args.method}", field=given[0])
    for name, methods in _methods_of_fields().items():
        if args.method not in methods and getattr(args, METHOD_PREFIX + name) is not None:
            raise ConfigError(
                f"an option of --method {' or '.join(methods)}", field=_method_dest(name)
            )


def _fail(exc: KeyseedError) -> int:
    print(f"error: {_option(exc.field)}: {exc.message}", file=sys.stderr)
    return 2


@contextmanager
def _atomic_outputs(*paths: Path) -> Iterator[list[Path]]:
    """Temporary siblings of ``paths``; renamed over them only if the block succeeds."""
    temps = [p.with_name(f".{p.name}.partial-{os.getpid()}") for p in paths]
    try:
        yield temps
    except BaseException:
        for tmp in temps:
            tmp.unlink(missing_ok=True)
        raise
    for tmp, final in zip(temps, paths, strict=True):
        os.replace(tmp, final)


def _read_few_shot(path: Path | None) -> tuple[str, ...]:
    if path is None:
        return ()
    from workers.errors import InputDataError

    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputDataError(f"cannot read {path} as UTF-8 text", field="few_shot") from exc
    return tuple(line.strip() for line in lines if line.strip())


def _config(args: argparse.Namespace) -> Any:
    from workers.methods.dpkps.config import GenerationConfig

    per_class = args.per_class
    if args.total is None and per_class is None:
        per_class = _defaults()["per_class"]
    noise = args.noise or ("gaussian" if args.delta else "laplace")
    return GenerationConfig(
        epsilon_vocab=args.epsilon_vocab,
        epsilon_kde=args.epsilon_kde,
        epsilon_count=args.epsilon_count,
        epsilon=args.epsilon,
        delta=args.delta,
        noise=noise,
        share_vocab=args.share_vocab,
        share_kde=args.share_kde,
        share_count=args.share_count,
        per_class=per_class,
        total=args.total,
        vocabulary_size=args.vocabulary_size,
        max_matches_per_document=args.max_matches_per_document,
        sequence_length=args.sequence_length,
        mode=args.mode,
        ensemble=args.ensemble,
        num_features=args.num_features,
        bandwidth=args.bandwidth,
        kde_method=args.kde_method,
        vocabulary_method=args.vocabulary_method,
        kde_weighting=args.kde_weighting,
        public_vocabulary_size=args.public_vocabulary_size,
        public_extension=args.public_extension,
        extension_ratio=args.extension_ratio,
        centroid_cells=args.centroid_cells,
        label_prior=args.label_prior,
        label_prior_lead=args.label_prior_lead,
        sequence_selection=args.sequence_selection,
        consistency_filter=args.consistency_filter,
        subspace=args.subspace,
        document_window=args.document_window,
        temperature=args.temperature,
        class_contrast=args.class_contrast,
        max_phrases_per_document=args.max_phrases_per_document,
        seed=args.seed,
        device=args.device,
    ).validate()


def _warn_owner(result: Any) -> None:
    """Facts about the private corpus, for its owner's terminal only."""
    diag = result.owner_diagnostics
    if diag.documents_without_match:
        print(
            f"warning: {diag.documents_without_match} of {diag.documents} documents contain no "
            "phrase of the vocabulary; they contribute nothing to the synthetic corpus",
            file=sys.stderr,
        )
    for label, n in diag.documents_per_class.items():
        if n < SMALL_CLASS:
            print(
                f"warning: label {label!r} has {n} document(s); its sequences will be mostly "
                "noise at this ε",
                file=sys.stderr,
            )


def _endpoint_for(choice: str, settings: Any) -> Any:
    from workers.llm.client import LLMEndpoint

    endpoint = LLMEndpoint.from_settings(settings)
    if endpoint is None:
        key = settings.llm_api_key.get_secret_value() or os.environ.get("OPENAI_API_KEY", "")
        if not key:
            raise ConfigError(
                "set KEYSEED_LLM_API_KEY (or OPENAI_API_KEY), and KEYSEED_LLM_BASE_URL for a "
                "server other than OpenAI's",
                field="llm",
            )
        endpoint = LLMEndpoint(
            base_url="https://api.openai.com/v1",
            model=settings.llm_model or "gpt-4o-mini",
            api_key=key,
            timeout=settings.llm_timeout,
            max_tokens=settings.llm_max_tokens,
        )
    return endpoint


def _prompt(
    args: argparse.Namespace,
    sequences: Sequence[Any],
    settings: Any,
    progress: StageBars,
    costs: LLMCosts,
) -> tuple[list[str | None], dict[str, Any]]:
    """Texts for every sequence (None where the LLM failed) and a public summary; what
    the calls cost is added to ``costs``."""
    from workers.llm.local import LocalLLMServer
    from workers.methods.dpkps.prompting import PromptSpec, run_prompts

    spec = PromptSpec(
        document_type=args.document_type, few_shot=_read_few_shot(args.few_shot)
    ).validate()
    keyphrases = [list(s.keyphrases) for s in sequences]
    concurrency = args.llm_concurrency or settings.llm_concurrency
    max_calls = args.max_llm_calls or settings.llm_max_calls

    def run(endpoint: Any) -> list[Any]:
        return run_prompts(
            keyphrases,
            endpoint=endpoint,
            spec=spec,
            concurrency=concurrency,
            max_calls=max_calls,
            progress=progress.prompts,
            costs=costs,
        )

    if args.llm == "local":
        with LocalLLMServer() as server:
            endpoint = server.endpoint
            outcomes = run(endpoint)
    else:
        endpoint = _endpoint_for(args.llm, settings)
        outcomes = run(endpoint)
    failures = Counter(o.error for o in outcomes if o.text is None)
    summary = {
        "llm": args.llm,
        "base_url": endpoint.base_url if args.llm == "openai" else "local",
        "model": endpoint.model,
        "document_type": spec.document_type,
        "few_shot_examples": len(spec.few_shot),
        "requested": len(outcomes),
        "succeeded": len(outcomes) - sum(failures.values()),
        "failed": dict(failures),
    }
    return [o.text for o in outcomes], summary


def _declared_labels(args: argparse.Namespace) -> list[str]:
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


def _manifest_path(output: Path) -> Path:
    return output.with_name(output.name[: -len(".jsonl")] + ".manifest.json")


def generate(args: argparse.Namespace) -> int:
    started = time.time()
    try:
        return _generate(args, started)
    except KeyseedError as exc:
        return _fail(exc)


def _generate(args: argparse.Namespace, started: float) -> int:
    from workers.methods.dpkps.config import method_description
    from workers.methods.dpkps.pipeline import generate_sequences, shuffled
    from workers.methods.dpkps.plan import plan
    from workers.settings import CoreSettings
    from workers.text.corpus import read_labelled
    from workers.text.embeddings import EmbeddingCache, SentenceEmbedder
    from workers.text.vocabulary import load_vocabulary

    _refuse_other_methods_options(args)
    if args.output.suffix.lower() != ".jsonl":
        raise ConfigError("must name a .jsonl file", field="output")
    if not args.output.parent.is_dir():
        raise ConfigError(f"folder {args.output.parent} does not exist", field="output")
    if args.llm_concurrency is not None and not 1 <= args.llm_concurrency <= 256:
        raise ConfigError("must be between 1 and 256", field="llm_concurrency")
    if args.max_llm_calls is not None and args.max_llm_calls < 1:
        raise ConfigError("must be ≥ 1", field="max_llm_calls")
    if args.method != "dpkps":
        return _generate_llm_method(args, started)
    config = _config(args)
    settings = CoreSettings()
    label_set = _declared_labels(args)
    if len(label_set) < 2:
        raise ConfigError("a labelled corpus needs at least two labels", field="declared_labels")
    vocabulary = load_vocabulary(args.vocabulary)
    config.check_vocabulary(vocabulary.name, len(vocabulary))
    config = config.for_classes(len(label_set))  # the default subspace: by the label set
    planned = plan(config, label_set, len(vocabulary))
    if args.dry_run:  # public inputs only: --input is not opened
        summary = {
            "method": method_description(config),
            "parameters": config.to_dict(),
            **planned.to_dict(),
        }
        print(json.dumps(summary, indent=2, ensure_ascii=False))
        return 0
    corpus = read_labelled(
        args.input,
        text_columns=args.text_columns,
        label_column=args.label_column,
        unit_column=args.unit_column,
    )
    embedder = SentenceEmbedder(settings.embedding_model, device=config.device)
    cache = EmbeddingCache(settings.embedding_cache_dir)
    progress = StageBars(run_stages("dpkps", mode=config.mode, llm=args.llm))
    try:
        result = generate_sequences(
            corpus.texts,
            corpus.labels,
            label_set=label_set,
            vocabulary=vocabulary,
            config=config,
            embedder=embedder,
            cache=cache,
            progress=progress,
            units=corpus.units,
            unit_name=args.unit_column,
            planned=planned,
        )
        progress.close()
        _warn_owner(result)
        sequences = shuffled(result.sequences, config.seed)
        prompting: dict[str, Any] = {"llm": "none"}
        costs = LLMCosts()
        texts: list[str | None] = [" ".join(s.keyphrases) for s in sequences]
        if args.llm != "none":
            texts, prompting = _prompt(args, sequences, settings, progress, costs)
    finally:
        progress.close()
    manifest_path = _manifest_path(args.output)
    manifest = {
        **result.manifest(),
        "labels": {"names": label_set, "source": "declared"},
        "prompting": prompting,
        "llm_costs": {"method": "dpkps", **costs.as_dict()},
        "input": {
            "text_columns": args.text_columns,
            "label_column": args.label_column,
            "unit_column": args.unit_column,
        },
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    written = 0
    with _atomic_outputs(args.output, manifest_path) as (out_tmp, manifest_tmp):
        with open(out_tmp, "w", encoding="utf-8") as out:
            for seq, text in zip(sequences, texts, strict=True):
                if text is None:
                    continue  # the LLM failed on it; counted in the manifest
                record = {"label": seq.label, "keyphrases": list(seq.keyphrases), "text": text}
                out.write(json.dumps(record, ensure_ascii=False) + "\n")
                written += 1
        manifest["documents_written"] = written
        manifest_tmp.write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
        if written == 0:
            raise KeyseedError("the language model produced no text for any sequence", field="llm")
    drawn = manifest["sequences_drawn"]
    filtered = (
        f"; the consistency filter kept {len(sequences)} of {drawn} sequences drawn"
        if drawn != len(sequences)
        else ""
    )
    print(
        f"wrote {written} synthetic documents to {args.output} "
        f"(ε = {float(result.report.epsilon):.6g}, δ = {result.report.delta:g} spent{filtered}; "
        f"manifest {manifest_path}; "
        f"{time.time() - started:.1f} s)",
        file=sys.stderr,
    )
    return 0


def _checkpoint_dir(output: Path) -> Path:
    """``OUT.checkpoints/`` beside ``OUT.jsonl``."""
    return output.with_name(output.name[: -len(".jsonl")] + ".checkpoints")


def _generate_llm_method(args: argparse.Namespace, started: float) -> int:
    """``--method aug-pe``, ``pate-tutor`` or ``dp-eda``: the run, its checkpoints in
    ``OUT.checkpoints/`` (a killed run resumes), ``OUT.jsonl`` and its manifest."""
    from workers.llm.local import LocalLLMServer
    from workers.methods.checkpoints import DirectoryCheckpoints
    from workers.methods.registry import LLM_METHODS
    from workers.privacy.accountant import compose
    from workers.settings import CoreSettings
    from workers.text.corpus import read_labelled
    from workers.text.embeddings import EmbeddingCache, SentenceEmbedder
    from workers.text.vocabulary import load_vocabulary

    method = LLM_METHODS[args.method]
    params = _method_params(args)
    label_set = _declared_labels(args)
    events = method.plan(params, label_set)
    if args.dry_run:  # public inputs only: --input is not opened
        planned = {
            "method": method.id,
            "description": method.description,
            "parameters": params.to_dict(),
            "labels": label_set,
            "planned_llm_calls": method.planned_calls(params, len(label_set)),
            "max_released": method.max_released(params, len(label_set)),
            "events": [e.to_dict() for e in events],
            "privacy": compose(events).to_dict(delta=params.delta),
        }
        print(json.dumps(planned, indent=2, ensure_ascii=False))
        return 0
    if args.llm == "none":
        raise ConfigError(
            f"{args.method} writes texts with an LLM: choose local or openai", field="llm"
        )
    settings = CoreSettings()
    extra: dict[str, Any] = {}
    vocabulary = method.vocabulary(params)
    if vocabulary is not None:
        extra["vocabulary"] = load_vocabulary(vocabulary)
        extra["cache"] = EmbeddingCache(settings.embedding_cache_dir)
    endpoint = None if args.llm == "local" else _endpoint_for(args.llm, settings)
    corpus = read_labelled(
        args.input,
        text_columns=args.text_columns,
        label_column=args.label_column,
        unit_column=args.unit_column,
    )
    checkpoint_dir = _checkpoint_dir(args.output)
    if checkpoint_dir.is_dir():
        print(f"resuming from {checkpoint_dir}", file=sys.stderr)
    embedder = SentenceEmbedder(settings.embedding_model, device=args.device)
    progress = StageBars(run_stages(args.method))

    def run(llm: Any) -> Any:
        return method.run(
            corpus.texts,
            corpus.labels,
            label_set=label_set,
            units=corpus.units,
            params=params,
            llm=llm,
            embedder=embedder,
            checkpoints=DirectoryCheckpoints(checkpoint_dir),
            progress=progress,
            **extra,
        )

    try:
        if endpoint is None:
            with LocalLLMServer(max_tokens=params.max_tokens) as server:
                endpoint = server.endpoint
                result = run(endpoint)
        else:
            result = run(endpoint)
    finally:
        progress.close()
    manifest_path = _manifest_path(args.output)
    manifest = {
        **result.manifest,
        "labels": {"names": label_set, "source": "declared"},
        "llm": {
            "llm": args.llm,
            "base_url": endpoint.base_url if args.llm == "openai" else "local",
            "model": endpoint.model,
        },
        "input": {
            "text_columns": args.text_columns,
            "label_column": args.label_column,
            "unit_column": args.unit_column,
        },
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "documents_written": len(result.records),
    }
    with _atomic_outputs(args.output, manifest_path) as (out_tmp, manifest_tmp):
        with open(out_tmp, "w", encoding="utf-8") as out:
            for label, text in result.records:
                out.write(json.dumps({"label": label, "text": text}, ensure_ascii=False) + "\n")
        manifest_tmp.write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    shutil.rmtree(checkpoint_dir, ignore_errors=True)  # the outputs hold the run now
    privacy = manifest["privacy"]
    costs = manifest["llm_costs"]
    print(
        f"wrote {len(result.records)} synthetic documents to {args.output} "
        f"(ε = {float(privacy['epsilon']):.6g}, δ = {privacy['delta']:g} spent; "
        f"{costs['calls']} LLM calls; manifest {manifest_path}; "
        f"{time.time() - started:.1f} s)",
        file=sys.stderr,
    )
    return 0


def _read_synthetic(path: Path) -> tuple[list[str], list[str]]:
    from workers.errors import InputDataError

    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError as exc:
        raise InputDataError(f"{path} does not exist", field="synthetic") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise InputDataError(f"cannot read {path} as UTF-8", field="synthetic") from exc
    texts: list[str] = []
    labels: list[str] = []
    for row, line in enumerate((x for x in lines if x.strip()), start=1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            raise InputDataError(f"row {row} is not valid JSON", field="synthetic") from None
        if not isinstance(record, dict) or "label" not in record:
            raise InputDataError(f"row {row} has no label", field="synthetic")
        text = record.get("text") or " ".join(record.get("keyphrases") or [])
        if not isinstance(text, str) or not text.strip():
            raise InputDataError(f"row {row} has neither text nor keyphrases", field="synthetic")
        texts.append(text)
        labels.append(str(record["label"]))
    if not texts:
        raise InputDataError(f"{path} holds no synthetic document", field="synthetic")
    return texts, labels


@contextmanager
def _fields_as(options: dict[str, str]) -> Iterator[None]:
    """Re-label an evaluation error's field as the option that supplied the data."""
    try:
        yield
    except KeyseedError as exc:
        if exc.field in options:
            exc.field = options[exc.field]
        raise


def evaluate(args: argparse.Namespace) -> int:
    try:
        return _evaluate(args)
    except KeyseedError as exc:
        return _fail(exc)


def _evaluate(args: argparse.Namespace) -> int:
    from workers.evaluation.classifier import DEFAULT_CLASSIFIER, train_and_score
    from workers.text.corpus import read_labelled
    from workers.text.embeddings import SentenceEmbedder

    classifier = args.classifier or DEFAULT_CLASSIFIER
    texts, labels = _read_synthetic(args.synthetic)
    test = read_labelled(
        args.test, text_columns=args.text_columns, label_column=args.label_column, field="test"
    )
    unlabeled = None
    if args.unlabeled is not None:
        unlabeled = read_labelled(
            args.unlabeled, text_columns=args.text_columns, label_column=None, field="unlabeled"
        ).texts
    embedder = SentenceEmbedder() if classifier == "embedding" else None
    coral = {} if args.coral_weight is None else {"coral_weight": args.coral_weight}
    data = {
        "train_texts": "synthetic",
        "train_labels": "synthetic",
        "test_texts": "test",
        "test_labels": "test",
    }
    with _fields_as(data):
        synthetic = train_and_score(
            texts,
            labels,
            test.texts,
            test.labels,
            classifier=classifier,
            unlabeled=unlabeled,
            seed=args.seed,
            embedder=embedder,
            **coral,
        )
    out: dict[str, Any] = {**synthetic.to_dict()}
    if args.train_real is not None:
        real = read_labelled(
            args.train_real,
            text_columns=args.text_columns,
            label_column=args.label_column,
            field="train_real",
        )
        with _fields_as({**data, "train_texts": "train_real", "train_labels": "train_real"}):
            baseline = train_and_score(
                real.texts,
                real.labels,
                test.texts,
                test.labels,
                classifier=classifier,
                seed=args.seed,
                embedder=embedder,
            )
        out["accuracy_real"] = baseline.accuracy
        out["macro_f1_real"] = baseline.macro_f1
        out["relative_accuracy"] = (
            synthetic.accuracy / baseline.accuracy if baseline.accuracy else None
        )
    print(json.dumps(out))
    return 0
