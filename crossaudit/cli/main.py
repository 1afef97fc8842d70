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
from crossaudit.cli.common import EXIT_FAIL, EXIT_OK, EXIT_USAGE
from crossaudit.kernel.errors import CrossAuditError, PolicyValidationError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="crossaudit", description="CrossAudit policy platform")
    completion.add_version(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    policy_parser = sub.add_parser("policy", help="validate, test, deploy policies")
    psub = policy_parser.add_subparsers(dest="policy_command", metavar="SUBCOMMAND")
    psub.required = True
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    completion.autocomplete(parser)  # answers the shell's completion request (crossaudit completion) and exits
    try:
        args = parser.parse_args(argv)
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
