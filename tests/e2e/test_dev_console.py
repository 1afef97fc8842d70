"""``serve --dev`` (what ``make serve`` runs) serves the review console too, on loopback, and its
start line prints every address it serves (issue 19); the default port in use is one ``error:``
line naming the flag, and ``--console-port off`` turns the console off."""

from __future__ import annotations

import contextlib
import errno
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from crossaudit.service.config import DEV_CONSOLE_PORT
from tests.e2e.conftest import ROOT, ServerProcess
from tests.e2e.console_http import console_url, sign_in

pytestmark = pytest.mark.e2e


def test_serve_dev_serves_the_console_and_prints_every_address(tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path, dev=True)  # --port 0: the console takes an ephemeral port too
    srv.start()
    try:
        line = srv.start_line
        url = console_url(line)
        assert re.fullmatch(r"127\.0\.0\.1:\d+", srv.address), line
        assert line.startswith(f"crossaudit serving on {srv.address},")
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", url) and srv.metrics_address, line
        assert httpx.get(f"http://{srv.metrics_address}/metrics", timeout=10).status_code == 200
        h = sign_in(url, "any-key-signs-in-with-dev")
        assert h.get("/queue").status_code == 200
        # DNS rebinding: a page of another site whose name now resolves to 127.0.0.1 is
        # same-origin for the browser, and any key signs in under --dev; its Host gives it away.
        port = url.rsplit(":", 1)[1]
        for host in ("evil.example", f"evil.example:{port}", f"127.0.0.1.evil.example:{port}", "["):
            r = httpx.get(f"{url}/signin", headers={"Host": host}, timeout=10)
            assert r.status_code == 403 and "csrf_token" not in r.text, host
        for host in (f"localhost:{port}", "localhost", f"127.0.0.1:{port}"):
            assert httpx.get(f"{url}/signin", headers={"Host": host}, timeout=10).status_code == 200, host
    finally:
        assert srv.stop() == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _in_use(port: int) -> Iterator[None]:
    """``port`` in use on loopback while inside (by us, or already by someone else)."""
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        s.listen()
    except OSError as e:
        if e.errno != errno.EADDRINUSE:
            raise
    try:
        yield
    finally:
        s.close()


def test_the_default_console_port_in_use_is_one_error_line_naming_the_flag(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "crossaudit.cli", "serve", "--dev", "--port", str(_free_port()),
           "--data-dir", str(tmp_path / "d"), "--policies-dir", str(tmp_path), "--sandbox", "process"]  # fmt: skip
    with _in_use(DEV_CONSOLE_PORT):
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and "Traceback" not in res.stderr + res.stdout, res.stderr
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and f"127.0.0.1:{DEV_CONSOLE_PORT}" in errors[0], res.stderr
    assert "--console-port PORT" in errors[0] and "--console-port off" in errors[0]
    # the way out it names works
    srv = ServerProcess(tmp_path / "off", dev=True, extra=("--console-port", "off"))
    srv.start()
    try:
        assert "review console" not in srv.start_line and "metrics on" in srv.start_line
    finally:
        assert srv.stop() == 0
