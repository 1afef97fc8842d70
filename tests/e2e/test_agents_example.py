"""docs/agents.md's runnable example, its commands as written: the ```bash block of "A runnable
example" run line by line through ``bash -c`` in a directory holding a copy of ``policies/``,
with ``.venv/bin`` first on ``PATH`` (``crossaudit``, ``python``) and the sandbox the README's
tests use (``CROSSAUDIT_SANDBOX=process``: no Docker needed). A line ending in ``&`` runs in the
background (``exec`` of the line without it, so the test can stop it) until its ready line; the
last line is the example itself: the official ``openai`` and ``anthropic`` SDKs through the proxy,
every step as described, exit 0."""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import ROOT, _die_with_parent

pytestmark = pytest.mark.e2e

DOC = ROOT / "docs" / "agents.md"
READY = {"crossaudit serve": "crossaudit serving on ", "crossaudit proxy": "crossaudit proxy on "}
START_TIMEOUT_S = 120
RUN_TIMEOUT_S = 180


def commands() -> list[str]:
    section = DOC.read_text().split("## A runnable example", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```bash\n(.*?)```", section, re.S)
    return [line for line in block.splitlines() if line.strip()]


def ports(lines: list[str]) -> set[int]:
    return {int(p) for p in re.findall(r"(?:--port |--model-port |127\.0\.0\.1:)(\d+)", "\n".join(lines))}


@pytest.fixture()
def workdir(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "policies", tmp_path / "policies")
    return tmp_path


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CROSSAUDIT_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["CROSSAUDIT_SANDBOX"] = "process"
    return env


@contextlib.contextmanager
def background(line: str, cwd: Path, log: Path) -> Iterator[subprocess.Popen[str]]:
    ready = next(r for prefix, r in READY.items() if line.startswith(prefix))
    proc = subprocess.Popen(
        ["bash", "-c", "exec " + line.removesuffix("&").strip()], cwd=cwd, env=_env(), text=True,
        stdout=subprocess.PIPE, stderr=log.open("a"), preexec_fn=_die_with_parent,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert time.monotonic() < deadline and proc.poll() is None, f"{line!r} did not start:\n{log.read_text()}"
            if sel.select(timeout=0.5) and proc.stdout.readline().startswith(ready):
                break
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def test_the_runnable_example_runs_as_written(workdir: Path) -> None:
    lines = commands()
    assert len(lines) == 3 and lines[0].endswith("&") and lines[1].endswith("&") and not lines[2].endswith("&")
    for port in ports(lines):  # fixed ports, as a reader types them: say so plainly when one is taken
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                pytest.fail(f"port {port} of docs/agents.md's example is in use on this machine")
    with contextlib.ExitStack() as stack:
        for n, line in enumerate(lines[:-1]):
            stack.enter_context(background(line, workdir, workdir / f"background-{n}.log"))
        res = subprocess.run(
            ["bash", "-c", lines[-1]], cwd=workdir, env=_env(), capture_output=True, text=True, timeout=RUN_TIMEOUT_S
        )
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("\nok ") + res.stdout.startswith("ok ") == 5, res.stdout
    assert "every step as described" in res.stdout and "Traceback" not in res.stderr
