"""The orchestrator image, really built (``python -m crossaudit.service.image build``, as ``make
image``) FROM the local base, then run with no network but its own loopback: ``crossaudit serve``
is the entrypoint, the user is not root, and a ``--dev`` server inside answers health checks and
evaluates a policy whose custom code runs in a Docker sandbox started through the host's socket."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator

import pytest

from tests.conftest import need
from tests.e2e.policies import word_policy
from tests.images import built_tag

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.deploy_image]

RUN_TIMEOUT_S = 240

# Runs inside the container: start `crossaudit serve --dev` on loopback, wait (bounded) for health,
# deploy a policy blocking 'bad' (a custom evaluator), evaluate, print one line per check, stop it.
PROBE = r"""
import signal, subprocess, sys, time
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from crossaudit import Client

POLICY = __POLICY__
server = subprocess.Popen(["crossaudit", "serve", "--dev", "--host", "127.0.0.1", "--port", "50051",
                           "--sandbox", "docker", "--data-dir", "/var/lib/crossaudit", "--policies-dir", "/tmp/none"])
try:
    status = None
    with grpc.insecure_channel("127.0.0.1:50051") as ch:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and server.poll() is None:
            try:
                status = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=2).status
                break
            except grpc.RpcError:
                time.sleep(0.5)
    print("HEALTH", health_pb2.HealthCheckResponse.ServingStatus.Name(status or 0), flush=True)
    with Client("127.0.0.1:50051", timeout=120) as c:
        print("BACKEND", c.server_info().sandbox_backend, flush=True)
        c.deploy_policy(POLICY)
        d = c.evaluate("probe", prompt="p", response="bad", timeout=60)
        print("DECISION", d.passed, d.action, flush=True)
finally:
    server.send_signal(signal.SIGTERM)
    print("EXIT", server.wait(30), flush=True)
""".replace("__POLICY__", repr(word_policy("probe")))


def _docker(*args: str, timeout: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def image(docker_daemon: object) -> str:
    """Built by ``make test-images`` before the suite (minutes on a new machine), never here."""
    return built_tag("orchestrator")


@pytest.fixture
def container_name() -> Iterator[str]:
    name = f"crossaudit-image-test-{uuid.uuid4().hex[:12]}"
    try:
        yield name
    finally:
        _docker("rm", "-f", name, timeout=60)


def test_entrypoint_is_crossaudit_serve_as_a_non_root_user(image: str) -> None:
    inspect = _docker("image", "inspect", "--format", "{{json .Config.Entrypoint}} {{.Config.User}}", image)
    assert inspect.returncode == 0, inspect.stderr
    entrypoint, user = inspect.stdout.split()
    assert entrypoint == '["crossaudit","serve"]'
    assert user.split(":")[0] not in {"", "0", "root"}
    ident = _docker("run", "--rm", "--network", "none", "--entrypoint", "id", image, "-u")
    assert ident.returncode == 0 and int(ident.stdout) != 0, ident.stdout + ident.stderr
    helped = _docker("run", "--rm", "--network", "none", image, "--help")
    assert helped.returncode == 0, helped.stderr[-2000:]
    assert "usage: crossaudit serve" in helped.stdout
    base = _docker("image", "inspect", "--format", "{{range .Config.Env}}{{println .}}{{end}}", image)
    assert any(line.startswith("CROSSAUDIT_BASE_IMAGE=crossaudit/base:") for line in base.stdout.splitlines())


def test_serves_and_runs_custom_code_through_the_hosts_daemon(image: str, container_name: str) -> None:
    sock_gid = _docker("run", "--rm", "--network", "none", "-v", "/var/run/docker.sock:/s", "--entrypoint", "stat",
                       image, "-c", "%g", "/s")  # fmt: skip
    gid = sock_gid.stdout.strip() if sock_gid.returncode == 0 else ""
    need(gid.isdigit(), f"cannot read the Docker socket's group: {sock_gid.stderr[-300:]}")
    proc = _docker(
        "run", "--rm", "--name", container_name, "--init", "--network", "none", "--read-only",
        "--tmpfs", "/tmp", "--tmpfs", "/var/lib/crossaudit:uid=10003,gid=10003,mode=0700",
        "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
        "-v", "/var/run/docker.sock:/var/run/docker.sock", "--group-add", gid,
        "--entrypoint", "python3", image, "-c", PROBE,
    )  # fmt: skip
    out = proc.stdout
    assert proc.returncode == 0, out[-2000:] + proc.stderr[-3000:]
    assert "HEALTH SERVING" in out, out + proc.stderr[-3000:]
    assert "BACKEND docker" in out
    assert "DECISION False block" in out, out + proc.stderr[-3000:]
    assert "EXIT 0" in out
