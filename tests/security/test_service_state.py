"""The service's own state and decisions, attacked: world-readable files, stale cached verdicts,
a failed ``modify`` that would hand back unredacted text, and start-up on a hostile data dir.

Each test drives a real ``crossaudit serve`` process on an ephemeral loopback port.
"""

from __future__ import annotations

import os
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from crossaudit import Client
from crossaudit.kernel.results import Action
from tests.e2e.conftest import ROOT, ServerProcess, key, write_keys

pytestmark = [pytest.mark.security, pytest.mark.e2e]

SSN = "123-45-6789"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _serve(*args: str, cwd: Path = ROOT, umask: int | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CROSSAUDIT_")}
    return subprocess.run(
        [sys.executable, "-m", "crossaudit.cli", "serve", "--host", "127.0.0.1", "--port", "0", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        preexec_fn=(lambda: os.umask(umask)) if umask is not None else None,
    )


def _one_error_line(res: subprocess.CompletedProcess[str], needle: str) -> None:
    assert res.returncode == 1, (res.returncode, res.stderr[-2000:])
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and needle in lines[0], res.stderr[-2000:]
    assert "Traceback" not in res.stderr + res.stdout
    assert "internal error" not in res.stderr


# --- item 6: state on disk is private, secret files must be private --------------------------


def test_data_dir_and_database_are_private_whatever_the_umask(tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path)
    old = os.umask(0)  # the server inherits it: everything it creates would be 0666/0777
    try:
        srv.start()
    finally:
        os.umask(old)
    try:
        with Client(srv.address, api_key=key("acme")) as c:
            c.deploy_policy(_cached_policy("alpha"))
            c.evaluate("cache-probe", "p", "text", timeout=10)
        data = tmp_path / "data"
        assert _mode(data) == 0o700
        files = [p for p in data.iterdir() if p.is_file()]
        names = {p.name for p in files}
        assert {"crossaudit.db", "crossaudit.db-wal", "crossaudit.db-shm", "server.lock"} <= names, names
        assert {p.name: _mode(p) for p in files} == {p.name: 0o600 for p in files}
    finally:
        assert srv.stop() == 0


def test_an_existing_lax_data_dir_is_made_private_at_start(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    data.chmod(0o755)
    sqlite3.connect(data / "crossaudit.db").close()
    (data / "crossaudit.db").chmod(0o644)
    srv = ServerProcess(tmp_path)
    srv.start()
    try:
        assert _mode(data) == 0o700
        assert _mode(data / "crossaudit.db") == 0o600
    finally:
        assert srv.stop() == 0


def test_group_readable_api_keys_file_is_refused(tmp_path: Path) -> None:
    keys = write_keys(tmp_path / "keys.yaml")
    keys.chmod(0o644)
    res = _serve("--api-keys", str(keys), "--data-dir", str(tmp_path / "d"), "--allow-process-sandbox")
    _one_error_line(res, "chmod 600")
    assert not (tmp_path / "d").exists(), "nothing may start before the configuration is accepted"


def test_world_readable_tls_key_is_refused(tmp_path: Path) -> None:
    keys = write_keys(tmp_path / "keys.yaml")
    cert, tls_key = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.write_text("-----BEGIN CERTIFICATE-----\n")
    tls_key.write_text("-----BEGIN PRIVATE KEY-----\n")
    tls_key.chmod(0o604)
    res = _serve(
        "--api-keys", str(keys), "--data-dir", str(tmp_path / "d"), "--tls-cert", str(cert), "--tls-key", str(tls_key)
    )
    _one_error_line(res, "TLS private key")


def test_process_sandbox_with_api_keys_needs_an_explicit_opt_in(tmp_path: Path) -> None:
    keys = write_keys(tmp_path / "keys.yaml")
    res = _serve("--api-keys", str(keys), "--data-dir", str(tmp_path / "d"), "--sandbox", "process")
    _one_error_line(res, "--allow-process-sandbox")


def test_process_sandbox_start_line_and_info_say_it_is_weaker(tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path)  # --sandbox process --allow-process-sandbox
    srv.start()
    try:
        assert "WEAKER isolation" in srv.start_line
        with Client(srv.address, api_key=key("globex")) as c:
            info = c.server_info()
        assert info.sandbox_backend == "process" and info.weaker_isolation and info.multi_tenant
        assert info.tenant == "globex" and "weaker" in info.isolation
    finally:
        assert srv.stop() == 0


# --- item 9 (start-up): a corrupt or locked database is one clear error ------------------------


def test_corrupt_database_is_one_error_line(tmp_path: Path) -> None:
    keys = write_keys(tmp_path / "keys.yaml")
    data = tmp_path / "d"
    data.mkdir()
    (data / "crossaudit.db").write_bytes(b"this is not a database" * 100)
    res = _serve("--api-keys", str(keys), "--data-dir", str(data), "--allow-process-sandbox")
    _one_error_line(res, "cannot open the database")


def test_locked_database_is_one_error_line(tmp_path: Path) -> None:
    keys = write_keys(tmp_path / "keys.yaml")
    data = tmp_path / "d"
    data.mkdir()
    holder = sqlite3.connect(data / "crossaudit.db", isolation_level=None)
    try:
        holder.execute("CREATE TABLE t (x)")
        holder.execute("BEGIN EXCLUSIVE")  # another program holds the database
        res = _serve("--api-keys", str(keys), "--data-dir", str(data), "--allow-process-sandbox")
        _one_error_line(res, "locked")
    finally:
        holder.close()


# --- item 7: the result cache never serves a verdict across configs, policies or tenants -------


def _cached_policy(word: str, *, name: str = "cache-probe") -> str:
    return f"""
name: {name}
description: cache probe
version: "1.0"
settings:
  cache_results: true
  cache_duration: 600
evaluators:
  - name: words
    type: custom
    config:
      words: ["{word}"]
      code: |
        def evaluate(prompt, response, context):
            words = context["evaluator_config"]["words"]
            hit = [w for w in words if w in response]
            return {{"score": 0.0 if hit else 1.0, "violations": hit}}
rules:
  - name: no_words
    evaluator: words
    threshold: 0.5
    action: block
"""


def _verdict(c: Client, policy: str, text: str) -> tuple[bool, bool]:
    d = c.evaluate(policy, "p", text, timeout=10)
    [ev] = d.rules[0].evaluators
    return d.passed, ev.cached


def test_a_redeploy_that_changes_the_config_never_serves_the_old_verdict(acme: Client) -> None:
    acme.deploy_policy(_cached_policy("alpha"))
    assert _verdict(acme, "cache-probe", "alpha and beta") == (False, False)
    assert _verdict(acme, "cache-probe", "alpha and beta") == (False, True)  # the cache is on
    acme.deploy_policy(_cached_policy("gamma"))
    assert _verdict(acme, "cache-probe", "alpha and beta") == (True, False)


def test_two_policies_sharing_an_evaluator_name_never_collide(acme: Client) -> None:
    acme.deploy_policy(_cached_policy("alpha", name="first"))
    acme.deploy_policy(_cached_policy("beta", name="second"))
    assert _verdict(acme, "first", "alpha") == (False, False)
    assert _verdict(acme, "second", "alpha") == (True, False)
    assert _verdict(acme, "second", "alpha") == (True, True)
    assert _verdict(acme, "first", "alpha") == (False, True)


def test_tenants_never_share_cached_verdicts(acme: Client, globex: Client) -> None:
    policy = _cached_policy("delta", name="shared-code")
    acme.deploy_policy(policy)
    globex.deploy_policy(policy)
    assert _verdict(acme, "shared-code", "delta") == (False, False)
    assert _verdict(globex, "shared-code", "delta") == (False, False)  # identical code and input: no hit


# --- item 10: a modify rule without a verdict never returns the text it should redact ------------

FAILING_MODIFY = """
name: {name}
description: a modify rule whose evaluator fails
version: "1.0"
evaluators:
  - name: pii
    type: custom
    config:
      code: |
        def evaluate(prompt, response, context):
            return {{"score": 1 / 0}}
rules:
  - name: redact_pii
    evaluator: pii
    threshold: 0.5
    action: modify
    action_config:
      strategy: redact
      replacement_text: "[REDACTED]"
{fallback}
"""


def test_a_failed_modify_escalates_to_block_with_no_modified_response(acme: Client) -> None:
    acme.deploy_policy(FAILING_MODIFY.format(name="failing-modify", fallback=""))
    d = acme.evaluate("failing-modify", "p", f"my ssn is {SSN}", timeout=10)
    assert d.action == Action.BLOCK and not d.passed
    assert not d.modified_response
    assert d.errored_rules == ["redact_pii"]
    assert "escalated to block" in d.rules[0].reason
    record = acme.get_decision(d.decision_id)
    assert record.action == "block"


def test_a_failed_modify_with_on_error_keeps_that_action_but_never_the_text(acme: Client) -> None:
    fallback = "    fallback:\n      on_error: warn"
    acme.deploy_policy(FAILING_MODIFY.format(name="failing-modify-warn", fallback=fallback))
    d = acme.evaluate("failing-modify-warn", "p", f"my ssn is {SSN}", timeout=10)
    assert d.action == Action.WARN
    assert not d.modified_response
