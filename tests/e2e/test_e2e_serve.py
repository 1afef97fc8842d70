"""``crossaudit serve`` configuration: refusals are one line (exit 1), TLS works end to end."""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import ipaddress
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from crossaudit import Client
from crossaudit.kernel.errors import ServerUnavailableError
from tests.conftest import need
from tests.e2e.conftest import ROOT, ServerProcess, key, write_keys
from tests.e2e.policies import KEYWORDS, busy
from tests.e2e.test_workers import metrics

pytestmark = pytest.mark.e2e


def serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "crossaudit.cli", "serve", "--port", "0", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--dev", "--host", "0.0.0.0"), "only on loopback"),
        ((), "give --api-keys FILE"),
        (("--api-keys", "/nonexistent/keys.yaml"), "not found"),
        (("--dev", "--tls-cert", "x.pem"), "go together"),
    ],
)
def test_refused_configurations_are_one_clear_line(args: tuple[str, ...], message: str, tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    res = serve("--data-dir", str(tmp_path / "d"), *args, env=env)
    assert res.returncode == 1, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and message in lines[0], res.stderr
    assert "Traceback" not in res.stderr + res.stdout


def test_a_port_in_use_is_refused(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "crossaudit.cli",
                "serve",
                "--dev",
                "--port",
                str(port),
                "--data-dir",
                str(tmp_path / "d"),
                "--policies-dir",
                str(tmp_path),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert res.returncode == 1 and "cannot listen" in res.stderr and "Traceback" not in res.stderr


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        need(False, "the cryptography package is needed to make a test certificate")
    k = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(k.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(k, hashes.SHA256())
    )
    cert_path, key_path = tmp / "cert.pem", tmp / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    key_path.chmod(0o600)
    return cert_path, key_path


def test_tls_end_to_end(tmp_path: Path) -> None:
    cert, tls_key = _self_signed(tmp_path)
    write_keys(tmp_path / "unused.yaml")
    srv = ServerProcess(tmp_path, extra=("--tls-cert", str(cert), "--tls-key", str(tls_key)))
    srv.start()
    try:
        with Client(srv.address, api_key=key("acme"), tls=cert) as c:
            c.deploy_policy(KEYWORDS)
            assert c.evaluate("keywords", "p", "fine", timeout=10).passed
        plain = Client(srv.address, api_key=key("acme"), timeout=3)
        with plain, pytest.raises(ServerUnavailableError) as info:
            plain.list_policies()
        assert info.value.message.startswith(f"cannot reach the CrossAudit server at {srv.address}: it closed the")
        assert "needs --tls or --ca-cert" in info.value.message  # a plaintext client, a TLS server
    finally:
        assert srv.stop() == 0


def test_one_server_per_data_directory(tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path)
    srv.start()
    try:
        res = serve("--api-keys", str(tmp_path / "keys.yaml"), "--data-dir", str(tmp_path / "data"))
        assert res.returncode == 1 and "another crossaudit server" in res.stderr
    finally:
        assert srv.stop() == 0


def test_sigterm_lets_an_in_flight_decision_finish(tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path)
    srv.start()
    with Client(srv.address, api_key=key("acme")) as c:
        c.deploy_policy(busy(3.0))
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pending = pool.submit(c.evaluate, "busy", "p", "r", None, "production", 30.0)
            for _ in range(1200):  # bounded (60 s): until the call is being decided (was: a 0.3 s sleep)
                if metrics(srv)["crossaudit_inflight_evaluations"] >= 1 or pending.done():
                    break
                time.sleep(0.05)
            assert not pending.done(), "the call ended before SIGTERM: nothing was in flight"
            srv.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
            decision = pending.result(timeout=60)
    assert decision.passed and decision.decision_id
    assert srv.proc.wait(30) == 0  # type: ignore[union-attr]
    with sqlite3.connect(tmp_path / "data" / "crossaudit.db") as db:
        assert db.execute("SELECT COUNT(*) FROM decisions WHERE decision_id=?", (decision.decision_id,)).fetchone()[0]
