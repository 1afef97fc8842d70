"""How the CLI shows a decision: a ``rich`` table of its rules and one decision line.

Shared by ``crossaudit evaluate`` and ``crossaudit policy test`` (which prints the table under a
case that did not pass), so a rule reads the same in both. Each evaluator error is shown once:
its first line in the table (the reason column leaves it out), and a message with more lines
(a missing model's how-to-fix and the places tried) in full once under the table, however many
rules or cases it touched.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from typing import TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

from crossaudit.kernel.results import Decision
from crossaudit.sdk.cases import RuleRow, errored_rules, rule_rows, summary

# Piped output (CI logs, files) has no terminal width: this many columns keep a reason on a line
# or two instead of wrapping at rich's default of 80.
PIPE_WIDTH = 160
# C0 controls but tab and newline, DEL, C1 controls: an evaluator's error or a response may carry
# terminal escape sequences, which must not reach the reader's terminal as such.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
IN_FULL_BELOW = " (in full below)"  # a table cell whose error has more lines than it shows
_STATUS_STYLE = {"pass": "green", "fail": "red", "error": "bold red", "timeout": "bold red", "skipped": "dim"}


def printable(text: str) -> str:
    """``text`` with control characters shown as escapes (``\\x1b``), never interpreted."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def console(file: TextIO | None = None) -> Console:
    out = file or sys.stdout
    tty = out.isatty()
    # soft_wrap off, no highlighting: the table decides wrapping, and numbers are not recoloured
    return Console(file=out, width=None if tty else PIPE_WIDTH, highlight=False, soft_wrap=False)


def _num(value: float | None) -> str:
    # 6 decimals: a score just under its threshold must not print as equal to it
    return "-" if value is None else str(round(value, 6))


def rules_table(rows: Iterable[RuleRow], *, title: str | None = None) -> Table:
    """Rule | Status | Score | Threshold | Action | Reason | Evaluator errors."""
    table = Table(title=title, title_justify="left", show_lines=False, expand=False)
    table.add_column("Rule", overflow="fold")
    table.add_column("Status")
    table.add_column("Score", justify="right")
    table.add_column("Threshold", justify="right")
    table.add_column("Action")
    table.add_column("Reason", overflow="fold", ratio=2)
    table.add_column("Evaluator errors", overflow="fold", ratio=2)
    for r in rows:
        table.add_row(
            Text(printable(r.rule)),
            Text(r.status, style=_STATUS_STYLE.get(r.status, "")),
            _num(r.score),
            _num(r.threshold),
            Text(r.action or "-"),
            Text(printable(r.reason) or "-"),
            Text(printable("\n".join(map(_cell, r.errors))) or "-", style="red" if r.errors else ""),
        )
    return table


def _cell(error: str) -> str:
    return summary(error) + (IN_FULL_BELOW if "\n" in error else "")


def error_details(rows: Iterable[RuleRow]) -> list[str]:
    """The evaluator errors the table shows cut (several lines), each once, in order. Once per
    first line: a later call's text may differ only in its details (a failed download that is
    not retried says so), and the how-to-fix is worth reading once."""
    seen: dict[str, str] = {}
    for r in rows:
        for e in r.errors:
            if "\n" in e:
                seen.setdefault(summary(e), e)
    return list(seen.values())


def print_error_details(errors: Iterable[str], out: Console, indent: str = "") -> None:
    """Each error in full: its first line, then the rest indented under it."""
    for text in errors:
        first, _, rest = text.partition("\n")
        out.print(Text(indent + printable(first)), soft_wrap=True)
        for line in rest.splitlines():
            out.print(Text(f"{indent}  {printable(line)}"), soft_wrap=True)


def decision_line(decision: Decision) -> str:
    """``PASSED`` / ``NOT PASSED``, the action, the decision id, errored rules and where it was decided."""
    verdict = "PASSED" if decision.passed else "NOT PASSED"
    parts = [f"{verdict}  action: {decision.action.value}", f"decision: {decision.decision_id or '-'}"]
    where = getattr(decision, "environment", "")
    if where:  # a RemoteDecision: the deployed revision that answered
        parts.append(f"policy: {decision.policy} r{getattr(decision, 'policy_revision', 0)} ({where})")
    else:
        parts.append(f"policy: {decision.policy} v{decision.policy_version}")
    errored = errored_rules(decision)
    if errored:
        parts.append(f"errored rules: {', '.join(errored)}")
    reviews = getattr(decision, "review_ids", None)
    if reviews:
        parts.append(f"reviews: {', '.join(reviews)}")
    return "  ".join(parts)


def print_decision(decision: Decision, out: Console) -> None:
    rows = rule_rows(decision)
    out.print(rules_table(rows))
    out.print(Text(printable(decision_line(decision))), soft_wrap=True)  # one line, for grep (ids are not split)
    if decision.modified_response is not None:
        out.print(Text("modified response: ") + Text(printable(decision.modified_response)), soft_wrap=True)
    print_error_details(error_details(rows), out)
