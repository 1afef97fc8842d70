"""``serve --workers N`` against a hostile local user and a killed supervisor: the review console's
port stays held (no other user can take it) while worker 0 restarts, and the data-dir lock outlives
a supervisor killed with SIGKILL until its workers are gone (no new server beside them)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.e2e.conftest import ServerProcess
from tests.e2e.test_workers import RESTART_WAIT_S, _alive, workers_of

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _bind_as_nobody(port: int) -> str:
    """Try, as another user (nobody), to take ``port`` on loopback the way any program may
    (SO_REUSEADDR, bind, listen): 'taken' when it could, else the error."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read)
        outcome = "taken"
        try:
            os.setgid(65534)
            os.setuid(65534)
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
            s.listen()
        except OSError as e:
            outcome = e.strerror or str(e)
        os.write(write, outcome.encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read, "rb") as f:
        return f.read().decode()


@pytest.mark.skipif(os.geteuid() != 0, reason="becoming another user needs root")
def test_the_console_port_stays_held_while_worker_0_restarts(tmp_path: Path) -> None:
    """Worker 0 serves the review console on a socket the supervisor holds: while it is dead no
    other user can bind the port the start line printed, and a request made meanwhile is answered
    by its replacement."""
    with ServerProcess(tmp_path, extra=("--workers", "2", "--console-port", "0")) as srv:
        url = srv.start_line.split("review console on ", 1)[1].split(",", 1)[0].strip()
        port = int(url.rsplit(":", 1)[1])
        log = srv.log.read_text()
        worker0 = int(log.split("worker 0 (pid ", 1)[1].split(")", 1)[0])
        os.kill(worker0, signal.SIGKILL)
        deadline = time.monotonic() + RESTART_WAIT_S
        while _alive(worker0) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _bind_as_nobody(port) != "taken"
        try:  # queued in the held socket's backlog until the new worker 0 accepts it
            with urllib.request.urlopen(f"{url}/", timeout=RESTART_WAIT_S) as r:
                status = r.status
        except urllib.error.HTTPError as e:
            status = e.code
        assert status < 500
        assert "restarting it in" in srv.log.read_text()


def test_a_killed_supervisors_data_dir_stays_locked_until_its_workers_are_gone(tmp_path: Path) -> None:
    """The data-dir lock is shared with the workers: a supervisor killed with SIGKILL does not let
    a new server in (releasing the outbox leases of workers still draining) before they exit."""
    import fcntl

    with ServerProcess(tmp_path, extra=("--workers", "2")) as srv:
        workers = workers_of(srv)
        lock_file = next(tmp_path.rglob("server.lock"))
        os.kill(srv.pid, signal.SIGKILL)
        assert srv.proc is not None
        srv.proc.wait(10)  # its own descriptors are closed once it is reaped
        with open(lock_file, "a") as fh:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                taken = True
            except BlockingIOError:
                taken = False
            still_serving = [p for p in workers if _alive(p)]
            if still_serving:  # (they notice the supervisor is gone within a second, then drain)
                assert not taken, "a new server could lock the data dir while the workers still serve"
            deadline = time.monotonic() + RESTART_WAIT_S
            while any(_alive(p) for p in workers) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not any(_alive(p) for p in workers), "workers outlived their supervisor"
            while True:  # free once they are gone (and what they started has finished exiting)
                try:
                    fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    assert time.monotonic() < deadline, "the data dir stayed locked after the workers exited"
                    time.sleep(0.05)


def _metrics_dirs(tmp: Path) -> set[str]:
    return {p.name for p in tmp.iterdir() if p.name.startswith("crossaudit-metrics-")}


def test_a_killed_supervisors_metrics_directory_is_removed_by_the_next_start(tmp_path: Path) -> None:
    """``kill -9`` of a supervisor (and its workers) left its prometheus multiprocess directory in
    the temporary directory, one more per crash. The next supervisor's start removes it, and keeps
    the directory of a supervisor that still runs; a stop by SIGHUP or SIGTERM removes its own."""
    tmp = tmp_path / "tmp"
    tmp.mkdir(mode=0o700)
    env = {"TMPDIR": str(tmp)}
    with ServerProcess(tmp_path / "live", extra=("--workers", "2"), env=env):
        live = _metrics_dirs(tmp)
        assert len(live) == 1
        crashed = ServerProcess(tmp_path / "crashed", extra=("--workers", "2"), env=env)
        crashed.start()
        try:
            dead = _metrics_dirs(tmp) - live
            assert len(dead) == 1
            workers = workers_of(crashed)
            assert workers
            os.kill(crashed.pid, signal.SIGKILL)
            for pid in workers:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            assert crashed.proc is not None
            crashed.proc.wait(10)
            deadline = time.monotonic() + RESTART_WAIT_S
            while any(_alive(p) for p in workers) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not any(_alive(p) for p in workers)
        finally:
            crashed.kill()
        assert dead <= _metrics_dirs(tmp), "the killed supervisor's directory is there to be found"
        following = ServerProcess(tmp_path / "next", extra=("--workers", "2"), env=env)
        following.start()
        try:
            now = _metrics_dirs(tmp)
            assert not dead & now, "the dead supervisor's metrics directory was left behind"
            assert live <= now, "a live supervisor's metrics directory was removed"
            assert len(now - live) == 1
            os.kill(following.pid, signal.SIGHUP)  # a closed terminal: an exit it sees
            assert following.proc is not None
            assert following.proc.wait(RESTART_WAIT_S) == 0
        finally:
            following.kill()
        assert _metrics_dirs(tmp) == live, "a supervisor stopped by a signal removes its own directory"
    assert _metrics_dirs(tmp) == set()
