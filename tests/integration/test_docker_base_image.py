"""Where the sandbox base image comes from, against the real daemon: a machine that has a local
base never asks a registry (the start-up used to try ``docker pull python:3.11-slim`` on every
start), while an image the operator names is still pulled (once per process) before falling back.

``client.api.pull`` is replaced by a tripwire on the real docker-py client: it records the call and
refuses, as a machine without a registry does.
"""

from __future__ import annotations

from typing import Any

import pytest

from sandbox.docker.images import DEFAULT_BASE_IMAGE, ENV_BASE_IMAGE, ImageManager

pytestmark = [pytest.mark.docker]


class Tripwire:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        self.calls.append(args)
        raise RuntimeError("no registry here")


def _manager(
    client: Any, monkeypatch: pytest.MonkeyPatch, base_image: str | None = None
) -> tuple[ImageManager, Tripwire]:
    monkeypatch.delenv(ENV_BASE_IMAGE, raising=False)
    mgr = ImageManager(client, base_image=base_image)
    local = mgr.local_base_tag()
    if not mgr.exists(local):  # a fresh machine: build the local base first, without any registry
        mgr._local_base(lambda _m, _f: None, force=False)
    tripwire = Tripwire()
    monkeypatch.setattr(client.api, "pull", tripwire)
    return mgr, tripwire


def test_the_default_base_is_found_locally_without_a_pull(docker_daemon, monkeypatch) -> None:
    mgr, tripwire = _manager(docker_daemon, monkeypatch)
    said: list[str] = []
    for _ in range(3):  # several starts' worth
        base = mgr.ensure_base(lambda m, _f: said.append(m))
    expected = DEFAULT_BASE_IMAGE if mgr.exists(DEFAULT_BASE_IMAGE) else mgr.local_base_tag()
    assert base == expected
    assert tripwire.calls == []
    assert not [m for m in said if "pull" in m], said


def test_an_absent_configured_image_is_pulled_once_then_the_local_base_serves(docker_daemon, monkeypatch) -> None:
    mgr, tripwire = _manager(docker_daemon, monkeypatch, base_image="crossaudit-test/absent-base:never")
    said: list[str] = []
    assert mgr.ensure_base(lambda m, _f: said.append(m)) == mgr.local_base_tag()
    assert mgr.ensure_base(lambda m, _f: said.append(m)) == mgr.local_base_tag()
    assert len(tripwire.calls) == 1  # tried once per process, then the local base
    assert any("pull of crossaudit-test/absent-base:never unavailable" in m for m in said)
