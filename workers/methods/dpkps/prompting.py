"""Prompting an LLM with the DP keyphrase sequences (method.md, step 7).

One chat-completion call per sequence, through the shared client of
:mod:`workers.llm.client` (retries, concurrency bound, call cap, costs), against any
OpenAI-compatible endpoint or the packaged SmolLM2 of :mod:`workers.llm.local`. This
module owns what DP-KPS puts in a prompt, and nothing else.

Privacy. A prompt holds exactly three things: the document type (public, from the job
spec), one DP keyphrase sequence, and optionally few-shot example texts that the data
recipient supplied (public). No label, no private text, no count. :func:`build_messages`
takes nothing else, so nothing else can reach the LLM by accident. Everything the LLM
returns is post-processing of ε-DP releases, which is why a failed call can be retried
as often as the endpoint needs without spending budget.

Errors and log lines are the client's: short codes and counts, never a prompt or a
completion.
"""

from __future__ import annotations

import inspect
import string
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Unpack

from workers.errors import ConfigError
from workers.llm.attestation import DPKPS, Prompt
from workers.llm.client import (
    LLMCosts,
    LLMEndpoint,
    LLMOutcome,
    OnResult,
    Progress,
    RunOptions,
    check_run,
    complete,
    synchronous,
)
from workers.text.cleanup import clean_completion

SYSTEM_MESSAGE = (
    "You write realistic documents. Reply with the document text only: "
    "no title, no preamble, no notes."
)
# Not "uses all of these keyphrases": asked so, the small packaged model opened 57 of 160
# texts with talk about the keyphrases; asked this way, 5 of 160, and a classifier trained
# on the texts scored 0.770 instead of 0.729 (benchmarks/notes/2026-12-07-text-cleanup.md).
DEFAULT_TEMPLATE = (
    "{examples}Write a short {document_type} about {keyphrases}. "
    "Reply with the {document_type} itself, starting with its first sentence."
)
EXAMPLES_HEADER = "Examples of the style to follow:\n\n"
PLACEHOLDERS = ("document_type", "keyphrases", "examples")

# Bounds that keep one prompt within a small model's context; far above useful values.
LIMITS = {
    "document_type_chars": 200,
    "template_chars": 4_000,
    "few_shot": 8,
    "example_chars": 4_000,
    "keyphrases": 256,
    "keyphrase_chars": 200,
}

PromptOutcome = LLMOutcome  # what became of one sequence (index = its position)


# ----------------------------------------------------------------------- prompt


@dataclass(frozen=True)
class PromptSpec:
    """The public part of every prompt: document type, template, few-shot examples."""

    document_type: str
    few_shot: tuple[str, ...] = ()  # PUBLIC example texts supplied by the data recipient
    template: str = DEFAULT_TEMPLATE  # placeholders {document_type} {keyphrases} {examples}

    def __post_init__(self) -> None:
        if isinstance(self.few_shot, list):  # accept a list from JSON; keep the spec hashable
            object.__setattr__(self, "few_shot", tuple(self.few_shot))

    def validate(self) -> PromptSpec:
        if not isinstance(self.document_type, str) or not self.document_type.strip():
            raise ConfigError("must be a non-empty string", field="document_type")
        if len(self.document_type) > LIMITS["document_type_chars"]:
            raise ConfigError(
                f"must be at most {LIMITS['document_type_chars']} characters",
                field="document_type",
            )
        used = _template_placeholders(self.template)
        if "keyphrases" not in used:
            raise ConfigError("must contain the {keyphrases} placeholder", field="template")
        if not isinstance(self.few_shot, tuple):
            raise ConfigError("must be a list of example texts", field="few_shot")
        if len(self.few_shot) > LIMITS["few_shot"]:
            raise ConfigError(f"at most {LIMITS['few_shot']} examples", field="few_shot")
        for number, example in enumerate(self.few_shot, start=1):
            if not isinstance(example, str) or not example.strip():
                raise ConfigError(f"example {number} is not a non-empty string", field="few_shot")
            if len(example) > LIMITS["example_chars"]:
                raise ConfigError(
                    f"example {number} is longer than {LIMITS['example_chars']} characters",
                    field="few_shot",
                )
        if self.few_shot and "examples" not in used:
            raise ConfigError(
                "few-shot examples are given but the template has no {examples} placeholder",
                field="template",
            )
        return self


def _template_placeholders(template: object) -> set[str]:
    """The named fields of ``template``; ConfigError for anything but the three names."""
    if not isinstance(template, str) or not template.strip():
        raise ConfigError("must be a non-empty string", field="template")
    if len(template) > LIMITS["template_chars"]:
        raise ConfigError(
            f"must be at most {LIMITS['template_chars']} characters", field="template"
        )
    allowed = ", ".join("{" + name + "}" for name in PLACEHOLDERS)
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:  # a lone "{" or "}"
        raise ConfigError(
            f"is not a valid format string ({exc}); write {{{{ and }}}} for literal braces",
            field="template",
        ) from exc
    used: set[str] = set()
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if name not in PLACEHOLDERS or spec or conversion:
            shown = "{" + name + (f"!{conversion}" if conversion else "")
            shown += (f":{spec}" if spec else "") + "}"
            raise ConfigError(f"unknown placeholder {shown}; allowed: {allowed}", field="template")
        used.add(name)
    return used


def _clean(text: str) -> str:
    return " ".join(text.split())


def _check_keyphrases(keyphrases: object, *, name: str = "keyphrases") -> list[str]:
    if isinstance(keyphrases, str) or not isinstance(keyphrases, Sequence):
        raise ConfigError("must be a sequence of keyphrases", field=name)
    if not keyphrases:
        raise ConfigError("holds no keyphrase", field=name)
    if len(keyphrases) > LIMITS["keyphrases"]:
        raise ConfigError(f"holds more than {LIMITS['keyphrases']} keyphrases", field=name)
    cleaned = []
    for phrase in keyphrases:
        if not isinstance(phrase, str) or not phrase.strip():
            raise ConfigError("holds an empty or non-string keyphrase", field=name)
        if len(phrase) > LIMITS["keyphrase_chars"]:
            raise ConfigError(
                f"holds a keyphrase longer than {LIMITS['keyphrase_chars']} characters",
                field=name,
            )
        cleaned.append(_clean(phrase))
    return cleaned


def _render_examples(few_shot: Sequence[str]) -> str:
    if not few_shot:
        return ""
    blocks = [f"Example {i}:\n{text.strip()}" for i, text in enumerate(few_shot, start=1)]
    return EXAMPLES_HEADER + "\n\n".join(blocks) + "\n\n"


def build_messages(keyphrases: Sequence[str], spec: PromptSpec) -> list[dict[str, str]]:
    """The chat messages for one sequence: a fixed system message and one user message.

    The user message names the document type, the keyphrases (in sequence order, comma
    separated, whitespace collapsed) and the few-shot examples, and nothing else: there
    is no parameter through which a label or a private text could enter.
    """
    spec.validate()
    phrases = _check_keyphrases(keyphrases)
    user = spec.template.format(
        document_type=_clean(spec.document_type),
        keyphrases=", ".join(phrases),
        examples=_render_examples(spec.few_shot),
    ).strip()
    return [
        {"role": "system", "content": SYSTEM_MESSAGE},
        {"role": "user", "content": user},
    ]


# ----------------------------------------------------------------------- calls


async def prompt_sequences(
    sequences: Sequence[Sequence[str]],
    *,
    endpoint: LLMEndpoint,
    spec: PromptSpec,
    on_result: OnResult | None = None,
    progress: Progress | None = None,
    costs: LLMCosts | None = None,
    clean: bool = True,
    ids: Sequence[int] | None = None,
    **options: Unpack[RunOptions],
) -> list[PromptOutcome]:
    """One completion per keyphrase sequence; outcomes in input order.

    The run is :func:`workers.llm.client.complete` on :func:`build_messages` of each
    sequence (see there for ``concurrency``, ``max_calls``, ``indices``, ``on_result``
    and ``costs``). Every argument, and every sequence the run will prompt, is checked
    before any call is made (``ConfigError`` naming ``sequences[i]`` for a bad one).
    With ``clean`` (the default) each text, as ``on_result`` sees it and as returned, is
    :func:`workers.text.cleanup.clean_completion` of the completion: the small model's
    talk about the request removed, never an empty text. A prompt log that is bound
    (:mod:`workers.llm.attestation`) records each prompt as :func:`attested` describes
    it, under the sequence's id in ``ids`` (the job's positions; default its index).
    """
    endpoint.validate()
    spec.validate()
    for position in check_run(count=len(sequences), **options):
        _check_keyphrases(sequences[position], name=f"sequences[{position}]")
    tidy = _cleaned if clean else _as_is
    report: OnResult | None = None
    if on_result is not None:
        given = on_result

        async def report(outcome: LLMOutcome) -> None:
            returned = given(tidy(outcome))
            if inspect.isawaitable(returned):
                await returned

    outcomes = await complete(
        lambda position: build_messages(sequences[position], spec),
        len(sequences),
        endpoint=endpoint,
        on_result=report,
        progress=progress,
        costs=costs,
        describe=lambda position, messages: attested(
            sequences[position],
            spec,
            messages,
            position=position if ids is None else ids[position],
            model=endpoint.model,
        ),
        **options,
    )
    return [tidy(outcome) for outcome in outcomes]


def attested(
    keyphrases: Sequence[str],
    spec: PromptSpec,
    messages: list[dict[str, str]],
    *,
    position: int,
    model: str,
) -> Prompt:
    """The prompt log's record of one DP-KPS prompt: built from the released keyphrase
    sequence at ``position`` (a DP output) and the public template, document type and
    few-shot examples, so that a verifier renders it again with :func:`build_messages`."""
    return Prompt(
        key=f"dpkps/sequence/{position}",
        kind=DPKPS,
        messages=messages,
        inputs={
            "keyphrases": list(keyphrases),
            "template": spec.template,
            "few_shot": list(spec.few_shot),
        },
        refs={"position": position, "document_type": spec.document_type, "model": model},
    )


def _cleaned(outcome: LLMOutcome) -> LLMOutcome:
    """``outcome`` with its text cleaned of the model's meta-talk (:mod:`workers.text.cleanup`)."""
    if outcome.text is None:
        return outcome
    return replace(outcome, text=clean_completion(outcome.text))


def _as_is(outcome: LLMOutcome) -> LLMOutcome:
    return outcome


# For synchronous callers (a Celery task, the CLI).
run_prompts = synchronous(prompt_sequences)
