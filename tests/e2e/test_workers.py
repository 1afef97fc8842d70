"""``crossaudit serve --workers 2``: two real server processes on one loopback port under a
supervisor. A worker SIGKILLed under load is replaced while the other keeps answering, the
supervisor counts the restart and the decisions lost with it, and every decision a client got
an answer for is in the audit log; a rate_limit bucket holds across the workers (SQLite); the one
metrics endpoint sums every worker; SIGTERM drains the workers and exits 0."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from crossaudit import Client
from crossaudit.kernel.errors import CrossAuditError
from tests.e2e.conftest import ServerProcess, key

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

LOAD_THREADS = 6
MIN_ANSWERED = 20  # the kill comes once this many decisions were answered
MAX_LOAD_S = 60.0  # bound on every load phase
MAX_CALLS_PER_THREAD = 2_000
AFTER_KILL_ANSWERED = 10  # the survivors must answer this many more after the kill
RESTART_WAIT_S = 60.0  # bound on waiting for the replacement worker (a fresh interpreter)
RATE_CLIENTS = 16  # separate channels, so both workers get calls (the kernel spreads connections)
RATE_CALLS_EACH = 2

# ~0.1 s of CPU per call in the sandbox: a looping client nearly always has a call in flight.
BUSY = """
name: busy
description: a little CPU per call
version: "1.0"
evaluators:
  - name: spin
    type: custom
    config:
      code: |
        def evaluate(prompt, response, context):
            n = 0
            for i in range(200000):
                n += i
            return {"score": 1.0, "details": {"n": n}}
rules:
  - {name: r, evaluator: spin, threshold: 0.5, action: block}
"""

SLOW = BUSY.replace("name: busy", "name: slow").replace("range(200000)", "range(3000000)")
DRAIN_GRACE_S = 60  # limits.shutdown_grace_s of this module's server: the slow call finishes within it

# 6 per minute: a burst of one, the next token 10 s later; a call waits at most its 1 s timeout.
LIMITED = """
name: limited
description: one call per ten seconds, every worker together
version: "1.0"
evaluators:
  - name: e
    type: custom
    config:
      rate_limit: 6
      code: |
        def evaluate(prompt, response, context):
            return {"score": 1.0}
rules:
  - {name: r, evaluator: e, threshold: 0.5, action: block, settings: {timeout: 1}}
"""


def metrics(srv: ServerProcess) -> dict[str, float]:
    """The supervisor's /metrics as {series: value} (comments dropped)."""
    with urllib.request.urlopen(f"http://{srv.metrics_address}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                text = Path(entry.path, "stat").read_text()
                if int(text[text.rindex(")") + 2 :].split()[1]) == pid:
                    out.append(int(entry.name))
    return out


def workers_of(srv: ServerProcess) -> list[int]:
    """The supervisor's worker processes (its other child is multiprocessing's resource tracker).
    A child that exits between the listing and the read (a killed worker being reaped) is not one."""
    found = []
    for p in _children(srv.pid):
        try:
            cmdline = Path(f"/proc/{p}/cmdline").read_bytes()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if b"spawn_main" in cmdline:
            found.append(p)
    return found


def connections(pid: int, port: int) -> int:
    """Established TCP connections ``pid`` holds on local ``port`` (from /proc, no tools)."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.scandir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(fd.path)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    n = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                f = line.split()
                if int(f[1].rsplit(":", 1)[1], 16) == port and f[3] == "01" and f[9] in inodes:
                    n += 1
    return n


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory: pytest.TempPathFactory):
    """One supervisor for this module's tests (the last one stops it)."""
    extra = ("--workers", "2", "--set", f"limits.shutdown_grace_s={DRAIN_GRACE_S}")
    with ServerProcess(tmp_path_factory.mktemp("workers"), extra=extra) as srv:
        yield srv


def test_a_killed_worker_is_replaced_and_no_answered_decision_is_lost(two_workers: ServerProcess) -> None:
    srv = two_workers
    assert "workers 2" in srv.start_line
    with Client(srv.address, api_key=key("acme")) as c:
        c.deploy_policy(BUSY)
    before = workers_of(srv)
    assert len(before) == 2
    answered: list[str] = []
    failed: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()

    def load() -> None:
        with Client(srv.address, api_key=key("acme")) as c:
            for _ in range(MAX_CALLS_PER_THREAD):
                if stop.is_set():
                    return
                try:
                    d = c.evaluate("busy", "p", "r", timeout=30)
                except CrossAuditError as e:
                    with lock:
                        failed.append(str(e))
                    continue
                with lock:
                    answered.append(d.decision_id)

    threads = [threading.Thread(target=load) for _ in range(LOAD_THREADS)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + MAX_LOAD_S
        while len(answered) < MIN_ANSWERED and time.monotonic() < deadline:
            time.sleep(0.05)
        port = int(srv.address.rsplit(":", 1)[1])
        victim = max(before, key=lambda p: connections(p, port))  # a worker with callers in flight
        os.kill(victim, signal.SIGKILL)
        at_kill = len(answered)
        while time.monotonic() < deadline:
            serving = metrics(srv)["crossaudit_workers"]  # the replacement serves, not only started
            if serving == 2 and victim not in workers_of(srv) and len(answered) >= at_kill + AFTER_KILL_ANSWERED:
                break
            time.sleep(0.1)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    after = workers_of(srv)
    assert victim not in after and len(after) == 2, "the dead worker was not replaced"
    assert len(answered) >= at_kill + AFTER_KILL_ANSWERED, "the server stopped answering after the kill"
    m = metrics(srv)
    assert m["crossaudit_worker_restarts_total"] == 1.0
    assert m["crossaudit_worker_lost_calls_total"] >= 1.0  # its callers were in the middle of calls
    assert m["crossaudit_workers"] == 2.0
    with Client(srv.address, api_key=key("acme")) as c:
        audited = {d.decision_id for d in c.list_decisions(policy="busy", limit=1000)}
        for decision_id in set(answered) - audited:  # beyond the list cap: look each one up
            assert c.get_decision(decision_id).policy == "busy"
    log = srv.log.read_text()
    assert f"(pid {victim}) died: killed by SIGKILL" in log


def test_a_rate_limit_holds_across_workers_and_metrics_sum_every_worker(two_workers: ServerProcess) -> None:
    check_one_bucket_and_one_scrape(two_workers)


def test_workers_on_postgresql_share_the_bucket_too(tmp_path: Path, postgres_url: str) -> None:
    with ServerProcess(tmp_path, extra=("--workers", "2", "--store", postgres_url)) as srv:
        assert "store postgresql://" in srv.start_line
        check_one_bucket_and_one_scrape(srv)


def check_one_bucket_and_one_scrape(srv: ServerProcess) -> None:
    """Clients on both workers call a policy whose bucket holds one call: one passes in all, and
    the one scrape counts every worker's decisions."""
    with Client(srv.address, api_key=key("acme")) as c:
        c.deploy_policy(LIMITED)
    results: list[bool] = []
    lock = threading.Lock()

    def call() -> None:
        with Client(srv.address, api_key=key("acme")) as c:  # a channel of its own: either worker
            for _ in range(RATE_CALLS_EACH):
                d = c.evaluate("limited", "p", "r", timeout=30)
                with lock:
                    results.append(not d.errored_rules)

    threads = [threading.Thread(target=call) for _ in range(RATE_CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(MAX_LOAD_S)
    assert len(results) == RATE_CLIENTS * RATE_CALLS_EACH
    assert sum(results) == 1, f"{sum(results)} calls passed a bucket of one (per-worker buckets?)"
    m = metrics(srv)
    passed = {
        flag: sum(v for k, v in m.items() if k.startswith("crossaudit_decisions_total{") and 'policy="limited"' in k
                  and f'passed="{flag}"' in k)
        for flag in ("true", "false")
    }  # fmt: skip
    assert passed == {"true": 1.0, "false": len(results) - 1.0}  # every worker's decisions, in one scrape
    flag = 'crossaudit_sandbox_state{key="restricted"}'  # 1 in each worker (the process sandbox)
    deadline = time.monotonic() + MAX_LOAD_S
    while m.get(flag) != 2.0 and time.monotonic() < deadline:
        time.sleep(0.2)  # the workers copy their scrape-time series every second
        m = metrics(srv)
    assert m.get(flag) == 2.0  # both workers' sandbox state, summed


def test_sigterm_drains_every_worker_and_exits_0(two_workers: ServerProcess) -> None:
    srv = two_workers
    with Client(srv.address, api_key=key("acme")) as c:
        c.deploy_policy(SLOW)
    answers: list[bool] = []

    def call() -> None:
        with Client(srv.address, api_key=key("acme")) as c:
            answers.append(c.evaluate("slow", "p", "r", timeout=DRAIN_GRACE_S).passed)

    caller = threading.Thread(target=call)
    caller.start()
    deadline = time.monotonic() + MAX_LOAD_S
    while metrics(srv)["crossaudit_inflight_evaluations"] < 1 and caller.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)  # until the call is being decided in a worker
    assert caller.is_alive(), "the slow call ended before the stop: nothing was in flight"
    workers = workers_of(srv)
    assert srv.stop() == 0
    caller.join(DRAIN_GRACE_S)
    assert answers == [True]  # the call in flight at SIGTERM was answered
    assert not [p for p in workers if _alive(p)]
    assert "did not stop in time" not in srv.log.read_text()


def _alive(pid: int) -> bool:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    return False


def test_one_worker_is_todays_server(tmp_path: Path) -> None:
    with ServerProcess(tmp_path, extra=("--workers", "1")) as srv:
        assert "workers" not in srv.start_line
        assert workers_of(srv) == []  # it serves itself: no supervisor, no children of its own
        with Client(srv.address, api_key=key("acme")) as c:
            c.deploy_policy(LIMITED)
            assert not c.evaluate("limited", "p", "r").errored_rules

