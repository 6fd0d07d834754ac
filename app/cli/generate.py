"""``keyseed generate``: the engine on files, without the service.

It is for a data owner on their own machine: it reads a labelled CSV (or JSONL), runs a
method (``--method dpkps``, the default: DP-KPS, optionally prompting an LLM;
``--method aug-pe`` (Private Evolution for text), ``pate-tutor`` (PATE discriminator
with a DP label tutor) or ``dp-eda`` (DP evolution of embeddings), which need an LLM),
and writes ``OUT.jsonl`` (one synthetic document a line) and ``OUT.manifest.json``
(every parameter, the models, the privacy events and their composed (ε, δ), LLM
costs). Both files appear only when the run succeeded: they are written under
temporary names and renamed at the end, so an interrupted or failed run leaves nothing
that looks complete.

Every method goes through one path, as the service's worker runs them
(:mod:`workers.methods.registry`): its parameters from its own model, its plan, its run
with the inputs its registry entry says it takes, its result as a
:class:`~workers.methods.outcome.RunOutcome`, written by one writer; ``--dry-run``
prints one format for every method (:func:`_planned`). A run that releases keyphrase
sequences (DP-KPS) has them written out by an LLM afterwards (post-processing) or
writes each as its keyphrases; a method that writes its texts with an LLM keeps its DP
outputs in ``OUT.checkpoints/`` as it goes: a killed run, started again with the same
arguments, resumes without drawing (or spending) again. The folder is removed once the
outputs are in place.

The input is never held whole where it need not be: its checks read it a row at a time,
and a DP-KPS run in a configuration the service shards
(:func:`workers.methods.dpkps.shards.shardable`: class centroids or moments over a
public vocabulary, the default) runs as ONE shard of
:class:`~workers.methods.dpkps.shards.ShardedRun`, reading the file once a round: its
memory does not grow with the corpus. Its result, manifest and privacy events are those
of the same run in memory (the same releases, of the same sums). Other runs read the
corpus into memory.

Its options are declared in :mod:`app.cli.options`. Every check that needs no model
(options, labels, vocabulary, the input file) runs first, with only the standard
library and pydantic loaded (:mod:`app.cli.checks`); the numerical stack, the
embedding model and the LLM are imported after. An option of another method is
refused.

What reaches the terminal: progress bars and errors on stderr. Errors name the option
(``--epsilon-kde: must be finite and > 0``) or the row of the input, never a document's
text. A few warnings about the corpus itself (documents without any vocabulary phrase,
very small classes) are facts about the private data that only its owner sees here;
they are never written to the output or the manifest.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import sys
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.cli import checks
from workers.errors import ConfigError, KeyseedError
from workers.methods.progress import run_stages
from workers.progress_bars import StageBars

if TYPE_CHECKING:
    from workers.llm.client import LLMCosts
    from workers.methods.dpkps.shards import ShardedRun
    from workers.methods.outcome import RunOutcome

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


def _warn_owner(diag: Any) -> None:
    """Facts about the private corpus (a run's owner diagnostics, None where its method
    gives none), for its owner's terminal only."""
    if diag is None:
        return
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


def _endpoint(args: argparse.Namespace, settings: Any) -> Any:
    """The endpoint of ``--llm openai``, resolved before the run (None otherwise: the
    packaged model starts when the LLM is needed, or there is none)."""
    if args.llm != "openai":
        return None
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


def _llm_block(args: argparse.Namespace, endpoint: Any) -> dict[str, Any]:
    """The manifest's ``llm``: the LLM named, and the endpoint that wrote the texts (none
    where no LLM wrote any)."""
    if endpoint is None:
        return {"llm": args.llm}
    return {
        "llm": args.llm,
        "base_url": endpoint.base_url if args.llm == "openai" else "local",
        "model": endpoint.model,
    }


def _prompt(
    args: argparse.Namespace,
    few_shot: tuple[str, ...],
    endpoint: Any,
    sequences: Sequence[tuple[str, Sequence[str]]],
    settings: Any,
    progress: StageBars,
    costs: LLMCosts,
) -> tuple[list[str | None], dict[str, Any]]:
    """Texts for every ``(label, keyphrases)`` sequence (None where the LLM failed) and a
    public summary; what the calls cost is added to ``costs``. ``endpoint``: the one of
    ``--llm openai``, resolved before the run (None for the packaged model)."""
    from workers.llm.local import LocalLLMServer
    from workers.methods.dpkps.prompting import PromptSpec, run_prompts

    spec = PromptSpec(document_type=args.document_type, few_shot=few_shot).validate()
    keyphrases = [list(phrases) for _, phrases in sequences]
    with contextlib.ExitStack() as stack:
        if endpoint is None:
            endpoint = stack.enter_context(LocalLLMServer()).endpoint
        outcomes = run_prompts(
            keyphrases,
            endpoint=endpoint,
            spec=spec,
            concurrency=args.llm_concurrency or settings.llm_concurrency,
            max_calls=args.max_llm_calls or settings.llm_max_calls,
            progress=progress.prompts,
            costs=costs,
        )
    failures = Counter(o.error for o in outcomes if o.text is None)
    summary = {
        **_llm_block(args, endpoint),
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


def generate(args: argparse.Namespace) -> int:
    started = time.time()
    try:
        return _generate(args, started)
    except KeyseedError as exc:
        return checks.fail(exc)


def _generate(args: argparse.Namespace, started: float) -> int:
    """Every method through one path: its parameters from its own model, its plan, its
    run with the inputs its registry entry says it takes, its outcome written by
    :func:`_write_outputs` (:mod:`workers.methods.registry`)."""
    checks.check_run_options(args)
    params = checks.run_params(args)
    label_set = checks.declared_labels(args)
    vocabulary = checks.read_vocabulary(args, params)
    size = len(vocabulary) if vocabulary is not None else None
    if args.dry_run:  # public inputs only: --input is not opened
        print(json.dumps(_planned(args, params, label_set, size), indent=2, ensure_ascii=False))
        return 0
    from workers.settings import CoreSettings

    settings = CoreSettings()
    few_shot = checks.read_few_shot(args.few_shot) if args.llm != "none" else ()
    endpoint = _endpoint(args, settings)
    rows = checks.check_input(args, label_set)  # one pass over the file, a row at a time
    # Every check that needs no model has passed: the engine loads from here on.
    from workers.llm.local import LocalLLMServer
    from workers.methods.checkpoints import DirectoryCheckpoints
    from workers.methods.registry import METHODS
    from workers.text.embeddings import SentenceEmbedder

    method = METHODS[args.method]
    if method.writes_texts and args.llm == "none":
        raise ConfigError(
            f"{method.id} writes texts with an LLM: choose local or openai", field="llm"
        )
    method.plan(params, label_set, size)  # its errors, before the embedding model loads
    inputs = _run_inputs(args, method, vocabulary, settings)
    checkpoint_dir = _checkpoint_dir(args.output)
    embedder = SentenceEmbedder(settings.embedding_model, device=args.device)
    progress = StageBars(run_stages(args.method, mode=args.mode or "independent", llm=args.llm))
    try:
        with contextlib.ExitStack() as stack:
            if method.writes_texts:  # with its LLM, from its checkpoints (a killed run resumes)
                if checkpoint_dir.is_dir():
                    print(f"resuming from {checkpoint_dir}", file=sys.stderr)
                if endpoint is None:
                    server = LocalLLMServer(max_tokens=params.max_tokens)
                    endpoint = stack.enter_context(server).endpoint
                inputs["llm"] = endpoint
                inputs["checkpoints"] = DirectoryCheckpoints(checkpoint_dir)
            result = _run(args, method, params, label_set, rows, embedder, progress, inputs)
        progress.close()
        _warn_owner(method.owner_diagnostics(result))
        outcome = method.outcome(result, params, label_set, args.unit_column)
        texts, written_by = _texts(args, outcome, endpoint, few_shot, settings, progress)
    finally:
        progress.close()
    manifest = {
        **outcome.manifest,
        "labels": _declared(label_set),
        **written_by,
        **_inputs(args),
    }
    afterwards = outcome.texts is None  # its texts were written from its sequences
    records = [
        {"label": label, **({"keyphrases": list(phrases)} if afterwards else {}), "text": text}
        for (label, phrases), text in zip(outcome.sequences, texts, strict=True)
        if text is not None  # the LLM failed on it; counted in the manifest
    ]
    manifest_path = _write_outputs(args, records, manifest, none_is_an_error=afterwards)
    if method.writes_texts:
        shutil.rmtree(checkpoint_dir, ignore_errors=True)  # the outputs hold the run now
    _report(args, outcome, manifest, records, manifest_path, started)
    return 0


def _run(
    args: argparse.Namespace,
    method: Any,
    params: Any,
    label_set: list[str],
    rows: Any,
    embedder: Any,
    progress: StageBars,
    inputs: dict[str, Any],
) -> Any:
    """``method``'s run on the corpus of ``rows`` (checked, read from the file at each
    pass): streamed as one shard where it is DP-KPS in a configuration the sharded run
    takes (:func:`_streamed`), else on the corpus read into memory, as its registry entry
    runs it. Either way the same result (:mod:`workers.methods.dpkps.shards`)."""
    one_shard = _one_shard(args, method, params, label_set, embedder, inputs, progress)
    if one_shard is not None:
        return _streamed(one_shard, rows, progress)
    corpus = rows.read()  # checked already: one more pass, into memory
    return method.run(
        corpus.texts,
        corpus.labels,
        label_set=label_set,
        units=corpus.units,
        params=params,
        embedder=embedder,
        progress=progress,
        **inputs,
    )


def _one_shard(
    args: argparse.Namespace,
    method: Any,
    params: Any,
    label_set: list[str],
    embedder: Any,
    inputs: dict[str, Any],
    progress: StageBars,
) -> ShardedRun | None:
    """DP-KPS's sharded run of ``params`` (:class:`~workers.methods.dpkps.shards.ShardedRun`,
    its key 32 random bytes, never shown) where its configuration is one it takes
    (:func:`~workers.methods.dpkps.shards.shardable`: class centroids or moments over a
    public vocabulary with Gaussian noise, the default); None otherwise."""
    from workers.methods.dpkps.shards import ShardedRun, shardable
    from workers.methods.registry import DPKPS
    from workers.privacy.sampling import KEY_BYTES

    if method.id != DPKPS:
        return None
    config = params.generation_config(args.device)
    if not shardable(config.for_classes(len(label_set))):
        return None
    return ShardedRun(
        config=config,
        label_set=label_set,
        vocabulary=inputs["vocabulary"],
        embedder=embedder,
        cache=inputs["cache"],
        planned=None,  # as run_dpkps: the plan of the configuration
        key=secrets.token_bytes(KEY_BYTES),
        unit_name=args.unit_column,
        device=args.device or "auto",
        progress=progress,
    )


def _streamed(run: ShardedRun, rows: Iterable[Any], progress: StageBars) -> Any:
    """``run``'s rounds with the whole corpus as its one shard, the file read again for
    each (a row at a time: what is held is a batch of documents and the class sums),
    then its post-processing; the :class:`~workers.methods.dpkps.pipeline.GenerationResult`
    a run in memory gives."""
    from workers.methods.progress import ROUND_STAGES

    state = None
    for name in run.rounds:
        progress(ROUND_STAGES[name], 0.0)
        state = run.reduce(name, [run.map(name, rows, state)], state)
        progress(ROUND_STAGES[name], 1.0)
    assert state is not None  # a run has at least its sums round
    return run.finish(state, progress=progress)


def _run_inputs(
    args: argparse.Namespace, method: Any, vocabulary: Any, settings: Any
) -> dict[str, Any]:
    """What the run of ``method`` takes besides the corpus and its parameters, as its
    registry entry says: the vocabulary it reads (and an embedding cache for its
    phrases), the unit column's name and the device (its LLM and checkpoints are added
    where the run starts)."""
    from workers.text.embeddings import EmbeddingCache

    inputs: dict[str, Any] = {}
    if vocabulary is not None:
        inputs["vocabulary"] = vocabulary
        inputs["cache"] = EmbeddingCache(settings.embedding_cache_dir)
    if method.takes_unit_and_device:
        inputs["unit_name"] = args.unit_column
        inputs["device"] = args.device
    return inputs


def _texts(
    args: argparse.Namespace,
    outcome: RunOutcome,
    endpoint: Any,
    few_shot: tuple[str, ...],
    settings: Any,
    progress: StageBars,
) -> tuple[list[str | None], dict[str, Any]]:
    """The released documents' texts (None where the LLM failed on one) and the
    manifest's entries on what wrote them: the texts the run wrote with its LLM; or, for
    a run that released keyphrase sequences, an LLM prompted with each afterwards
    (post-processing, ``prompting`` and its ``llm_costs``), or each its keyphrases."""
    from workers.llm.client import LLMCosts

    if outcome.texts is not None:
        return list(outcome.texts), {"llm": _llm_block(args, endpoint)}
    costs = LLMCosts()
    texts: list[str | None] = [text for _, text in outcome.released()]
    prompting: dict[str, Any] = {"llm": "none"}
    if args.llm != "none":
        texts, prompting = _prompt(
            args, few_shot, endpoint, outcome.sequences, settings, progress, costs
        )
    return texts, {"prompting": prompting, "llm_costs": {"method": args.method, **costs.as_dict()}}


def _report(
    args: argparse.Namespace,
    outcome: RunOutcome,
    manifest: dict[str, Any],
    records: Sequence[dict[str, Any]],
    manifest_path: Path,
    started: float,
) -> None:
    """The run's one line on stderr: what was written, what it spent, how long it took."""
    drawn = manifest.get("sequences_drawn", len(outcome.sequences))
    filtered = (
        f"; the consistency filter kept {len(outcome.sequences)} of {drawn} sequences drawn"
        if drawn != len(outcome.sequences)
        else ""
    )
    calls = f"; {manifest['llm_costs']['calls']} LLM calls" if args.llm != "none" else ""
    print(
        f"wrote {len(records)} synthetic documents to {args.output} "
        f"(ε = {outcome.epsilon:.6g}, δ = {manifest['privacy']['delta']:g} spent{filtered}"
        f"{calls}; manifest {manifest_path}; {time.time() - started:.1f} s)",
        file=sys.stderr,
    )


def _planned(
    args: argparse.Namespace, params: Any, label_set: list[str], vocabulary_size: int | None
) -> dict[str, Any]:
    """``--dry-run``, one format for every method (public inputs only): the method and
    what it runs in words, its parameters (every one the run uses, resolved), the
    declared labels, the LLM calls it plans and the documents it can release, its
    releases' events and the (ε, δ) they compose to."""
    from workers.methods.registry import METHODS
    from workers.privacy.accountant import compose, epsilon_by_mechanism

    method = METHODS[args.method]
    classes = len(label_set)
    events = method.plan(params, label_set, vocabulary_size)
    prompts = method.writes_texts or args.llm != "none"  # else no LLM writes anything
    return {
        "method": method.id,
        "description": method.described(params, classes),
        "parameters": method.engine_parameters(params, classes),
        "labels": label_set,
        "planned_llm_calls": method.planned_calls(params, classes) if prompts else 0,
        "max_released": method.max_released(params, classes),
        "events": [e.to_dict() for e in events],
        "by_mechanism": epsilon_by_mechanism(events, params.delta),
        "privacy": compose(events).to_dict(delta=params.delta),
    }


def _checkpoint_dir(output: Path) -> Path:
    """``OUT.checkpoints/`` beside ``OUT.jsonl``."""
    return output.with_name(output.name[: -len(".jsonl")] + ".checkpoints")
