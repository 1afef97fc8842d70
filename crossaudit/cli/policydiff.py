"""``crossaudit policy diff OLD NEW``: what changed between two versions of a policy, in words.

Each side is a policy file, or ``NAME@VERSION`` / ``NAME`` for a version stored on a server (the
deployed one in ``--environment`` when no version is given), read with the client options of
the remote commands. Both are validated first: an invalid side gets its located issues.
``--exit-code`` exits 1 when they differ (as ``git diff --exit-code``), for a CI gate.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from crossaudit.api.limits import DEFAULT_ENVIRONMENT
from crossaudit.cli.common import EXIT_FAIL, EXIT_OK
from crossaudit.cli.connect import client, client_options
from crossaudit.kernel.dsl import Policy
from crossaudit.kernel.errors import InvalidInputError

MARKS = {"added": "+", "removed": "-", "changed": "~"}
STORED = re.compile(r"^(?P<name>[^@/\\]+?)(?:@(?P<version>[1-9][0-9]{0,9}))?$")


def register(psub: argparse._SubParsersAction) -> None:
    d = psub.add_parser(
        "diff",
        parents=[client_options()],
        help="what changed between two versions of a policy (files, or NAME@VERSION on a server)",
    )
    d.add_argument("old", metavar="OLD", help="a policy file, or NAME@VERSION / NAME stored on the server")
    d.add_argument("new", metavar="NEW", help="a policy file, or NAME@VERSION / NAME stored on the server")
    d.add_argument("--environment", "-e", default=DEFAULT_ENVIRONMENT, help="where NAME without @VERSION is deployed")
    d.add_argument("--exit-code", action="store_true", help="exit 1 when the two differ")
    d.add_argument(
        "--symbolic", action="store_true", help="the inputs the two decide differently, proved (docs/analysis.md)"
    )
    from crossaudit.cli.analyze import add_solver_option

    add_solver_option(d)
    d.set_defaults(func=_cmd_diff)


def _load(spec: str, args: argparse.Namespace) -> tuple[str, Policy]:
    """(label, policy) of one side: a file when one exists there, else a stored version."""
    from orchestrator.policy import load_policy, load_policy_file

    if Path(spec).exists():
        return spec, load_policy_file(spec, env={})
    m = STORED.match(spec)
    if m is None:
        raise InvalidInputError(f"{spec}: no such file, and not NAME or NAME@VERSION of a stored policy")
    version = int(m["version"] or 0)
    with client(args) as c:
        info = c.get_policy(m["name"], environment=args.environment, version=version)
    label = f"{info.version.name}@{info.version.version}"
    return label, load_policy(info.content, label, env={})


def _cmd_diff(args: argparse.Namespace) -> int:
    from orchestrator.policy.diff import diff_policies

    old_label, old = _load(args.old, args)
    new_label, new = _load(args.new, args)
    if args.symbolic:
        from crossaudit.cli.analyze import cmd_symbolic_diff

        return cmd_symbolic_diff(args, (old_label, old), (new_label, new))
    changes = diff_policies(old, new)
    if args.json:
        print(json.dumps({"old": old_label, "new": new_label, "changes": [c.to_json() for c in changes]}, indent=2))
    elif not changes:
        print(f"{old_label} and {new_label}: no change to what the policy does")
    else:
        print(f"{old_label} -> {new_label}: {len(changes)} change(s)")
        for change in changes:
            print(
                f"  {'+' if change.kind == 'added' else '-' if change.kind == 'removed' else '~'} {change.describe()}"
            )
    return EXIT_FAIL if changes and args.exit_code else EXIT_OK
