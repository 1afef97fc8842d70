"""``crossaudit`` command line. Errors are one clear line each; never a traceback.

Exit codes: 0 success, 1 invalid input / failed checks, 2 usage or internal error.
``CROSSAUDIT_DEBUG=1`` shows tracebacks of internal errors for bug reports.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from crossaudit.cli import completion
from crossaudit.cli.common import EXIT_FAIL, EXIT_OK, EXIT_USAGE, command_group
from crossaudit.kernel.errors import CrossAuditError, PolicyValidationError

# Every top-level command, in the order --help lists them, with its help line and the groups of
# modules that declare it (the remote commands add `policy deploy|list|...` to the policy group).
# A command's modules are imported only when that command runs, so `crossaudit --version` and
# `crossaudit policy validate` never load the server, the SDK's client or grpc
# (tests/unit/test_cli_startup.py checks the table against the whole parser, and the imports).
COMMANDS: dict[str, tuple[str, str]] = {
    "policy": ("validate, test, deploy policies", "policy remote"),
    "serve": ("run the gRPC orchestrator service", "serve"),
    "evaluator": ("upload and inspect custom evaluators", "remote"),
    "audit": ("read the audit log of answered decisions", "remote"),
    "review": ("review items created by require_review and flag", "remote"),
    "webhooks": ("deliveries of custom actions' webhooks", "remote"),
    "eval-labels": ("write a dataset from a deployed policy's resolved reviews and feedback labels", "remote"),
    "models": ("list, pull, import and verify the builtins' models", "models"),
    "config": ("show the server settings in effect and their sources; write a deployment's secret files", "config"),
    "evaluate": ("evaluate one request through a policy file (or, with --server, a deployed policy)", "evaluate"),
    "eval": ("measure a policy on a labelled dataset (precision, recall, F1, thresholds, CI gates)", "eval"),
    "completion": ("print the shell completion script (bash, zsh or fish)", "completion"),
    "proxy": (
        "serve an OpenAI-compatible /v1/chat/completions that applies a policy before and after the model",
        "proxy",
    ),
}
GROUPS = ("policy", "serve", "remote", "models", "config", "evaluate", "eval", "completion", "proxy")


def _declare(group: str, sub: argparse._SubParsersAction, psub: argparse._SubParsersAction) -> None:
    """Import the modules of one group of commands and declare its commands in ``sub`` (``psub``:
    the ``policy`` command's own sub-commands, which the remote commands add to)."""
    if group == "policy":
        from crossaudit.cli import policy

        policy.register(psub)
    elif group == "remote":
        from crossaudit.cli import remote

        remote.register(sub, psub)
    elif group == "serve":
        from crossaudit.cli import server

        server.register(sub)
    elif group == "models":
        from crossaudit.cli import models

        models.register(sub)
    elif group == "config":
        from crossaudit.cli import config as config_cli

        config_cli.register(sub)
    elif group == "evaluate":
        from crossaudit.cli import evaluate

        evaluate.register(sub)
    elif group == "eval":
        from crossaudit.cli import eval as eval_cli

        eval_cli.register(sub)
    elif group == "completion":
        completion.register(sub)
    elif group == "proxy":
        from crossaudit.cli import proxy as proxy_cli

        proxy_cli.register(sub)
    else:
        raise ValueError(f"no command group {group!r}")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ``only`` (a top-level command) just that command's group is
    declared and the others are listed by name, which is all that parsing that command needs."""
    parser = argparse.ArgumentParser(
        prog="crossaudit",
        description="CrossAudit policy platform",
        epilog="A command's options may also come before it, as in git and kubectl: "
        "crossaudit --server HOST:PORT policy list.",
    )
    completion.add_version(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    groups = GROUPS if only is None else COMMANDS[only][1].split() if only in COMMANDS else ()
    psub = command_group(sub, "policy", help=COMMANDS["policy"][0], dest="policy_command")
    for group in groups:
        _declare(group, sub, psub)
    for name, (help_line, _) in COMMANDS.items():
        if name not in sub.choices:  # named in --help and in argparse's "invalid choice", never run
            sub.add_parser(name, help=help_line, add_help=False)
    order = list(COMMANDS)
    sub._choices_actions.sort(key=lambda a: order.index(a.dest) if a.dest in order else len(order))
    return parser


def parser_for(argv: Sequence[str]) -> argparse.ArgumentParser:
    """The parser ``argv`` needs: one command's group when it starts with a command's name; the
    whole command line for options written before the command (they are looked up among every
    command's options) and for the shell's completion requests; none for ``--version``/``--help``."""
    first = argv[0] if argv else ""
    if "_ARGCOMPLETE" in os.environ:
        return build_parser()
    if first in COMMANDS:
        return build_parser(first)
    if first in ("", "-h", "--help", "--version"):
        return build_parser(only="")
    return build_parser()


# How many values an option takes, by its argparse nargs: none, an optional one, exactly one. An
# option taking more (nargs '+', '*', N) is never moved: where its values end is not known here.
_FLAG, _OPTIONAL, _ONE = "flag", "optional", "one"


def _arity(action: argparse.Action) -> str | None:
    if action.nargs == 0:
        return _FLAG
    if action.nargs == argparse.OPTIONAL:
        return _OPTIONAL
    if action.nargs is None or action.nargs == 1:
        return _ONE
    return None


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def command_options(parser: argparse.ArgumentParser) -> dict[str, set[str | None]]:
    """Every option string any command (at any depth) accepts, with the arities it has there."""
    table: dict[str, set[str | None]] = {}
    seen: set[int] = set()
    todo = list(_subcommands(parser).values())
    while todo:
        p = todo.pop()
        if id(p) in seen:
            continue
        seen.add(id(p))
        todo += _subcommands(p).values()
        for action in p._actions:
            for option in action.option_strings:
                table.setdefault(option, set()).add(_arity(action))
    return table


def hoist_options(parser: argparse.ArgumentParser, argv: Sequence[str]) -> list[str]:
    """``argv`` with the options written before the command moved after it (``crossaudit --server
    H:P policy deploy F`` is ``crossaudit policy deploy --server=H:P F``), as git and kubectl accept
    them: argparse would read the option's value as the command (``invalid choice``).

    Each option is looked up among every command's options to know whether it takes a value; a
    value that may be left out (``--server [ADDR]``) is not taken when the next word is a
    command. The command then checks them as if written after it; an option no command has, or
    the program's own (``--version``, ``--help``), leaves ``argv`` as it is for argparse to judge."""
    argv = list(argv)
    own = {o for a in parser._actions for o in a.option_strings}
    table = command_options(parser)
    commands = _subcommands(parser)
    moved: list[str] = []
    i = 0
    while i < len(argv) and argv[i].startswith("-") and argv[i] not in ("-", "--"):
        name, eq, _ = argv[i].partition("=")
        arities = table.get(name)
        if name in own or not arities or None in arities:
            return argv
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        may_stand_alone = bool(arities & {_FLAG, _OPTIONAL})
        if eq or arities == {_FLAG}:
            moved.append(argv[i])
            i += 1
        elif may_stand_alone and (nxt is None or nxt.startswith("-") or nxt in commands):
            moved.append(name)
            i += 1
        elif nxt is None:
            return argv
        elif name.startswith("--"):
            moved.append(f"{name}={nxt}")  # one word: a value that looks like a path stays the option's
            i += 2
        else:
            moved += [name, nxt]  # a short option: -e=prod would be the value '=prod'
            i += 2
    if not moved:
        return argv
    if i == len(argv):
        return moved  # options and no command: argparse says the command is missing
    rest, p, depth = argv[i:], parser, 0
    while depth < len(rest) and rest[depth] in _subcommands(p):
        p = _subcommands(p)[rest[depth]]
        depth += 1
    return [*rest[:depth], *moved, *rest[depth:]]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = parser_for(argv)
    if "_ARGCOMPLETE" in os.environ:
        completion.autocomplete(parser)  # answers the shell's completion request (crossaudit completion) and exits
    try:
        args = parser.parse_args(hoist_options(parser, argv))
    except SystemExit as e:  # argparse already printed usage
        return int(e.code or 0) and EXIT_USAGE
    try:
        return int(args.func(args))
    except PolicyValidationError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAIL
    except CrossAuditError as e:
        print(f"error: {e.message}", file=sys.stderr)
        return EXIT_FAIL
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return EXIT_OK
    except Exception as e:
        if os.environ.get("CROSSAUDIT_DEBUG"):
            raise
        print(f"internal error: {type(e).__name__}: {e} (set CROSSAUDIT_DEBUG=1 for details)", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    raise SystemExit(main())
