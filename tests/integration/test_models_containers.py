"""Model servers as hardened containers, through the pool (``isolation="docker"``).

A real Presidio server runs from its image (built once per content tag from the local base, then
cached by Docker): pattern entities with no model, then PERSON from a spaCy pipeline mounted
read-only, which replaces the container with one holding the mount. The containers' host config
is checked (no network, read-only root, capabilities dropped, non-root, limits), writes to the
root and to the model mount fail, a killed container is restarted, and close removes them all.
"""

from __future__ import annotations

import asyncio
import os

import pytest

from crossaudit.kernel.errors import ConfigurationError
from crossaudit.kernel.ownership import owner_id
from crossaudit.modelserver import containers
from crossaudit.modelserver.pool import ModelServerLimits, ModelServerPool
from crossaudit.modelserver.testing import build_spacy_pipeline
from tests.conftest import need

pytestmark = [pytest.mark.models, pytest.mark.docker, pytest.mark.slow]

TEXT = "Mail john@example.com or call John Smith, card 4111 1111 1111 1111."
LIMITS = ModelServerLimits(container_memory_bytes=768 * 1024**2, container_pids=128)


@pytest.fixture(scope="module")
def presidio_image(docker_daemon) -> str:
    from crossaudit.modelserver.images import build

    try:
        return build("presidio")
    except ConfigurationError as exc:  # no local base, no PyPI, no apt: say which
        need(False, f"the presidio model-server image cannot be built here: {exc}")
        raise


def _own_containers(client) -> list:
    return client.containers.list(all=True, filters={"label": f"{containers.OWNER_LABEL}={owner_id()}"})


async def test_presidio_container_is_hardened_and_serves_through_the_pool(
    docker_daemon, presidio_image, tmp_path
) -> None:
    pipeline = build_spacy_pipeline(tmp_path / "pipeline")
    pool = ModelServerPool(LIMITS, isolation="docker", images={"presidio": presidio_image})
    try:
        # Pattern entities need no model: a container with no model mounts.
        v = await pool.analyze("presidio", {"model": "presidio", "entities": ["EMAIL_ADDRESS", "CREDIT_CARD"]},
                               "", TEXT, timeout=120)
        assert {(s.label, TEXT[s.start:s.end]) for s in v.spans} == {
            ("EMAIL_ADDRESS", "john@example.com"), ("CREDIT_CARD", "4111 1111 1111 1111")}
        first = (await pool.health("presidio"))["container"]
        assert first

        c = docker_daemon.containers.get(first)
        host = c.attrs["HostConfig"]
        assert host["NetworkMode"] == "none"
        assert host["ReadonlyRootfs"] is True
        assert host["CapDrop"] == ["ALL"]
        assert "no-new-privileges" in host["SecurityOpt"]
        assert host["Memory"] == LIMITS.container_memory_bytes
        assert host["PidsLimit"] == LIMITS.container_pids
        assert "/tmp" in host["Tmpfs"]
        assert c.attrs["Config"]["User"] not in ("", "0", "root", "0:0")
        assert c.labels[containers.LABEL] == "presidio"
        assert c.labels[containers.OWNER_LABEL] == owner_id()
        networks = c.attrs["NetworkSettings"]["Networks"]
        assert set(networks) <= {"none"}
        code, out = c.exec_run(["python3", "-c", "open('/etc/x', 'w')"])
        assert code != 0 and b"Read-only file system" in out

        # A model path: the container is replaced by one that mounts it read-only; the config the
        # server receives names the in-container path, and the evaluator's details only its basename.
        cfg = {"model": "presidio", "spacy_model_path": pipeline, "entities": ["PERSON", "EMAIL_ADDRESS"]}
        v = await pool.analyze("presidio", cfg, "", TEXT, timeout=120)
        assert {(s.label, TEXT[s.start:s.end]) for s in v.spans} == {
            ("EMAIL_ADDRESS", "john@example.com"), ("PERSON", "John Smith")}
        health = await pool.health("presidio")
        second = health["container"]
        assert second != first
        target = health["mounts"][pipeline]
        assert target.startswith(f"{containers.MODEL_ROOT}/presidio/")
        c = docker_daemon.containers.get(second)
        mounts = {m["Destination"]: m for m in c.attrs["Mounts"]}
        assert mounts[target]["RW"] is False and mounts[target]["Source"] == pipeline
        assert mounts[containers.SOCKET_DIR]["RW"] is True
        code, out = c.exec_run(["python3", "-c", f"open('{target}/new', 'w')"], user="0")  # even as root
        assert code != 0 and b"Read-only file system" in out
        for _ in range(600):  # bounded (60 s): the replaced container finished its calls and was removed
            if first not in {x.id for x in _own_containers(docker_daemon)}:
                break
            await asyncio.sleep(0.1)
        assert first not in {x.id for x in _own_containers(docker_daemon)}

        # Restart semantics as for subprocesses: a killed container is replaced on the next call.
        c.kill()
        for _ in range(100):
            if not pool._servers["presidio"].alive:
                break
            await asyncio.sleep(0.1)
        v = await pool.analyze("presidio", cfg, "", TEXT, timeout=120)
        assert "PERSON" in {s.label for s in v.spans}
        third = (await pool.health("presidio"))["container"]
        assert third not in (first, second)
    finally:
        await pool.aclose()
    assert _own_containers(docker_daemon) == []  # close removed every container it started


async def test_detoxify_onnx_export_served_from_a_read_only_mount(docker_daemon, tmp_path) -> None:
    """The torch-free detoxify image serves an export mounted read-only, with in-process ONNX's scores."""
    import importlib.util

    from crossaudit.modelserver.export import export_detoxify
    from crossaudit.modelserver.images import build
    from crossaudit.modelserver.pool import InProcessModels
    from crossaudit.modelserver.testing import build_tiny_detoxify

    stack = ("torch", "transformers", "onnx", "onnxscript", "onnxruntime")
    missing = [m for m in stack if importlib.util.find_spec(m) is None]
    need(not missing, f"{', '.join(missing)} not installed (make export-deps)")
    try:
        tag = build("detoxify")
    except ConfigurationError as exc:
        need(False, f"the detoxify model-server image cannot be built here: {exc}")
        raise
    tiny = build_tiny_detoxify(tmp_path / "ckpt", seed=3)
    out = str(tmp_path / "export")
    export_detoxify(tiny.checkpoint, tiny.config_dir, out, int8=False)
    os.chmod(out, 0o755)  # written as a private temporary directory; the container's uid must read it
    cfg = {"model": "detoxify", "checkpoint": out, "threshold": 0.5}
    text = "you are an idiot"
    local = InProcessModels()
    pool = ModelServerPool(LIMITS, isolation="docker", images={"detoxify": tag})
    try:
        want = await local.analyze("detoxify", cfg, "", text, timeout=60)
        got = await pool.analyze("detoxify", cfg, "", text, timeout=120)
        assert got.score == pytest.approx(want.score, abs=1e-5)
        assert got.details["checkpoint"] == "export"
        health = await pool.health("detoxify")
        c = docker_daemon.containers.get(health["container"])
        mount = {m["Destination"]: m for m in c.attrs["Mounts"]}[health["mounts"][out]]
        assert mount["RW"] is False and mount["Source"] == out
        assert c.attrs["HostConfig"]["NetworkMode"] == "none" and c.attrs["HostConfig"]["ReadonlyRootfs"] is True
        code, log = c.exec_run(["python3", "-c", "import torch"])
        assert code != 0 and b"torch" in log  # the serving image carries no torch
    finally:
        await pool.aclose()
        await local.aclose()
    assert _own_containers(docker_daemon) == []
