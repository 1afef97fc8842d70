"""Run a command, streaming its output lines as build progress, under a deadline."""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass

from crossaudit.kernel.progress import ProgressCallback

MAX_PROGRESS_LINES = 10_000  # lines forwarded to the progress callback; the rest only count
TAIL_LINES = 20  # last output lines kept for error messages


@dataclass(frozen=True)
class StreamedRun:
    returncode: int | None  # None when the deadline killed it
    tail: list[str]

    @property
    def timed_out(self) -> bool:
        return self.returncode is None


def run_streaming(cmd: list[str], deadline: float, say: ProgressCallback, fraction: float) -> StreamedRun:
    """Run ``cmd`` until it exits or ``deadline`` (monotonic) passes; never raises for exit codes."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    tail: list[str] = []
    assert proc.stdout is not None
    timed_out = False
    try:
        for n, raw in enumerate(proc.stdout):
            line = raw.rstrip()
            if line:
                tail = [*tail[-(TAIL_LINES - 1):], line]
                if n < MAX_PROGRESS_LINES:
                    say(line[:200], fraction)
            if time.monotonic() > deadline:
                timed_out = True
                break
        if not timed_out:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return StreamedRun(None if timed_out else proc.returncode, tail)
