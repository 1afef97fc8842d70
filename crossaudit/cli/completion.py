"""``crossaudit --version`` and ``crossaudit completion bash|zsh|fish``.

Completion is argcomplete's: the shell script it prints calls ``crossaudit`` back with the
partial command line in the environment, and :func:`autocomplete` (run in ``main`` before
parsing) answers from the same argparse parser the command runs with — so every sub-command
and flag, the ``proxy`` one included, completes without a hand-kept table.
"""

from __future__ import annotations

import argparse
from importlib.metadata import PackageNotFoundError, version

from crossaudit.cli.common import EXIT_OK

PROG = "crossaudit"
SHELLS = ("bash", "zsh", "fish")


def package_version() -> str:
    """The installed distribution's version (pyproject.toml), or ``unknown`` from a bare source tree."""
    try:
        return version("crossaudit")
    except PackageNotFoundError:
        return "unknown"


def add_version(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--version", action="version", version=f"{PROG} {package_version()}")


def register(subparsers: argparse._SubParsersAction) -> None:
    c = subparsers.add_parser(
        "completion",
        help="print the shell completion script (bash, zsh or fish)",
        description='bash: eval "$(crossaudit completion bash)" in ~/.bashrc; zsh: the same with zsh in ~/.zshrc '
        "(after compinit); fish: crossaudit completion fish | source in ~/.config/fish/config.fish",
    )
    c.add_argument("shell", choices=SHELLS)
    c.set_defaults(func=cmd_completion)


def cmd_completion(args: argparse.Namespace) -> int:
    from argcomplete import shellcode

    print(shellcode([PROG], shell=args.shell), end="")
    return EXIT_OK


def autocomplete(parser: argparse.ArgumentParser) -> None:
    """Answer a completion request from the shell script and exit; a no-op on an ordinary run
    (argcomplete looks for its environment variables only)."""
    import argcomplete

    argcomplete.autocomplete(parser)
