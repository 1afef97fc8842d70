"""Image-build progress of ``evaluator upload`` and ``policy deploy`` (and of a local ``evaluate`` or
``policy test`` whose preparation is slow): a progress bar on a terminal, one line per build step
elsewhere (CI logs, pipes), on stderr so stdout stays the answer.

A build takes from seconds to minutes (wheels resolved with pip, an image built, a warm sandbox
started); piped, a bar draws nothing, so without these lines the command was silent for all of it.
The server sends every output line of the build (pip's, docker's) as progress; a *step* is a new
phase (its fraction moved: resolving wheels, building the image, starting the sandbox) or a
Dockerfile step (``Step 2/3 : ...``, :func:`crossaudit.imagebuild.build_step`), so a log gets a
line per step, not pip's chatter.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

from crossaudit.cli.render import printable
from crossaudit.imagebuild import build_step

MESSAGE_CHARS = 160  # a step line's message is cut here (a pip or docker line can be long)
# evaluate / policy test: a local preparation shorter than this (images already built) prints nothing
SLOW_PREPARE_S = 2.0


class StepLines:
    """A progress callback writing ``[  4.2s  60%] message`` once per step to ``out``.

    ``hold_s``: steps are held back until that many seconds have passed, then written with the
    ones that follow; a preparation that finishes sooner (images already built) writes nothing.
    For commands whose output is something else (``evaluate``, ``policy test``)."""

    def __init__(self, out: TextIO, clock: Callable[[], float] = time.monotonic, hold_s: float = 0.0) -> None:
        self.out = out
        self.clock = clock
        self.start = clock()
        self.hold_s = hold_s
        self.held: list[str] = []
        self.fraction: float | None = None

    def __call__(self, message: str, fraction: float) -> None:
        message = " ".join(str(message).split())
        if not message or (fraction == self.fraction and build_step(message) is None):
            return
        self.fraction = fraction
        pct = max(0.0, min(1.0, fraction))
        elapsed = self.clock() - self.start
        self.held.append(f"[{elapsed:6.1f}s {pct:4.0%}] {printable(message[:MESSAGE_CHARS])}")
        if elapsed >= self.hold_s:
            print("\n".join(self.held), file=self.out, flush=True)
            self.held.clear()


@contextmanager
def build_progress(quiet: bool = False, hold_s: float = 0.0, label: str = "uploading"):  # -> Iterator[...]
    """The progress callback for a command that may build images: a bar when stderr is a
    terminal (and not ``quiet``, e.g. ``--json``), else step lines (``hold_s``: see StepLines);
    the bar is removed after."""
    if not sys.stderr.isatty():
        yield StepLines(sys.stderr, hold_s=hold_s)
        return
    if quiet:
        yield None
        return
    with stderr_bar("{task.description}", description=label, total=1.0) as update:
        yield lambda message, fraction: update(
            description=printable(str(message))[:60], completed=max(0.0, min(1.0, fraction))
        )


@contextmanager
def stderr_bar(
    title: str, *, description: str = "", total: float | None = None, counted: bool = False, detail: bool = False
) -> Iterator[Callable[..., None]]:
    """The CLI's one Rich progress bar: on stderr, removed when the block ends. Its columns:
    ``title`` (a Rich text template: ``"{task.description}"`` shows the description), the bar, how
    much is done (``counted``: ``3/10``, else a percentage), the description again when ``detail``,
    the time elapsed. Yields ``update(**fields)`` of its one task (``completed``, ``total``,
    ``description``), whose ``total`` None draws a pulsing bar until one is given."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        ProgressColumn,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    columns: list[ProgressColumn] = [
        TextColumn(title),
        BarColumn(),
        MofNCompleteColumn() if counted else TaskProgressColumn(),
    ]
    if detail:
        columns.append(TextColumn("{task.description}"))
    columns.append(TimeElapsedColumn())
    bar = Progress(*columns, console=Console(stderr=True), transient=True)
    task = bar.add_task(description, total=total)
    bar.start()
    try:
        yield functools.partial(bar.update, task)
    finally:
        bar.stop()
