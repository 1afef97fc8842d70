"""deploy/compose.yaml is valid for docker-compose (``docker-compose config``) and says what the
deployment needs; the orchestrator and PostgreSQL Dockerfiles build FROM the local base only, run
as non-root users, and the orchestrator's entrypoint is ``crossaudit serve``. Static checks: the
real image build is tests/integration/test_orchestrator_image.py."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import need

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "deploy" / "compose.yaml"
ORCHESTRATOR_DOCKERFILE = ROOT / "images" / "orchestrator" / "Dockerfile"
POSTGRES_DOCKERFILE = ROOT / "deploy" / "postgres" / "Dockerfile"
CONFIG_TIMEOUT_S = 60


def _compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def _replicas(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: svc for name, svc in doc["services"].items() if name.startswith("orchestrator")}


def test_docker_compose_config_validates_it(tmp_path: Path) -> None:
    exe = shutil.which("docker-compose")
    need(exe is not None, "docker-compose is not installed (Debian: apt-get install docker-compose)")
    assert exe is not None
    proc = subprocess.run(
        [exe, "-f", str(COMPOSE), "config"], capture_output=True, text=True, timeout=CONFIG_TIMEOUT_S, check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "CROSSAUDIT_SECRETS_DIR": str(tmp_path)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    resolved = yaml.safe_load(proc.stdout)
    assert set(resolved["services"]) == {"postgres", "orchestrator-1", "orchestrator-2"}
    for svc in _replicas(resolved).values():
        assert any(a.startswith("--store=postgresql://") for a in svc["command"])  # the anchor merged
    assert resolved["secrets"]["api-keys"]["file"].startswith(str(tmp_path))


def test_two_replicas_share_postgres_and_drive_the_hosts_daemon() -> None:
    doc = _compose()
    replicas = _replicas(doc)
    assert len(replicas) == 2
    for name, svc in replicas.items():
        merged = {**doc["x-orchestrator"], **svc}
        cmd = merged["command"]
        assert merged["image"] == "crossaudit/orchestrator:latest", name
        store = next(a for a in cmd if a.startswith("--store="))
        assert re.fullmatch(r"--store=postgresql://crossaudit@postgres:5432/crossaudit", store), store  # no password
        assert "--api-keys=/run/secrets/api-keys" in cmd
        assert set(merged["secrets"]) == {"api-keys", "pgpass"}
        assert merged["environment"]["PGPASSFILE"] == "/run/secrets/pgpass"
        assert "/var/run/docker.sock:/var/run/docker.sock" in merged["volumes"], name
        assert merged["read_only"] is True and merged["cap_drop"] == ["ALL"]
        assert merged["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_ports_are_published_on_loopback_only() -> None:
    doc = _compose()
    published = [p for svc in doc["services"].values() for p in svc.get("ports", [])]
    assert published, "the replicas publish their gRPC ports"
    for port in published:
        assert str(port).startswith("127.0.0.1:"), port
    assert "ports" not in doc["services"]["postgres"]
    assert doc["networks"]["backend"]["internal"] is True


def test_secrets_come_from_files() -> None:
    doc = _compose()
    assert set(doc["secrets"]) == {"api-keys", "pgpass", "postgres-password"}
    for secret in doc["secrets"].values():
        assert set(secret) == {"file"}
    inline = re.findall(r"^\s*[A-Za-z_]*PASSWORD\s*:.*$", COMPOSE.read_text(), flags=re.M | re.I)
    assert not inline, inline  # a password only ever as a file (POSTGRES_PASSWORD_FILE, pgpass)


def test_orchestrator_dockerfile_is_local_non_root_and_serves() -> None:
    text = ORCHESTRATOR_DOCKERFILE.read_text()
    froms = re.findall(r"^FROM\s+(\S+)", text, flags=re.M)
    assert froms and all(f == "${BASE}" for f in froms), froms  # only the local base, never a registry image
    assert re.search(r"^ARG BASE=crossaudit/base$", text, flags=re.M)
    (user,) = re.findall(r"^USER\s+(\S+)", text, flags=re.M)
    assert not user.startswith(("0", "root")), user
    assert 'ENTRYPOINT ["crossaudit", "serve"]' in text
    assert "--no-index" in text  # installed from the context's wheels: the build needs no network
    assert "HEALTHCHECK" not in text  # probes use grpc.health.v1


def test_postgres_dockerfile_is_local_and_non_root() -> None:
    text = POSTGRES_DOCKERFILE.read_text()
    assert re.findall(r"^FROM\s+(\S+)", text, flags=re.M) == ["${BASE}"]
    (user,) = re.findall(r"^USER\s+(\S+)", text, flags=re.M)
    assert not user.startswith(("0", "root")), user
    assert "dpkg -i" in text and "apt-get" not in text.split("FROM", 1)[1]  # no network in the build
