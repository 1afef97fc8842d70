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
        "--strict", action="store_true", help="treat warnings (e.g. unset ${ENV}, a model missing here) as errors"
    )
    v.add_argument("--json", action="store_true", help="machine-readable report")
    v.set_defaults(func=_cmd_validate)

    policytest.register(psub)

    s = psub.add_parser("schema", help="print the policy JSON Schema")
    s.set_defaults(func=_cmd_schema)


def _cmd_validate(args: argparse.Namespace) -> int:
    from crossaudit.orchestrator.policy import load_policy_file
    from crossaudit.orchestrator.policy.models import model_warnings

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
        # A model missing here is a warning: the file may be meant for a server that has it
        # (PolicyTester, `policy test` and the service's validate/deploy refuse it).
        warnings = [*policy.warnings, *model_warnings(policy)]
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


def _cmd_schema(args: argparse.Namespace) -> int:
    from crossaudit.orchestrator.policy.schema import policy_json_schema_text

    sys.stdout.write(policy_json_schema_text())
    return EXIT_OK
