"""Cleaning an LLM's document of talk about the request.

A small instruction model asked to write "a news article that uses these keyphrases"
often answers with talk about the task before, or instead of, the document: "Sure! Here
is a rewritten news article:", "Using the keyphrases, …", a "Title:" label, the whole
text in quotes, or a closing "Note: the article uses all the keyphrases." (issue 67: 30
of 58 texts of one release opened so). A client trains on these texts, and such talk is
the same in every class: it costs accuracy and looks broken.

:func:`clean_completion` removes it, in a few readable rules grounded in completions of
the packaged SmolLM2-135M-Instruct (``tests/core/fixtures/smollm2_completions.json``):

1. leading lines that are talk about the request (an opener such as "Sure!", "Here's …",
   "Using the keyphrases …", "I'd be happy to …", or a line that names the keyphrases,
   keywords or the rewriting) are dropped, as is an opener sentence ending in a colon
   on the document's own line;
2. a leading label ("Title:", "Document:", "News article:") is dropped, its text kept;
3. from the first trailing line of meta-talk ("Note: …", "I hope this helps", "This
   article uses the keyphrases …", "Keyphrases: …") to the end is dropped;
4. quotes or markdown bold around the whole remaining text are removed.

It is conservative: a rule applies only where its pattern matches at the start or end of
the text, and when what is left has fewer than :data:`MIN_WORDS` words the original text
(stripped) is returned instead, so a text is never emptied. :func:`opens_with_meta` is the
one detector of such talk; the benchmark (``benchmarks/text_cleanup.py``) and the tests
measure with it.

The cleanup is post-processing of the completion (itself post-processing of DP
releases): it costs no privacy, and it reads nothing but the text.
"""

from __future__ import annotations

import re

MIN_WORDS = 5  # fewer words left than this: keep the original text

# the words a model uses when it talks about the request instead of doing it
_TASK_WORDS = (
    r"key ?phrases?|key ?words?|key terms|given (?:terms|words|phrases)|"
    r"provided (?:terms|words|phrases)|these (?:terms|words|phrases)|"
    r"rewrit\w*|re-?written|paraphras\w*"
)
_TASK = re.compile(rf"\b(?:{_TASK_WORDS})\b", re.IGNORECASE)

# how a reply that talks about the request begins
_INTERJECTION = (
    r"(?:sure|certainly|of\ course|absolutely|okay|ok|great|alright|awesome|excuse\ me"
    r"|what\ an?\ \w+\ (?:task|idea|request|challenge)(?:\ indeed)?|how\ about\ this(?:\ one)?)"
)
_OPENER = re.compile(
    r"""^\W*(?:
        """
    + _INTERJECTION
    + r"""\b
      | here(?:'s|’s|\ is|\ are|\ was)\b
      | i(?:'m|’m|\ am)\ (?:ready|here|happy|glad|thrilled|excited|delighted|going)\b
      | (?:i(?:'d|’d|\ would|'ll|’ll|\ will|\ can|\ have|'ve|’ve)|let\ me)
        \ (?:be|love|write|provide|create|help|share|just|now|craft|gladly)\b
      | (?:using|with|incorporating|based\ on|below\ is|the\ following)\b
        [^.\n]*\b(?:"""
    + _TASK_WORDS
    + r"""|article|document|text|post|review|abstract|summary|note|story)\b
      | as\ an?\ (?:ai|language\ model)\b
      | (?:the\ |this\ |a\ |an\ |my\ )?(?:news\ )?
        (?:article|document|story|post|text|piece|headline|title|review|abstract)\b
        [^.\n:]{0,60}?\b(?:is|would\ be|could\ be|can\ be|will\ be|might\ be|may\ be)\b
        [^.\n:]{0,20}:
    )""",
    re.IGNORECASE | re.VERBOSE,
)

# a label before the document's own text: "Title: …", "News article: …", "A: …"
_LABEL = re.compile(
    r"^\W{0,3}(?:the\ )?(?:title|headline|document|text|output|answer|response|summary|a|"
    r"(?:news\ )?(?:article|story|post|review|abstract))\W{0,3}\s*:\**\s*",
    re.IGNORECASE | re.VERBOSE,
)

# how talk about the request after the document begins (a line of its own)
_CLOSER = re.compile(
    r"""^\W*(?:
        notes?\b\s*[:\-–]
      | \(?note\b | please\ note\b
      | i\ hope\b | hope\ this\b | let\ me\ know\b | feel\ free\b
      | here(?:'s|’s|\ is)\ how\b
      | (?:key\ ?phrases|key\ ?words|keyphrases\ used|word\ count)\s*:
      | (?:this|the|my|that)\ (?:article|document|text|post|review|story|version|rewrite|response)\b
        [^.\n]*\b(?:"""
    + _TASK_WORDS
    + r"""|uses|used|incorporat\w*|includ\w*|highlight\w*|mention\w*)\b
      | in\ this\ (?:article|document|text|version|rewrite|sentence|piece)\b
      | i(?:'ve|’ve|\ have)?\ (?:incorporated|used|included|made|added)\b
      | (?:explanation|changes\ made|rationale)\s*:
    )""",
    re.IGNORECASE | re.VERBOSE,
)

_HERE = re.compile(
    r"^\W*here(?:'s|’s|\ is|\ are)\ (?:a|an|the|my|one)\b", re.IGNORECASE | re.VERBOSE
)
_ONLY_INTERJECTION = re.compile(rf"^\W*{_INTERJECTION}\W*$", re.IGNORECASE | re.VERBOSE)
_QUOTES = {'"': '"', "“": "”", "'": "'", "«": "»"}
_WORD = re.compile(r"\w+")


def _first_sentence(text: str) -> str:
    line = text.split("\n", 1)[0]
    match = re.search(r"[.!?:](?:\s|$)", line)
    return line[: match.end()] if match else line


def opens_with_meta(text: str) -> bool:
    """Whether ``text`` begins with talk about the request (the detector every
    measurement uses): an opener (:data:`_OPENER`), a label such as "Title:", or a first
    sentence that names the keyphrases or the rewriting."""
    head = text.strip()
    first = _first_sentence(head)
    return bool(_OPENER.match(head) or _LABEL.match(head) or _TASK.search(first))


def _is_meta_line(line: str) -> bool:
    """A whole line of talk about the request (not the document's first line)."""
    stripped = line.strip()
    if not stripped:
        return True
    if stripped.endswith(":") and (_OPENER.match(stripped) or _TASK.search(stripped)):
        return True  # "Here's a news article that uses the keyphrases:"
    if _OPENER.match(stripped) and (_TASK.search(stripped) or len(_WORD.findall(stripped)) <= 12):
        return True  # "Sure! Here is a rewritten version." / "Certainly!"
    if _HERE.match(stripped) and len(stripped) <= 200:
        return True  # "Here's a news article on the topic of Exxon." above the article
    return bool(_TASK.search(_first_sentence(stripped)) and len(stripped) <= 200)


def _strip_opening(text: str) -> str:
    lines = text.split("\n")
    while lines and _is_meta_line(lines[0]) and len(lines) > 1:
        lines.pop(0)
    text = "\n".join(lines).strip()
    # an opener sentence on the document's own line: "Sure! Here is the article: Rain fell…"
    for _ in range(3):
        first = _first_sentence(text)
        if first == text or not (_OPENER.match(first) or _TASK.search(first)):
            break
        if not (first.rstrip().endswith(":") or _ONLY_INTERJECTION.match(first)):
            break
        text = text[len(first) :].strip()
    return _LABEL.sub("", text, count=1).strip()


def _strip_closing(text: str) -> str:
    lines = text.split("\n")
    for index in range(1, len(lines)):
        if _CLOSER.match(lines[index]):
            return "\n".join(lines[:index]).strip()
    return text


def _unwrap(text: str) -> str:
    for _ in range(2):
        if text.startswith("**") and text.endswith("**") and len(text) > 4:
            text = text[2:-2].strip()
        elif text[:1] in _QUOTES and text.endswith(_QUOTES[text[0]]) and len(text) > 2:
            inner = text[1:-1]
            if _QUOTES[text[0]] in inner or text[0] in inner:
                break  # "A" said "B": quotes inside, not around
            text = inner.strip()
    return text


def clean_completion(text: str) -> str:
    """``text`` without the model's talk about the request (see the module docstring);
    the original, stripped, where the cleaned text would keep fewer than
    :data:`MIN_WORDS` words."""
    original = text.strip()
    cleaned = _unwrap(_strip_closing(_strip_opening(original)))
    if len(_WORD.findall(cleaned)) < MIN_WORDS:
        return original
    return cleaned
