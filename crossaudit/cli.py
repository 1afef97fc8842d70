"""``crossaudit`` command line. Errors are one clear line each; never a traceback.

Exit codes: 0 success, 1 invalid input / failed checks, 2 usage or internal error.
``CROSSAUDIT_DEBUG=1`` shows tracebacks of internal errors for bug reports.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from orchestrator.errors import CrossAuditError, PolicyValidationError

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def _cmd_validate(args: argparse.Namespace) -> int:
    from orchestrator.policy import load_policy_file

    failed = 0
    report = []
    for path in args.files:
        try:
            policy = load_policy_file(path)
        except PolicyValidationError as e:
            failed += 1
            report.append({"file": path, "valid": False, "issues": [str(i) for i in e.issues]})
            if not args.json:
                print(f"✗ {path}: {len(e.issues)} issue(s)")
                for issue in e.issues:
                    print(f"  {issue}")
            continue
        warnings = policy.warnings
        strict_fail = args.strict and bool(warnings)
        failed += strict_fail
        report.append({"file": path, "valid": not strict_fail, "warnings": warnings})
        if not args.json:
            mark = "✗" if strict_fail else "✓"
            print(
                f"{mark} {path}: {policy.name} v{policy.version} "
                f"({len(policy.evaluators)} evaluators, {len(policy.rules)} rules)"
            )
            for w in warnings:
                print(f"  warning: {w}")
    if args.json:
        print(json.dumps(report, indent=2))
    return EXIT_FAIL if failed else EXIT_OK


def _cmd_test(args: argparse.Namespace) -> int:
    from crossaudit.tester import PolicyTester, load_cases_file

    extra = load_cases_file(args.input) if args.input else []
    with PolicyTester(args.file, sandbox=args.sandbox, timeout=args.timeout) as tester:
        cases = list(tester.policy.test_cases) + extra
        if not cases:
            print(f"{args.file}: no test cases (add test_cases to the policy or pass --input cases.json)")
            return EXIT_FAIL
        results = tester.run_cases(cases)
    for r in results:
        print(r.line())
    failed = sum(not r.ok for r in results)
    print(f"{len(results) - failed} passed, {failed} failed")
    return EXIT_FAIL if failed else EXIT_OK


def _cmd_schema(args: argparse.Namespace) -> int:
    from orchestrator.policy.schema import policy_json_schema_text

    sys.stdout.write(policy_json_schema_text())
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="crossaudit", description="CrossAudit policy platform")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    policy = sub.add_parser("policy", help="validate, test, deploy policies")
    psub = policy.add_subparsers(dest="policy_command", metavar="SUBCOMMAND")
    psub.required = True

    v = psub.add_parser("validate", help="validate policy files (exit 1 if any is invalid)")
    v.add_argument("files", nargs="+", metavar="FILE")
    v.add_argument("--strict", action="store_true", help="treat warnings (e.g. unset ${ENV}) as errors")
    v.add_argument("--json", action="store_true", help="machine-readable report")
    v.set_defaults(func=_cmd_validate)

    t = psub.add_parser("test", help="run a policy's test_cases (and --input cases.json)")
    t.add_argument("file", metavar="FILE")
    t.add_argument("--input", metavar="CASES.json", help="extra test cases (same shape as test_cases)")
    t.add_argument(
        "--sandbox",
        choices=["process", "docker", "auto"],
        default=None,
        help="where custom code runs (default: $CROSSAUDIT_SANDBOX or process)",
    )
    t.add_argument("--timeout", type=float, default=None, help="seconds per evaluation")
    t.set_defaults(func=_cmd_test)

    s = psub.add_parser("schema", help="print the policy JSON Schema")
    s.set_defaults(func=_cmd_schema)

    try:
        from crossaudit import cli_server
    except ImportError:  # the service commands are optional for a library-only install
        cli_server = None  # type: ignore[assignment]
    if cli_server is not None:
        cli_server.register(sub, psub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
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
