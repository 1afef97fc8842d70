"""A private PostgreSQL server for tests: Debian's binaries, a temporary cluster, loopback only.

``PgServer.start()`` runs initdb into a temp dir and starts the server on 127.0.0.1 on a free
port (its socket in the same dir; fsync off: the tests check behaviour, not durability), as the
``postgres`` system user when the tests run as root (PostgreSQL refuses root). ``database()``
creates a fresh database per test and returns its URL; ``pause()``/``resume()`` make an outage
(use a server of your own for that, not the session's). ``make postgres`` installs the packages.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path

START_TIMEOUT_S = 60
USER = "crossaudit"


def binaries() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgServer:
    def __init__(self) -> None:
        self.bin = binaries()
        self.dir = Path(tempfile.mkdtemp(prefix="crossaudit-pg-"))
        self.port = _free_port()
        self.owner: pwd.struct_passwd | None = None
        if os.geteuid() == 0:
            self.owner = pwd.getpwnam("postgres")
            os.chown(self.dir, self.owner.pw_uid, self.owner.pw_gid)
        self.started = False

    def _run(self, *args: str, timeout: float = START_TIMEOUT_S) -> None:
        cmd = list(args)
        if self.owner is not None:
            cmd = ["runuser", "-u", self.owner.pw_name, "--", *cmd]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, cwd=self.dir)
        if proc.returncode != 0:
            raise RuntimeError(f"{args[0]} failed: {proc.stderr[-2000:] or proc.stdout[-2000:]}")

    def start(self) -> PgServer:
        assert self.bin is not None
        data = self.dir / "data"
        self._run(str(self.bin / "initdb"), "-D", str(data), "-A", "trust", "-U", USER, "--no-sync", "-E", "UTF8")
        self._pg_ctl_start()
        return self

    def _pg_ctl_start(self) -> None:
        assert self.bin is not None
        options = f"-h 127.0.0.1 -p {self.port} -k {self.dir} -F -c max_connections=300 -c full_page_writes=off"
        data = str(self.dir / "data")
        self._run(str(self.bin / "pg_ctl"), "-D", data, "-o", options, "-l", str(self.dir / "log"), "-w", "start")
        self.started = True

    def pause(self) -> None:
        """Stop the server as an outage would (``-m immediate``: connections cut, no shutdown
        checkpoint), keeping its cluster and port for :meth:`resume`."""
        assert self.bin is not None and self.started
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.dir / "data"), "-m", "immediate", "-w", "stop")
        self.started = False

    def resume(self) -> None:
        """Start the paused cluster again on the same port (crash recovery runs first)."""
        self._pg_ctl_start()

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def database(self) -> str:
        import psycopg

        name = f"t_{uuid.uuid4().hex[:16]}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        if self.started and self.bin is not None:
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                self._run(str(self.bin / "pg_ctl"), "-D", str(self.dir / "data"), "-m", "immediate", "stop")
            self.started = False
        shutil.rmtree(self.dir, ignore_errors=True)
