"""Dependency validation, import-name mapping and the container hardening spec (no daemon needed)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from crossaudit.kernel.depspec import Dependency, parse_dependency, validate_dependencies
from crossaudit.kernel.errors import ConfigurationError, DependencyRejectedError, EvaluatorUnavailableError
from crossaudit.kernel.limits import DependencyLimits, SandboxLimits
from crossaudit.kernel.ownership import owner_alive as _owner_alive
from sandbox.deps import dependency_key, hash_lock, import_names
from sandbox.docker.container import (
    ENV_ALLOWLIST,
    SANDBOX_UID_RANGE,
    UID_LABEL,
    UidAllocator,
    check_env,
    container_spec,
    uids_in_use,
)
from sandbox.docker.images import LABEL, SANDBOX_UID, host_apt_sources


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("nltk", Dependency("nltk")),
        ("TextBlob", Dependency("textblob")),
        ("scikit_learn>=1.3", Dependency("scikit-learn", ">=1.3")),
        ("numpy >=1.26, <3", Dependency("numpy", "<3,>=1.26")),
        ("regex==2024.*", Dependency("regex", "==2024.*")),
        ("pydantic~=2.7", Dependency("pydantic", "~=2.7")),
        ("  requests!=2.0.0  ", Dependency("requests", "!=2.0.0")),
    ],
)
def test_valid_dependencies_are_normalised(raw, expected):
    assert parse_dependency(raw) == expected


@pytest.mark.parametrize(
    "raw",
    [
        "", "   ", "requests; os_name == 'posix'", "requests[socks]", "git+https://127.0.0.1/x.git",
        "x @ https://127.0.0.1/x.whl", "./pkg", "/abs/pkg", "-e .", "--index-url=http://127.0.0.1",
        "-r req.txt", "pkg\nother", "pkg\rother", "pkg\tx", "pkg;id", "pkg|id", "pkg&&id", "pkg`id`",
        "pkg$(id)", "pkg>", "pkg>=", "pkg===1.0", "pkg>=1 <2", "pkg>=1,,<2", "pkg>=abc", "pkg>=1.0; x",
        "pké", "pkg>=1.0\x00", "_private", "pkg-", "a" * 101, 42, None, b"bytes",
    ],
)
def test_hostile_or_malformed_dependencies_are_rejected(raw):
    with pytest.raises(DependencyRejectedError):
        validate_dependencies([raw])


def test_caps_lists_and_duplicates():
    limits = DependencyLimits(max_count=3, allowlist=("nltk", "TextBlob", "six"), denylist=("six",))
    assert [d.name for d in validate_dependencies(["textblob", "nltk"], limits)] == ["nltk", "textblob"]
    with pytest.raises(DependencyRejectedError, match="too many"):
        validate_dependencies(["a", "b", "c", "d"], limits)
    with pytest.raises(DependencyRejectedError, match="allowlist"):
        validate_dependencies(["requests"], limits)
    with pytest.raises(DependencyRejectedError, match="denylist"):
        validate_dependencies(["six"], limits)
    with pytest.raises(DependencyRejectedError, match="twice"):
        validate_dependencies(["nltk", "NLTK>=3"], limits)
    # every problem is reported at once
    with pytest.raises(DependencyRejectedError) as info:
        validate_dependencies(["requests", "six", "bad;x"], limits)
    assert info.value.message.count(";") >= 2


def test_dependency_key_is_order_and_case_insensitive():
    a = validate_dependencies(["TextBlob", "nltk>=3"])
    b = validate_dependencies(["nltk >=3", "textblob"])
    assert dependency_key(a) == dependency_key(b)
    assert dependency_key(a) != dependency_key(validate_dependencies(["nltk", "textblob"]))


def _dist(site: Path, name: str, version: str, *, top_level: str | None = None, record: list[str] = ()) -> None:
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    if top_level is not None:
        (info / "top_level.txt").write_text(top_level)
    (info / "RECORD").write_text("\n".join(f"{r},sha256=x,1" for r in record))


def test_import_names_from_top_level_record_and_fallback(tmp_path):
    _dist(tmp_path, "scikit_learn", "1.5.0", top_level="sklearn\n")
    _dist(tmp_path, "textblob", "0.18.0", record=["textblob/__init__.py", "textblob/en/__init__.py",
                                                   "textblob-0.18.0.dist-info/RECORD"])
    _dist(tmp_path, "typing_extensions", "4.0", record=["typing_extensions.py", "__pycache__/x.pyc"])
    _dist(tmp_path, "pyyaml", "6.0", top_level="_yaml\nyaml\n")
    _dist(tmp_path, "regex", "2024.1", record=["regex/_regex.cpython-311-x86_64-linux-gnu.so", "regex/__init__.py"])
    names = import_names(tmp_path, ["scikit-learn", "TextBlob", "typing-extensions", "PyYAML", "regex", "missing-dist"])
    assert names == {
        "scikit-learn": ["sklearn"],
        "textblob": ["textblob"],
        "typing-extensions": ["typing_extensions"],
        "pyyaml": ["yaml"],
        "regex": ["regex"],
        "missing-dist": ["missing_dist"],
    }


def test_container_spec_carries_every_isolation_setting():
    import docker

    api = docker.APIClient(base_url="unix:///nonexistent.sock", version="1.41")
    limits = SandboxLimits(container_memory_bytes=300_000_000, pids=40, cpus=0.5, nofile=50, tmpfs_bytes=4_000_000)
    spec = container_spec(api, "img:tag", limits, {"LANG": "C.UTF-8"}, {"crossaudit.owner": "h:1"})
    hc = spec["host_config"]
    assert hc["NetworkMode"] == "none" and spec["network_disabled"] is True
    assert hc["ReadonlyRootfs"] is True
    assert hc["CapDrop"] == ["ALL"] and "CapAdd" not in hc
    assert hc["SecurityOpt"] == ["no-new-privileges"]
    assert hc["Memory"] == hc["MemorySwap"] == 300_000_000
    assert hc["PidsLimit"] >= 40 and hc["NanoCpus"] == 500_000_000
    ulimits = {u["Name"]: (u["Soft"], u["Hard"]) for u in hc["Ulimits"]}
    assert ulimits["core"] == (0, 0) and ulimits["nofile"][0] >= 50
    assert hc["Tmpfs"]["/tmp"].startswith("rw,noexec,nosuid,nodev,size=4000000")
    assert hc["AutoRemove"] is True and hc["LogConfig"]["Type"] == "none"
    assert not hc.get("Binds") and not hc.get("Mounts") and not hc.get("Privileged")
    assert spec["user"] == f"{SANDBOX_UID}:{SANDBOX_UID}" and spec["tty"] is False and spec["stdin_open"] is True
    assert spec["labels"][LABEL] == "1" and spec["use_config_proxy"] is False
    assert spec["environment"] == {"LANG": "C.UTF-8"}
    assert container_spec(api, "i", limits, {}, {}, uid=23456)["user"] == f"23456:{SANDBOX_UID}"


def test_every_container_gets_its_own_unprivileged_uid():
    lo, hi = SANDBOX_UID_RANGE
    alloc = UidAllocator(start=hi - 2)
    uids = [alloc.next() for _ in range(5)]
    assert uids == [hi - 2, hi - 1, lo, lo + 1, lo + 2]  # wraps inside the range
    assert all(u > 0 for u in uids) and len(set(uids)) == 5


def test_a_uid_another_orchestrators_container_holds_is_skipped():
    """Two allocators (two workers, two orchestrators on one daemon) walk the same range from
    random starts; where their walks meet, the uids the daemon's containers hold are skipped,
    or one tenant's fork bomb would refuse another tenant's threads."""
    lo, hi = SANDBOX_UID_RANGE
    alloc = UidAllocator(start=lo + 10)
    assert [alloc.next({lo + 10, lo + 11}), alloc.next({lo + 10, lo + 11})] == [lo + 12, lo + 13]
    with pytest.raises(EvaluatorUnavailableError, match="every sandbox uid"):  # one lap, not forever
        UidAllocator(start=lo).next(range(lo, hi))


def test_the_uids_in_use_come_from_the_containers_labels():
    class Api:
        def containers(self, *, all: bool, filters: dict) -> list[dict]:  # docker-py's names
            assert all and filters == {"label": [f"{LABEL}=1", UID_LABEL]}
            return [{"Labels": {UID_LABEL: "23456"}}, {"Labels": {UID_LABEL: "x"}}, {"Labels": None}]

    assert uids_in_use(Api()) == {23456}


def test_only_allowlisted_environment_variables():
    assert check_env({"LANG": "C", "OMP_NUM_THREADS": "1"}) == {"LANG": "C", "OMP_NUM_THREADS": "1"}
    with pytest.raises(ConfigurationError, match="AWS_SECRET_ACCESS_KEY"):
        check_env({"AWS_SECRET_ACCESS_KEY": "x"})
    assert not any(k.endswith(("KEY", "TOKEN", "SECRET", "PASSWORD")) for k in ENV_ALLOWLIST)
    assert "DOCKER_HOST" not in ENV_ALLOWLIST and "PATH" not in ENV_ALLOWLIST


def test_reaper_owner_liveness():
    host = socket.gethostname()
    assert _owner_alive(f"{host}:{os.getpid()}")
    assert not _owner_alive(f"{host}:999999999")
    assert not _owner_alive("garbage")
    assert _owner_alive("another-host-entirely:1")  # not ours to judge


def test_apt_sources_override_and_refusal(tmp_path, monkeypatch):
    good = tmp_path / "good.sources"
    good.write_text("Types: deb\nURIs: http://127.0.0.1/debian\nSuites: bookworm\nComponents: main\n")
    other = tmp_path / "other.list"
    other.write_text("deb http://127.0.0.1/ubuntu noble main\n")
    monkeypatch.setenv("CROSSAUDIT_APT_SOURCES", f"{good}{os.pathsep}{other}")
    assert host_apt_sources() == [good]
    monkeypatch.setenv("CROSSAUDIT_APT_SOURCES", str(other))
    with pytest.raises(ConfigurationError, match="apt sources"):
        host_apt_sources()


class _DeadDaemonClient:
    """Answers the ping, then every image/container call fails like a daemon that went away."""

    class _Api:
        def containers(self, **kw):
            return []

    def __init__(self) -> None:
        self.api = self._Api()

        class _Images:
            def get(self, ref):
                import requests

                raise requests.exceptions.ConnectionError("daemon went away")

        self.images = _Images()

    def ping(self):
        return True


async def test_daemon_failures_surface_as_typed_retryable_errors():
    from crossaudit.kernel.errors import EvaluatorUnavailableError
    from sandbox.base import CodeBundle
    from sandbox.docker.backend import DockerSandbox

    sb = DockerSandbox(client=_DeadDaemonClient())
    bundle = CodeBundle("def evaluate(p, r, c):\n    return {'score': 1.0}\n")
    try:
        with pytest.raises(EvaluatorUnavailableError) as info:
            await sb.prepare(bundle)
        assert info.value.retryable
        with pytest.raises(EvaluatorUnavailableError):
            await sb.run(bundle, "", "", {}, timeout=1)
    finally:
        await sb.aclose()


def test_the_lock_pins_each_wheel_by_its_sha256_sorted_by_name(tmp_path: Path) -> None:
    import hashlib

    wheels = {
        "zipp-3.20.0-py3-none-any.whl": b"zipp bytes",
        "Six-1.16.0-py2.py3-none-any.whl": b"six bytes",
    }
    for name, data in wheels.items():
        (tmp_path / name).write_bytes(data)
    lock = hash_lock(sorted(tmp_path.glob("*.whl")))
    six, zipp = (hashlib.sha256(d).hexdigest() for d in (b"six bytes", b"zipp bytes"))
    assert lock == (
        f"six==1.16.0 \\\n    --hash=sha256:{six}\n"
        f"zipp==3.20.0 \\\n    --hash=sha256:{zipp}\n"
    )


def test_a_lock_refuses_two_versions_of_one_distribution(tmp_path: Path) -> None:
    for name in ("six-1.16.0-py3-none-any.whl", "six-1.17.0-py3-none-any.whl"):
        (tmp_path / name).write_bytes(b"x")
    with pytest.raises(DependencyRejectedError, match="two wheels of six"):
        hash_lock(sorted(tmp_path.glob("*.whl")))
