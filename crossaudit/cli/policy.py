"""Local ``crossaudit policy`` commands: ``validate``, ``schema``, and ``test`` (``crossaudit.cli.policytest``:
here, or against a server with ``--server``)."""

from __future__ import annotations

import argparse
import json
import sys

from crossaudit.cli import policytest
from crossaudit.cli.common import EXIT_FAIL, EXIT_OK
from crossaudit.kernel.errors import PolicyValidationError


def register(psub: argparse._SubParsersAction) -> None:
    """Add the local commands to the ``policy`` sub-command parser."""
    v = psub.add_parser("validate", help="validate policy files (exit 1 if any is invalid)")
    v.add_argument("files", nargs="+", metavar="FILE")
    v.add_argument(
        "--strict",
        action="store_true",
        help="treat warnings (an unset ${ENV}, a rule that reaches no verdict offline) as errors",
    )
    v.add_argument("--json", action="store_true", help="machine-readable report")
    v.add_argument("--no-analyze", action="store_true", help="skip the analysis findings (policy analyze)")
    v.set_defaults(func=_cmd_validate)

    policytest.register(psub)

    s = psub.add_parser("schema", help="print the policy JSON Schema")
    s.set_defaults(func=_cmd_schema)

    from crossaudit.cli import analyze, policydiff

    policydiff.register(psub)
    analyze.register(psub)


def _print_indented(prefix: str, text: str) -> None:
    """``prefix`` + the first line, the rest of a multi-line message indented under it."""
    first, _, rest = text.partition("\n")
    print(f"  {prefix}{first}")
    for line in rest.splitlines():
        print(f"      {line}")


def _cmd_validate(args: argparse.Namespace) -> int:
    from crossaudit.cli import analyze
    from orchestrator.policy import load_policy_file
    from orchestrator.readiness import readiness

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
        # Rules that reach no verdict here (an LLM key unset, a model not here) are warnings: the
        # file may be meant for a server that has them (the service refuses what it lacks).
        # Context the rules need is a note: choosing requests is what conditions are for.
        ready = readiness(policy)
        analysis, findings = ([], []) if args.no_analyze else analyze.validate_findings(policy)
        warnings = [*policy.warnings, *ready.warnings, *analysis]
        strict_fail = args.strict and bool(warnings)
        failed += strict_fail
        entry = {"file": path, "valid": not strict_fail, "warnings": warnings, "notes": ready.notes}
        report.append(entry if args.no_analyze else {**entry, "analysis": findings})
        if not args.json:
            mark = "✗" if strict_fail else "✓"
            print(
                f"{mark} {path}: {policy.name} v{policy.version} "
                f"({len(policy.evaluators)} evaluators, {len(policy.rules)} rules)"
            )
            for w in warnings:
                _print_indented("warning: ", w)
            for n in ready.notes:
                _print_indented("note: ", n)
    if args.json:
        print(json.dumps(report, indent=2))
    return EXIT_FAIL if failed else EXIT_OK


def _cmd_schema(args: argparse.Namespace) -> int:
    from orchestrator.policy.schema import policy_json_schema_text

    sys.stdout.write(policy_json_schema_text())
    return EXIT_OK
