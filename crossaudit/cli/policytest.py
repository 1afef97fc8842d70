"""``crossaudit policy test``: run policies' ``test_cases`` here, or against a running server.

* Inputs: files and directories (``crossaudit.cli.testreport.discover``: recursive).
* Here, each policy runs through PolicyTester on the sandbox the server would use (Docker where a
  daemon answers); where the result may differ from the server's (a dependency the process
  sandbox cannot install, an uploaded evaluator only a server has) it says so, one ``warning:``
  line on stderr each, and in the error of the cases it touches.
* ``--server``: each file supplies the test cases and the policy's name; the deployed policy of
  that name answers (so policies using uploaded evaluators can be tested).
* Every case is PASS, FAIL (wrong decision) or ERROR (a rule got no verdict, unless the case
  expects ``error``): ``crossaudit.sdk.cases.judge_case``. A case that did not pass prints each
  rule with its score, threshold, action, reason and evaluator errors; ``-v`` for every case.
* ``--json`` prints the report on stdout; ``--junit FILE`` writes JUnit XML.
* Recorded LLM answers (``crossaudit.evals.cassettes``, local runs only): ``--record DIR`` keeps
  each LLM judge's answers (one file per policy version, written when the run ends);
  ``--replay DIR`` answers every LLM call from them with no network: a policy version DIR holds
  no cassette for is refused before anything runs, and a request that was not recorded fails its
  rule and the run. ``--repeat N`` runs each case N times: a case passes only when every run
  passed (pass^N), and per case and per rule the pass rate is reported, flaky rules marked.

Exit codes: 0 every case passed; 1 a case failed or errored, a policy could not be loaded, a
replayed request was not recorded, or no case ran; 2 usage (and a replay directory with no
cassette for a policy version, or an unreadable one).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import sys
import time
from typing import Any

from rich.padding import Padding
from rich.text import Text

from crossaudit.cli import connect, progress, render
from crossaudit.cli.common import EXIT_FAIL, EXIT_OK, EXIT_USAGE
from crossaudit.cli.progress import SLOW_PREPARE_S
from crossaudit.cli.testreport import PolicyFile, Suite, discover, json_report, junit_xml, run_ok, total_line
from crossaudit.evals import cassettes
from crossaudit.kernel.errors import CrossAuditError, InvalidInputError, NotFoundError, PolicyValidationError
from crossaudit.kernel.files import write_private
from crossaudit.sdk.cases import CaseResult, CaseStatus, judge_case

NO_CASES = "no test cases (add test_cases to the policy or pass --input cases.json)"


def register(psub: argparse._SubParsersAction) -> None:
    t = psub.add_parser(
        "test",
        help="run policies' test_cases (files and directories), here or against a server",
        description="Run the test_cases of policy files (directories: every *.yaml/*.yml below them). "
        "Exit 0 when every case passes, 1 when a case fails or errors or a policy cannot load, 2 on usage errors.",
    )
    t.add_argument("files", nargs="*", metavar="PATH", help="policy files and directories")
    t.add_argument("--input", metavar="CASES.json", help="extra test cases (same shape as test_cases; one policy)")
    t.add_argument("-v", "--verbose", action="store_true", help="explain passing cases too")
    t.add_argument("--json", action="store_true", help="print a machine-readable report")
    t.add_argument("--junit", metavar="FILE", help="write a JUnit XML report to FILE")
    cassettes.add_cassette_arguments(t)
    connect.add_target_options(t)
    t.set_defaults(func=cmd_test)


# --- running ------------------------------------------------------------------------------


def _load(pf: PolicyFile, extra: list[Any], suite: Suite) -> Any:
    """The policy (for its name and cases), or None with ``suite`` saying why it will not run."""
    from orchestrator.policy import load_policy_file

    try:
        policy = load_policy_file(pf.path)
    except PolicyValidationError as e:
        suite.error = "\n".join(str(i) for i in e.issues) or str(e)
        return None
    except CrossAuditError as e:
        suite.error = e.message
        return None
    suite.policy = policy.name
    if not policy.test_cases and not extra:
        if pf.explicit:
            suite.error = NO_CASES
        else:
            suite.skipped = "no test cases"
        return None
    return policy


def run_local(pf: PolicyFile, extra: list[Any], args: argparse.Namespace) -> Suite:
    from crossaudit.sdk.tester import PolicyTester

    suite = Suite(file=str(pf.path))
    t0 = time.monotonic()
    if _load(pf, extra, suite) is None:
        return suite
    try:
        with progress.build_progress(quiet=args.json, hold_s=SLOW_PREPARE_S, label="preparing") as update:
            tester = PolicyTester(pf.path, sandbox=connect.local_sandbox(args), timeout=args.timeout, progress=update)
    except PolicyValidationError as e:  # e.g. a builtin's model is missing here
        suite.error = "\n".join(str(i) for i in e.issues) or str(e)
        return suite
    except CrossAuditError as e:
        suite.error = e.message
        return suite
    with tester:
        suite.where = f"local ({tester.sandbox_name} sandbox)"
        differ = tester.local_differences
        suite.warnings += [f"local results may differ from the server's: {n}" for n in differ.values()]
        suite.warnings += [
            f"evaluator {name!r} could not be prepared: {why}"
            for name, why in tester.preparation_errors.items()
            if name not in differ
        ]
        runs = tester.repeat_cases([*tester.policy.test_cases, *extra], cassettes.repeat_count(args))
        suite.cases, suite.repeat = _merge_runs(runs)
    suite.duration_s = time.monotonic() - t0
    return suite


def _merge_runs(runs: list[list[CaseResult]]) -> tuple[list[CaseResult], cassettes.RepeatReport | None]:
    """One result per case from N runs (``--repeat``): the first run's when every run passed,
    else the first that did not, its ``actual`` saying how many passed; and the repeat report."""
    if len(runs) == 1:
        return runs[0], None
    report = cassettes.RepeatReport(len(runs))
    for run in runs:
        for c in run:
            outcome = (c.status or CaseStatus.FAIL).value
            rules = {} if c.decision is None else {r.rule: r.status.value for r in c.decision.rules}
            report.add(c.name, outcome, rules)
    merged = []
    for i, first in enumerate(runs[0]):
        results = [run[i] for run in runs]
        passed = sum(c.status is CaseStatus.PASS for c in results)
        shown = next((c for c in results if c.status is not CaseStatus.PASS), first)
        merged.append(dataclasses.replace(shown, actual=f"{shown.actual} [passed {passed} of {len(runs)} runs]"))
    return merged, report


def _check_cassette(files: list[PolicyFile], cassette: cassettes.Cassette | None) -> None:
    """Up front: each policy that loads is known to a recording, or has a cassette to replay
    (one that does not load is reported by its suite)."""
    if cassette is None:
        return
    from orchestrator.policy import load_policy_file

    for pf in files:
        try:
            policy = load_policy_file(pf.path)
        except CrossAuditError:
            continue
        cassettes.check_policy(cassette, policy)


def _deployed_differs(client: Any, pf: PolicyFile, name: str, environment: str) -> str | None:
    """A warning when the deployed version is not this file's content (the cases test what runs)."""
    from crossaudit.sdk.sources import policy_upload

    info = client.get_policy(name, environment=environment)
    try:
        text, _, _ = policy_upload(pf.path, None)
    except CrossAuditError:
        return None  # a file it names cannot be read: deploy would say so
    if hashlib.sha256(text.encode()).hexdigest() == info.version.digest:
        return None
    return (
        f"{pf.path} differs from the deployed {name!r} (revision {info.version.version} in {environment}): "
        "the cases run against the deployed version"
    )


def run_remote(pf: PolicyFile, extra: list[Any], args: argparse.Namespace, client: Any) -> Suite:
    address = connect.server_address(args)
    suite = Suite(file=str(pf.path), where=f"server {address} ({args.environment})")
    t0 = time.monotonic()
    policy = _load(pf, extra, suite)
    if policy is None:
        return suite
    try:
        warning = _deployed_differs(client, pf, policy.name, args.environment)
    except NotFoundError as exc:  # the server's text names the environments the policy is in
        suite.error = f"{exc.message} (server {address})"
        return suite
    if warning:
        suite.warnings.append(warning)
    for case in [*policy.test_cases, *extra]:
        c0 = time.monotonic()
        try:
            d = client.evaluate(
                policy.name,
                case.input.prompt,
                case.input.response,
                case.input.context,
                environment=args.environment,
                timeout=args.timeout,
                stage=case.input.stage or "",
            )
        except CrossAuditError as e:  # refused or failed: this case could not be evaluated
            suite.cases.append(judge_case(case, None, e.message, duration_s=time.monotonic() - c0))
            continue
        suite.cases.append(judge_case(case, d, duration_s=time.monotonic() - c0))
    suite.duration_s = time.monotonic() - t0
    return suite


# --- output -------------------------------------------------------------------------------


def print_text(suites: list[Suite], verbose: bool) -> None:
    out = render.console()
    for s in suites:
        head = f"{s.file}: {s.policy}" if s.policy else s.file
        if s.skipped is not None:
            out.print(Text(render.printable(f"{head}: skipped ({s.skipped})")))
            continue
        out.print(Text(render.printable(f"{head}" + (f" [{s.where}]" if s.where else ""))))
        if s.error is not None:
            out.print(Text(render.printable("  ERROR " + s.error).replace("\n", "\n        ")), soft_wrap=True)
        shown = []  # rows of the tables printed: their long errors follow once, after the cases
        for c in s.cases:
            out.print(Text("  " + render.printable(c.line())), soft_wrap=True)  # one line per case, for grep
            if (c.status is not CaseStatus.PASS or verbose) and c.decision is not None:
                shown += c.rows()
                out.print(Padding(render.rules_table(c.rows()), (0, 0, 0, 4), expand=False))
        render.print_error_details(render.error_details(shown), out, indent="  ")
        if s.repeat is not None:
            for line in s.repeat.lines():
                out.print(Text("  " + render.printable(line)), soft_wrap=True)
        if s.cases:
            out.print(Text(f"  {s.tally().line()}"))
    if len(suites) > 1:
        out.print(Text(total_line(suites)))


def _write_junit(path: str, data: bytes) -> None:
    try:
        write_private(path, data)  # 0600 like every report: case names, rules and reasons
    except InvalidInputError as e:
        raise InvalidInputError(f"--junit: {e.message}") from None


def cmd_test(args: argparse.Namespace) -> int:
    from crossaudit.sdk.tester import load_cases_file

    spare = connect.reclaim_positional(args)
    if spare is not None:
        args.files.append(spare)
    if not args.files:
        return connect.usage_error("give policy files or directories to test")
    problem = connect.check_target(args)
    if problem:
        return connect.usage_error(problem)
    if args.server is not None and (args.record or args.replay or cassettes.repeat_count(args) > 1):
        return connect.usage_error("--record, --replay and --repeat run the policies here: drop --server")
    files = discover(args.files)
    if args.input and len(files) != 1:
        return connect.usage_error(f"--input applies to one policy file; {len(files)} were given")
    extra = load_cases_file(args.input) if args.input else []
    cassette = None
    if args.server is None:
        where = "local"
        with contextlib.ExitStack() as stack:
            try:
                cassette = stack.enter_context(cassettes.cassette_from_args(args))
                _check_cassette(files, cassette)
            except InvalidInputError as e:  # no such directory, an unreadable cassette, another version's
                print(f"error: {render.printable(e.message)}", file=sys.stderr)
                return EXIT_USAGE
            suites = [run_local(pf, extra, args) for pf in files]
    else:
        where = f"server {connect.server_address(args)} ({args.environment})"
        with connect.client(args) as client:
            suites = [run_remote(pf, extra, args, client) for pf in files]
    for s in suites:
        for w in s.warnings:
            print(f"warning: {render.printable(w)}", file=sys.stderr)
    if args.junit:
        _write_junit(args.junit, junit_xml(suites))
    report = json_report(suites, where=where)
    if cassette is not None:
        report["cassette"] = _cassette_report(cassette)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_text(suites, args.verbose)
        if not any(s.cases for s in suites) and not any(s.error for s in suites):
            print("no test cases found")
    missed = cassettes.miss_summary(cassette)
    if missed:
        print(f"error: {render.printable(missed)}", file=sys.stderr)
    elif cassette is not None and cassette.mode == "record":
        print(f"recorded {cassette.calls} LLM answer(s) into {cassette.directory}", file=sys.stderr)
    return EXIT_OK if run_ok(suites) and not missed else EXIT_FAIL


def _cassette_report(cassette: cassettes.Cassette) -> dict[str, Any]:
    return {
        "mode": cassette.mode,
        "directory": str(cassette.directory),
        "calls": cassette.calls,
        "unrecorded": cassette.miss_count,
        "unrecorded_requests": [{"evaluator": m.evaluator, "digest": m.digest} for m in cassette.misses],
    }
