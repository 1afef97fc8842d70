"""``crossaudit policy analyze POLICY`` and ``crossaudit policy diff OLD NEW --symbolic``: what the
solver proves about a policy, each counterexample reproduced by the engine (docs/analysis.md).

Exit codes: 0 clean (diff: proved equivalent); 1 findings at or above ``--fail-on`` (diff: the
versions differ, or the solver could not say); 2 bad input (a policy that does not load, a
stored version not found), or a witness the engine did not reproduce (a bug of the analysis,
never printed as a finding). ``policy validate`` shows the findings as warnings, ``policy deploy
--analyze LEVEL`` refuses to upload a policy with findings at that level (:func:`deploy_gate`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from crossaudit.api.limits import DEFAULT_ENVIRONMENT
from crossaudit.cli.common import EXIT_FAIL, EXIT_OK, EXIT_USAGE
from crossaudit.cli.connect import client, looks_like_address
from crossaudit.kernel.dsl import Policy
from crossaudit.kernel.errors import CrossAuditError, InvalidInputError
from crossaudit.sdk.options import API_KEY_ENV, DEFAULT_SERVER, SERVER_ENV

LEVELS = ("warning", "error")
DEFAULT_QUERY_TIMEOUT_S = 5.0


def register(psub: argparse._SubParsersAction) -> None:
    a = psub.add_parser(
        "analyze",
        help="prove things about a policy (dead rules, contradictions, inert thresholds), with counterexamples",
    )
    a.add_argument("policy", nargs="?", metavar="POLICY", help="a policy file, or NAME[@VERSION] with --server")
    a.add_argument("--json", action="store_true", help="the report as JSON (docs/analysis.md: stable)")
    a.add_argument(
        "--fail-on",
        choices=LEVELS,
        default="error",
        help="exit 1 on findings of this severity or above (default error)",
    )
    add_solver_option(a)
    g = a.add_argument_group("a deployed policy")
    g.add_argument(
        "--server", nargs="?", const="", default=None, metavar="ADDR",
        help=f"analyze NAME[@VERSION] stored on a server (ADDR default: ${SERVER_ENV} or {DEFAULT_SERVER})",
    )  # fmt: skip
    g.add_argument("--environment", "-e", default=DEFAULT_ENVIRONMENT, help="where NAME without @VERSION is deployed")
    g.add_argument("--api-key", default=None, metavar="KEY", help=f"with --server (default: ${API_KEY_ENV})")
    g.add_argument("--tls", action="store_true", help="with --server: connect with TLS (system roots)")
    g.add_argument("--ca-cert", default=None, metavar="PEM", help="with --server: TLS trusting this CA certificate")
    g.add_argument("--timeout", type=float, default=None, metavar="SECONDS", help="with --server: call deadline")
    a.set_defaults(func=cmd_analyze)


def add_solver_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--solver-timeout",
        type=float,
        default=DEFAULT_QUERY_TIMEOUT_S,
        metavar="SECONDS",
        help="per solver query; a query not settled in time is reported as unknown "
        f"(default {DEFAULT_QUERY_TIMEOUT_S:g})",
    )


def _limits(args: argparse.Namespace) -> Any:
    from crossaudit.analysis import SolverLimits

    if args.solver_timeout <= 0:
        raise InvalidInputError("--solver-timeout must be more than 0 seconds")
    return SolverLimits(query_timeout_s=args.solver_timeout)


def load(spec: str, args: argparse.Namespace, stored: bool) -> tuple[str, Policy]:
    """(label, policy): a file, or with ``stored`` NAME[@VERSION] from the server."""
    from orchestrator.policy import load_policy, load_policy_file

    if not stored:
        if not Path(spec).is_file():
            raise InvalidInputError(f"policy file {spec} not found (a stored policy needs --server)")
        return spec, load_policy_file(spec, env={})
    name, _, version = spec.partition("@")
    if version and not version.isdigit():
        raise InvalidInputError(f"{spec}: give NAME or NAME@VERSION (a version number)")
    with client(args) as c:
        info = c.get_policy(name, environment=args.environment, version=int(version or 0))
    label = f"{info.version.name}@{info.version.version}"
    return label, load_policy(info.content, label, env={})


def cmd_analyze(args: argparse.Namespace) -> int:
    from crossaudit.analysis import analyze

    if args.server and not looks_like_address(args.server) and args.policy is None:
        args.policy, args.server = args.server, ""  # `--server NAME`: the name, on the default server
    if not args.policy:
        return _bad("give a policy file, or NAME[@VERSION] with --server")
    try:
        label, policy = load(args.policy, args, stored=args.server is not None)
        report = analyze(policy, _limits(args))
    except CrossAuditError as e:
        return _bad(str(e))
    if args.json:
        print(json.dumps({"source": label, **report.to_json()}, indent=2))
    else:
        print_report(label, report)
    if report.bugs:
        return EXIT_USAGE
    return EXIT_FAIL if report.at_least(args.fail_on) else EXIT_OK


def _bad(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_USAGE


def print_report(label: str, report: Any) -> None:
    counts = report.to_json()["counts"]
    print(
        f"{label}: {report.policy} v{report.version}: {counts['error']} error(s), {counts['warning']} warning(s), "
        f"{counts['info']} note(s) ({report.seconds:.2f} s)"
    )
    for f in report.findings:
        print(f"  {f.severity}: [{f.kind}] {f.message}")
        if f.witness is not None:
            print(f"      witness: {f.witness_text}")
            e = f.engine or {}
            print(
                f"      engine (reproduced): passed={e.get('passed')} action={e.get('action')} rules={e.get('rules')}"
            )
    for note in report.not_modelled:
        print(f"  not modelled: {note}")
    for bug in report.bugs:
        print(f"  analysis bug (not a finding; please report): {bug}")


# --- policy diff --symbolic -------------------------------------------------------------------


def cmd_symbolic_diff(args: argparse.Namespace, old: tuple[str, Policy], new: tuple[str, Policy]) -> int:
    """``policy diff OLD NEW --symbolic`` (crossaudit/cli/policydiff.py loads both sides)."""
    from crossaudit.analysis import symbolic_diff

    try:
        report = symbolic_diff(old[1], new[1], (old[0], new[0]), _limits(args))
    except CrossAuditError as e:
        return _bad(str(e))
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        _print_diff(report)
    if report.bugs:
        return EXIT_USAGE
    return EXIT_OK if report.equivalent is True else EXIT_FAIL


def _outcome(o: dict[str, Any]) -> str:
    if "status" in o:
        return o["status"] + (f" ({o['action']})" if o.get("action") else "")
    return ("passes" if o["passed"] else "fails") + f", {o['action']}" + (", modified" if o.get("modified") else "")


def _print_diff(report: Any) -> None:
    if report.equivalent is True:
        print(f"{report.old} and {report.new}: equivalent (no input is decided differently) ({report.seconds:.2f} s)")
    elif report.equivalent is None:
        print(f"{report.old} -> {report.new}: unknown: the solver could not decide within its limit")
    else:
        more = " (more not shown)" if report.truncated else ""
        print(f"{report.old} -> {report.new}: {len(report.regions)} region(s) decided differently{more} "
              f"({report.seconds:.2f} s)")  # fmt: skip
    for r in report.regions:
        print(f"  {_outcome(r.old)} -> {_outcome(r.new)} when " + ("; ".join(r.when) or "always"))
        if r.witness is not None:
            print(f"      witness (reproduced by the engine): {json.dumps(r.witness, sort_keys=True)}")
    for c in report.rules:
        if c.region is None:
            print(f"  rule {c.rule}: {c.change}")
        else:
            print(f"  rule {c.rule}: {_outcome(c.region.old)} -> {_outcome(c.region.new)}, e.g. when "
                  + ("; ".join(c.region.when) or "always"))  # fmt: skip
    for note in report.not_modelled:
        print(f"  not modelled: {note}")
    for bug in report.bugs:
        print(f"  analysis bug (not a finding; please report): {bug}")


# --- policy validate and policy deploy ----------------------------------------------------------


def validate_findings(policy: Policy) -> tuple[list[str], list[dict[str, Any]]]:
    """What ``policy validate`` shows of the analysis: (warning lines, findings as JSON). An
    analysis that fails is one line saying so, never a failed validation."""
    from crossaudit.analysis import analyze

    try:
        report = analyze(policy)
    except Exception as e:
        return [f"analysis did not run: {type(e).__name__}: {e}"], []
    lines = [f"analysis {f.severity}: [{f.kind}] {f.message}" for f in report.at_least("warning")]
    lines += [f"analysis bug (not a finding): {b}" for b in report.bugs]
    return lines, [f.to_json() for f in report.findings]


def add_deploy_option(d: argparse.ArgumentParser) -> None:
    d.add_argument(
        "--analyze",
        choices=LEVELS,
        default=None,
        metavar="LEVEL",
        help="analyze the file first (policy analyze) and refuse to deploy it with findings of LEVEL "
        "(warning or error) or above",
    )


def deploy_gate(args: argparse.Namespace) -> int | None:
    """``policy deploy --analyze LEVEL``: None to go on with the upload, else the exit code."""
    if not getattr(args, "analyze", None):
        return None
    from crossaudit.analysis import analyze

    label, policy = load(args.file, args, stored=False)
    report = analyze(policy)
    blocking = report.at_least(args.analyze)
    if not blocking and not report.bugs:
        return None
    print_report(label, report)
    print(f"error: not deployed: {len(blocking)} finding(s) at or above {args.analyze} (policy analyze {label})",
          file=sys.stderr)  # fmt: skip
    return EXIT_FAIL if blocking else EXIT_USAGE
