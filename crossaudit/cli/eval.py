"""``crossaudit eval POLICY DATASET``: how good each rule is on a labelled dataset (docs/evals.md).

Per rule and for the decision: precision, recall, F1 and accuracy with 95% bootstrap intervals,
the confusion matrix, p50/p95 latency (of rows evaluated one at a time), LLM cost; for scored
rules a threshold sweep (PR and ROC curves with ``--plots DIR`` or ``--html``) and with
``--target`` a suggested threshold; the rows each rule got wrong, as ``test_cases`` to paste.
``--fail-under rule=metric:value`` makes it a CI gate. ``crossaudit eval --compare A.yaml B.yaml
DATASET`` puts two policies side by side with McNemar's paired test per rule.

Exit codes: 0 done (every gate holds); 1 a gate failed, or some rows could not be evaluated
(the report names them); 2 bad input (arguments, the dataset's problems listed with their lines,
an invalid policy). A report file is written whole or not at all.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from crossaudit.cli import connect, progress, render
from crossaudit.cli.common import EXIT_FAIL, EXIT_OK, EXIT_USAGE, parse_when
from crossaudit.cli.progress import SLOW_PREPARE_S
from crossaudit.evals.cassettes import (
    add_cassette_arguments,
    cassette_from_args,
    check_policy,
    miss_summary,
    repeat_count,
)
from crossaudit.kernel.errors import InvalidInputError, NotFoundError, PolicyValidationError
from crossaudit.kernel.files import write_private

HUMAN_WRONG_ROWS = 5  # wrong rows the human table lists per subject (all of them in --json/--html)
HUMAN_TEST_CASES = 20  # test_cases the human output prints (all of them in --json/--html)
PROGRESS_STEPS = 4  # off a terminal: a progress line at each quarter


def register(sub: argparse._SubParsersAction) -> None:
    e = sub.add_parser(
        "eval",
        help="measure a policy on a labelled dataset (precision, recall, F1, thresholds, CI gates)",
        description="Evaluate every row of a labelled JSONL/CSV dataset (policies/dataset.schema.json) and "
        "measure each rule and the decision. Exit 0 done, 1 a --fail-under gate failed or rows could not be "
        "evaluated, 2 bad input.",
    )
    e.add_argument("inputs", nargs="+", metavar="POLICY DATASET", help="POLICY DATASET, or with --compare A B DATASET")
    e.add_argument("--compare", action="store_true", help="compare two policies (A B DATASET) with McNemar's test")
    e.add_argument("--json", action="store_true", help="print the report as JSON")
    e.add_argument("--html", default=None, metavar="FILE", help="write a self-contained HTML report")
    e.add_argument("--plots", default=None, metavar="DIR", help="write each scored rule's PR and ROC curves (PNG)")
    e.add_argument(
        "--target", default=None, metavar="METRIC=X", help="suggest thresholds meeting precision=X or recall=X"
    )
    e.add_argument(
        "--fail-under",
        action="append",
        default=[],
        metavar="RULE=METRIC:VALUE",
        help="exit 1 unless RULE's METRIC (precision, recall, f1, accuracy) is defined and >= VALUE; "
        "RULE may be 'decision'; repeatable",
    )
    e.add_argument("--seed", type=int, default=0, metavar="N", help="bootstrap seed (default 0: reproducible)")
    e.add_argument(
        "--concurrency",
        type=int,
        default=None,
        metavar="N",
        help="requests in flight (default: the warm sandboxes per evaluator, 4; at most 256), after the first "
        "20 rows, which run one at a time to measure each rule's latency",
    )
    connect.add_target_options(e)
    e.add_argument(
        "--from-reviews",
        default=None,
        metavar="NAME",
        help="rows from production: the resolved reviews and feedback labels of deployed policy NAME (no DATASET)",
    )
    e.add_argument("--since", default="30d", metavar="WHEN", help="with --from-reviews: labels since (default 30d)")
    e.add_argument("--out", default=None, metavar="FILE", help="with --from-reviews: keep the rows as a dataset file")
    add_cassette_arguments(e)
    e.set_defaults(func=cmd_eval)


def cmd_eval(args: argparse.Namespace) -> int:
    try:
        _check_args(args)
        if args.compare:
            return _compare(args)
        return _eval(args)
    except (PolicyValidationError, InvalidInputError, NotFoundError) as err:  # bad input: exit 2
        message = str(err) if isinstance(err, PolicyValidationError) else err.message
        print(f"error: {render.printable(message)}", file=sys.stderr)
        return EXIT_USAGE


def _check_args(args: argparse.Namespace) -> None:
    spare = connect.reclaim_positional(args)  # `--server POLICY DATASET`: POLICY is not an address
    if spare is not None:
        args.inputs.insert(0, spare)
    if args.from_reviews and args.compare:
        raise InvalidInputError("--from-reviews does not apply to --compare")
    if args.out and not args.from_reviews:
        raise InvalidInputError("--out keeps the rows of --from-reviews")
    if repeat_count(args) > 1:
        raise InvalidInputError("--repeat applies to `crossaudit policy test` (an eval's rows are its repeats)")
    if (args.record or args.replay) and args.server is not None:
        raise InvalidInputError("--record and --replay apply to local runs (LLM calls made here), not --server")
    want = 3 if args.compare else 1 if args.from_reviews else 2
    if len(args.inputs) != want:
        shape = (
            "--compare A.yaml B.yaml DATASET"
            if args.compare
            else "POLICY --from-reviews NAME"
            if args.from_reviews
            else "POLICY DATASET"
        )
        raise InvalidInputError(f"give {shape} ({len(args.inputs)} argument(s) given)")
    problem = connect.check_target(args)
    if problem:
        raise InvalidInputError(problem)
    if args.compare:
        for flag, value in (
            ("--server", args.server is not None),
            ("--plots", args.plots),
            ("--target", args.target),
            ("--fail-under", args.fail_under),
        ):
            if value:
                raise InvalidInputError(f"{flag} does not apply to --compare")
    from crossaudit.evals.runner import DEFAULT_CONCURRENCY, MAX_CONCURRENCY

    if args.concurrency is None:
        args.concurrency = DEFAULT_CONCURRENCY
    if not 1 <= args.concurrency <= MAX_CONCURRENCY:
        raise InvalidInputError(f"--concurrency must be between 1 and {MAX_CONCURRENCY}")
    for path in args.inputs[:-1] if args.server is None else []:
        if not Path(path).is_file():
            raise InvalidInputError(f"policy file {path} not found (to use a deployed policy, add --server)")


# --- running ------------------------------------------------------------------------------------


@contextmanager
def _row_progress(quiet: bool) -> Iterator[Any]:
    """A bar of rows done on a terminal; off one, a line at each quarter; nothing when ``quiet``."""
    if quiet:
        yield None
        return
    if not sys.stderr.isatty():
        marks = [0]

        def lines(done: int, total: int) -> None:
            step = done * PROGRESS_STEPS // max(total, 1)
            if step > marks[0]:
                marks[0] = step
                print(f"evaluated {done}/{total} rows", file=sys.stderr, flush=True)

        yield lines
        return
    with progress.stderr_bar("evaluating", description="rows", counted=True) as update:
        yield lambda done, total: update(total=total, completed=done)


def _warn(message: str) -> None:
    print(f"warning: {render.printable(message)}", file=sys.stderr)


def _run_local(args: argparse.Namespace, policy_path: str, rows: Any = None, dataset: str = "") -> Any:
    from crossaudit.evals.dataset import load_dataset
    from crossaudit.evals.runner import LLMUsage, rule_names, run_local
    from crossaudit.sdk.tester import PolicyTester

    usage = LLMUsage()
    quiet = args.json
    with progress.build_progress(quiet=quiet, hold_s=SLOW_PREPARE_S, label="preparing") as update:
        tester = PolicyTester(
            policy_path, sandbox=connect.local_sandbox(args), timeout=args.timeout, progress=update, llm_usage=usage
        )
    with tester:
        if rows is None:
            rows = load_dataset(dataset, rule_names(tester.policy))
        else:
            from crossaudit.evals.dataset import check_rows

            check_rows(rows, rule_names(tester.policy), dataset)
        for note in tester.local_differences.values():
            _warn(f"local results may differ from the server's: {note}")
        for name, why in tester.preparation_errors.items():
            if name not in tester.local_differences:
                _warn(f"evaluator {name!r} could not be prepared: {why}")
        with _row_progress(quiet) as tick:
            return run_local(tester, rows, usage=usage, concurrency=args.concurrency, progress=tick)


def _run_remote(
    args: argparse.Namespace, policy_arg: str, dataset: str, check: Any = None, production: Any = None
) -> Any:
    from crossaudit.evals.dataset import load_dataset
    from crossaudit.evals.runner import rule_names, run_server
    from orchestrator.policy import load_policy, load_policy_file

    name = load_policy_file(policy_arg).name if Path(policy_arg).is_file() else policy_arg
    with connect.client(args) as c:
        info = c.get_policy(name, args.environment)
        policy = load_policy(info.content, f"{name} (deployed)")
        if check is not None:
            check(policy)  # the gates name its rules: refused before anything runs
        if production is None:
            rows = load_dataset(dataset, rule_names(policy))
        else:
            from crossaudit.evals.dataset import check_rows

            rows = production
            check_rows(rows, rule_names(policy), dataset)
        with _row_progress(args.json) as tick:
            return run_server(
                c,
                name,
                policy,
                rows,
                environment=args.environment,
                address=connect.server_address(args),
                timeout=args.timeout,
                concurrency=args.concurrency,
                progress=tick,
            )


def _matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise InvalidInputError("--html and --plots draw with matplotlib: pip install matplotlib") from None


def _production_rows(args: argparse.Namespace) -> list[Any]:
    """``--from-reviews NAME``: the labelled decisions of the deployed policy, as dataset rows."""
    import time as _time

    from crossaudit.evals.production import rows_from_reviews, write_jsonl

    since = parse_when(args.since, _time.time(), "since")
    with connect.client(args) as c:
        rows = rows_from_reviews(c, args.from_reviews, since, args.environment)
    if not rows:
        raise InvalidInputError(f"policy {args.from_reviews!r} has no labelled decisions since --since {args.since}")
    if args.out:
        write_jsonl(rows, args.out)
    return rows


def _eval(args: argparse.Namespace) -> int:
    from crossaudit.evals.report import DECISION, Gate, build_report, html_report
    from crossaudit.evals.sweep import Target, write_plots

    if args.from_reviews:
        args.inputs.append(args.out or f"labels of {args.from_reviews}")
    policy_arg, dataset = args.inputs
    target = Target.parse(args.target) if args.target else None
    if args.html or args.plots:
        _matplotlib()
    production = _production_rows(args) if args.from_reviews else None
    if production is None and not Path(dataset).is_file():
        raise InvalidInputError(f"dataset {dataset}: file not found")
    gates: list[Gate] = []

    def check(policy: Any) -> None:
        subjects = [DECISION, *[r.name for r in policy.rules if r.enabled]]
        gates[:] = [Gate.parse(g, subjects) for g in args.fail_under]

    if args.server is not None:
        run = _run_remote(args, policy_arg, dataset, check, production)
    else:
        from crossaudit.evals.dataset import check_rows, load_dataset
        from crossaudit.evals.runner import rule_names
        from orchestrator.policy import load_policy_file

        policy = load_policy_file(policy_arg)  # bad gates and datasets are refused before any sandbox starts
        check(policy)
        if production is None:
            rows = load_dataset(dataset, rule_names(policy))
        else:
            rows = production
            check_rows(rows, rule_names(policy), dataset)
        with cassette_from_args(args) as cassette:
            check_policy(cassette, policy)  # a replay without this version's cassette: refused up front
            run = _run_local(args, policy_arg, rows, dataset)
        summary = miss_summary(cassette)
        if summary:
            print(summary, file=sys.stderr)
    report = build_report(run, seed=args.seed, target=target)
    if args.plots:
        written = write_plots([s.sweep for s in report.subjects.values() if s.sweep is not None], Path(args.plots))
        if not args.json:
            print(f"wrote {len(written)} plot(s) to {args.plots}", file=sys.stderr)
    if args.html:
        write_private(args.html, html_report(report))
        if not args.json:
            print(f"wrote {args.html}", file=sys.stderr)
    failures = [why for g in gates if (why := g.failure(report)) is not None]
    if args.json:
        doc = report.to_json()
        doc["gates"] = [{"gate": t, "failure": g.failure(report)} for t, g in zip(args.fail_under, gates, strict=True)]
        print(json.dumps(doc, indent=2))
    else:
        print_report(report)
    for why in failures:
        print(f"gate failed: {render.printable(why)}", file=sys.stderr)
    if report.errors:
        print(f"error: {len(report.errors)} row(s) could not be evaluated (listed in the report)", file=sys.stderr)
    return EXIT_FAIL if failures or report.errors else EXIT_OK


def _compare(args: argparse.Namespace) -> int:
    from crossaudit.evals.dataset import load_dataset
    from crossaudit.evals.report import compare, compare_html

    a, b, dataset = args.inputs
    production = _production_rows(args) if args.from_reviews else None
    if production is None and not Path(dataset).is_file():
        raise InvalidInputError(f"dataset {dataset}: file not found")
    # Rows are read once, checked against the union of both policies' rules (each run checks its own).
    from orchestrator.policy import load_policy_file

    names = {r.name for p in (a, b) for r in load_policy_file(p).rules}
    rows = load_dataset(dataset, names)
    run_a = _run_local(args, a, [r for r in rows], dataset)
    run_b = _run_local(args, b, [r for r in rows], dataset)
    run_a.source, run_b.source = a, b  # the files as given: two versions often share a name and version
    result = compare(run_a, run_b, seed=args.seed)
    if args.html:
        write_private(args.html, compare_html(result))
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        print_comparison(result)
    errors = len(result.a.errors) + len(result.b.errors)
    if errors:
        print(f"error: {errors} evaluation(s) failed (listed in the report)", file=sys.stderr)
        return EXIT_FAIL
    return EXIT_OK


# --- the human report ---------------------------------------------------------------------------


def _n(v: float | None, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def print_report(r: Any) -> None:
    from rich.table import Table
    from rich.text import Text

    from crossaudit.evals.metrics import METRICS
    from crossaudit.evals.report import DECISION, cases_yaml

    out = render.console()
    p = render.printable
    out.print(
        Text(
            f"eval of {p(r.policy)} {p(r.version)}: {r.rows} row(s) in {r.wall_s:.2f}s "
            f"({r.rows_per_s:.0f} rows/s, {p(r.where)}); 95% bootstrap intervals, seed {r.seed}"
        )
    )
    t = Table(show_lines=False)
    t.add_column("subject", no_wrap=True, max_width=40)
    for col in ("labelled", "tp/fp/fn/tn", *METRICS, "p50 ms", "p95 ms", "LLM $"):
        t.add_column(col, no_wrap=col in METRICS)
    for name, s in r.subjects.items():
        c = s.confusion
        unj = f" ({s.unjudged} unjudged)" if s.unjudged else ""
        t.add_row(
            Text(p(name)),
            f"{s.labelled}{unj}",
            f"{c.tp}/{c.fp}/{c.fn}/{c.tn}",
            *(m.text() for m in s.metrics.values()),
            _n(s.latency_p50_ms, 1),
            _n(s.latency_p95_ms, 1),
            _n(s.cost_usd, 4),
        )
    out.print(t)
    out.print(Text(r.latency_text))
    d = r.subjects[DECISION]
    if d.action_labelled:
        out.print(Text(f"decision action right in {d.action_right}/{d.action_labelled} labelled row(s)"))
    for name, s in r.subjects.items():
        if s.sweep is not None:
            line = f"{p(name)}: threshold {s.sweep.current:g}, ROC AUC {_n(s.sweep.auc_roc)}"
            if s.suggestion is not None:
                g = s.suggestion
                line += (
                    f"; for {g.target} use threshold {g.threshold:.4f} (precision {_n(g.precision)}, "
                    f"recall {_n(g.recall)})"
                    if g.threshold is not None
                    else f"; {p(g.reason)}"
                )
            out.print(Text(line))
    for name, s in r.subjects.items():
        if s.wrong:
            shown = ", ".join(
                f"{p(w.row.id)} (line {w.row.line}: expected {w.expected}, got {w.got})"
                for w in s.wrong[:HUMAN_WRONG_ROWS]
            )
            more = f" and {len(s.wrong) - HUMAN_WRONG_ROWS} more" if len(s.wrong) > HUMAN_WRONG_ROWS else ""
            out.print(Text(f"{p(name)} got {len(s.wrong)} row(s) wrong: {shown}{more}"))
    for note in r.notes:
        out.print(Text(f"note: {p(note)}"))
    for rid, err in r.errors:
        out.print(Text(f"row {p(rid)} could not be evaluated: {p(err)}"))
    yaml_text = cases_yaml(r)
    if yaml_text:
        cases = yaml_text.split("\n- name: ")
        shown_yaml = "\n- name: ".join(cases[: HUMAN_TEST_CASES + 1])
        more = (
            f"# … {len(cases) - 1 - HUMAN_TEST_CASES} more in --json / --html\n"
            if len(cases) > HUMAN_TEST_CASES + 1
            else ""
        )
        out.print(Text("wrong rows as test_cases (paste into the policy):"))
        out.print(Text(p(shown_yaml.rstrip("\n")) + "\n" + more), end="")


def print_comparison(c: Any) -> None:
    from rich.table import Table
    from rich.text import Text

    from crossaudit.evals.metrics import METRICS

    out = render.console()
    p = render.printable
    out.print(Text(f"A = {p(c.a.label)}, B = {p(c.b.label)}: {c.a.rows} row(s)"))
    t = Table()
    t.add_column("subject")
    t.add_column("paired")
    for m in METRICS:
        t.add_column(f"{m} A → B (Δ)")
    t.add_column("McNemar p")
    t.add_column("verdict")
    for d in c.deltas:
        cells = [f"{d.a[m].text()} → {d.b[m].text()} ({_delta(d.delta(m))})" for m in METRICS]
        t.add_row(Text(p(d.subject)), str(d.paired), *cells, f"{d.test.p_value:.4g} ({d.test.method})", d.verdict())
    out.print(t)
    if c.only_a:
        out.print(Text(f"rules only in A: {', '.join(map(p, c.only_a))}"))
    if c.only_b:
        out.print(Text(f"rules only in B: {', '.join(map(p, c.only_b))}"))


def _delta(v: float | None) -> str:
    return "undefined" if v is None else f"{v:+.3f}"
