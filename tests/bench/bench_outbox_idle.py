"""The server's idle CPU with a tenant's webhook backlog: 10,000 pending deliveries to a loopback
receiver that never answers (tests/webhook_receiver.py), on SQLite and on PostgreSQL.

The delivery worker once leased rows of a tenant already at its in-flight share, handed them
back and woke at once: 80-97% of a core with no caller. The target is under 5% of a core; the
figure is the server process's CPU (from /proc) over MEASURE_S once the tenant holds its share
of attempts. With PostgreSQL the database's own CPU is printed beside it (the postmaster and
its children, present at the start of the window).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from crossaudit.outbox.limits import DeliveryLimits
from crossaudit.store import SQLiteStore
from crossaudit.store.base import Store
from tests.e2e.conftest import ServerProcess
from tests.pgserver import PgServer, binaries
from tests.security.test_webhook_backlog import PENDING, SIGNING_SECRET, cpu_seconds, keys_file, seed
from tests.webhook_receiver import HangingReceiver, Receiver

MEASURE_S = 20.0
WAIT_S = 60.0


def _cluster_pids(pg: PgServer) -> list[int]:
    """The postmaster of ``pg`` and its children (backends, checkpointer, ...), from /proc."""
    postmaster = int((pg.dir / "data" / "postmaster.pid").read_text().split()[0])
    pids = [postmaster]
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == postmaster:
                pids.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    return pids


def _cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            total += cpu_seconds(pid)
        except OSError:  # gone since
            continue
    return total


def _measure(tmp: Path, store_url: str | None, open_store: Callable[[], Store], pg: PgServer | None) -> float:
    hanging, working = HangingReceiver(), Receiver()
    try:
        seed(open_store, [("acme", f"{hanging.url}/hook")] * PENDING)
        extra = ("--store", store_url) if store_url else ()
        with ServerProcess(
            tmp, keys_text=keys_file(hanging.port, working.port), env={"SIGNING_SECRET": SIGNING_SECRET}, extra=extra
        ) as srv:
            deadline = time.monotonic() + WAIT_S
            while hanging.open_connections() < DeliveryLimits().max_inflight_per_tenant:
                if time.monotonic() > deadline:
                    raise RuntimeError("the worker never reached its share of attempts")
                time.sleep(0.2)
            time.sleep(1.0)
            pg_pids = _cluster_pids(pg) if pg is not None else []
            c0, p0, t0 = cpu_seconds(srv.pid), _cpu(pg_pids), time.monotonic()
            time.sleep(MEASURE_S)
            wall = time.monotonic() - t0
            used = (cpu_seconds(srv.pid) - c0) / wall
            extra_text = ""
            if pg is not None:
                pg_used = (_cpu(pg_pids) - p0) / wall
                extra_text = f", PostgreSQL {pg_used:.1%}"
            backend = "postgresql" if store_url else "sqlite"
            print(f"  {backend:10s} server {used:.1%} of a core{extra_text}", flush=True)
            return used
    finally:
        hanging.close()
        working.close()


def main() -> None:
    print(f"idle CPU with {PENDING} pending webhooks to a hanging receiver, over {MEASURE_S:g}s (target < 5%):")
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "sqlite" / "data"
        data.mkdir(parents=True, mode=0o700)
        _measure(Path(tmp) / "sqlite", None, lambda: SQLiteStore(data / "crossaudit.db"), None)
        if binaries() is None:
            print("  postgresql: not installed (make postgres)")
            return
        from crossaudit.store.postgres import PostgresStore

        pg = PgServer()
        pg.start()
        try:
            url = pg.database()
            _measure(Path(tmp) / "pg", url, lambda: PostgresStore(url), pg)
        finally:
            pg.stop()


if __name__ == "__main__":
    main()
