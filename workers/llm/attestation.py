"""A hash-chained log of every prompt a job sends to an LLM (issue 66, item 4).

The attestation that the LLM saw only DP outputs and public inputs: each prompt is
recorded before it can leave, with what it was built from, and each record carries the
hash of the one before, so a log whose head hash is printed in the release report
cannot be changed, shortened or reordered without the change showing.

A **record** (the hashed part, canonical JSON: keys sorted, no spaces, UTF-8) holds:

* ``seq``: its number in the chain, from 0; ``prev``: the previous record's hash
  (:data:`GENESIS` for the first);
* ``key``: the request's stable name within the job (``dpkps/sequence/17``,
  ``aug_pe/variation/2.0/31``), ``kind``: what built it (a renderer's name);
* ``prompt_sha256``: SHA-256 of the canonical JSON of the chat messages sent;
* ``inputs``: the SHA-256 of each input the prompt was built from (a released keyphrase
  sequence, the template, a synthetic parent text), by name;
* ``refs``: public identifiers recorded in clear (a sequence's position, the model, the
  document type, an iteration).

``hash`` = SHA-256 of the canonical JSON of the record. A log line is the record, its
``hash`` and, for whoever may read the release, its ``content``: the messages and the
inputs in clear, which must hash to the record's digests. Without the content (what
platform roles get) the chain still verifies; with it, a prompt whose ``kind`` has a
renderer (:data:`RENDERERS`: DP-KPS's prompt, the random prompt of Aug-PE and
PATE-tutor) is rendered again from its inputs and must be the prompt sent.

Retries. A record's ``entry`` (SHA-256 of key, kind, digests and refs, without its
place in the chain) names the request: a retried request that sends the same prompt
again appends nothing (:meth:`MemoryPromptLog.append`), so a resumed run neither forks
nor duplicates the chain, and what it appends follows in the order of the requests
(callers record a batch in position order before sending any of it: the order never
depends on which call finished first).

Where it is recorded. Every prompt of a job leaves through
:func:`workers.llm.client.complete`; while a log is bound (:func:`recording`),
``complete`` builds a batch's messages, hands them to the log, and sends exactly
what was recorded. This module is pure: no I/O beyond what a log does.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

GENESIS = "0" * 64
FORMAT = "keyseed prompt log 1"
BODY_FIELDS = ("key", "kind", "prompt_sha256", "inputs", "refs")
RECORD_FIELDS = ("seq", "prev", *BODY_FIELDS)
UNATTRIBUTED = "unattributed"

Messages = list[dict[str, str]]


def canonical(value: Any) -> bytes:
    """The canonical JSON of ``value``: keys sorted, no spaces, UTF-8, no NaN."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode()


def digest(value: Any) -> str:
    """SHA-256 (hex) of the canonical JSON of ``value``.

    >>> digest("a")
    'ac8d8342bbb2362d13f0a559a3621bb407011368895164b628a54f7fc33fc43c'
    """
    return hashlib.sha256(canonical(value)).hexdigest()


@dataclass(frozen=True)
class Prompt:
    """One request about to be sent: its messages and what they were built from.

    ``inputs`` are the values the prompt was built from (recorded as digests, shown in
    clear in the content); ``refs`` public identifiers recorded in clear.
    """

    key: str
    kind: str
    messages: Messages
    inputs: Mapping[str, Any] = field(default_factory=dict)
    refs: Mapping[str, Any] = field(default_factory=dict)

    def body(self) -> dict[str, Any]:
        """The hashed fields that do not depend on the chain."""
        return {
            "key": self.key,
            "kind": self.kind,
            "prompt_sha256": digest(self.messages),
            "inputs": {name: digest(value) for name, value in sorted(self.inputs.items())},
            "refs": dict(sorted(self.refs.items())),
        }

    def entry(self) -> str:
        """What names the request whatever its place in the chain (dedup on retries)."""
        return digest(self.body())

    def content(self) -> dict[str, Any]:
        return {"messages": self.messages, "inputs": dict(self.inputs)}


@dataclass(frozen=True)
class Source:
    """What a request is built from, before its messages exist (:class:`Prompt`)."""

    key: str
    kind: str
    inputs: Mapping[str, Any] = field(default_factory=dict)
    refs: Mapping[str, Any] = field(default_factory=dict)

    def prompt(self, messages: Messages) -> Prompt:
        return Prompt(self.key, self.kind, messages, dict(self.inputs), dict(self.refs))


def unattributed(position: int, messages: Messages) -> Prompt:
    """A prompt whose caller said nothing of its inputs (recorded all the same)."""
    return Prompt(key=f"{UNATTRIBUTED}/{position}", kind=UNATTRIBUTED, messages=messages)


def chain_hash(record: Mapping[str, Any]) -> str:
    """The hash of a record: SHA-256 of the canonical JSON of its :data:`RECORD_FIELDS`."""
    return digest(record_of(record))


def entry_of(line: Mapping[str, Any]) -> str:
    """The entry of a log line (:meth:`Prompt.entry` of the prompt it records)."""
    return digest({name: line[name] for name in BODY_FIELDS})


def record_of(line: Mapping[str, Any]) -> dict[str, Any]:
    """The hashed fields of a log line."""
    return {name: line[name] for name in RECORD_FIELDS}


def link(prompt: Prompt, *, seq: int, prev: str) -> dict[str, Any]:
    """The log line of ``prompt`` as record ``seq`` after a record of hash ``prev``."""
    record: dict[str, Any] = {"seq": seq, "prev": prev, **prompt.body()}
    return {**record, "hash": chain_hash(record), "content": prompt.content()}


def extend(
    prompts: Iterable[Prompt], known: set[str], *, seq: int, head: str
) -> list[dict[str, Any]]:
    """The log lines of the prompts whose entry is not in ``known`` (updated), in order,
    chained after a log of ``seq`` records whose head is ``head``."""
    added: list[dict[str, Any]] = []
    for prompt in prompts:
        entry = prompt.entry()
        if entry in known:
            continue
        known.add(entry)
        line = link(prompt, seq=seq + len(added), prev=head)
        added.append(line)
        head = line["hash"]
    return added


def head_of(lines: Sequence[Mapping[str, Any]]) -> str:
    """The chain's head hash (:data:`GENESIS` for an empty log)."""
    return str(lines[-1]["hash"]) if lines else GENESIS


# ----------------------------------------------------------------------- logs


class PromptLog(Protocol):
    """Where a job's prompts are recorded; ``append`` returns once they are stored."""

    def append(self, prompts: Sequence[Prompt]) -> None: ...


class MemoryPromptLog:
    """A log in memory (tests, the CLI): ``lines`` in chain order."""

    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []
        self.known: set[str] = set()

    def append(self, prompts: Sequence[Prompt]) -> None:
        self.lines += extend(prompts, self.known, seq=len(self.lines), head=self.head)

    @property
    def head(self) -> str:
        return head_of(self.lines)


_LOG: contextvars.ContextVar[PromptLog | None] = contextvars.ContextVar(
    "keyseed_prompt_log", default=None
)


@contextlib.contextmanager
def recording(log: PromptLog) -> Iterator[PromptLog]:
    """Record every prompt sent through the shared client within the block in ``log``."""
    token = _LOG.set(log)
    try:
        yield log
    finally:
        _LOG.reset(token)


def current() -> PromptLog | None:
    """The log bound by :func:`recording`, if any."""
    return _LOG.get()


def record(
    positions: Sequence[int],
    messages_for: Callable[[int], Messages],
    describe: Callable[[int, Messages], Prompt] | None,
) -> Callable[[int], Messages] | None:
    """When a log is bound: build the messages of ``positions``, append their prompts
    (in position order) and return what to send for a position (exactly what was
    recorded); else None."""
    log = current()
    if log is None:
        return None
    built = {position: messages_for(position) for position in positions}
    log.append(
        [
            (describe or unattributed)(position, messages)
            for position, messages in sorted(built.items())
        ]
    )
    return built.__getitem__


# ----------------------------------------------------------------------- verification


def _dpkps(inputs: Mapping[str, Any], refs: Mapping[str, Any]) -> Messages:
    from workers.methods.dpkps.prompting import PromptSpec, build_messages

    spec = PromptSpec(str(refs["document_type"]), tuple(inputs["few_shot"]), inputs["template"])
    return build_messages(list(inputs["keyphrases"]), spec)


def _random(inputs: Mapping[str, Any], refs: Mapping[str, Any]) -> Messages:
    from workers.methods.aug_pe.prompts import random_messages

    return random_messages(document_type=str(refs["document_type"]), label=str(refs["label"]))


def _population(inputs: Mapping[str, Any], refs: Mapping[str, Any]) -> Messages:
    from workers.methods.dp_eda.decoding import population_messages

    return population_messages(document_type=str(refs["document_type"]), label=str(refs["label"]))


def _reconstruction(inputs: Mapping[str, Any], refs: Mapping[str, Any]) -> Messages:
    from workers.methods.dp_eda.decoding import reconstruction_messages

    return reconstruction_messages(
        document_type=str(refs["document_type"]),
        label=str(refs["label"]),
        phrases=list(inputs["phrases"]),
        draft=inputs["draft"],
    )


DPKPS = "dpkps.sequence"
RANDOM = "random_document"  # Aug-PE's RANDOM_API, PATE-tutor's public pool
VARIATION = "aug_pe.variation"  # a synthetic text (post-processing of DP selections) varied
POPULATION = "dp_eda.population"
RECONSTRUCTION = "dp_eda.reconstruction"  # public phrases near a DP target, and a draft
# kind -> the prompt rendered again from the record's inputs (in clear) and refs
RENDERERS: dict[str, Callable[[Mapping[str, Any], Mapping[str, Any]], Messages]] = {
    DPKPS: _dpkps,
    RANDOM: _random,
    POPULATION: _population,
    RECONSTRUCTION: _reconstruction,
}


@dataclass
class Verdict:
    """What :func:`verify` found: ``problems`` empty means the log holds."""

    records: int = 0
    head: str = GENESIS
    with_content: int = 0
    rederived: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def verify(
    lines: Iterable[Mapping[str, Any]], *, rederive: bool = True, limit: int = 20
) -> Verdict:
    """Check the chain (numbering, links, hashes), each content against its record's
    digests and, for a kind with a renderer, the prompt against its inputs; problems
    name the record (``record 17 (dpkps/sequence/17)``). At most ``limit`` problems are
    listed."""
    verdict = Verdict()
    prev = GENESIS
    for number, line in enumerate(lines):
        verdict.records += 1
        name = f"record {number}"
        missing = [f for f in (*RECORD_FIELDS, "hash") if f not in line]
        if missing:
            verdict.problems.append(f"{name}: missing {', '.join(missing)}")
            prev = str(line.get("hash", ""))
            continue
        name += f" ({line['key']})"
        kind = str(line["kind"])
        verdict.by_kind[kind] = verdict.by_kind.get(kind, 0) + 1
        if line["seq"] != number:
            verdict.problems.append(f"{name}: numbered {line['seq']!r}, expected {number}")
        if line["prev"] != prev:
            verdict.problems.append(f"{name}: does not follow the record before it (prev)")
        try:
            computed = chain_hash(line)
        except (TypeError, ValueError):
            computed = ""
        if computed != line["hash"]:
            verdict.problems.append(f"{name}: its hash does not match its contents")
        prev = str(line["hash"])
        content = line.get("content")
        if content is not None:
            verdict.with_content += 1
            _check_content(name, line, content, rederive, verdict)
        if len(verdict.problems) >= limit:
            break
    verdict.head = prev
    return verdict


def _check_content(
    name: str, line: Mapping[str, Any], content: Any, rederive: bool, verdict: Verdict
) -> None:
    if not isinstance(content, Mapping) or not isinstance(content.get("inputs"), Mapping):
        verdict.problems.append(f"{name}: its content is not an object with inputs")
        return
    messages, inputs = content.get("messages"), content["inputs"]
    if digest(messages) != line["prompt_sha256"]:
        verdict.problems.append(f"{name}: the prompt shown is not the prompt recorded")
    shown = {key: digest(value) for key, value in inputs.items()}
    if shown != line["inputs"]:
        verdict.problems.append(f"{name}: the inputs shown are not the inputs recorded")
    renderer = RENDERERS.get(str(line["kind"]))
    if not rederive or renderer is None:
        return
    try:
        rendered = renderer(inputs, line["refs"])
    except Exception as exc:  # a record that cannot be rendered is a finding, not a crash
        verdict.problems.append(
            f"{name}: the prompt cannot be rendered from its inputs ({type(exc).__name__})"
        )
        return
    if rendered != messages:
        verdict.problems.append(f"{name}: the prompt is not the one its inputs render")
    else:
        verdict.rederived += 1


def read_jsonl(text: str) -> list[dict[str, Any]]:
    """Log lines from JSONL text; ValueError naming the line for one that is not JSON."""
    lines: list[dict[str, Any]] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"line {number} is not JSON ({exc.msg})") from None
        if not isinstance(value, dict):
            raise ValueError(f"line {number} is not a JSON object")
        lines.append(value)
    return lines
