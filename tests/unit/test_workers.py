"""The parts of ``serve --workers N`` that need no server: the port reservation, the workers'
settings, exit descriptions, ``auto``, and SQLite shared by several writers (one file lock)."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from crossaudit.kernel.errors import ConfigurationError
from crossaudit.service.config import CONSOLE_OFF, DEV_CONSOLE_PORT, ServerConfig, WorkerLimits
from crossaudit.service.metrics import SUMMED_KINDS, WorkerMetrics
from crossaudit.service.workers import METRICS_ENV, describe_exit, reserve_port, worker_config
from crossaudit.store.sqlite import WRITER_LOCK_SUFFIX, SQLiteStore

STORES = 3  # writers sharing one SQLite file
TAKES_EACH = 6


def test_port_0_is_resolved_and_the_workers_can_listen_on_it() -> None:
    reserved = reserve_port("127.0.0.1", 0)
    try:
        port = reserved.getsockname()[1]
        assert port > 0
        workers = []
        for _ in range(2):  # what grpc.so_reuseport=1 does in each worker
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            s.bind(("127.0.0.1", port))
            s.listen()
            workers.append(s)
        for s in workers:
            s.close()
    finally:
        reserved.close()


def test_a_port_another_program_listens_on_is_refused() -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        with pytest.raises(ConfigurationError, match="in use"):
            reserve_port("127.0.0.1", other.getsockname()[1])


def test_exits_are_described_by_code_or_signal() -> None:
    assert describe_exit(-9) == "killed by SIGKILL"
    assert describe_exit(3) == "exit code 3"
    assert describe_exit(None) == "running"


def test_a_workers_settings() -> None:
    config = ServerConfig(workers=2, dev=True, metrics_port=0)
    first, second = worker_config(config, 0, 4242), worker_config(config, 1, 4242)
    assert (first.port, second.port) == (4242, 4242)
    assert first.metrics_port is None and second.metrics_port is None  # the supervisor serves /metrics
    assert first.console_port == DEV_CONSOLE_PORT  # --dev's console: worker 0 only
    assert second.console_port == CONSOLE_OFF
    assert first.worker_count == 2  # rate_limit buckets go to the store
    assert worker_config(config, 0, 4242, console_port=38001).console_port == 38001  # a restart keeps it
    assert worker_config(ServerConfig(workers=2, console_port="off"), 0, 1, 38001).console_port == CONSOLE_OFF


def test_auto_is_the_usable_cores_within_the_bound() -> None:
    assert ServerConfig(workers="auto").worker_count == len(os.sched_getaffinity(0))
    assert ServerConfig(workers="auto", worker_limits=WorkerLimits(max_workers=1)).worker_count == 1
    assert ServerConfig().worker_count == 1


async def test_writers_sharing_one_sqlite_file_queue_on_its_lock_and_share_a_bucket(tmp_path: Path) -> None:
    path = tmp_path / "crossaudit.db"
    await SQLiteStore(path).aclose()  # the supervisor's open: migrations, leases released
    stores = [SQLiteStore(path, shared=True, release_leases=False) for _ in range(STORES)]
    try:
        assert Path(str(path) + WRITER_LOCK_SUFFIX).stat().st_mode & 0o777 == 0o600
        now = time.time()
        got = await asyncio.gather(
            *(
                s.take_rate_token("t/p/e", rate_per_s=0.01, capacity=5, now=now, max_wait_s=0.0)
                for s in stores * TAKES_EACH
            )
        )
        assert sorted(got, key=lambda w: w is None) == [0.0] * 5 + [None] * (STORES * TAKES_EACH - 5)
    finally:
        for s in stores:
            await s.aclose()


def test_a_workers_lines_name_it_in_text_and_json() -> None:
    import io
    import json
    import logging

    from crossaudit.service.logs import configure_logging

    root = logging.getLogger()
    saved, level = list(root.handlers), root.level
    try:
        for fmt in ("text", "json"):
            out = io.StringIO()
            configure_logging("INFO", fmt, out, worker=1)
            logging.getLogger("crossaudit.test").info("serving")
            line = out.getvalue().strip()
            if fmt == "json":
                assert json.loads(line)["worker"] == 1
            else:
                assert line.endswith("INFO [worker 1] crossaudit.test: serving")
    finally:
        root.handlers[:] = saved
        root.setLevel(level)


def test_a_scrape_skips_a_workers_file_that_is_not_yet_sized(tmp_path: Path) -> None:
    """A worker (re)starting creates its metrics file empty, then sizes it: a scrape in between must
    still answer with every other worker's samples (it used to fail unpacking the empty header)."""
    from prometheus_client import generate_latest
    from prometheus_client.mmap_dict import MmapedDict, mmap_key

    from crossaudit.service.metrics import WorkerMetrics

    ready = MmapedDict(str(tmp_path / "counter_111.db"))
    ready.write_value(mmap_key("crossaudit_demo_total", "crossaudit_demo_total", (), (), ""), 3.0, 0.0)
    ready.close()
    (tmp_path / "counter_222.db").touch()  # the restarting worker's file, not yet sized
    metrics = WorkerMetrics(str(tmp_path))
    text = generate_latest(metrics.registry).decode()
    assert "crossaudit_demo_total 3.0" in text


DEAD_WORKERS = 4
A_LIFE = """
from prometheus_client import Counter, Histogram
Counter("crossaudit_test_calls", "calls", ["tenant"]).labels("acme").inc(3)
Histogram("crossaudit_test_seconds", "seconds", buckets=[1.0]).observe(0.5)
"""


def test_dead_workers_metrics_stay_summed_in_a_bounded_number_of_files(tmp_path: Path) -> None:
    """A worker that keeps dying must not grow the metrics directory (and each scrape) by its
    files for every life it had; what it counted stays in the sums."""
    metrics = WorkerMetrics(str(tmp_path))
    env = {**os.environ, METRICS_ENV: str(tmp_path)}
    for _ in range(DEAD_WORKERS):  # real processes writing their own files, then gone
        life = subprocess.run([sys.executable, "-c", A_LIFE], env=env, check=True)
        assert life.returncode == 0
    pids = {f.stem.rsplit("_", 1)[1] for f in tmp_path.glob("counter_*.db")}
    assert len(pids) == DEAD_WORKERS
    for pid in pids:
        metrics.worker_died(int(pid))
    assert len(list(tmp_path.iterdir())) <= len(SUMMED_KINDS)
    scrape = generate_latest(metrics.registry).decode()
    assert f'crossaudit_test_calls_total{{tenant="acme"}} {3.0 * DEAD_WORKERS}' in scrape
    assert f'crossaudit_test_seconds_bucket{{le="1.0"}} {float(DEAD_WORKERS)}' in scrape


def test_the_metrics_directory_sweep_removes_only_this_users_dead_supervisors_directories(tmp_path: Path) -> None:
    """A start removes a ``crossaudit-metrics-*`` directory whose lock nobody holds; it keeps a
    live supervisor's (held by its supervisor or by a worker that inherited the lock), an older
    version's (no lock file: cannot be told), another user's, and never follows a link."""
    import fcntl

    from crossaudit.service import metricsdir

    live = metricsdir.create(str(tmp_path))
    assert stat.S_IMODE(os.stat(live.path).st_mode) == 0o700
    assert os.path.basename(live.path).startswith(metricsdir.PREFIX)
    dead = metricsdir.create(str(tmp_path))
    (Path(dead.path) / "counter_123.db").write_bytes(b"x")
    os.close(dead.lock_fd)  # what SIGKILL does to the supervisor (its workers gone too)
    inherited = metricsdir.create(str(tmp_path))
    worker_fd = os.dup(inherited.lock_fd)  # a worker's copy of the open file outlives the supervisor
    os.close(inherited.lock_fd)
    legacy = tmp_path / f"{metricsdir.PREFIX}legacy"
    legacy.mkdir(mode=0o700)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / metricsdir.LOCK_NAME).write_text("")
    (outside / "keep").write_text("")
    link = tmp_path / f"{metricsdir.PREFIX}link"
    link.symlink_to(outside)
    fake_lock = tmp_path / f"{metricsdir.PREFIX}fifo"
    fake_lock.mkdir(mode=0o700)
    os.mkfifo(fake_lock / metricsdir.LOCK_NAME)  # never opened for blocking, never taken as a lock
    others = None
    if os.geteuid() == 0:
        others = metricsdir.create(str(tmp_path))
        os.close(others.lock_fd)
        os.chown(others.path, 65534, 65534)
    removed = metricsdir.sweep(str(tmp_path))
    assert removed == [os.path.basename(dead.path)]
    assert not os.path.lexists(dead.path)
    for kept in (live.path, inherited.path, legacy, link, fake_lock, outside / "keep"):
        assert os.path.lexists(kept), kept
    if others is not None:
        assert os.path.isdir(others.path)
    os.close(worker_fd)  # the last worker is gone: the next start removes it
    assert metricsdir.sweep(str(tmp_path)) == [os.path.basename(inherited.path)]
    fcntl.flock(live.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # still its own
    live.remove()
    assert not os.path.lexists(live.path)
    assert not any(p.name.startswith(metricsdir.STAGING_PREFIX) for p in tmp_path.iterdir())


def test_a_flood_of_foreign_metrics_names_never_hides_a_dead_supervisors_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Any local user can fill the temporary directory with ``crossaudit-metrics-*`` names (files,
    links): the sweep's bound counts this user's directories it examines, not names, so the dead
    supervisor's directory is removed even when it is listed after every one of them."""
    from crossaudit.service import metricsdir

    monkeypatch.setattr(metricsdir, "MAX_SWEPT", 5)
    dead = metricsdir.create(str(tmp_path))
    os.close(dead.lock_fd)  # its supervisor was killed: the lock is free, the directory stays
    outside = tmp_path / "outside"
    outside.mkdir()
    for i in range(20 * metricsdir.MAX_SWEPT):
        (tmp_path / f"{metricsdir.PREFIX}file{i:04d}").touch()
        (tmp_path / f"{metricsdir.PREFIX}link{i:04d}").symlink_to(outside)
    real = os.scandir

    class DeadListedLast(list[os.DirEntry[str]]):  # what os.scandir gives, in the worst order
        def __enter__(self) -> DeadListedLast:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

    def dead_listed_last(path: str) -> DeadListedLast:
        with real(path) as it:
            return DeadListedLast(sorted(it, key=lambda e: e.path == dead.path))

    monkeypatch.setattr(metricsdir.os, "scandir", dead_listed_last)
    assert metricsdir.sweep(str(tmp_path)) == [os.path.basename(dead.path)]
    assert not os.path.lexists(dead.path)


def test_the_metrics_directory_sweep_examines_at_most_max_swept_directories_a_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from crossaudit.service import metricsdir

    monkeypatch.setattr(metricsdir, "MAX_SWEPT", 3)
    for _ in range(metricsdir.MAX_SWEPT + 2):
        os.close(metricsdir.create(str(tmp_path)).lock_fd)
    assert len(metricsdir.sweep(str(tmp_path))) == metricsdir.MAX_SWEPT
    assert len(metricsdir.sweep(str(tmp_path))) == 2  # the rest at the next start
