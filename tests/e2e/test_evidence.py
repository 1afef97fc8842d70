"""The verifiable decision log through a real server and the CLI, as an auditor and an attacker
use it: verify, export and verify offline, proofs, receipts; a row edited in the database found
by its sequence number; a bundle changed by one byte refused; tenants confined to their own log;
an auditor key that reads and changes nothing; a bad signing key stopping the start with one line."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from crossaudit import Client
from crossaudit.evidence.notes import generate_private_pem
from crossaudit.kernel.errors import NotFoundError
from crossaudit.v1 import audit_pb2, audit_pb2_grpc, evaluation_pb2, evaluation_pb2_grpc
from tests.e2e.conftest import ROOT, TENANT_KEYS, ServerProcess, key, run_cli
from tests.e2e.policies import KEYWORDS

pytestmark = pytest.mark.e2e

AUDITOR_KEY = "acme-auditor-key-0123456789abcdef"
KEYS_FILE = f"""
tenants:
  acme:
    keys:
      - {TENANT_KEYS["acme"]}
      - {{key: {AUDITOR_KEY}, role: auditor, name: eve}}
  globex: [{TENANT_KEYS["globex"]}]
"""
DECISIONS = 6


@pytest.fixture(scope="module")
def signing_key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "signing.pem"
    path.write_bytes(generate_private_pem())
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory, signing_key: Path) -> Iterator[ServerProcess]:
    extra = ("--set", f"evidence.signing_key_file={signing_key}", "--set", "evidence.checkpoint_every=4")
    with ServerProcess(tmp_path_factory.mktemp("evidence"), keys_text=KEYS_FILE, extra=extra) as s:
        for tenant in ("acme", "globex"):
            with Client(s.address, api_key=key(tenant)) as c:
                c.deploy_policy(KEYWORDS)
                for i in range(DECISIONS):
                    c.evaluate("keywords", f"p{i}", "bad" if i % 2 else "fine", timeout=30)
        yield s


@pytest.fixture(scope="module")
def pub(srv: ServerProcess, tmp_path_factory: pytest.TempPathFactory, signing_key: Path) -> Path:
    res = run_cli("audit", "key", server=srv, api_key=key("acme"))
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("-----BEGIN PUBLIC KEY-----")
    local = run_cli("audit", "key", "--private", str(signing_key), sandbox=None)
    assert local.stdout == res.stdout  # the operator publishes the same key the server names
    path = tmp_path_factory.mktemp("pub") / "pub.pem"
    path.write_text(res.stdout)
    return path


def test_a_tenant_verifies_its_log_with_the_published_key(srv: ServerProcess, pub: Path) -> None:
    res = run_cli("audit", "verify", "--key", str(pub), "--json", server=srv, api_key=key("acme"))
    assert res.returncode == 0, res.stdout + res.stderr
    report = json.loads(res.stdout)
    assert report["ok"] and report["log"] == "crossaudit/acme"
    assert report["records"] == DECISIONS and report["signed_size"] == DECISIONS and report["unsigned_records"] == 0


def test_an_export_verifies_offline_and_fails_after_a_one_byte_change(
    srv: ServerProcess, pub: Path, tmp_path: Path
) -> None:
    out = tmp_path / "bundle"
    res = run_cli("audit", "export", "--out", str(out), "--key", str(pub), server=srv, api_key=key("acme"))
    assert res.returncode == 0 and "wrote" in res.stdout, res.stdout + res.stderr
    offline = run_cli("audit", "verify", "--bundle", str(out), "--key", str(pub), sandbox=None)  # no server
    assert offline.returncode == 0 and offline.stdout.startswith("ok:"), offline.stdout
    assert "of log crossaudit/acme" in offline.stdout  # whose log it is, said
    ours = run_cli("audit", "verify", "--bundle", str(out), "--key", str(pub), "--tenant", "acme", sandbox=None)
    assert ours.returncode == 0, ours.stdout
    theirs = run_cli("audit", "verify", "--bundle", str(out), "--key", str(pub), "--tenant", "globex", sandbox=None)
    assert theirs.returncode == 1 and "not 'crossaudit/globex'" in theirs.stdout, theirs.stdout
    records = out / "records.jsonl"
    text = records.read_bytes()
    i = text.index(b'"passed":') + len(b'"passed":')
    records.write_bytes(text[:i] + (b"t" if text[i : i + 1] == b"f" else b"f") + text[i + 1 :])
    bad = run_cli("audit", "verify", "--bundle", str(out), "--key", str(pub), sandbox=None)
    assert bad.returncode == 1 and bad.stdout.startswith("FAILED:"), bad.stdout
    assert "seq " in bad.stdout


def test_proofs_and_receipts_of_a_decision(srv: ServerProcess, pub: Path) -> None:
    with Client(srv.address, api_key=key("acme")) as c:
        d = c.evaluate("keywords", "p", "bad", timeout=30)
        record = c.get_decision(d.decision_id)
    assert record.log_seq is not None and record.leaf_hash
    proof = run_cli("audit", "proof", d.decision_id, "--key", str(pub), "--json", server=srv, api_key=key("acme"))
    assert proof.returncode == 0, proof.stdout + proof.stderr
    doc = json.loads(proof.stdout)
    assert doc["verified"] and doc["seq"] == record.log_seq and doc["leaf_hash"] == record.leaf_hash
    cons = run_cli("audit", "proof", "--consistency", "4", "0", "--key", str(pub), server=srv, api_key=key("acme"))
    assert cons.returncode == 0 and "extends the one of 4" in cons.stdout, cons.stdout + cons.stderr
    receipt = run_cli("audit", "receipt", d.decision_id, "--json", server=srv, api_key=key("acme"))
    r = json.loads(receipt.stdout)
    assert r["log_seq"] == record.log_seq and r["log"] == "crossaudit/acme"
    assert r["receipt"]["policy"]["name"] == "keywords" and r["receipt"]["policy"]["digest"] == record.policy_digest
    assert r["receipt"]["engine"]["name"] == "crossaudit" and r["receipt"]["evaluators"]
    facts = r["receipt"]["evaluators"][0]["provenance"]
    assert facts["kind"] == "custom" and facts["backend"] == "process" and len(facts["code_sha256"]) == 64
    assert facts["image_id"].startswith("process:")
    human = run_cli("audit", "receipt", d.decision_id, server=srv, api_key=key("acme"))
    assert f"seq {record.log_seq} of crossaudit/acme" in human.stdout


def test_tenants_cannot_read_or_prove_each_others_log(srv: ServerProcess) -> None:
    with Client(srv.address, api_key=key("acme")) as acme, Client(srv.address, api_key=key("globex")) as globex:
        theirs = acme.list_decisions(limit=1)[0].decision_id
        for call in (globex.receipt, globex.inclusion_proof):
            with pytest.raises(NotFoundError):
                call(theirs)
        report = globex.verify_log()
        assert report.ok and report.origin == "crossaudit/globex" and report.records == DECISIONS
        assert globex.log_key().log == "crossaudit/globex"


def test_an_auditor_key_reads_the_log_and_changes_nothing(srv: ServerProcess, pub: Path) -> None:
    res = run_cli("audit", "verify", "--key", str(pub), server=srv, api_key=AUDITOR_KEY)
    assert res.returncode == 0, res.stdout + res.stderr
    md = (("authorization", f"Bearer {AUDITOR_KEY}"),)
    with grpc.insecure_channel(srv.address) as ch:
        with pytest.raises(grpc.RpcError) as e:
            evaluation_pb2_grpc.EvaluationServiceStub(ch).Evaluate(
                evaluation_pb2.EvaluateRequest(policy="keywords", prompt="p", response="r"), metadata=md, timeout=10
            )
        assert e.value.code() is grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(grpc.RpcError) as e:
            audit_pb2_grpc.AuditServiceStub(ch).EraseInputs(
                audit_pb2.EraseInputsRequest(decision_id="x"), metadata=md, timeout=10
            )
        assert e.value.code() is grpc.StatusCode.PERMISSION_DENIED


def test_a_row_edited_in_the_database_is_named_by_its_sequence_number(
    srv: ServerProcess, pub: Path, tmp_path: Path
) -> None:
    db = srv.data_dir / "data" / "crossaudit.db"
    copy = tmp_path / "copy.db"
    with sqlite3.connect(db) as live, sqlite3.connect(copy) as c:
        live.backup(c)
    with sqlite3.connect(copy) as c:
        c.execute("UPDATE decisions SET action='allow', passed=1 WHERE tenant='globex' AND log_seq=3")
    res = run_cli("audit", "verify", "--store", str(copy), "--tenant", "globex", "--key", str(pub), sandbox=None)
    assert res.returncode == 1, res.stdout
    assert res.stdout.startswith("FAILED: log crossaudit/globex: seq 3: edited"), res.stdout
    # the live log is untouched
    live_res = run_cli("audit", "verify", "--store", str(db), "--tenant", "globex", "--key", str(pub), sandbox=None)
    assert live_res.returncode == 0, live_res.stdout


def _start_with(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    keys = tmp_path / "keys.yaml"
    keys.write_text(f"tenants:\n  acme: [{TENANT_KEYS['acme']}]\n")
    keys.chmod(0o600)
    cmd = [sys.executable, "-m", "crossaudit.cli", "serve", "--port", "0", "--data-dir", str(tmp_path / "data"),
           "--api-keys", str(keys), "--sandbox", "process", "--allow-process-sandbox", *args]  # fmt: skip
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    "problem", ["missing", "readable by others", "not a key", "an RSA key"], ids=lambda p: p.replace(" ", "-")
)
def test_a_bad_signing_key_stops_the_start_with_one_error_line(problem: str, tmp_path: Path) -> None:
    path = tmp_path / "signing.pem"
    if problem == "readable by others":
        path.write_bytes(generate_private_pem())
        path.chmod(0o644)
    elif problem == "not a key":
        path.write_text("hello\n")
        path.chmod(0o600)
    elif problem == "an RSA key":
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa

        pem = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        path.write_bytes(pem)
        path.chmod(0o600)
    res = _start_with(["--set", f"evidence.signing_key_file={path}"], tmp_path)
    assert res.returncode != 0
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "evidence signing key" in errors[0], res.stderr
    assert "Traceback" not in res.stderr
