"""Build progress as step lines (crossaudit/cli/progress.py): what a pipe gets from an upload whose
dependency image is built, fed the messages the Docker sandbox sends in the order it sends them
(sandbox/docker/images.py, sandbox/deps.py: a phase line, then every pip and docker
output line at that phase's fraction)."""

from __future__ import annotations

import io

from crossaudit.cli.progress import StepLines

BUILD = [
    ("checking sandbox images", 0.0),
    ("downloading wheels for tabulate==0.9.0", 0.05),
    ("Collecting tabulate==0.9.0", 0.05),
    ("  Downloading tabulate-0.9.0-py3-none-any.whl (35 kB)", 0.05),
    ("Saved ./tabulate-0.9.0-py3-none-any.whl", 0.05),
    ("installing wheels into the dependency layer", 0.2),
    ("Processing ./tabulate-0.9.0-py3-none-any.whl", 0.2),
    ("dependencies resolved: 1 wheels", 0.3),
    ("building dependency image crossaudit/deps:0123456789abcdef", 0.5),
    ("Step 1/2 : FROM crossaudit/runner:9399d53e6037c174", 0.6),
    ("---> 55bdfc91e555", 0.6),
    ("Step 2/2 : COPY site/ /opt/crossaudit/site/", 0.6),
    ("---> 75a473ac256e", 0.6),
    ("Successfully built 75a473ac256e", 0.6),
    ("Successfully tagged crossaudit/deps:0123456789abcdef", 0.6),
    ("dependency image crossaudit/deps:0123456789abcdef ready", 0.9),
    ("starting warm sandbox", 0.92),
    ("evaluator ready", 1.0),
]


def test_one_line_per_step_not_per_build_output_line() -> None:
    out = io.StringIO()
    ticks = iter(float(t) for t in range(100))
    steps = StepLines(out, clock=lambda: next(ticks))
    for message, fraction in BUILD:
        steps(message, fraction)
    assert out.getvalue().splitlines() == [
        "[   1.0s   0%] checking sandbox images",
        "[   2.0s   5%] downloading wheels for tabulate==0.9.0",
        "[   3.0s  20%] installing wheels into the dependency layer",
        "[   4.0s  30%] dependencies resolved: 1 wheels",
        "[   5.0s  50%] building dependency image crossaudit/deps:0123456789abcdef",
        "[   6.0s  60%] Step 1/2 : FROM crossaudit/runner:9399d53e6037c174",
        "[   7.0s  60%] Step 2/2 : COPY site/ /opt/crossaudit/site/",
        "[   8.0s  90%] dependency image crossaudit/deps:0123456789abcdef ready",
        "[   9.0s  92%] starting warm sandbox",
        "[  10.0s 100%] evaluator ready",
    ]


def test_a_step_line_is_one_short_line_and_never_drives_the_terminal() -> None:
    out = io.StringIO()
    steps = StepLines(out, clock=lambda: 0.0)
    steps("evil \x1b]0;title\x07\nsecond line " + "x" * 500, 0.5)
    steps("", 0.7)  # nothing to say: no line
    (line,) = out.getvalue().splitlines()
    assert "\x1b" not in line and "\\x1b" in line and len(line) < 200


def test_held_steps_appear_only_when_the_preparation_is_slow() -> None:
    fast, slow = io.StringIO(), io.StringIO()
    now = [0.0]
    quick = StepLines(fast, clock=lambda: now[0], hold_s=2.0)
    quick("checking sandbox images", 0.0)
    now[0] = 0.3
    quick("evaluator ready", 1.0)
    assert fast.getvalue() == ""  # images already built: evaluate's output stays the table alone
    now[0] = 0.0
    building = StepLines(slow, clock=lambda: now[0], hold_s=2.0)
    building("checking sandbox images", 0.0)
    now[0] = 5.0
    building("building dependency image crossaudit/deps:0123", 0.5)  # the held step comes first
    now[0] = 9.0
    building("evaluator ready", 1.0)
    assert slow.getvalue().splitlines() == [
        "[   0.0s   0%] checking sandbox images",
        "[   5.0s  50%] building dependency image crossaudit/deps:0123",
        "[   9.0s 100%] evaluator ready",
    ]


def test_policy_tester_reports_the_preparation_of_each_custom_evaluator() -> None:
    from crossaudit import PolicyTester

    text = """\
name: p
description: two custom evaluators the tester prepares at construction
version: "1"
evaluators:
  - {name: a, type: custom, config: {code: "def evaluate(p, r, c): return {'score': 1.0}"}}
  - {name: b, type: custom, config: {code: "def evaluate(p, r, c): return {'score': 1.0}"}}
rules:
  - {name: ra, evaluator: a}
  - {name: rb, evaluator: b}
"""
    heard: list[tuple[str, float]] = []
    with PolicyTester(text, sandbox="process", progress=lambda m, f: heard.append((m, f))) as tester:
        assert tester.evaluate("p", "r").passed
    assert [m.split(": ", 1)[0] for m, _ in heard] == ["a"] * (len(heard) // 2) + ["b"] * (len(heard) // 2)
    assert heard[-1] == ("b: ready", 1.0) and ("a: ready", 0.5) in heard  # each evaluator's share of the whole


def test_one_rich_bar_with_the_columns_each_command_asks_for() -> None:
    from rich.progress import TextColumn

    from crossaudit.cli.progress import stderr_bar

    def kinds(update) -> list[str]:  # the bar behind the update function it yields
        bar = update.func.__self__
        return [f"TextColumn:{c.text_format}" if type(c) is TextColumn else type(c).__name__ for c in bar.columns]

    with stderr_bar("{task.description}", description="uploading", total=1.0) as update:  # build progress
        assert kinds(update) == [
            "TextColumn:{task.description}",
            "BarColumn",
            "TaskProgressColumn",
            "TimeElapsedColumn",
        ]
        update(completed=0.5, description="x")
        task = update.func.__self__.tasks[0]
        assert (task.completed, task.total, task.description) == (0.5, 1.0, "x")
    with stderr_bar("replaying", counted=True, detail=True) as update:
        assert kinds(update) == [
            "TextColumn:replaying",
            "BarColumn",
            "MofNCompleteColumn",
            "TextColumn:{task.description}",
            "TimeElapsedColumn",
        ]
        assert update.func.__self__.tasks[0].total is None
    with stderr_bar("evaluating", description="rows", counted=True) as update:
        assert kinds(update) == ["TextColumn:evaluating", "BarColumn", "MofNCompleteColumn", "TimeElapsedColumn"]
