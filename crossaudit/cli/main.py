"""``crossaudit`` command line. Errors are one clear line each; never a traceback.

Exit codes: 0 success, 1 invalid input / failed checks, 2 usage or internal error.
``CROSSAUDIT_DEBUG=1`` shows tracebacks of internal errors for bug reports.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from crossaudit.cli import completion, evaluate, models, policy, remote, server
from crossaudit.cli import config as config_cli
from crossaudit.cli import eval as eval_cli
from crossaudit.cli import proxy as proxy_cli
from crossaudit.cli.common import EXIT_FAIL, EXIT_OK, EXIT_USAGE, command_group
from crossaudit.kernel.errors import CrossAuditError, PolicyValidationError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="crossaudit",
        description="CrossAudit policy platform",
        epilog="A command's options may also come before it, as in git and kubectl: "
        "crossaudit --server HOST:PORT policy list.",
    )
    completion.add_version(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    psub = command_group(sub, "policy", help="validate, test, deploy policies", dest="policy_command")
    policy.register(psub)
    server.register(sub)
    remote.register(sub, psub)
    models.register(sub)
    config_cli.register(sub)
    evaluate.register(sub)
    eval_cli.register(sub)
    completion.register(sub)
    proxy_cli.register(sub)
    return parser


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
    parser = build_parser()
    completion.autocomplete(parser)  # answers the shell's completion request (crossaudit completion) and exits
    try:
        args = parser.parse_args(hoist_options(parser, sys.argv[1:] if argv is None else argv))
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
