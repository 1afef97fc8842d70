"""Shared fixtures. Integration needs are *failures* under CI=true, skips elsewhere."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
# Model resolution never downloads in tests (and servers they start inherit HF_HUB_OFFLINE), nor
# finds a developer's own model store: tests of the store and of downloads pass their own settings.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("CROSSAUDIT_MODEL_STORE", str(Path(tempfile.gettempdir()) / f"crossaudit-tests-{os.getpid()}"))


def need(condition: bool, reason: str) -> None:
    """Skip when a real dependency is missing, but fail under CI=true (CI must run everything)."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"required in CI but unavailable: {reason}", pytrace=False)
    pytest.skip(reason)


def docker_client():
    """A live docker-py client, or None when no daemon answers."""
    from crossaudit.imagebuild.daemon import docker_client as client_from_env
    from crossaudit.kernel.errors import ConfigurationError

    try:
        return client_from_env(10, purpose="the Docker tests")
    except ConfigurationError:
        return None


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


@pytest.fixture
def receiver():
    """A webhook receiver on loopback (``tests/webhook_receiver.py``), closed after the test."""
    from tests.webhook_receiver import Receiver

    r = Receiver()
    try:
        yield r
    finally:
        r.close()


@pytest.fixture(scope="session")
def docker_daemon():
    client = docker_client()
    need(client is not None, "no Docker daemon answers")
    return client


@pytest.fixture(scope="session")
def postgres_server():
    """One private PostgreSQL per test session (``tests/pgserver.py``); required under CI=true."""
    from tests.pgserver import PgServer, binaries

    need(binaries() is not None, "PostgreSQL is not installed (make postgres)")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        need(False, "psycopg is not installed (pip install -e '.[dev]')")
    server = PgServer()
    try:
        server.start()
    except Exception as exc:  # a server that will not start is a broken environment, not a skip in CI
        server.stop()
        need(False, f"PostgreSQL did not start: {exc}")
    yield server
    server.stop()


@pytest.fixture
def postgres_url(postgres_server) -> str:
    """A fresh, empty database on the session's server."""
    return postgres_server.database()


@pytest.fixture(params=["sqlite", "postgresql"])
async def any_store(request: pytest.FixtureRequest, tmp_path: Path):
    """The store contract runs against both backends: an SQLite file, a fresh PostgreSQL database."""
    if request.param == "sqlite":
        from crossaudit.store import SQLiteStore

        s = SQLiteStore(tmp_path / "db.sqlite")
    else:
        from crossaudit.store.postgres import PostgresStore

        s = PostgresStore(request.getfixturevalue("postgres_url"))
    yield s
    await s.aclose()


@pytest.fixture(params=["sqlite", "postgresql"])
def server_store_env(request: pytest.FixtureRequest) -> dict[str, str]:
    """The environment that points a real server (``tests/e2e/conftest.py`` ServerProcess) at each
    store backend in turn: its own SQLite file, then a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return {}
    return {"CROSSAUDIT_STORE_URL": request.getfixturevalue("postgres_url")}
