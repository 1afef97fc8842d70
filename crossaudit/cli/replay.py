"""``crossaudit policy replay CANDIDATE.yaml --against NAME``: what a candidate policy would have
decided on recorded traffic (docs/replay.md), as a summary, ``--json`` or a self-contained
``--html`` report.

Exit codes: 0 done (flips within ``--fail-on-flips``, or not asked), 1 more flips than
``--fail-on-flips``, or a gate over a replay that replayed nothing (unless ``--allow-empty``), or a
failure on the server's side; 2 bad input: arguments, an invalid candidate (its located issues
printed), a policy this tenant does not have. A gate that checked nothing must not pass: a CI job
whose retention was never turned on, or whose range holds no decision, would go green for ever.
``--rerun-llm``
first asks the server what calling the changed LLM judges again would cost, then for a
confirmation (``--yes`` answers it: needed when stdin is not a terminal).
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from crossaudit.api.limits import DEFAULT_ENVIRONMENT
from crossaudit.api.replayreport import ReplayProgress, ReplayReport
from crossaudit.cli import progress
from crossaudit.cli.common import EXIT_FAIL, EXIT_OK, EXIT_USAGE, parse_when
from crossaudit.cli.render import printable
from crossaudit.kernel.errors import InvalidInputError, NotFoundError, PolicyValidationError
from crossaudit.kernel.files import write_private
from crossaudit.kernel.htmlreport import escape, page, png_img

PLOT_RULES = 20  # the plot shows the rules with the most flips, at most this many
TABLE_SAMPLES = 5  # sample ids a human summary prints per category (all of them in --json/--html)


def register(policy_subparsers: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    r = policy_subparsers.add_parser(
        "replay",
        parents=[common],
        help="what a candidate policy would have decided on recorded, retained traffic",
        description=(
            "Re-evaluate the retained decisions of a deployed policy under a candidate file and report what "
            "changes: pass->fail, fail->pass, action changes, per-rule flips and score shifts (docs/replay.md)."
        ),
    )
    r.add_argument("file", metavar="CANDIDATE", help="the candidate policy file (code inlined as deploy does)")
    r.add_argument("--against", required=True, metavar="NAME", help="the deployed policy whose decisions replay")
    r.add_argument("--environment", "-e", default=DEFAULT_ENVIRONMENT)
    r.add_argument("--since", default="7d", metavar="WHEN", help="a duration back from now (7d, 12h) or ISO time")
    r.add_argument("--until", default=None, metavar="WHEN", help="default: now; a duration back or ISO time")
    r.add_argument("--limit", type=int, default=0, metavar="N", help="records read at most (default: server cap)")
    r.add_argument("--samples", type=int, default=0, metavar="N", help="sample decision ids per category")
    r.add_argument("--html", default=None, metavar="FILE", help="write a self-contained HTML report")
    r.add_argument(
        "--fail-on-flips",
        type=int,
        default=None,
        metavar="N",
        help="exit 1 when more than N flip, or when nothing was replayed (a gate that checked nothing fails)",
    )
    r.add_argument(
        "--allow-empty",
        action="store_true",
        help="let a gate (--fail-on-flips) pass when no decision was replayed",
    )
    r.add_argument("--rerun-llm", action="store_true", help="call changed LLM judges again (estimated cost first)")
    r.add_argument("--yes", action="store_true", help="confirm --rerun-llm's cost without asking")
    r.set_defaults(func=cmd_policy_replay)


def cmd_policy_replay(args: argparse.Namespace) -> int:
    try:
        options = _options(args)
        return _run(args, options)
    except (PolicyValidationError, InvalidInputError, NotFoundError) as e:  # bad input: exit 2
        print(f"error: {e}" if isinstance(e, PolicyValidationError) else f"error: {e.message}", file=sys.stderr)
        return EXIT_USAGE


def _options(args: argparse.Namespace) -> Any:
    from crossaudit.sdk.client import ReplayOptions

    if args.json and args.html:
        raise InvalidInputError("--json and --html exclude each other")
    if args.limit < 0 or args.samples < 0:
        raise InvalidInputError("--limit and --samples must not be negative")
    if args.fail_on_flips is not None and args.fail_on_flips < 0:
        raise InvalidInputError("--fail-on-flips must not be negative")
    if args.yes and not args.rerun_llm:
        raise InvalidInputError("--yes confirms --rerun-llm's cost: give --rerun-llm too")
    if args.allow_empty and not gated(args):
        raise InvalidInputError("--allow-empty lets a gate pass on an empty replay: give --fail-on-flips N too")
    if not Path(args.file).is_file():
        raise InvalidInputError(f"candidate policy file {args.file} not found")
    now = time.time()
    since, until = parse_when(args.since, now, "since"), parse_when(args.until, now, "until")
    return ReplayOptions(environment=args.environment, since=since, until=until, limit=args.limit, samples=args.samples)


def _run(args: argparse.Namespace, options: Any) -> int:
    import dataclasses

    from crossaudit.cli.connect import client

    with client(args) as c:
        if args.rerun_llm:
            estimate = c.replay_policy(Path(args.file), args.against, dataclasses.replace(options, estimate_only=True))
            if not _confirmed(args, estimate):
                print("not replayed: the LLM calls were not confirmed", file=sys.stderr)
                return EXIT_FAIL
            options = dataclasses.replace(options, rerun_llm=True)
        with _progress(quiet=args.json) as update:
            report = c.replay_policy(Path(args.file), args.against, options, progress=update, timeout=args.timeout)
    failure = gate_failure(report, args.fail_on_flips, allow_empty=args.allow_empty)
    if args.json:
        print(json.dumps(report.to_json() | {"gate": gate_json(args, failure)}, indent=2))
    else:
        print_summary(report)
    if args.html:
        write_private(args.html, html_report(report))  # 0600 like every report: it carries policy details
        print(f"wrote {args.html}")
    if failure is not None:
        print(f"gate failed: {failure}", file=sys.stderr)
        return EXIT_FAIL
    return EXIT_OK


def gated(args: argparse.Namespace) -> bool:
    """True when an option makes this replay a gate (its exit status judges the candidate)."""
    return args.fail_on_flips is not None


def gate_failure(report: ReplayReport, fail_on_flips: int | None, *, allow_empty: bool = False) -> str | None:
    """Why the gate fails, or None when it passes (or there is no gate). A gate over a replay that
    replayed nothing has checked nothing, and fails unless ``allow_empty`` says that is expected."""
    if fail_on_flips is None:
        return None
    if report.replayed == 0 and not allow_empty:
        reasons = ", ".join(f"{printable(k)} {b.count}" for k, b in sorted(report.not_replayable.items()))
        why = f" (not replayable: {reasons})" if reasons else ""
        return (
            f"nothing was replayed: {report.read} record(s) read, 0 replayed{why}, so --fail-on-flips "
            "checked nothing; turn retention on (docs/retention.md) or widen --since, or pass --allow-empty "
            "if an empty replay may pass"
        )
    if report.flips > fail_on_flips:
        return f"{report.flips} decision(s) flipped, more than --fail-on-flips {fail_on_flips}"
    return None


def gate_json(args: argparse.Namespace, failure: str | None) -> dict[str, Any] | None:
    """The gate's verdict in ``--json`` (null without a gate): what was asked and why it failed."""
    if not gated(args):
        return None
    return {
        "fail_on_flips": args.fail_on_flips,
        "allow_empty": args.allow_empty,
        "passed": failure is None,
        "failure": failure,
    }


def _confirmed(args: argparse.Namespace, report: ReplayReport) -> bool:
    e = report.estimate
    if e is None or e.calls == 0:
        print("no LLM judge needs calling again: nothing to pay for", file=sys.stderr)
        return True
    unpriced = f"; not priced: {', '.join(map(printable, e.unpriced_models))}" if e.unpriced_models else ""
    print(
        f"--rerun-llm would make up to {e.calls} LLM call(s) for {e.decisions} decision(s): about "
        f"{e.prompt_tokens} prompt + {e.completion_tokens} completion tokens, at most ${e.cost_usd:.4f}{unpriced}",
        file=sys.stderr,
    )
    if args.yes:
        return True
    if not sys.stdin.isatty():
        print("confirm with --yes (stdin is not a terminal)", file=sys.stderr)
        return False
    answer = input("call them? [y/N] ").strip().lower()
    return answer in ("y", "yes")


@contextmanager
def _progress(quiet: bool) -> Iterator[Callable[[ReplayProgress], None] | None]:
    """A rich progress bar on a terminal (records read of the limit), nothing elsewhere."""
    if quiet or not sys.stderr.isatty():
        yield None
        return
    with progress.stderr_bar("replaying", counted=True, detail=True) as update:
        yield lambda p: update(total=p.limit, completed=p.read, description=f"{p.not_replayable} not replayable")


# --- the human summary -----------------------------------------------------------------------


def _ids(samples: list[str]) -> str:
    shown = ", ".join(printable(s) for s in samples[:TABLE_SAMPLES])
    return f" (e.g. {shown})" if shown else ""


def summary_lines(r: ReplayReport) -> list[str]:
    """The summary as lines of plain text (every name from the server printed, never interpreted)."""
    out = [
        f"replayed {printable(r.candidate)!r} against {printable(r.policy)!r} ({printable(r.environment)}): "
        f"{r.read} record(s) read, {r.replayed} replayed, {r.not_replayable_count} not replayable"
        + (" (limit reached: more in the range)" if r.more else ""),
        f"  unchanged      {r.unchanged}",
        f"  flipped        {r.flips}{_ids(r.changed.samples)}",
        f"  pass -> fail   {r.pass_to_fail.count}{_ids(r.pass_to_fail.samples)}",
        f"  fail -> pass   {r.fail_to_pass.count}{_ids(r.fail_to_pass.samples)}",
    ]
    for pair, b in sorted(r.action_changes.items()):
        out.append(f"  action {printable(pair):<18} {b.count}{_ids(b.samples)}")
    if r.not_replayable:
        out.append("not replayable:")
        out += [f"  {printable(k):<24} {b.count}{_ids(b.samples)}" for k, b in sorted(r.not_replayable.items())]
    changed_rules = [
        d
        for d in r.sorted_rules()
        if d.pass_to_fail.count or d.fail_to_pass.count or d.score_shifts.count or d.change != "same"
    ]
    if changed_rules:
        out.append("rules:")
        for d in changed_rules:
            tag = f" [{d.change}]" if d.change != "same" else ""
            out.append(
                f"  {printable(d.rule)}{tag}: pass->fail {d.pass_to_fail.count}, fail->pass {d.fail_to_pass.count}, "
                f"score shifts {d.score_shifts.count} (mean {d.mean_shift:+.3f}, max {d.max_shift:.3f})"
            )
    if r.evaluator_runs:
        out.append(f"evaluator calls made: {r.evaluator_runs} (changed evaluators ran again)")
    if r.hint:
        out.append(f"hint: {printable(r.hint)}")
    return out


def print_summary(r: ReplayReport) -> None:
    print("\n".join(summary_lines(r)))


# --- the HTML report -------------------------------------------------------------------------


def _plot_png(r: ReplayReport) -> bytes | None:
    """Per-rule pass->fail and fail->pass as a horizontal bar chart (PNG), None with no rule."""
    rules = r.sorted_rules()[:PLOT_RULES]
    if not rules:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot as plt
    except ImportError:
        raise InvalidInputError("--html draws its plot with matplotlib: pip install 'crossaudit[report]'") from None
    names = [printable(d.rule if len(d.rule) <= 40 else d.rule[:39] + "…") for d in rules][::-1]
    p2f = [d.pass_to_fail.count for d in rules][::-1]
    f2p = [d.fail_to_pass.count for d in rules][::-1]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(rules) + 1.5))
    try:
        ys = range(len(rules))
        ax.barh([y + 0.2 for y in ys], p2f, height=0.4, label="pass → fail", color="#c0392b")
        ax.barh([y - 0.2 for y in ys], f2p, height=0.4, label="fail → pass", color="#27ae60")
        ax.set_yticks(list(ys))
        ax.set_yticklabels(names)  # matplotlib draws text as glyphs: nothing in it is interpreted
        ax.set_xlabel("decisions")
        ax.set_title("per-rule flips under the candidate")
        ax.legend(loc="lower right")
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=96)
        return buf.getvalue()
    finally:
        plt.close(fig)


def _samples_cell(samples: list[str]) -> str:
    return "<br>".join(f"<code>{escape(s)}</code>" for s in samples)


def html_report(r: ReplayReport) -> str:
    """A self-contained page (inline CSS, the plot as a data: URI, no script): every value from
    the server escaped, since rule names and ids are the tenant's text."""
    rows = [
        ("records read", r.read, []),
        ("replayed", r.replayed, []),
        ("unchanged", r.unchanged, []),
        ("flipped (passed or action differs)", r.flips, r.changed.samples),
        ("pass → fail", r.pass_to_fail.count, r.pass_to_fail.samples),
        ("fail → pass", r.fail_to_pass.count, r.fail_to_pass.samples),
        *((f"action {pair}", b.count, b.samples) for pair, b in sorted(r.action_changes.items())),
        *((f"not replayable: {k}", b.count, b.samples) for k, b in sorted(r.not_replayable.items())),
    ]
    summary = "".join(
        f"<tr><th>{escape(k)}</th><td>{escape(v)}</td><td>{_samples_cell(s)}</td></tr>" for k, v, s in rows
    )
    rules = "".join(
        f"<tr><td>{escape(d.rule)}</td><td>{escape(d.change)}</td><td>{d.compared}</td><td>{d.pass_to_fail.count}</td>"
        f"<td>{d.fail_to_pass.count}</td><td>{d.score_shifts.count}</td><td>{d.mean_shift:+.4f}</td>"
        f"<td>{d.max_shift:.4f}</td><td>{_samples_cell(d.pass_to_fail.samples + d.fail_to_pass.samples)}</td></tr>"
        for d in r.sorted_rules()
    )
    png = _plot_png(r)
    plot = png_img(png, "per-rule flips") if png else ""
    window = " to ".join(
        escape(dt.datetime.fromtimestamp(t, dt.UTC).isoformat(timespec="seconds")) if t is not None else "…"
        for t in (r.since, r.until)
    )
    hint = f"<p class=note>{escape(r.hint)}</p>" if r.hint else ""
    more = "<p class=note>The limit was reached: the range holds more records.</p>" if r.more else ""
    body = f"""<h1>Replay of {escape(r.candidate)} against {escape(r.policy)}</h1>
<p>Environment <b>{escape(r.environment)}</b>, decisions from {window}.
{r.evaluator_runs} evaluator call(s) made; everything else reused the recorded verdicts.</p>
{hint}{more}
<h2>Summary</h2>
<table><tr><th>what</th><th>decisions</th><th>samples</th></tr>{summary}</table>
<h2>Per rule</h2>
<table><tr><th>rule</th><th>in the candidate</th><th>compared</th><th>pass → fail</th><th>fail → pass</th>
<th>score shifts</th><th>mean shift</th><th>max shift</th><th>samples</th></tr>{rules}</table>
{plot}
"""
    return page(f"Replay of {r.candidate} against {r.policy}", body)
