"""deploy/compose.yaml is valid for docker-compose (``docker-compose config``) and says what the
deployment needs, its evidence signing key and retention operator key included (files mounted as
secrets, named by path: never values, never variables; ``crossaudit config secrets`` makes every
file it mounts); the orchestrator and PostgreSQL Dockerfiles build FROM the local base only, run
as non-root users, and the orchestrator's entrypoint is ``crossaudit serve``. Static checks: the
real image build is tests/integration/test_orchestrator_image.py, the stack itself
tests/integration/test_compose_stack.py."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from crossaudit.cli import secretfiles
from crossaudit.cli.main import build_parser
from crossaudit.cli.server import settings_flags
from crossaudit.governance.evidence import load_keys, unsigned_log
from crossaudit.governance.retention import load_operator_keys
from crossaudit.kernel.errors import InvalidInputError
from crossaudit.service.auth import Authenticator
from crossaudit.service.config import ServerConfig
from crossaudit.service.settings import load_settings
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
        assert set(merged["secrets"]) == {"api-keys", "pgpass", "evidence-signing-key", "retention-operator-key"}
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
    assert set(doc["secrets"]) == {
        "api-keys", "pgpass", "postgres-password", "evidence-signing-key", "retention-operator-key"
    }  # fmt: skip
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


SECRETS_MOUNT = "/run/secrets/"  # where compose mounts a service's secrets (read-only bind mounts)
KEY_SETTINGS = {"evidence.signing_key_file": "evidence-signing-key",
                "retention.operator_key_file": "retention-operator-key"}  # fmt: skip


def _replica_config(cmd: list[str], monkeypatch: pytest.MonkeyPatch) -> ServerConfig:
    """The settings a replica's command line gives ``crossaudit serve`` (the image's entrypoint)."""
    for name in [n for n in os.environ if n.startswith("CROSSAUDIT_")]:
        monkeypatch.delenv(name)
    args = build_parser().parse_args(["serve", *cmd])
    return load_settings(None, settings_flags(args)).config


def test_every_replica_signs_its_log_with_a_key_file_mounted_as_a_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stack used to start with no evidence.signing_key_file: its logs were unsigned and
    `audit verify` said FAILED. Each replica's settings name the signing and operator keys as
    files compose mounts from its own secrets, so its start line has no UNSIGNED warning."""
    doc = _compose()
    for name, svc in _replicas(doc).items():
        merged = {**doc["x-orchestrator"], **svc}
        config = _replica_config(merged["command"], monkeypatch)
        assert unsigned_log(config.evidence, shared_store=bool(config.store_url)) is None, name
        paths = {"evidence.signing_key_file": config.evidence.signing_key_file,
                 "retention.operator_key_file": config.retention.operator_key_file}  # fmt: skip
        for setting, secret in KEY_SETTINGS.items():
            assert str(paths[setting]) == SECRETS_MOUNT + secret, (name, setting)
            assert secret in merged["secrets"], (name, secret)
            assert doc["secrets"][secret]["file"].startswith("${CROSSAUDIT_SECRETS_DIR:-./secrets}/")
        assert config.evidence.signing_key_env is None and config.retention.operator_key_env is None


def test_no_key_material_is_an_environment_variable_or_in_the_file() -> None:
    """Keys are files: a variable is in every process listing of /proc/PID/environ, in `docker
    inspect`, and inherited by every child; so neither the *_KEY_ENV settings nor a PEM."""
    doc = _compose()
    text = COMPOSE.read_text()
    assert "PRIVATE KEY" not in text and "_key_env" not in text.lower()
    for name, svc in doc["services"].items():
        merged = {**doc["x-orchestrator"], **svc} if name.startswith("orchestrator") else svc
        for var, value in (merged.get("environment") or {}).items():
            assert "KEY" not in var.upper() or str(value).startswith("/"), (name, var)


def test_the_secrets_command_makes_every_file_compose_mounts(tmp_path: Path) -> None:
    """`crossaudit config secrets DIR` writes exactly the files the stack mounts, owner-only, each
    one the server accepts (the signing key signs, the operator key loads, the API keys file
    authenticates), and a second run keeps them: a key is never replaced under a running log."""
    doc = _compose()
    mounted = {Path(s["file"]).name for s in doc["secrets"].values()}
    written = secretfiles.write_secret_files(tmp_path / "secrets", tenant="acme")
    assert {n for n, new in written} == mounted and all(new for _, new in written)
    d = tmp_path / "secrets"
    assert stat.S_IMODE(d.stat().st_mode) == secretfiles.DIR_MODE
    for name in mounted:
        assert stat.S_IMODE((d / name).stat().st_mode) == secretfiles.PRIVATE_MODE, name
    assert stat.S_IMODE((d / secretfiles.EVIDENCE_PUBLIC).stat().st_mode) == secretfiles.PUBLIC_MODE
    config = ServerConfig(data_dir=tmp_path, store_url="postgresql://crossaudit@postgres:5432/crossaudit")
    evidence = replace(config.evidence, signing_key_file=d / secretfiles.EVIDENCE_KEY)
    key, _ = load_keys(evidence, None, shared_store=True)
    assert key is not None and key.public.pem() == (d / secretfiles.EVIDENCE_PUBLIC).read_text()
    assert load_operator_keys(replace(config.retention, operator_key_file=d / secretfiles.OPERATOR_KEY)) is not None
    assert Authenticator.from_file(d / secretfiles.API_KEYS).tenants == ["acme"]
    password = (d / secretfiles.POSTGRES_PASSWORD).read_text().strip()
    assert (d / secretfiles.PGPASS).read_text() == f"postgres:5432:crossaudit:crossaudit:{password}\n"
    before = {n: (d / n).read_bytes() for n in mounted}
    assert not any(new for _, new in secretfiles.write_secret_files(d))
    assert {n: (d / n).read_bytes() for n in mounted} == before
    (d / secretfiles.PGPASS).unlink()  # one password in two files: never made up for one of them
    with pytest.raises(InvalidInputError, match="both hold one password"):
        secretfiles.write_secret_files(d)


def test_the_secrets_command_prints_no_value_and_refuses_a_shared_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from crossaudit.cli.main import main

    d = tmp_path / "secrets"
    assert main(["config", "secrets", str(d)]) == 0
    said = "".join(capsys.readouterr())
    for name in secretfiles.SECRET_FILES:
        text = (d / name.name).read_text()
        for word in re.findall(r"[A-Za-z0-9+/=]{24,}", text):  # keys, passwords, base64 lines
            assert word not in said, name.name
    assert "sudo chown 10003:10003" in said and secretfiles.EVIDENCE_PUBLIC in said
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    assert main(["config", "secrets", str(shared)]) == 1
    assert "writable by other users" in capsys.readouterr().err and not list(shared.iterdir())


def test_the_secrets_command_names_the_images_users() -> None:
    """Compose mounts a secret file as it is: it must belong to the uid the image runs as."""
    for dockerfile, uid in ((ORCHESTRATOR_DOCKERFILE, secretfiles.ORCHESTRATOR_UID),
                            (POSTGRES_DOCKERFILE, secretfiles.POSTGRES_UID)):  # fmt: skip
        (user,) = re.findall(r"^USER\s+(\S+)", dockerfile.read_text(), flags=re.M)
        assert user == f"{uid}:{uid}", dockerfile
    hint = secretfiles.chown_hint(Path("deploy/secrets"))
    assert f"sudo chown {secretfiles.POSTGRES_UID}:{secretfiles.POSTGRES_UID} deploy/secrets/postgres-password" in hint
    assert f"deploy/secrets/{secretfiles.EVIDENCE_KEY}" in hint.split(" && ")[0]


def test_no_secret_file_can_enter_the_orchestrator_image() -> None:
    """The image installs a wheel built from a copy of the tree that leaves deploy/ out, so
    deploy/secrets/ (the keys) is never baked into an image, whatever is in it at build time."""
    from crossaudit.service.image import _SKIP

    assert {"deploy", ".crossaudit"} <= set(_SKIP(str(ROOT), ["deploy", ".crossaudit", "crossaudit"]))
