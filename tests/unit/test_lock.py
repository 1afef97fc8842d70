"""One lock, installed exactly: uv.lock agrees with pyproject.toml, .venv holds exactly its versions,
and everything derived from it (uv's bootstrap pin, the images' requirements, the stubs) is in step."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from crossaudit.imagebuild import locked
from tools import generate_protos, lockfiles

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "uv.lock"
FIX = "run `make lock` and commit uv.lock with what it regenerates"


def _lock() -> dict:
    with LOCK.open("rb") as f:
        return tomllib.load(f)


def _locked_versions() -> dict[str, str]:
    return {locked.normalize(p["name"]): p["version"] for p in _lock()["package"]}


def _uv() -> str:
    """The uv the Makefile bootstrapped, else the locked one in .venv (both are the lock's pin)."""
    for candidate in (ROOT / ".crossaudit" / "uv" / "bin" / "uv", Path(sys.prefix) / "bin" / "uv"):
        if candidate.is_file():
            return str(candidate)
    pytest.fail("no uv: `make venv` bootstraps it from tools/uv.requirements.txt")


def test_the_lock_agrees_with_pyproject() -> None:
    """`uv lock --check` resolves nothing new: a range edited in pyproject.toml without `make lock` fails here."""
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never", "UV_OFFLINE": "1"}
    proc = subprocess.run([_uv(), "lock", "--check", "--offline", "--python", sys.executable],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, env=env, check=False)
    assert proc.returncode == 0, f"pyproject.toml and uv.lock disagree: {FIX}\n{proc.stderr[-2000:]}"


def test_every_locked_file_has_a_hash() -> None:
    for package in _lock()["package"]:
        if "registry" not in package.get("source", {}):
            continue  # the project itself (editable)
        files = [*package.get("wheels", []), *([package["sdist"]] if "sdist" in package else [])]
        assert files and all(re.fullmatch(r"sha256:[0-9a-f]{64}", f.get("hash", "")) for f in files), package["name"]


def test_the_venv_holds_exactly_the_locked_versions() -> None:
    """Every distribution in the running environment is in the lock at the locked version: nothing
    was resolved at install time, and nothing unlocked (a stray pip install) slipped in."""
    if not Path(sys.prefix, "pyvenv.cfg").is_file() or Path(sys.prefix).name != ".venv":
        pytest.skip("not running from the project's .venv (make creates it)")
    lock = _locked_versions()
    wrong = {}
    for dist in importlib.metadata.distributions():
        name = locked.normalize(dist.metadata["Name"])
        if lock.get(name) != dist.version:
            wrong[name] = (dist.version, lock.get(name, "not in uv.lock"))
    assert not wrong, f"installed ≠ locked: {wrong}; `make venv` syncs .venv to uv.lock"


def test_uv_is_bootstrapped_from_the_locked_pin() -> None:
    pins = locked.pinned(lockfiles.UV_REQUIREMENTS)
    assert pins == {"uv": _locked_versions()["uv"]}, FIX


def test_derived_files_are_what_the_lock_gives() -> None:
    """tools/uv.requirements.txt and the images' requirements under crossaudit/imagebuild/locked/."""
    stale = [str(p.relative_to(ROOT)) for p, text in lockfiles.expected_files().items()
             if not p.is_file() or p.read_text() != text]
    assert not stale, f"stale: {stale}: {FIX}"


def test_image_requirements_pin_the_locked_versions() -> None:
    lock = _locked_versions()
    for path in sorted(locked.LOCKED_DIR.glob("*.txt")):
        pins = locked.pinned(path)
        assert pins, path.name
        assert {name: lock.get(name) for name in pins} == pins, path.name
        for line in path.read_text().splitlines():
            if "==" in line:
                assert line.endswith("\\"), f"{path.name}: {line} has no --hash"
    assert {"pip", "tzdata", "grpcio"} <= set(locked.pinned(locked.requirements_file("orchestrator")))
    assert "onnxruntime" in locked.pinned(locked.requirements_file("modelserver-detoxify"))
    assert "torch" not in locked.pinned(locked.requirements_file("modelserver-detoxify"))


def test_stubs_say_they_were_made_by_the_locked_grpcio_tools() -> None:
    """The stub check regenerates with the installed grpcio-tools; this pins that to the lock's, so a
    fresh clone compares against the same generator that made the committed files."""
    tools_version = _locked_versions()["grpcio-tools"]
    assert importlib.metadata.version("grpcio-tools") == tools_version, FIX
    stubs = sorted(generate_protos.PACKAGE_DIR.glob("*_pb2_grpc.py"))
    assert stubs
    for stub in stubs:
        stated = re.search(r"^GRPC_GENERATED_VERSION = '([^']+)'", stub.read_text(), re.MULTILINE)
        assert stated and stated[1] == tools_version, f"{stub.name}: run `make proto` with the locked grpcio-tools"


def test_closure_follows_extras_and_markers() -> None:
    lock = {"package": [
        {"name": "a", "version": "1", "source": {"registry": "r"}, "wheels": [{"hash": "sha256:" + "1" * 64}],
         "dependencies": [{"name": "b", "extra": ["x"]}, {"name": "c", "marker": "platform_machine == 'aarch64'"}]},
        {"name": "b", "version": "2", "source": {"registry": "r"}, "sdist": {"hash": "sha256:" + "2" * 64},
         "optional-dependencies": {"x": [{"name": "d"}]}},
        {"name": "c", "version": "3", "source": {"registry": "r"}, "wheels": [{"hash": "sha256:" + "3" * 64}]},
        {"name": "d", "version": "4", "source": {"registry": "r"}, "wheels": [{"hash": "sha256:" + "4" * 64}]},
    ]}
    x86 = locked.closure(lock, [("a", ())], locked.image_environment("x86_64"))
    arm = locked.closure(lock, [("a", ())], locked.image_environment("aarch64"))
    assert [p.name for p in x86] == ["a", "b", "d"]
    assert [p.name for p in arm] == ["a", "b", "c", "d"]
    text = locked.render("h", {"x86_64": x86, "aarch64": arm})
    assert "c==3 ; platform_machine == 'aarch64' \\" in text
    assert "b==2 \\\n    --hash=sha256:" + "2" * 64 in text
