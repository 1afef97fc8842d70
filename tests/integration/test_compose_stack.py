"""deploy/compose.yaml, really up: PostgreSQL (built locally) and two orchestrator replicas driving
the host's Docker daemon. A policy deployed through one replica is evaluated through both with
custom code in Docker, and every decision is in the shared audit log; then the stack goes down."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from crossaudit import Client
from crossaudit.cli import secretfiles
from crossaudit.evidence.notes import load_public_key
from crossaudit.kernel.errors import CrossAuditError
from tests.conftest import ROOT, need
from tests.e2e.policies import KEYWORDS
from tests.images import built_tag

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.deploy_image]

KEY = "acme-compose-key-0123456789abcdef"
REPLICAS = ("127.0.0.1:50051", "127.0.0.1:50052")  # as deploy/compose.yaml publishes them
UP_TIMEOUT_S = 180


def _compose(project: str, env: dict[str, str], *args: str, timeout: float = UP_TIMEOUT_S):
    cmd = ["docker-compose", "-f", str(ROOT / "deploy" / "compose.yaml"), "-p", project, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, env=env)


@pytest.fixture(scope="module")
def stack(docker_daemon: object) -> Iterator[tuple[str, Path]]:
    need(shutil.which("docker-compose") is not None, "docker-compose is not installed")
    need(os.geteuid() == 0, "the secrets must belong to the images' users (needs root)")
    # compose.yaml runs the :latest tags, which `make test-images` moves to what it built
    built_tag("orchestrator")
    built_tag("postgres")
    secrets = Path(tempfile.mkdtemp(prefix="compose-secrets-"))
    secrets.chmod(0o755)
    keys = secrets / secretfiles.API_KEYS  # ours (a known key); the command makes every other file
    keys.write_text(f'tenants:\n  acme:\n    keys: ["{KEY}"]\n')
    keys.chmod(0o600)
    secretfiles.write_secret_files(secrets)
    secretfiles.set_owners(secrets)  # as `crossaudit config secrets --owners` does
    project = f"crossaudit-test-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "CROSSAUDIT_SECRETS_DIR": str(secrets),
        "DOCKER_GID": str(os.stat("/var/run/docker.sock").st_gid),
    }
    up = _compose(project, env, "up", "-d")
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        yield project, secrets
    finally:
        logs = _compose(project, env, "logs", "--tail", "30", timeout=60).stdout
        down = _compose(project, env, "down", "-v", timeout=120)
        shutil.rmtree(secrets, ignore_errors=True)
        print(logs[-4000:])
        assert down.returncode == 0, down.stderr[-2000:]


def _ready(address: str) -> None:
    deadline = time.monotonic() + UP_TIMEOUT_S
    while True:
        try:
            with Client(address, api_key=KEY, timeout=5) as c:
                c.server_info()
            return
        except CrossAuditError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def test_two_replicas_share_postgresql_and_run_custom_code_in_docker(stack: tuple[str, Path]) -> None:
    for address in REPLICAS:
        _ready(address)
    with Client(REPLICAS[0], api_key=KEY, timeout=300) as c:
        c.deploy_policy(KEYWORDS)
    time.sleep(1.5)  # deployment_recheck_s on the other replica
    ids = []
    for i in range(10):
        with Client(REPLICAS[i % 2], api_key=KEY, timeout=120) as c:
            d = c.evaluate("keywords", "p", "bad" if i % 2 else "fine", timeout=60)
            assert d.passed is (i % 2 == 0)
            ids.append(d.decision_id)
    with Client(REPLICAS[1], api_key=KEY, timeout=60) as c:
        audited = {d.decision_id for d in c.list_decisions(policy="keywords")}
        info = c.server_info()
    assert set(ids) <= audited and info.sandbox_backend == "docker"
    # both replicas sign the shared log with the one key the stack mounts: it verifies under its
    # public half (the stack used to run without a key: every log unsigned, verify FAILED)
    pem = (stack[1] / secretfiles.EVIDENCE_PUBLIC).read_text()
    public = load_public_key(pem, "evidence-public.pem", "crossaudit")  # evidence.key_name's default
    for address in REPLICAS:
        with Client(address, api_key=KEY, timeout=120) as c:
            info = c.log_key()
            assert info.signing and info.key is not None and info.key.raw == public.raw
            report = c.verify_log([public])
            assert report.ok, report.summary()
