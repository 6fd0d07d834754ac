"""``keyseed … --help`` explains every option, and a newcomer's options come first."""

from __future__ import annotations

import argparse
import importlib

import pytest

from app.cli import COMMANDS, REGISTRARS, build_parser
from app.cli.options import METHOD_PREFIX, SHARED_OPTIONS, method_dest, option_name
from workers.methods.catalog import METHOD_PARAMS
from workers.methods.dpkps.params import DPKPSParams

NEWCOMER = (
    "--input",
    "--text-column",
    "--label-column",
    "--labels",
    "--method",
    "--epsilon",
    "--delta",
    "--llm",
    "--output",
    "--per-class",
    "--total",
)


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Every (nested) sub-command's parser by its path, e.g. ``admin create-org``."""
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                path = f"{parser.prog.removeprefix('keyseed').strip()} {name}".strip()
                found[path] = sub
                found.update(subcommands(sub))
    return found


PARSERS = subcommands(build_parser())
DOCUMENTED = ["generate", "evaluate", *sorted(p for p in PARSERS if p.startswith("admin"))]


def option_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        a
        for a in parser._actions
        if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))
    ]


@pytest.mark.parametrize("command", DOCUMENTED)
def test_every_option_has_help_beyond_its_name(command: str) -> None:
    parser = PARSERS[command]
    for action in option_actions(parser):
        names = {*action.option_strings, action.dest, action.dest.replace("_", "-")}
        text = (action.help or "").strip()
        assert text and text not in names, (command, action.option_strings or action.dest)
        assert len(text.split()) >= 3, (command, action.option_strings, text)
    assert parser.format_help()  # the help renders (no stray % in a help string)


def test_every_llm_method_field_is_an_option_with_its_description() -> None:
    parser = PARSERS["generate"]
    helps = {o: a.help or "" for a in parser._actions for o in a.option_strings}
    for method, params in METHOD_PARAMS.items():
        for name, info in params.model_fields.items():
            option = option_name(method_dest(name))
            assert option in helps, (method, name)
            if name in SHARED_OPTIONS:
                continue  # a DP-KPS option of the same meaning, with its own help
            assert info.description, (method, name)  # the API docs show it too
            assert info.description.split(". Default")[0].rstrip(".") in helps[option]
            assert method in helps[option], (method, option)
    generated = [a for a in parser._actions if a.dest.startswith(METHOD_PREFIX)]
    assert len(generated) >= 37


def test_every_dpkps_field_is_an_option_with_its_description() -> None:
    parser = PARSERS["generate"]
    helps = {o: a.help or "" for a in parser._actions for o in a.option_strings}
    for name, info in DPKPSParams.model_fields.items():
        option = "--" + name.replace("_", "-")
        assert option in helps, name
        if name != "vocabulary":  # the command line reads a file too (its own help)
            assert info.description and info.description.rstrip(".") in helps[option], name


def test_the_first_group_holds_what_a_newcomer_needs_and_the_rest_is_expert() -> None:
    parser = PARSERS["generate"]
    groups = [
        g
        for g in parser._action_groups
        if any(not isinstance(a, argparse._HelpAction) for a in g._group_actions)
    ]
    first = {o for a in groups[0]._group_actions for o in a.option_strings}
    assert set(NEWCOMER) <= first
    for group in groups[1:]:
        assert group.title and group.title.startswith("expert options"), group.title
    rendered = parser.format_help()
    assert rendered.index("--input") < rendered.index("expert options")


def test_the_description_names_all_four_methods() -> None:
    assert PARSERS["evaluate"].description
    description = PARSERS["generate"].description or ""
    assert "Run DP-KPS" not in description
    for method in ("dpkps", "aug-pe", "pate-tutor", "dp-eda"):
        assert method in description
    method_help = next(a.help for a in PARSERS["generate"]._actions if a.dest == "method")
    assert all(m in (method_help or "") for m in ("dpkps", "aug-pe", "pate-tutor", "dp-eda"))


@pytest.mark.parametrize("registrar", REGISTRARS)
def test_commands_name_the_module_that_registers_each(registrar: str) -> None:
    # main() builds a known command's parser from COMMANDS[command] alone
    parser = argparse.ArgumentParser(prog="keyseed")
    sub = parser.add_subparsers()
    importlib.import_module(registrar).register(sub)
    assert set(sub.choices) == {c for c, m in COMMANDS.items() if m == registrar}
    assert set(PARSERS) >= set(COMMANDS)
