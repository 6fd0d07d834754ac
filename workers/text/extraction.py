"""Keyphrase extraction (method.md, step 1): which vocabulary phrases a document contains.

A document and the vocabulary are both put through :func:`normalise` (NFKC, case
folding, whitespace collapsed). A phrase matches at a place in the document when

* the characters match exactly,
* it sits on word boundaries: the character just before it and the one just after it
  are not alphanumeric (``str.isalnum``), or are the ends of the text; so "cat" does not
  match inside "concatenate" but does in "cat-like" or "(cat)";
* among the phrases that match there, it is the longest ("heart failure" beats
  "heart"), and matches never overlap: scanning left to right, the leftmost match wins
  and the scan resumes after it.

Matches are reported in document order, repeats included.

How word boundaries are enforced inside one Aho-Corasick pass (pyahocorasick): text and
phrases are re-encoded so that every non-alphanumeric character ``c`` becomes
``END c START`` and the whole string is wrapped as ``START … END``, where ``START`` and
``END`` are two Unicode noncharacters that cannot occur in the encoded content. A
phrase is stored as its encoding, so it is found exactly where the original phrase
starts after a non-alphanumeric character (or at the start) and ends before one (or at
the end); no substring in the middle of a word is ever reported, which keeps the number
of raw hits close to the number of words.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import ahocorasick

from workers.errors import ConfigError, InputDataError
from workers.text.vocabulary import Vocabulary, normalise

_START = "\ufdd0"  # a noncharacter: "a word may start here"
_END = "\ufdd1"  # a noncharacter: "a word may end here"
_MARKERS = re.compile(f"[{_START}{_END}]")

# str.translate table: every non-alphanumeric character c -> END c START. All of ASCII
# is entered up front; other characters the first time they are seen (entries are only
# ever added, each with its one possible value, so sharing the table is safe).
_TABLE: dict[int, str] = {
    code: _END + chr(code) + _START for code in range(128) if not chr(code).isalnum()
}


def _mark(normalised: str) -> str:
    """Every non-alphanumeric character ``c`` of ``normalised`` replaced by END c START."""
    if _START in normalised or _END in normalised:
        normalised = _MARKERS.sub(" ", normalised)
    if not normalised.isascii():
        for char in set(normalised):
            if ord(char) not in _TABLE and not char.isalnum():
                _TABLE[ord(char)] = _END + char + _START
    return normalised.translate(_TABLE)


def _encode(normalised: str) -> str:
    """Boundary-marked form of a normalised string (see module docstring)."""
    return _START + _mark(normalised) + _END


def _encode_all(phrases: tuple[str, ...]) -> list[str]:
    """``[_encode(p) for p in phrases]``, in one pass over the joined phrases.

    Normalised phrases contain no newline, so the newlines that join them come out as
    ``END newline START``, exactly where one encoded phrase ends and the next begins.
    """
    joined = _START + _mark("\n".join(phrases)) + _END
    return [part + _END for part in joined[:-1].split(_END + "\n")]


def _check_limit(limit: int | None) -> int | None:
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise ConfigError("must be an integer or None", field="limit")
    if limit < 0:
        raise ConfigError(f"must be ≥ 0 (got {limit})", field="limit")
    return limit


class KeyphraseExtractor:
    """Leftmost-longest, word-boundary matching of one vocabulary's phrases.

    Building the automaton costs about one second per 300,000 phrases; matching is
    linear in the length of the text. An extractor is read-only once built and can be
    shared by threads.
    """

    def __init__(self, vocabulary: Vocabulary) -> None:
        if not isinstance(vocabulary, Vocabulary):
            raise ConfigError("must be a Vocabulary", field="vocabulary")
        self.vocabulary = vocabulary
        automaton = ahocorasick.Automaton(ahocorasick.STORE_INTS)
        lengths: list[int] = []
        for index, key in enumerate(_encode_all(vocabulary.phrases)):
            automaton.add_word(key, index)
            lengths.append(len(key))
        automaton.make_automaton()
        self._automaton = automaton
        self._lengths = lengths

    def extract(self, text: str, limit: int | None = None) -> list[int]:
        """Vocabulary indices of the phrases found in ``text``, in document order.

        With ``limit``, only the first ``limit`` matches are returned.
        """
        if not isinstance(text, str):
            raise InputDataError(f"must be a string, not {type(text).__name__}", field="text")
        limit = _check_limit(limit)
        if limit == 0:
            return []
        normalised = normalise(text)
        if not normalised:
            return []
        lengths = self._lengths
        # Each hit ends at ``end`` (index of its closing END marker). Its "core", the
        # encoding of the matched characters themselves, is [end - length + 2, end);
        # cores of matches that do not overlap in the text are disjoint.
        hits: list[tuple[int, int, int]] = []
        for end, index in self._automaton.iter(_encode(normalised)):
            length = lengths[index]
            hits.append((end - length + 2, -length, index))
        if not hits:
            return []
        hits.sort()  # leftmost first; at one start, longest first
        found: list[int] = []
        free = 0  # first position of the encoded text not covered by a kept match
        for start, negative_length, index in hits:
            if start >= free:
                found.append(index)
                if limit is not None and len(found) >= limit:
                    break
                free = start - negative_length - 2
        return found

    def extract_many(self, texts: Iterable[str], limit: int | None = None) -> list[list[int]]:
        """:meth:`extract` for every text, in order."""
        limit = _check_limit(limit)
        return [self.extract(text, limit) for text in texts]
