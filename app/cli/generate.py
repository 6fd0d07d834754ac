"""``keyseed generate``: the engine on files, without the service.

It is for a data owner on their own machine: it reads a labelled CSV (or JSONL), runs a
method (``--method dpkps``, the default: DP-KPS, optionally prompting an LLM;
``--method aug-pe`` (Private Evolution for text), ``pate-tutor`` (PATE discriminator
with a DP label tutor) or ``dp-eda`` (DP evolution of embeddings), which need an LLM:
:mod:`workers.methods.registry`), and writes ``OUT.jsonl`` (one synthetic document a
line) and ``OUT.manifest.json`` (every parameter, the models, the privacy events and
their composed (ε, δ), LLM costs). Both files appear only when the run succeeded: they
are written under temporary names and renamed at the end, so an interrupted or failed
run leaves nothing that looks complete.

Its options are declared in :mod:`app.cli.options`. Every check that needs no model
(options, labels, vocabulary, the input file) runs first, with only the standard
library and pydantic loaded (:mod:`app.cli.checks`); the numerical stack, the
embedding model and the LLM are imported after. An option of another method is
refused. An LLM method's run keeps its DP outputs in ``OUT.checkpoints/`` as it goes:
a killed run, started again with the same arguments, resumes without drawing (or
spending) again. The folder is removed once the outputs are in place.

What reaches the terminal: progress bars and errors on stderr. Errors name the option
(``--epsilon-kde: must be finite and > 0``) or the row of the input, never a document's
text. A few warnings about the corpus itself (documents without any vocabulary phrase,
very small classes) are facts about the private data that only its owner sees here;
they are never written to the output or the manifest.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.cli import checks
from workers.errors import ConfigError, KeyseedError
from workers.methods.progress import run_stages
from workers.progress_bars import StageBars

if TYPE_CHECKING:
    from workers.llm.client import LLMCosts

SMALL_CLASS = 20  # fewer documents than this: warn the owner that the class is mostly noise


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
    few_shot: tuple[str, ...],
    endpoint: Any,
    sequences: Sequence[Any],
    settings: Any,
    progress: StageBars,
    costs: LLMCosts,
) -> tuple[list[str | None], dict[str, Any]]:
    """Texts for every sequence (None where the LLM failed) and a public summary; what
    the calls cost is added to ``costs``. ``endpoint``: the one of ``--llm openai``,
    resolved before the run (None for the packaged model)."""
    from workers.llm.local import LocalLLMServer
    from workers.methods.dpkps.prompting import PromptSpec, run_prompts

    spec = PromptSpec(document_type=args.document_type, few_shot=few_shot).validate()
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


def _manifest_path(output: Path) -> Path:
    return output.with_name(output.name[: -len(".jsonl")] + ".manifest.json")


def _declared(label_set: list[str]) -> dict[str, Any]:
    """The manifest's ``labels``: the declared ones."""
    return {"names": label_set, "source": "declared"}


def _inputs(args: argparse.Namespace) -> dict[str, Any]:
    """What every method's manifest says of its input file (its columns' names) and when
    it ran."""
    return {
        "input": {
            "text_columns": args.text_columns,
            "label_column": args.label_column,
            "unit_column": args.unit_column,
        },
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _write_outputs(
    args: argparse.Namespace,
    records: Sequence[dict[str, Any]],
    manifest: dict[str, Any],
    *,
    none_is_an_error: bool = False,
) -> Path:
    """``OUT.jsonl`` (one record a line) and its manifest, with the documents written,
    both or neither (:func:`_atomic_outputs`: none written is an error where the LLM
    could fail on every sequence). The manifest's path."""
    manifest_path = _manifest_path(args.output)
    with _atomic_outputs(args.output, manifest_path) as (out_tmp, manifest_tmp):
        with open(out_tmp, "w", encoding="utf-8") as out:
            for record in records:
                out.write(json.dumps(record, ensure_ascii=False) + "\n")
        manifest["documents_written"] = len(records)
        manifest_tmp.write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
        if none_is_an_error and not records:
            raise KeyseedError("the language model produced no text for any sequence", field="llm")
    return manifest_path


def _endpoint(args: argparse.Namespace, settings: Any) -> Any:
    """The endpoint of ``--llm openai``, resolved before the run (None otherwise: the
    packaged model starts when the LLM is needed, or there is none)."""
    return _endpoint_for(args.llm, settings) if args.llm == "openai" else None


def generate(args: argparse.Namespace) -> int:
    started = time.time()
    try:
        return _generate(args, started)
    except KeyseedError as exc:
        return checks.fail(exc)


def _generate(args: argparse.Namespace, started: float) -> int:
    from workers.methods.catalog import METHOD_PARAMS

    checks.check_run_options(args)
    if args.method in METHOD_PARAMS:  # its options are its own parameter model's
        return _generate_llm_method(args, started)
    from workers.text.vocabulary import load_vocabulary

    params = checks.dpkps_params(args)
    config = params.generation_config(args.device)
    label_set = checks.declared_labels(args)
    if len(label_set) < 2:
        raise ConfigError("a labelled corpus needs at least two labels", field="declared_labels")
    vocabulary = load_vocabulary(args.vocabulary)
    config.check_vocabulary(vocabulary.name, len(vocabulary))
    config = config.for_classes(len(label_set))  # the default subspace: by the label set
    if args.dry_run:  # public inputs only: --input is not opened
        from workers.methods.dpkps.config import method_description
        from workers.methods.dpkps.run import plan_of

        summary = {
            "method": method_description(config),
            "parameters": config.to_dict(),
            **plan_of(params, label_set, len(vocabulary)).to_dict(),
        }
        print(json.dumps(summary, indent=2, ensure_ascii=False))
        return 0
    from workers.settings import CoreSettings

    settings = CoreSettings()
    few_shot = checks.read_few_shot(args.few_shot) if args.llm != "none" else ()
    endpoint = _endpoint(args, settings)
    corpus = checks.read_input(args, label_set)
    # Every check that needs no model has passed: the engine loads from here on.
    from workers.llm.client import LLMCosts
    from workers.methods.dpkps.pipeline import shuffled
    from workers.methods.dpkps.run import plan_of
    from workers.methods.registry import METHODS
    from workers.text.embeddings import EmbeddingCache, SentenceEmbedder

    planned = plan_of(params, label_set, len(vocabulary))
    embedder = SentenceEmbedder(settings.embedding_model, device=config.device)
    cache = EmbeddingCache(settings.embedding_cache_dir)
    progress = StageBars(run_stages(args.method, mode=config.mode, llm=args.llm))
    try:
        result = METHODS[args.method].run(
            corpus.texts,
            corpus.labels,
            label_set=label_set,
            units=corpus.units,
            params=params,
            vocabulary=vocabulary,
            embedder=embedder,
            cache=cache,
            progress=progress,
            unit_name=args.unit_column,
            device=config.device,
            planned=planned,
        )
        progress.close()
        _warn_owner(result)
        sequences = shuffled(result.sequences, config.seed)
        prompting: dict[str, Any] = {"llm": "none"}
        costs = LLMCosts()
        texts: list[str | None] = [" ".join(s.keyphrases) for s in sequences]
        if args.llm != "none":
            texts, prompting = _prompt(
                args, few_shot, endpoint, sequences, settings, progress, costs
            )
    finally:
        progress.close()
    manifest = {
        **result.manifest(),
        "labels": _declared(label_set),
        "prompting": prompting,
        "llm_costs": {"method": args.method, **costs.as_dict()},
        **_inputs(args),
    }
    records = [
        {"label": seq.label, "keyphrases": list(seq.keyphrases), "text": text}
        for seq, text in zip(sequences, texts, strict=True)
        if text is not None  # the LLM failed on it; counted in the manifest
    ]
    manifest_path = _write_outputs(args, records, manifest, none_is_an_error=True)
    written = len(records)
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


def _plan_llm_method(args: argparse.Namespace, params: Any, label_set: list[str]) -> int:
    """``--dry-run`` of an LLM method: its planned events and composed (ε, δ)."""
    from workers.methods.registry import METHODS
    from workers.privacy.accountant import compose

    method = METHODS[args.method]
    events = method.plan(params, label_set)
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


def _generate_llm_method(args: argparse.Namespace, started: float) -> int:
    """``--method aug-pe``, ``pate-tutor`` or ``dp-eda``: the run, its checkpoints in
    ``OUT.checkpoints/`` (a killed run resumes), ``OUT.jsonl`` and its manifest."""
    from workers.methods.catalog import vocabulary_of
    from workers.settings import CoreSettings
    from workers.text.vocabulary import load_vocabulary

    params = checks.method_params(args)
    label_set = checks.declared_labels(args)
    if args.dry_run:  # public inputs only: --input is not opened
        return _plan_llm_method(args, params, label_set)
    if args.llm == "none":
        raise ConfigError(
            f"{args.method} writes texts with an LLM: choose local or openai", field="llm"
        )
    settings = CoreSettings()
    vocabulary_name = vocabulary_of(args.method, params)
    vocabulary = load_vocabulary(vocabulary_name) if vocabulary_name is not None else None
    endpoint = _endpoint(args, settings)
    corpus = checks.read_input(args, label_set)
    # Every check that needs no model has passed: the engine loads from here on.
    from workers.llm.local import LocalLLMServer
    from workers.methods.checkpoints import DirectoryCheckpoints
    from workers.methods.registry import METHODS
    from workers.text.embeddings import EmbeddingCache, SentenceEmbedder

    method = METHODS[args.method]
    method.plan(params, label_set)  # its errors, before the embedding model loads
    extra: dict[str, Any] = {}
    if vocabulary is not None:
        extra["vocabulary"] = vocabulary
        extra["cache"] = EmbeddingCache(settings.embedding_cache_dir)
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
    manifest = {
        **result.manifest,
        "labels": _declared(label_set),
        "llm": {
            "llm": args.llm,
            "base_url": endpoint.base_url if args.llm == "openai" else "local",
            "model": endpoint.model,
        },
        **_inputs(args),
    }
    records = [{"label": label, "text": text} for label, text in result.records]
    manifest_path = _write_outputs(args, records, manifest)
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
