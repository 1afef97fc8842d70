"""``crossaudit evaluate``: one request through a policy, like ``opa eval``.

Without ``--server`` the policy file runs here, through PolicyTester (the engine and sandboxes
the server uses; Docker where a daemon answers). With ``--server`` POLICY names a deployed
policy (or is a policy file whose name is used) and a running server decides.

Exit codes: 0 the decision passed; 1 it did not, or the request could not be evaluated (one
``error:`` line, no decision); 2 usage, including an input larger than one request may carry.
So a script may treat any non-zero as "do not pass".
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from crossaudit.api.limits import REQUEST_LIMIT_ENV, REQUEST_LIMIT_KEY
from crossaudit.cli import connect, progress, render
from crossaudit.cli.common import EXIT_FAIL, EXIT_OK
from crossaudit.cli.progress import SLOW_PREPARE_S
from crossaudit.kernel.errors import InvalidInputError, RequestTooLargeError
from crossaudit.kernel.results import Decision, loads_strict
from crossaudit.sdk.options import request_limit

# The inputs (--prompt/--response/--context, each and together) may hold what one request to a
# server may carry: limits.max_request_bytes, the SDK's limit here (request_limit: the variable
# the server reads too, else the same default), so a local run refuses what a server would. The
# engine's own cap on prompt + response (EngineLimits.max_content_bytes) then applies, typed.
STDIN = "-"


def _too_large(what: str, size: int | None, limit: int, verb: str = "is") -> RequestTooLargeError:
    held = f"{verb} {size} bytes" if size is not None else f"holds more than {limit} bytes"
    return RequestTooLargeError(
        f"{what} {held}, over the {limit} bytes one request may carry "
        f"({REQUEST_LIMIT_KEY}; set {REQUEST_LIMIT_ENV} to change it, here and on the server)",
        size=size,
        limit=limit,
        setting=REQUEST_LIMIT_KEY,
    )


def register(sub: argparse._SubParsersAction) -> None:
    e = sub.add_parser(
        "evaluate",
        help="evaluate one request through a policy file (or, with --server, a deployed policy)",
        description="Evaluate one request. Exit 0 when the decision passes, 1 when it does not "
        "(or the request cannot be evaluated), 2 on usage errors.",
    )
    e.add_argument(
        "policy",
        nargs="?",
        metavar="POLICY",
        help="a policy file; with --server the name of a deployed policy (or a file whose name is used)",
    )
    e.add_argument("--prompt", "-p", default="", metavar="TEXT", help="the prompt: TEXT, @FILE, or - for stdin")
    e.add_argument("--response", "-r", default="", metavar="TEXT", help="the response: TEXT, @FILE, or - for stdin")
    e.add_argument("--context", "-c", default=None, metavar="JSON", help="a JSON object: JSON, @FILE, or - for stdin")
    e.add_argument("--json", action="store_true", help="print the decision as JSON")
    connect.add_target_options(e)
    e.set_defaults(func=cmd_evaluate)


def read_input(value: str, what: str) -> str:
    """``value`` itself, the text of ``@FILE``, or standard input for ``-``; at most the request
    limit (RequestTooLargeError beyond; a file or stdin is read no further)."""
    limit = request_limit()
    if value == STDIN:
        data = sys.stdin.buffer.read(limit + 1)
        source = "standard input"
    elif value.startswith("@"):
        path = Path(value[1:])
        source = str(path)
        try:
            with path.open("rb") as f:
                data = f.read(limit + 1)
        except FileNotFoundError:
            raise InvalidInputError(f"{what}: file {path} not found") from None
        except OSError as e:
            raise InvalidInputError(f"{what}: cannot read {path}: {e.strerror}") from None
    else:
        size = len(value.encode("utf-8", "surrogatepass"))
        if size > limit:
            raise _too_large(what, size, limit)
        return value
    if len(data) > limit:
        raise _too_large(f"{what}: {source}", None, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidInputError(f"{what}: {source} is not UTF-8 text (byte {e.start})") from None


def parse_context(value: str | None) -> dict[str, Any]:
    if value is None:
        return {}
    text = read_input(value, "--context")
    try:
        ctx = loads_strict(text)
    except ValueError as e:  # JSONDecodeError, or NaN/Infinity
        where = f" at line {e.lineno} column {e.colno}" if isinstance(e, json.JSONDecodeError) else ""
        raise InvalidInputError(f"--context: invalid JSON{where}: {getattr(e, 'msg', e)}") from None
    if not isinstance(ctx, dict):
        raise InvalidInputError(f"--context: expected a JSON object, got {type(ctx).__name__}")
    return ctx


def _warn(message: str) -> None:
    print(f"warning: {render.printable(message)}", file=sys.stderr)


def _evaluate_locally(args: argparse.Namespace, prompt: str, response: str, context: dict[str, Any]) -> Decision:
    from crossaudit.sdk.tester import PolicyTester

    if not Path(args.policy).is_file():
        raise InvalidInputError(f"policy file {args.policy} not found (to use a deployed policy, add --server)")
    with progress.build_progress(quiet=args.json, hold_s=SLOW_PREPARE_S, label="preparing") as update:
        tester = PolicyTester(args.policy, sandbox=connect.local_sandbox(args), timeout=args.timeout, progress=update)
    with tester:
        for note in tester.local_differences.values():
            _warn(f"local results may differ from the server's: {note}")
        for name, why in tester.preparation_errors.items():
            if name not in tester.local_differences:
                _warn(f"evaluator {name!r} could not be prepared: {why}")
        return tester.evaluate(prompt, response, context)


def _policy_name(policy: str) -> str:
    """With --server: a policy file stands for the policy it names."""
    if not Path(policy).is_file():
        return policy
    from orchestrator.policy import load_policy_file

    return load_policy_file(policy).name


def _evaluate_remotely(args: argparse.Namespace, prompt: str, response: str, context: dict[str, Any]) -> Decision:
    name = _policy_name(args.policy)
    with connect.client(args) as c:
        return c.evaluate(name, prompt, response, context, environment=args.environment, timeout=args.timeout)


def check_inputs(prompt: str, response: str, context: dict[str, Any]) -> None:
    """The inputs together within the request limit (each was checked as it was read)."""
    limit = request_limit()
    size = sum(len(t.encode("utf-8", "surrogatepass")) for t in (prompt, response, json.dumps(context)))
    if size > limit:
        raise _too_large("--prompt, --response and --context together", size, limit, "are")


def cmd_evaluate(args: argparse.Namespace) -> int:
    try:
        return _evaluate(args)
    except RequestTooLargeError as e:  # here, by the SDK before sending, or by the server: a usage error
        return connect.usage_error(e.message)


def _evaluate(args: argparse.Namespace) -> int:
    spare = connect.reclaim_positional(args)
    if spare is not None:
        if args.policy is not None:
            return connect.usage_error(f"--server {spare}: not a HOST:PORT address (write --server=HOST:PORT)")
        args.policy = spare
    if not args.policy:
        return connect.usage_error("give a POLICY (a policy file, or with --server a deployed policy's name)")
    problem = connect.check_target(args)
    if problem:
        return connect.usage_error(problem)
    if [args.prompt, args.response, args.context].count(STDIN) > 1:
        return connect.usage_error("only one of --prompt, --response and --context can read standard input")
    prompt = read_input(args.prompt, "--prompt")
    response = read_input(args.response, "--response")
    context = parse_context(args.context)
    check_inputs(prompt, response, context)
    if args.server is None:
        decision = _evaluate_locally(args, prompt, response, context)
    else:
        decision = _evaluate_remotely(args, prompt, response, context)
    if args.json:
        print(json.dumps(decision.model_dump(mode="json"), indent=2, sort_keys=True))
    else:
        render.print_decision(decision, render.console())
    return EXIT_OK if decision.passed else EXIT_FAIL
