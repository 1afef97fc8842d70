"""An installed wheel carries everything needed to build and run the images: the Dockerfiles,
the runner entry, the agent package, the protos and the model-server sources, found relative
to the installed package rather than to a repository checkout."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT_S = 300
SKIP = shutil.ignore_patterns(".git", ".venv", "__pycache__", "build", "*.egg-info", ".crossaudit", ".pytest_cache",
                              ".ruff_cache", ".mypy_cache", "tests", "docs", "policies")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    shutil.copytree(ROOT, src, ignore=SKIP)  # a copy: the build must not leave build/ in the checkout
    out = work / "dist"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", "wheel", "--no-deps", "--no-build-isolation",
         "-q", "-w", str(out), str(src)],
        capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    (built,) = out.glob("crossaudit-*.whl")
    return built


def test_wheel_holds_images_agent_and_stubs(wheel: Path) -> None:
    """The three top-level packages, the images (from images/, as crossaudit/images) and the
    generated stubs; the .proto sources stay in the repository (protos/), the only copy."""
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in (
        "crossaudit/images/runner/Dockerfile",
        "crossaudit/images/runner/entry.py",
        "crossaudit/images/modelserver/Dockerfile",
        "crossaudit/images/base/README.md",
        "crossaudit/images/orchestrator/Dockerfile",
        "sandbox/agent/__init__.py",
        "sandbox/docker/images.py",
        "crossaudit/imagebuild/__init__.py",
        "orchestrator/engine/engine.py",
        "crossaudit/v1/evaluation_pb2.py",
        "crossaudit/modelserver/server.py",
    ):
        assert required in names, required
    tops = {n.split("/")[0] for n in names} - {n.split("/")[0] for n in names if ".dist-info" in n}
    assert tops == {"crossaudit", "orchestrator", "sandbox"}
    assert not [n for n in names if n.endswith(".proto")]


def test_installed_wheel_finds_its_image_sources(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(target)  # a wheel is a zip laid out as site-packages
    probe = (
        "import json\n"
        "from sandbox.docker import images as d\n"
        "from crossaudit.modelserver import images as m\n"
        "print(json.dumps({'runner': str(d.RUNNER_DIR), 'agent': sorted(p.name for p in d.AGENT_DIR.glob('*.py')),\n"
        "  'dockerfile': (d.RUNNER_DIR / 'Dockerfile').is_file(), 'entry': (d.RUNNER_DIR / 'entry.py').is_file(),\n"
        "  'app': [rel for rel, src in m.app_files() if src.is_file()],\n"
        "  'model_dockerfile': str(m.DOCKERFILE) if m.DOCKERFILE.is_file() else ''}))\n"
    )
    env = {"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin", "PYTHONNOUSERSITE": "1"}
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=120, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = json.loads(proc.stdout)
    assert found["runner"].startswith(str(target))  # the installed copy, not the checkout
    assert found["dockerfile"] and found["entry"]
    assert "__init__.py" in found["agent"]
    assert "crossaudit/modelserver/server.py" in found["app"] and "crossaudit/kernel/errcodec.py" in found["app"]
    assert found["model_dockerfile"].startswith(str(target))  # the one recipe, built per model
