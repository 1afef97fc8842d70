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
    try:
        import docker

        client = docker.from_env(timeout=10)
        client.ping()
        return client
    except Exception:
        return None


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def docker_daemon():
    client = docker_client()
    need(client is not None, "no Docker daemon answers")
    return client
