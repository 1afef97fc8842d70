"""The CLI imports what a command needs when it runs: ``--version`` and ``--help`` load no gRPC, no
pydantic model, no numpy or matplotlib, and a command's parser is the whole parser's part for it."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from crossaudit.cli.main import COMMANDS, build_parser

HEAVY = ("grpc", "pydantic", "numpy", "matplotlib", "crossaudit.service", "crossaudit.store", "crossaudit.sdk.client")


def _loaded_after(argv: list[str]) -> list[str]:
    code = (
        "import sys, json, contextlib, io\n"
        "from crossaudit.cli.main import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    try: main({argv!r})\n"
        "    except SystemExit: pass\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("argv", [["--version"], ["--help"], []])
def test_version_and_help_load_nothing_heavy(argv: list[str]) -> None:
    loaded = _loaded_after(argv)
    heavy = [m for m in loaded if m.startswith(HEAVY)]
    assert not heavy, heavy


def test_a_local_policy_command_loads_no_server_and_no_grpc_client() -> None:
    loaded = _loaded_after(["policy", "schema"])
    assert not [m for m in loaded if m.startswith(("crossaudit.service", "crossaudit.store", "crossaudit.sdk.client"))]


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _shape(parser: argparse.ArgumentParser) -> dict[str, object]:
    """Every option and sub-command below ``parser``, as a comparable tree."""
    return {
        "options": sorted(o for a in parser._actions for o in a.option_strings),
        "sub": {name: _shape(p) for name, p in _subparsers(parser).items()},
    }


def test_the_command_table_is_the_whole_parser() -> None:
    whole = build_parser()
    listed = {a.dest: a.help for a in whole._subparsers._group_actions[0]._choices_actions}  # type: ignore[union-attr]
    assert listed == {name: help_line for name, (help_line, _) in COMMANDS.items()}
    assert list(listed) == list(COMMANDS)  # --help lists them in the table's order
    for name in COMMANDS:
        alone = _subparsers(build_parser(name))[name]
        assert _shape(alone) == _shape(_subparsers(whole)[name]), name
