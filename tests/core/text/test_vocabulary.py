"""Public vocabularies: normalisation, Vocabulary, built-ins, files, disk cache."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

from workers.errors import ConfigError, InputDataError
from workers.text import vocabulary as vocab_module
from workers.text.vocabulary import (
    BUILTIN_VOCABULARIES,
    Vocabulary,
    describe_builtin,
    english_vocabulary,
    load_vocabulary,
    medical_vocabulary,
    normalise,
    stop_words,
    vocabulary_from_file,
)

REPO = Path(__file__).resolve().parents[3]

# --------------------------------------------------------------------------------------
# normalise


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("Heart Failure", "heart failure"),
        ("  heart \t\n  failure  ", "heart failure"),
        ("heart\u00a0failure", "heart failure"),  # no-break space is NFKC-folded
        ("heart\u2003\u2003failure", "heart failure"),  # em spaces
        ("ﬁbrosis", "fibrosis"),  # ligature
        ("ＣＯＶＩＤ－１９", "covid-19"),  # full-width forms
        ("Straße", "strasse"),  # case folding, not lower()
        ("CAFÉ", "café"),
        ("Cafe\u0301", "café"),  # combining accent composed
        ("", ""),
        (" \t\n ", ""),
    ],
)
def test_normalise(raw: str, expected: str) -> None:
    assert normalise(raw) == expected


@pytest.mark.parametrize("raw", ["İstanbul", "ǅemal", "Ⅻ", "ΣΑΣ", "ﬃ  x", "ß\u00a0ẞ", "K\u212a"])
def test_normalise_is_idempotent(raw: str) -> None:
    once = normalise(raw)
    assert normalise(once) == once


# --------------------------------------------------------------------------------------
# Vocabulary


def test_from_phrases_normalises_dedupes_and_keeps_first_order() -> None:
    v = Vocabulary.from_phrases(
        "demo", ["Heart  Failure", "fever", "", "   ", "HEART FAILURE", "Fever", "cough"]
    )
    assert v.phrases == ("heart failure", "fever", "cough")
    assert len(v) == 3
    assert v.name == "demo"
    assert v.index_of("heart failure") == 0
    assert v.index_of("cough") == 2
    assert "fever" in v
    assert "Fever" not in v  # index_of/contains take normalised phrases
    with pytest.raises(KeyError):
        v.index_of("rash")


def test_fingerprint_depends_on_content_and_order_not_name() -> None:
    a = Vocabulary.from_phrases("a", ["x ray", "fever"])
    b = Vocabulary.from_phrases("b", ["X  Ray", "FEVER"])
    c = Vocabulary.from_phrases("a", ["fever", "x ray"])
    assert a.fingerprint == b.fingerprint
    assert a.fingerprint != c.fingerprint
    assert len(a.fingerprint) == 64
    int(a.fingerprint, 16)  # hexadecimal
    assert a != b  # equality also compares names
    assert a == Vocabulary.from_phrases("a", ["x ray", "fever"])
    assert hash(a) == hash(Vocabulary.from_phrases("a", ["x ray", "fever"]))


def test_vocabulary_is_frozen_and_repr_is_short() -> None:
    v = Vocabulary.from_phrases("demo", [f"word{i}" for i in range(10_000)])
    with pytest.raises(AttributeError):
        v.name = "other"  # type: ignore[misc]
    assert len(repr(v)) < 200
    assert "demo" in repr(v)


def test_constructor_rejects_unnormalised_duplicate_or_empty_phrases() -> None:
    for bad in [("Fever",), ("fever", "fever"), ("fever", ""), (), ("a  b",)]:
        with pytest.raises(InputDataError) as info:
            Vocabulary("bad", bad)
        assert info.value.field == "phrases"


def test_from_phrases_rejects_non_strings_and_empty_results() -> None:
    with pytest.raises(InputDataError) as info:
        Vocabulary.from_phrases("bad", ["fever", 3])  # type: ignore[list-item]
    assert info.value.field == "phrases"
    with pytest.raises(InputDataError):
        Vocabulary.from_phrases("bad", "fever")
    with pytest.raises(InputDataError):
        Vocabulary.from_phrases("bad", ["", "  "])


# --------------------------------------------------------------------------------------
# Built-ins


def test_english_vocabulary_size_and_content() -> None:
    v = english_vocabulary()
    assert v.name == "english"
    assert len(v) >= 100_000
    assert english_vocabulary() is v  # cached in-process
    for word in ["economy", "football", "president", "fire", "bill", "system", "oil"]:
        assert word in v
    # Most frequent first: common content words come before rare ones.
    assert v.index_of("people") < v.index_of("economy") < v.index_of("zwitterion")


def test_english_vocabulary_has_no_function_words_or_letterless_tokens() -> None:
    v = english_vocabulary()
    phrases = set(v.phrases)
    stops = stop_words()
    assert not phrases & stops
    # Every word of scikit-learn's list is gone, except the content words we re-admit.
    kept = {w for w in ENGLISH_STOP_WORDS if w in phrases}
    assert kept <= {"bill", "bottom", "cry", "detail", "empty", "fire", "front", "interest"} | {
        "mill",
        "serious",
        "sincere",
        "system",
        "thick",
        "thin",
    }
    for word in ["the", "and", "of", "it's", "don't", "i'm", "s", "t", "yeah"]:
        assert word not in phrases
    assert all(len(p) >= 2 and any(c.isalpha() for c in p) for p in v.phrases)
    assert "world's" not in phrases and "world" in phrases  # possessive folded into base


def test_medical_vocabulary_size_and_content() -> None:
    v = medical_vocabulary()
    assert v.name == "medical"
    assert len(v) >= 30_000
    for phrase in [
        "seizure",  # HPO name
        "abnormality of the nervous system",  # HPO branch name
        "neurological abnormality",  # HPO synonym
        "cholera, unspecified",  # ICD-10-CM description
        "typhoid fever",  # ICD-10-CM head before the comma
        "essential (primary) hypertension",
    ]:
        assert phrase in v, phrase
    assert "all" not in v  # the HPO root
    stops = stop_words()
    for phrase in v.phrases:
        words = re.findall(r"[^\W_]+", phrase)  # runs of letters and digits
        assert any(w not in stops and any(c.isalpha() for c in w) for w in words), phrase


def test_sample_of_builtin_phrases_is_normalised() -> None:
    for v in (english_vocabulary(), medical_vocabulary()):
        sample = v.phrases[:: max(1, len(v) // 2000)]
        assert all(normalise(p) == p for p in sample)


def test_describe_builtin_lists_every_builtin() -> None:
    listing = describe_builtin()
    assert [entry["name"] for entry in listing] == list(BUILTIN_VOCABULARIES)
    sizes = {entry["name"]: entry["size"] for entry in listing}
    assert sizes == {"english": len(english_vocabulary()), "medical": len(medical_vocabulary())}
    for entry in listing:
        for key in ("description", "source", "licence", "fingerprint"):
            assert isinstance(entry[key], str) and entry[key]
    json.dumps(listing)  # serialisable as is, for a service


def test_load_vocabulary_by_name_and_path(tmp_path: Path) -> None:
    assert load_vocabulary("english") is english_vocabulary()
    assert load_vocabulary(" medical ") is medical_vocabulary()
    path = tmp_path / "mine.txt"
    path.write_text("alpha\nbeta gamma\n", encoding="utf-8")
    v = load_vocabulary(str(path))
    assert v.phrases == ("alpha", "beta gamma")
    assert v.name == "mine"
    with pytest.raises(ConfigError) as info:
        load_vocabulary("  ")
    assert info.value.field == "vocabulary"
    with pytest.raises(InputDataError) as missing:
        load_vocabulary(str(tmp_path / "nope.txt"))
    assert missing.value.field == "vocabulary"


# --------------------------------------------------------------------------------------
# Files


def test_vocabulary_from_file(tmp_path: Path) -> None:
    path = tmp_path / "clinic.txt"
    path.write_bytes(
        "\ufeffHeart Failure\r\n\r\n  fever \n\nheart   failure\nCafé au lait spot\n\n".encode()
    )
    v = vocabulary_from_file(path)
    assert v.phrases == ("heart failure", "fever", "café au lait spot")
    assert v.name == "clinic"


def test_file_with_bad_utf8_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.txt"
    path.write_bytes(b"fever\n\ncough\ncaf\xe9 au lait\nrash\n")
    with pytest.raises(InputDataError) as info:
        vocabulary_from_file(path)
    assert info.value.field == "vocabulary"
    assert "line 4" in str(info.value)
    assert "latin1.txt" in str(info.value)


def test_file_with_bad_utf8_on_first_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.txt"
    path.write_bytes(b"\xff\xfe\nfever\n")
    with pytest.raises(InputDataError, match="line 1"):
        vocabulary_from_file(path)


@pytest.mark.parametrize("content", [b"", b"\n\n  \n\t\n", b"\xef\xbb\xbf\n"])
def test_file_without_phrases_is_rejected(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "empty.txt"
    path.write_bytes(content)
    with pytest.raises(InputDataError, match="no phrase") as info:
        vocabulary_from_file(path)
    assert info.value.field == "vocabulary"


def test_missing_file_and_folder_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(InputDataError, match="does not exist"):
        vocabulary_from_file(tmp_path / "absent.txt")
    with pytest.raises(InputDataError, match="cannot read"):
        vocabulary_from_file(tmp_path)


# --------------------------------------------------------------------------------------
# Disk cache


def test_cache_round_trip_and_corruption(tmp_path: Path) -> None:
    v = Vocabulary.from_phrases("english", ["fever", "heart failure", "café"])
    path = tmp_path / "sub" / "english-test.txt.gz"
    vocab_module._write_cache(path, v, {"wordfreq": "0"})
    assert vocab_module._read_cache(path, "english") == v
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary left
    path.write_bytes(b"not gzip at all")
    assert vocab_module._read_cache(path, "english") is None
    assert vocab_module._read_cache(tmp_path / "absent.gz", "english") is None


_LOAD_SCRIPT = """
import json, time
t0 = time.perf_counter()
from workers.text.vocabulary import english_vocabulary, medical_vocabulary
out = {}
for name, load in (("english", english_vocabulary), ("medical", medical_vocabulary)):
    t = time.perf_counter()
    v = load()
    out[name] = {"seconds": time.perf_counter() - t, "size": len(v), "fp": v.fingerprint}
print(json.dumps(out))
"""


@pytest.mark.slow
def test_second_process_loads_builtins_from_disk_cache(tmp_path: Path) -> None:
    env = {**os.environ, "KEYSEED_CACHE_DIR": str(tmp_path / "cache")}

    def run() -> dict[str, dict[str, Any]]:
        done = subprocess.run(
            [sys.executable, "-c", _LOAD_SCRIPT],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
        result: dict[str, dict[str, Any]] = json.loads(done.stdout)
        return result

    cold = run()
    files = sorted(p.name for p in (tmp_path / "cache" / "vocabularies").iterdir())
    assert len(files) == 2
    assert files[0].startswith("english-") and files[1].startswith("medical-")
    warm = run()
    for name in ("english", "medical"):
        assert warm[name]["fp"] == cold[name]["fp"]
        assert warm[name]["size"] == cold[name]["size"]
        assert warm[name]["seconds"] < 2.0, (name, warm[name]["seconds"])
    # The in-process built-ins of this test session are the same vocabularies.
    assert warm["english"]["fp"] == english_vocabulary().fingerprint
    assert warm["medical"]["fp"] == medical_vocabulary().fingerprint
