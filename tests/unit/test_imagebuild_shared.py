"""What the image builder's package holds for all its users, without a daemon: the one Docker
client factory, the one rule for the local base, the hardened container settings the sandbox and
the model servers share, and the build-step parser."""

from __future__ import annotations

import sys
import types

import pytest

from crossaudit.imagebuild import build_step
from crossaudit.imagebuild.baseimage import BASE_REPO, local_base, local_base_tag
from crossaudit.imagebuild.daemon import client_timeout, docker_answers, docker_client
from crossaudit.imagebuild.hardening import Hardening, scratch_tmpfs
from crossaudit.kernel.errors import ConfigurationError


class FakeClient:
    def __init__(self, answers: bool) -> None:
        self.answers = answers
        self.closed = False

    def ping(self) -> bool:
        if not self.answers:
            raise ConnectionError("no socket")
        return True

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def fake_docker(monkeypatch):
    """``docker.from_env`` recording its keywords and handing out :class:`FakeClient`s."""
    calls: list[dict] = []
    made: list[FakeClient] = []
    state = {"answers": True}

    def from_env(**kw):
        calls.append(kw)
        made.append(FakeClient(state["answers"]))
        return made[-1]

    monkeypatch.setitem(sys.modules, "docker", types.SimpleNamespace(from_env=from_env))
    return types.SimpleNamespace(calls=calls, made=made, state=state)


def test_the_client_timeout_is_whole_seconds_never_zero() -> None:
    assert client_timeout(60) == 60 and client_timeout(2.9) == 2 and client_timeout(0.5) == 1


def test_one_factory_pings_sizes_its_pool_and_names_who_needed_the_daemon(fake_docker) -> None:
    assert docker_client(120).answers and fake_docker.calls[-1] == {"timeout": 120}
    docker_client(60, ping=False, max_pool_size=32)
    assert fake_docker.calls[-1] == {"timeout": 60, "max_pool_size": 32}
    fake_docker.state["answers"] = False
    docker_client(60, ping=False)  # not pinged: no error yet
    with pytest.raises(ConfigurationError, match=r"^running model servers in containers needs a Docker daemon"):
        docker_client(60, purpose="running model servers in containers")
    assert fake_docker.made[-1].closed  # a client whose daemon did not answer is not left open
    assert docker_answers(2.0) is False
    fake_docker.state["answers"] = True
    assert docker_answers(0.2) is True and fake_docker.calls[-1] == {"timeout": 1} and fake_docker.made[-1].closed


def test_without_the_docker_package_the_factory_says_so(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "docker", None)  # import docker -> ImportError
    with pytest.raises(ConfigurationError, match="needs the docker package"):
        docker_client(purpose="x")
    assert docker_answers(1) is False


class FakeBuilder:
    def __init__(self, tags: list[str]) -> None:
        self.tags = tags  # newest first

    def exists(self, ref: str) -> bool:
        return ref in self.tags

    def newest(self, repo: str) -> str | None:
        return next((t for t in self.tags if t.startswith(f"{repo}:")), None)


def test_one_rule_picks_the_local_base() -> None:
    recipe = local_base_tag()
    assert recipe == "crossaudit/base:bookworm-py311-125d50f45124"  # a changed tag rebuilds every image
    other = f"{BASE_REPO}:something-else"
    assert local_base(FakeBuilder([other, recipe])) == recipe  # the recipe's base wins over a newer one
    assert local_base(FakeBuilder([other])) == other  # else the newest local one
    with pytest.raises(ConfigurationError, match="make images"):
        local_base(FakeBuilder([]))


def test_hardened_settings_are_the_same_for_every_container_but_their_caps() -> None:
    model_server = Hardening(memory_bytes=500, pids=64, tmpfs_bytes=1000).settings()
    assert model_server == {
        "network_mode": "none",
        "read_only": True,
        "tmpfs": {"/tmp": "rw,noexec,nosuid,nodev,size=1000,mode=1777"},
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "mem_limit": 500,
        "memswap_limit": 500,
        "pids_limit": 64,
    }
    sandbox = Hardening(500, 64, 1000, scratch_dirs=("/tmp", "/dev/shm"), tmpfs_inodes=7).settings()
    assert sandbox["tmpfs"] == dict.fromkeys(
        ("/tmp", "/dev/shm"), "rw,noexec,nosuid,nodev,size=1000,nr_inodes=7,mode=1777"
    )
    assert {k: v for k, v in sandbox.items() if k != "tmpfs"} == {k: v for k, v in model_server.items() if k != "tmpfs"}
    assert scratch_tmpfs(5) == "rw,noexec,nosuid,nodev,size=5,mode=1777"


def test_a_model_server_container_runs_with_the_shared_settings(monkeypatch) -> None:
    from crossaudit.modelserver import containers

    seen: dict = {}

    class Containers:
        def run(self, image, **kw):
            seen.update(kw, image=image)
            return types.SimpleNamespace(id="c1")

    client = types.SimpleNamespace(containers=Containers())
    monkeypatch.setattr(containers, "_live", {})
    containers.run(
        client,
        kind="presidio",
        image="img",
        args=["serve"],
        socket_dir="/s",
        mounts={},
        memory_bytes=500,
        pids=64,
        tmpfs_bytes=1000,
    )
    shared = Hardening(memory_bytes=500, pids=64, tmpfs_bytes=1000).settings()
    assert {k: seen[k] for k in shared} == shared


def test_build_steps_are_read_in_one_place() -> None:
    assert build_step("Step 2/5 : COPY site/ /opt/crossaudit/site/") == (2, 5)
    assert build_step('Step 12/12 : CMD ["python3"]') == (12, 12)
    for line in ("Step 2/5: COPY", " Step 2/5 : COPY", "Successfully built 0123", "Step x/5 : RUN", ""):
        assert build_step(line) is None
