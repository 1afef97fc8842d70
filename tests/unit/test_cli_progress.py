"""Build progress as step lines (crossaudit/cli/progress.py): what a pipe gets from an upload whose
dependency image is built, fed the messages the Docker sandbox sends in the order it sends them
(crossaudit/sandbox/docker/images.py, sandbox/deps.py: a phase line, then every pip and docker
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
