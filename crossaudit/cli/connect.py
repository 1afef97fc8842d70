"""How the CLI reaches a server: :func:`client`, the one Client factory of every command that calls
one, :func:`answer` for a command that makes one call and prints its answer, and the connection
flags (:func:`client_options` for the client commands). What ``crossaudit evaluate`` and
``crossaudit policy test`` share besides: ``--server [ADDR]`` (local evaluation without it) and how
a sandbox is chosen locally.

``--server`` takes an optional address, so ``--server NAME`` could swallow the positional that
follows it. A value that is an existing path, or is not an address, is given back to the
positionals (``crossaudit evaluate --server my-policy`` means the deployed ``my-policy`` on
``$CROSSAUDIT_SERVER``); write ``--server=HOST:PORT`` to be explicit.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from crossaudit.api.limits import DEFAULT_ENVIRONMENT
from crossaudit.cli.common import EXIT_OK, EXIT_USAGE
from crossaudit.kernel.errors import InvalidInputError
from crossaudit.sdk.options import API_KEY_ENV, DEFAULT_SERVER, SERVER_ENV, channel_target

# Locally, custom code runs where the server would run it: Docker when a daemon answers, else the
# process sandbox (crossaudit serve's default, orchestrator/runtime.py make_sandbox).
DEFAULT_LOCAL_SANDBOX = "auto"

T = TypeVar("T")


def add_target_options(p: argparse.ArgumentParser) -> None:
    """``--server [ADDR]`` and its connection flags; ``--sandbox`` for local runs."""
    g = p.add_argument_group("where it runs")
    g.add_argument(
        "--server",
        nargs="?",
        const="",
        default=None,
        metavar="ADDR",
        help=f"use the deployed policy on a running server (ADDR default: ${SERVER_ENV} or {DEFAULT_SERVER}); "
        "without --server the policy file is evaluated here",
    )
    g.add_argument("--api-key", default=None, metavar="KEY", help=f"with --server (default: ${API_KEY_ENV})")
    g.add_argument("--tls", action="store_true", help="with --server: connect with TLS (system roots)")
    g.add_argument("--ca-cert", default=None, metavar="PEM", help="with --server: TLS trusting this CA certificate")
    g.add_argument(
        "--environment", "-e", default=DEFAULT_ENVIRONMENT, help=f"with --server (default {DEFAULT_ENVIRONMENT})"
    )
    g.add_argument(
        "--sandbox",
        choices=["auto", "docker", "process"],
        default=None,
        help=f"without --server: where custom code runs (default: $CROSSAUDIT_SANDBOX or {DEFAULT_LOCAL_SANDBOX}: "
        "docker where a daemon answers, as the server does, else process)",
    )
    g.add_argument(
        "--timeout", type=float, default=None, metavar="SECONDS", help="seconds per evaluation (call deadline)"
    )


def looks_like_address(value: str) -> bool:
    """True for ``host:port`` (or several, or a gRPC target), False for a path or a policy name."""
    if os.path.exists(value):
        return False
    try:
        channel_target(value)
    except InvalidInputError:
        return False
    return True


def reclaim_positional(args: argparse.Namespace) -> str | None:
    """The ``--server`` value that is not an address (see the module docstring), now moved out of
    ``args.server`` (which becomes ``""``: the default server); None when there is none."""
    if args.server and not looks_like_address(args.server):
        value, args.server = args.server, ""
        return str(value)
    return None


def check_target(args: argparse.Namespace) -> str | None:
    """A usage problem of the flags as combined, or None."""
    if args.server is None:
        for flag, value in (("--api-key", args.api_key), ("--tls", args.tls), ("--ca-cert", args.ca_cert)):
            if value:
                return f"{flag} needs --server (without it the policy file is evaluated here)"
        return None
    if args.sandbox is not None:
        return "--sandbox applies to local runs: with --server the server's sandbox runs the evaluators"
    return None


def local_sandbox(args: argparse.Namespace) -> str:
    from crossaudit.sdk.tester import SANDBOX_ENV  # imported here: the engine is not needed for --help

    return args.sandbox or os.environ.get(SANDBOX_ENV) or DEFAULT_LOCAL_SANDBOX


def client_options() -> argparse.ArgumentParser:
    """The connection flags of the client commands (``policy deploy``, ``audit …``): a parent parser."""
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("server connection")
    g.add_argument("--server", default=None, metavar="HOST:PORT", help=f"default: ${SERVER_ENV} or {DEFAULT_SERVER}")
    g.add_argument("--api-key", default=None, metavar="KEY", help=f"default: ${API_KEY_ENV}")
    g.add_argument("--tls", action="store_true", help="connect with TLS (system roots)")
    g.add_argument("--ca-cert", default=None, metavar="PEM", help="connect with TLS trusting this CA certificate")
    g.add_argument("--timeout", type=float, default=None, metavar="SECONDS", help="call deadline")
    g.add_argument("--json", action="store_true", help="print JSON")
    return p


def client(args: argparse.Namespace) -> Any:
    """The one Client of the CLI's commands, for ``--server`` (``$CROSSAUDIT_SERVER`` /
    ``$CROSSAUDIT_API_KEY`` when not given)."""
    from crossaudit.sdk.client import Client

    tls: Any = args.ca_cert or bool(args.tls)
    options = {"timeout": args.timeout} if args.timeout else {}  # also the deadline of management calls
    return Client(args.server or None, api_key=args.api_key or None, tls=tls, **options)


def answer(args: argparse.Namespace, call: Callable[[Any], T], say: Callable[[T], str]) -> int:
    """Make one ``call`` on the server and print its answer: the record as JSON with ``--json``
    (timestamps as ISO-8601 UTC), else what ``say`` makes of it."""
    with client(args) as c:
        result = call(c)
    if args.json:
        from crossaudit.cli import display  # rich: loaded by the commands that print

        display.print_json(result)
    else:
        print(say(result))
    return EXIT_OK


def server_address(args: argparse.Namespace) -> str:
    return args.server or os.environ.get(SERVER_ENV) or DEFAULT_SERVER


def usage_error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_USAGE
