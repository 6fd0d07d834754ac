"""``keyseed generate`` and ``keyseed evaluate`` as a data owner and a recipient run them.

Errors are checked through ``app.cli.main`` (exit code, stderr); the end-to-end runs
start the installed ``keyseed`` command in a subprocess, on a slice of AG News.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from app.cli import main

LABELS = ("World", "Sports", "Business", "Sci/Tech")
WORDS = {
    "World": ["election", "minister", "troops", "embassy", "parliament"],
    "Sports": ["match", "goal", "coach", "tournament", "season"],
    "Business": ["shares", "profit", "market", "merger", "earnings"],
    "Sci/Tech": ["software", "internet", "chip", "space", "research"],
}


def write_csv(path: Path, rows: list[dict[str, str]], fields: list[str]) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    return path


@pytest.fixture
def small(tmp_path: Path) -> dict[str, Path]:
    """A tiny labelled corpus and a vocabulary file that covers it."""
    rows = []
    for label, words in WORDS.items():
        for i in range(12):
            rows.append(
                {
                    "title": f"{words[i % 5]} news",
                    "body": f"{words[(i + 2) % 5]} today",
                    "class": label,
                }
            )
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join([w for ws in WORDS.values() for w in ws] + ["news", "today"]))
    return {
        "input": write_csv(tmp_path / "in.csv", rows, ["title", "body", "class"]),
        "vocab": vocab,
        "out": tmp_path / "out.jsonl",
    }


def generate_args(small: dict[str, Path], *extra: str) -> list[str]:
    return [
        "generate",
        "--input",
        str(small["input"]),
        "--text-column",
        "title",
        "--text-column",
        "body",
        "--label-column",
        "class",
        "--labels",
        ",".join(LABELS),
        "--vocabulary",
        str(small["vocab"]),
        "--epsilon-vocab",
        "2",
        "--epsilon-kde",
        "4",
        "--output",
        str(small["out"]),
        "--vocabulary-size",
        "10",
        "--sequence-length",
        "3",
        "--per-class",
        "5",
        "--num-features",
        "128",
        *extra,
    ]


def outputs_absent(out: Path) -> bool:
    left = [p.name for p in out.parent.iterdir() if p.name.startswith((out.name, f".{out.name}"))]
    manifest = out.with_name(out.stem + ".manifest.json")
    return not out.exists() and not manifest.exists() and not left


def test_generate_writes_records_and_manifest(small: dict[str, Path]) -> None:
    assert main(generate_args(small, "--seed", "3")) == 0
    records = [json.loads(line) for line in small["out"].read_text().splitlines()]
    assert len(records) == 5 * len(LABELS)
    assert {r["label"] for r in records} == set(LABELS)
    for r in records:
        assert len(r["keyphrases"]) == 3
        assert r["text"] == " ".join(r["keyphrases"])
    manifest = json.loads(small["out"].with_name("out.manifest.json").read_text())
    assert manifest["privacy"]["epsilon"] == pytest.approx(6.0)
    assert manifest["privacy"]["epsilon_by_mechanism"] == pytest.approx(
        {"vocabulary": 2.0, "kde": 4.0}
    )
    assert manifest["parameters"]["seed"] == 3
    assert manifest["labels"] == {"names": list(LABELS), "source": "declared"}
    assert "seconds" not in manifest  # wall time is a timing side channel: stderr only
    assert "exact Gaussian kernel" in manifest["method"]  # what ran, from the configuration
    assert manifest["prompting"] == {"llm": "none"}
    assert manifest["llm_costs"] == {
        "method": "dpkps",
        "calls": 0,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "wall_seconds": 0.0,
    }
    assert manifest["documents_written"] == len(records)
    with open(small["input"], newline="", encoding="utf-8") as handle:
        documents = [f"{r['title']}. {r['body']}" for r in csv.DictReader(handle)]
    dumped = json.dumps(manifest)
    assert not any(doc in dumped for doc in documents)  # no private text in the manifest


def test_declared_labels_are_used_and_reported(small: dict[str, Path]) -> None:
    declared = "World,Sports,Business,Sci/Tech,Health"
    assert main(generate_args(small, "--labels", declared)) == 0
    labels = {json.loads(x)["label"] for x in small["out"].read_text().splitlines()}
    assert labels == {*LABELS, "Health"}  # a declared class with no document still appears
    manifest = json.loads(small["out"].with_name("out.manifest.json").read_text())
    assert manifest["labels"] == {"names": declared.split(","), "source": "declared"}


@pytest.mark.parametrize(
    ("extra", "option"),
    [
        (["--epsilon-kde", "0"], "--epsilon-kde"),
        (["--epsilon-kde", "-1"], "--epsilon-kde"),
        (["--epsilon-vocab", "inf"], "--epsilon-vocab"),
        (["--epsilon-vocab", "nan"], "--epsilon-vocab"),
        (["--epsilon-vocab", "1e-9"], "--epsilon-vocab"),
        (["--epsilon-kde", "1000"], "--epsilon-kde"),
        (["--vocabulary-size", "500"], "--vocabulary-size"),
        (["--temperature", "0"], "--temperature"),
        (["--mode", "iterative", "--kde-method", "exact"], "--kde-method"),
        (["--sequence-length", "0"], "--sequence-length"),
        (["--per-class", "0"], "--per-class"),
        # the small-ε options: Gaussian-only ones with a pure (Laplace) budget, bad sizes
        (["--kde-method", "centroid"], "--kde-method"),
        (["--public-vocabulary-size", "0"], "--public-vocabulary-size"),
    ],
)
def test_bad_options_name_the_option_and_write_nothing(
    small: dict[str, Path], capsys: pytest.CaptureFixture[str], extra: list[str], option: str
) -> None:
    assert main(generate_args(small, *extra)) != 0
    err = capsys.readouterr().err
    assert err.startswith(f"error: {option}:"), err
    assert outputs_absent(small["out"])


def test_missing_column_is_named(
    small: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    args = generate_args(small)
    args[args.index("class")] = "label"
    assert main(args) != 0
    err = capsys.readouterr().err
    assert "--label-column" in err and "'label'" in err and "title" in err
    assert outputs_absent(small["out"])


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"", "is empty"),
        (b"title,body,class\n", "no document"),
        (b"title,body,class\ncaf\xe9,x,World\n", "not valid UTF-8 (first bad byte on line 2)"),
        (b"title,body,class\nmatch,goal,\n", "empty label (rows 1)"),
    ],
)
def test_bad_input_files(
    small: dict[str, Path], capsys: pytest.CaptureFixture[str], content: bytes, needle: str
) -> None:
    small["input"].write_bytes(content)
    assert main(generate_args(small)) != 0
    err = capsys.readouterr().err
    assert err.startswith("error: --input:") or err.startswith("error: --label-column:"), err
    assert needle in err
    assert outputs_absent(small["out"])


def test_no_document_matching_the_vocabulary_is_not_an_error(
    small: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    # Success or failure after the private read must not depend on the data: the run
    # releases noise (DP on an all-zero histogram) and warns its owner on stderr only.
    small["vocab"].write_text("\n".join(f"zzz{i}" for i in range(20)))
    assert main(generate_args(small)) == 0
    assert "48 of 48 documents contain no phrase" in capsys.readouterr().err
    assert len(small["out"].read_text().splitlines()) == 5 * len(LABELS)


def test_the_label_set_must_be_declared(
    small: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    args = generate_args(small)
    at = args.index("--labels")
    del args[at : at + 2]
    assert main(args) != 0
    assert capsys.readouterr().err.startswith("error: --labels: declare the label set")
    assert outputs_absent(small["out"])


def test_random_features_are_named_in_the_manifest(small: dict[str, Path]) -> None:
    assert main(generate_args(small, "--kde-method", "random_features")) == 0
    manifest = json.loads(small["out"].with_name("out.manifest.json").read_text())
    assert "random Fourier features" in manifest["method"]


def test_small_class_and_unmatched_documents_warn_the_owner(
    small: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    with open(small["input"], "a", encoding="utf-8") as handle:
        handle.write("nothing known,here either,World\nshares up,profit,Health\n")
    assert main(generate_args(small, "--labels", ",".join([*LABELS, "Health"]))) == 0
    err = capsys.readouterr().err
    assert "1 of 50 documents contain no phrase" in err
    assert "label 'Health' has 1 document(s)" in err
    manifest = small["out"].with_name("out.manifest.json").read_text()
    assert "Health" in manifest and "document(s)" not in manifest


def test_output_must_be_jsonl_in_an_existing_folder(
    small: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    args = generate_args(small)
    args[args.index(str(small["out"]))] = str(small["out"].with_suffix(".csv"))
    assert main(args) != 0
    assert "error: --output: must name a .jsonl file" in capsys.readouterr().err
    args[args.index(str(small["out"].with_suffix(".csv")))] = "/nonexistent/dir/out.jsonl"
    assert main(args) != 0
    assert "error: --output: folder /nonexistent/dir does not exist" in capsys.readouterr().err


# ---------------------------------------------------------------- end to end on AG News


def ag_news_slice(source: Path, folder: Path, n_private: int, n_test: int) -> tuple[Path, Path]:
    with open(source, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    fields = ["title", "description", "class"]
    private = write_csv(folder / "private.csv", rows[:n_private], fields)
    test = write_csv(folder / "test.csv", rows[n_private : n_private + n_test], fields)
    return private, test


def keyseed(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("keyseed") or str(Path(sys.executable).with_name("keyseed"))
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout, env=env)


# AG News's columns: the text is the title and the description, joined
AG_NEWS_COLUMNS = (
    "--text-column",
    "title",
    "--text-column",
    "description",
    "--label-column",
    "class",
)


@pytest.mark.slow
def test_generate_and_evaluate_on_ag_news(ag_news_path: Path, tmp_path: Path) -> None:
    private, test = ag_news_slice(ag_news_path, tmp_path, 2000, 400)
    out = tmp_path / "synthetic.jsonl"
    done = keyseed(
        "generate",
        "--input",
        str(private),
        *AG_NEWS_COLUMNS,
        "--labels",
        ",".join(LABELS),
        "--vocabulary",
        "english",
        "--epsilon-vocab",
        "1",
        "--epsilon-kde",
        "5",
        "--per-class",
        "300",
        "--output",
        str(out),
        "--seed",
        "7",
    )
    assert done.returncode == 0, done.stderr
    records = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(records) == 1200 and {r["label"] for r in records} == set(LABELS)
    manifest = json.loads(out.with_name("synthetic.manifest.json").read_text())
    assert manifest["privacy"]["epsilon"] == pytest.approx(6.0)
    private_text = private.read_text(encoding="utf-8")
    assert all(r["text"] not in private_text for r in records[:50])

    scored = keyseed(
        "evaluate",
        "--synthetic",
        str(out),
        "--test",
        str(test),
        *AG_NEWS_COLUMNS,
        "--train-real",
        str(private),
    )
    assert scored.returncode == 0, scored.stderr
    result = json.loads(scored.stdout)
    assert 0.25 < result["accuracy"] <= 1.0  # the benchmark measures how far above chance
    assert result["accuracy_real"] > 0.8
    assert result["n_test"] == 400


@pytest.mark.slow
@pytest.mark.llm
def test_generate_with_the_local_llm(small: dict[str, Path]) -> None:
    args = generate_args(small, "--llm", "local", "--document-type", "news headline")
    args[args.index("--per-class") + 1] = "1"
    done = keyseed(*args, timeout=600)
    assert done.returncode == 0, done.stderr
    records = [json.loads(x) for x in small["out"].read_text().splitlines()]
    assert 1 <= len(records) <= len(LABELS)
    assert all(r["text"].strip() and r["text"] != " ".join(r["keyphrases"]) for r in records)
    manifest = json.loads(small["out"].with_name("out.manifest.json").read_text())
    assert manifest["prompting"]["llm"] == "local"
    assert manifest["prompting"]["requested"] == len(LABELS)
    assert manifest["prompting"]["succeeded"] == len(records)
    costs = manifest["llm_costs"]
    assert costs["method"] == "dpkps" and costs["calls"] >= len(LABELS)
    assert costs["prompt_tokens"] > 0 and costs["completion_tokens"] > 0
    assert costs["wall_seconds"] > 0


# ---------------------------------------------------------------- evaluate


def evaluate_args(small: dict[str, Path], *extra: str) -> list[str]:
    """``keyseed evaluate`` of the small corpus's output against the small corpus."""
    columns = ["--text-column", "title", "--text-column", "body", "--label-column", "class"]
    synthetic, test = str(small["out"]), str(small["input"])
    return ["evaluate", "--synthetic", synthetic, "--test", test, *columns, *extra]


def evaluated(small: dict[str, Path], capsys: pytest.CaptureFixture[str], *extra: str) -> Any:
    """``keyseed evaluate``'s result (with ``extra``) on a synthetic corpus of the small one
    (20 sequences a class)."""
    assert main(generate_args(small, "--per-class", "20")) == 0
    capsys.readouterr()
    assert main(evaluate_args(small, *extra)) == 0
    return json.loads(capsys.readouterr().out)


def test_evaluate_prints_accuracy_and_real_baseline(
    small: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    result = evaluated(small, capsys, "--train-real", str(small["input"]), "--classifier", "tfidf")
    assert 0.0 <= result["accuracy"] <= 1.0
    assert result["accuracy_real"] == 1.0  # trained and tested on the same tiny corpus
    assert result["n_train"] == 80 and result["n_test"] == 48
    assert result["classifier"] == "tfidf" and result["coral"] is False


def test_evaluate_with_unlabeled_texts_uses_coral(
    small: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    result = evaluated(small, capsys, "--unlabeled", str(small["input"]), "--coral-weight", "10")
    assert result["classifier"] == "embedding" and result["coral"] is True


@pytest.mark.parametrize(
    ("content", "extra", "message"),
    [
        ("not json\n", [], "error: --synthetic: row 1 is not valid JSON"),
        ('{"text": "x"}\n', [], "error: --synthetic: row 1 has no label"),
        ('{"label": "World", "text": "x"}\n', [], "error: --synthetic: training needs"),
        (
            '{"label": "World", "text": "a"}\n{"label": "Sports", "text": "b"}\n',
            ["--unlabeled", "IN", "--classifier", "tfidf"],
            "error: --unlabeled:",
        ),
    ],
)
def test_evaluate_errors_name_the_option(
    small: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
    content: str,
    extra: list[str],
    message: str,
) -> None:
    small["out"].write_text(content)
    extra = [str(small["input"]) if x == "IN" else x for x in extra]
    code = main(
        [
            "evaluate",
            "--synthetic",
            str(small["out"]),
            "--test",
            str(small["input"]),
            "--text-column",
            "title",
            "--label-column",
            "class",
            *extra,
        ]
    )
    assert code != 0
    assert capsys.readouterr().err.startswith(message)


def _without(args: list[str], *options: str) -> list[str]:
    out = list(args)
    for option in options:
        at = out.index(option)
        del out[at : at + 2]
    return out


def test_a_total_epsilon_delta_gives_gaussian_noise_and_a_full_privacy_block(
    small: dict[str, Path],
) -> None:
    args = _without(generate_args(small), "--epsilon-vocab", "--epsilon-kde")
    assert main([*args, "--epsilon", "1", "--delta", "1e-6"]) == 0
    manifest = json.loads(small["out"].with_name("out.manifest.json").read_text())
    privacy = manifest["privacy"]
    assert privacy["epsilon"] <= 1.0 and privacy["delta"] <= 1e-6
    assert privacy["accountant"].startswith("pld(dp-accounting")
    assert privacy["unit"] == "row"
    # the Gaussian defaults: class centroids over a public Ṽ, so no vocabulary release;
    # the class counts set the rate of the default sample of units (4,000 a class)
    assert {e["mechanism"] for e in privacy["events"]} == {"class_counts", "kde"}
    assert {e["dimension"] for e in privacy["events"] if e["mechanism"] == "kde"} == {384}
    assert manifest["parameters"]["embed_sample"] == 4000
    assert "phrases of the public vocabulary" in manifest["method"]
    assert {e["noise"] for e in privacy["events"]} == {"gaussian"}
    assert all(e["scale"] > 0 and e["sensitivity"] > 0 for e in privacy["events"])


def test_dry_run_prints_the_plan_without_reading_the_input(
    small: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    small["input"].unlink()  # the dry run never opens it
    args = _without(generate_args(small), "--epsilon-vocab", "--epsilon-kde")
    assert main([*args, "--epsilon", "0.25", "--delta", "1e-6", "--dry-run"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["method"] == "dpkps" and plan["labels"] == list(LABELS)
    assert float(plan["privacy"]["epsilon"]) <= 0.25 and plan["privacy"]["delta"] == 1e-6
    assert plan["privacy"]["accountant"].startswith("pld(")
    assert sorted(plan["privacy"]["events"], key=json.dumps) == sorted(
        plan["events"], key=json.dumps
    )
    assert plan["max_released"] == 5 * len(LABELS)
    assert plan["planned_llm_calls"] == 0  # --llm none: no LLM writes the sequences out
    kde = [e for e in plan["events"] if e["mechanism"] == "kde"]
    assert {e["partition"] for e in kde} == set(LABELS)  # one per class, in parallel
    assert outputs_absent(small["out"])


def test_a_vocabulary_file_may_have_a_long_path(
    small: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    # a job spec names a vocabulary in at most 64 characters; the command line reads a file
    folder = small["input"].parent / ("a folder with a long name " * 3).strip()
    folder.mkdir()
    vocabulary = folder / "phrases.txt"
    vocabulary.write_text(small["vocab"].read_text(encoding="utf-8"), encoding="utf-8")
    assert len(str(vocabulary)) > 64
    args = generate_args(small)
    args[args.index("--vocabulary") + 1] = str(vocabulary)
    assert main([*args, "--dry-run"]) == 0
    assert json.loads(capsys.readouterr().out)["events"]


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (
            ["--kde-method", "exact", "--vocabulary-method", "histogram"],
            {"kde_method": "exact", "vocabulary_method": "histogram", "kde_weighting": "l1"},
        ),
        (
            [
                "--kde-method",
                "exact",
                "--vocabulary-method",
                "public",
                "--public-vocabulary-size",
                "12",
            ],
            {"vocabulary_method": "public", "kde_weighting": "l1", "public_vocabulary_size": 12},
        ),
        (
            ["--kde-method", "centroid", "--vocabulary-method", "histogram"],
            {"kde_method": "centroid", "vocabulary_method": "histogram", "centroid_cells": 1},
        ),
        (["--centroid-cells", "3"], {"kde_method": "centroid", "centroid_cells": 3}),
        ([], {"label_prior": 0.5}),
        (["--sequence-selection", "3"], {"kde_method": "centroid", "sequence_selection": 3}),
        (["--subspace", "24"], {"kde_method": "centroid", "subspace": 24}),
        ([], {"kde_method": "centroid", "consistency_filter": True}),
        (["--no-consistency-filter"], {"kde_method": "centroid", "consistency_filter": False}),
        (["--consistency-filter"], {"kde_method": "centroid", "consistency_filter": True}),
    ],
)
def test_a_dry_run_shows_the_small_epsilon_options(
    small: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    expected: dict[str, object],
) -> None:
    args = _without(generate_args(small), "--epsilon-vocab", "--epsilon-kde")
    gaussian = ["--epsilon", "1", "--delta", "1e-6", "--dry-run"]
    assert main([*args, *gaussian, *extra]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert expected.items() <= plan["parameters"].items()
    vocab = [e for e in plan["events"] if e["mechanism"] == "vocabulary"]
    selection = plan["parameters"]["vocabulary_method"]
    assert len(vocab) == (selection != "public")
    if selection == "threshold":  # δ_thr is spent by the vocabulary release itself
        assert vocab[0]["delta"] == "5E-7" and "thresholded" in plan["description"]
    if selection == "public":
        size = plan["parameters"]["public_vocabulary_size"]
        assert f"first {size:,} phrases" in plan["description"]
    if plan["parameters"]["kde_weighting"] == "l2":
        assert "L2 norm 1" in plan["description"]
    cells = [e for e in plan["events"] if e["mechanism"] == "kde_cells"]
    if plan["parameters"]["centroid_cells"] > 1:  # a second release per class, in parallel
        assert cells and all(e["dimension"] == 3 * 384 for e in cells)
    else:
        assert not cells
    assert float(plan["privacy"]["epsilon"]) <= 1.0


@pytest.mark.parametrize(("declared", "dimension"), [(len(LABELS), 384), (20, 128)])
def test_a_dry_run_shows_the_subspace_the_declared_labels_choose(
    small: dict[str, Path], capsys: pytest.CaptureFixture[str], declared: int, dimension: int
) -> None:
    # by default, 20 or more declared labels with one cell a class (ε < 4): the top 128
    # principal directions of the public phrases; the declared labels are public
    labels = [*LABELS, *(f"extra {i}" for i in range(declared - len(LABELS)))]
    args = _without(generate_args(small), "--epsilon-vocab", "--epsilon-kde")
    args[args.index("--labels") + 1] = ",".join(labels)
    assert main([*args, "--epsilon", "1", "--delta", "1e-6", "--dry-run"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["parameters"]["subspace"] == dimension
    assert {e["dimension"] for e in plan["events"] if e["mechanism"] == "kde"} == {dimension}
    assert ("top 128 principal directions" in plan["description"]) == (dimension == 128)


def test_an_unknown_small_epsilon_option_value_names_the_option(
    small: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    for option in ("--vocabulary-method", "--kde-method"):
        with pytest.raises(SystemExit) as info:
            main(generate_args(small, option, "bogus"))
        assert info.value.code == 2
        err = capsys.readouterr().err
        assert f"argument {option}: invalid choice: 'bogus'" in err, err
    assert outputs_absent(small["out"])


def test_the_research_levers_are_no_options(
    small: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    # the benchmarks' (benchmarks/experiments.py; docs/parameters.md), not a user's
    for extra in (["--label-prior", "0"], ["--class-contrast", "2"], ["--bandwidth", "0.5"]):
        with pytest.raises(SystemExit) as info:
            main(generate_args(small, *extra))
        assert info.value.code == 2
        assert f"unrecognized arguments: {' '.join(extra)}" in capsys.readouterr().err
    for option, value in (("--kde-method", "moments"), ("--vocabulary-method", "threshold")):
        with pytest.raises(SystemExit) as info:
            main(generate_args(small, option, value))
        assert info.value.code == 2
        assert f"argument {option}: invalid choice: '{value}'" in capsys.readouterr().err
    assert outputs_absent(small["out"])


def test_unit_column_pools_a_patients_rows(small: dict[str, Path]) -> None:
    rows = list(csv.DictReader(small["input"].open(encoding="utf-8")))
    for i, row in enumerate(rows):
        row["patient"] = f"p{i // 3}"
    write_csv(small["input"], rows, ["title", "body", "class", "patient"])
    assert main(generate_args(small, "--unit-column", "patient")) == 0
    manifest = json.loads(small["out"].with_name("out.manifest.json").read_text())
    assert manifest["privacy"]["unit"] == "unit column 'patient'"
    assert manifest["input"]["unit_column"] == "patient"


@pytest.mark.parametrize(
    ("extra", "option"),
    [
        (["--epsilon", "1"], "--epsilon-vocab"),  # a total and per-mechanism ε together
        (["--delta", "1e-6"], "--noise"),  # per-mechanism ε is pure
        (["--noise", "gaussian"], "--noise"),
    ],
)
def test_budget_options_that_do_not_fit_together(
    small: dict[str, Path], capsys: pytest.CaptureFixture[str], extra: list[str], option: str
) -> None:
    assert main(generate_args(small, *extra)) != 0
    assert capsys.readouterr().err.startswith(f"error: {option}:")
