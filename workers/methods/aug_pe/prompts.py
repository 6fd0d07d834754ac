"""Aug-PE's two LLM APIs as chat messages (aug-pe.md §2, ``LLMAugPE``).

* **RANDOM_API** (the initial population): the public document type and the class label
  — allowed because keyseed's schema declares label names public (caveat A10).
* **VARIATION_API**: a paraphrase of a synthetic text, or **fill-in-the-blanks**, where
  each token of the text is replaced by ``_`` with probability ``blank_probability`` and
  the LLM fills the blanks. With ``word_count_std`` the prompt asks for a target length:
  the text's word count plus N(0, std²), floored at ``min_word_count`` (the library's
  word-count variation).

Every prompt is built from the document type, the label and a synthetic text (itself
made by the LLM from earlier public prompts): there is no parameter through which a
private document could enter.

Tokens for blanking come from a regular-expression pre-tokenizer with the pattern of
OpenAI's ``cl100k_base`` (the library blanks ``cl100k_base`` tokens with tiktoken, which
needs its vocabulary downloaded at run time): words with their leading space, numbers of
at most three digits, runs of punctuation, whitespace. Long rare words, which BPE would
split, are blanked whole. The pattern matches any string, special-token look-alikes
such as ``<|endoftext|>`` and unpaired surrogates included, and never raises (caveat A11).
"""

from __future__ import annotations

import numpy as np
import regex

Messages = list[dict[str, str]]

# OpenAI's cl100k_base pre-tokenization pattern (tiktoken, MIT licence).
_TOKENS = regex.compile(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
BLANK = "_"

SYSTEM = (
    "You write realistic documents. Reply with the document text only: "
    "no title, no preamble, no notes."
)
RANDOM_TEMPLATE = 'Write one {document_type} of the category "{label}".'
PARAPHRASE_TEMPLATE = (
    'Rephrase the following {document_type} of the category "{label}" in your own words, '
    "keeping its content{length}.\n\nText: {sample}"
)
FILL_TEMPLATE = (
    'Fill in the blanks (_) in the following {document_type} of the category "{label}" to '
    "make it complete and coherent{length}. If there are no blanks, output the text "
    "unchanged.\n\nInput: {sample}\n\nAnswer:"
)
LENGTH = " in exactly {words} words"


def tokens(text: str) -> list[str]:
    """``text`` cut into cl100k-style pre-tokens; ``"".join(tokens(t)) == t``."""
    found: list[str] = _TOKENS.findall(text)
    return found


def blank(text: str, probability: float, rng: np.random.Generator) -> str:
    """Each token replaced by ``_`` with ``probability`` (the library's ``_blank_sample``)."""
    pieces = tokens(text)
    if not pieces or probability <= 0:
        return text
    hidden = rng.random(len(pieces)) < probability
    return "".join(BLANK if h else piece for piece, h in zip(pieces, hidden, strict=True))


def target_words(
    text: str, *, std: float | None, minimum: int, rng: np.random.Generator
) -> int | None:
    """The word count a variation should have, or ``None`` when lengths are not asked."""
    if std is None:
        return None
    drawn = int(rng.normal(0.0, std)) if std > 0 else 0
    return max(minimum, len(text.split()) + drawn)


def _clean(text: str) -> str:
    return " ".join(text.split())


def random_messages(*, document_type: str, label: str) -> Messages:
    """RANDOM_API: one new text of ``label``."""
    user = RANDOM_TEMPLATE.format(document_type=_clean(document_type), label=_clean(label))
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def variation_messages(
    sample: str,
    *,
    document_type: str,
    label: str,
    variation: str,
    blank_probability: float,
    words: int | None,
    rng: np.random.Generator,
) -> Messages:
    """VARIATION_API: a paraphrase or a fill-in-the-blanks of the synthetic ``sample``."""
    length = LENGTH.format(words=words) if words is not None else ""
    fields = {"document_type": _clean(document_type), "label": _clean(label), "length": length}
    if variation == "paraphrase":
        user = PARAPHRASE_TEMPLATE.format(sample=sample.strip(), **fields)
    else:
        masked = blank(sample.strip(), blank_probability, rng)
        user = FILL_TEMPLATE.format(sample=masked, **fields)
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]
