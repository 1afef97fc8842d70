"""Tenants are adversaries: ``${NAME}`` must not reach the server's environment or another
tenant's secrets, a granted secret goes only where the policy puts it, never into a decision,
the audit log, the log or metrics, and an LLM key goes only to an allowlisted host.

Each service test drives a real ``crossaudit serve`` process on an ephemeral loopback port;
the LLM provider is a local stub speaking the OpenAI chat-completions API on loopback.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from crossaudit import Client, PolicyTester
from crossaudit.kernel.errors import PolicyValidationError
from tests.e2e.conftest import TENANT_KEYS, ServerProcess, key, raw_deploy
from tests.openai_stub import OpenAIStub

pytestmark = pytest.mark.security
e2e = pytest.mark.e2e

EVALUATE_TIMEOUT_S = 60.0
UNROUTABLE_URL = "http://198.51.100.7:9/v1"  # TEST-NET-2: refused before any packet is sent

# Unique values: found anywhere later means it leaked.
SERVER_ONLY = "server-only-" + secrets.token_hex(12)
SERVER_OPENAI_KEY = "sk-server-wide-" + secrets.token_hex(12)
ACME_HOOK = "acme-hook-" + secrets.token_hex(12)
ACME_LLM_KEY = "sk-acme-" + secrets.token_hex(12)
ACME_FILE_V1 = "acme-file-v1-" + secrets.token_hex(12)
ACME_FILE_V2 = "acme-file-v2-" + secrets.token_hex(12)
GLOBEX_TOKEN = "globex-token-" + secrets.token_hex(12)
ALL_VALUES = (SERVER_ONLY, SERVER_OPENAI_KEY, ACME_HOOK, ACME_LLM_KEY, ACME_FILE_V1, ACME_FILE_V2, GLOBEX_TOKEN)

KEYS_FILE = f"""
llm_base_url_hosts: ["127.0.0.1"]
tenants:
  acme:
    keys: [{TENANT_KEYS["acme"]}]
    secrets:
      HOOK_TOKEN: {{env: CA_ACME_HOOK}}
      FILE_TOKEN: {{file: acme_file_token}}
      OPENAI_API_KEY: {{env: CA_ACME_LLM_KEY}}
      EVIL_URL: {{env: CA_EVIL_URL}}
  globex:
    keys: [{TENANT_KEYS["globex"]}]
    secrets:
      GLOBEX_TOKEN: {{env: CA_GLOBEX_TOKEN}}
"""
SERVER_ENV = {
    "CA_SERVER_ONLY": SERVER_ONLY,
    "OPENAI_API_KEY": SERVER_OPENAI_KEY,
    "CA_ACME_HOOK": ACME_HOOK,
    "CA_ACME_LLM_KEY": ACME_LLM_KEY,
    "CA_GLOBEX_TOKEN": GLOBEX_TOKEN,
    "CA_EVIL_URL": UNROUTABLE_URL,
}


def checksum(value: str) -> int:
    """What the evaluator code reports instead of a value: proves the value arrived intact."""
    return sum(ord(c) * (i + 1) for i, c in enumerate(value))


ECHO_CODE = """
        def checksum(v):
            return sum(ord(c) * (i + 1) for i, c in enumerate(v))

        def evaluate(prompt, response, context):
            cfg = context["evaluator_config"]
            return {
                "score": 0.0,
                "passed": False,
                "violations": ["leaked " + cfg["token"], cfg["file_token"]],
                "details": {
                    "token": cfg["token"],
                    "file": cfg["file_token"],
                    cfg["file_token"]: "as a key",
                    "token_sum": checksum(cfg["token"]),
                    "file_sum": checksum(cfg["file_token"]),
                },
            }
"""


def policy(name: str, evaluators: str, rules: str, settings: str = "") -> str:
    return f'name: {name}\ndescription: d\nversion: "1.0"\nevaluators:\n{evaluators}\nrules:\n{rules}\n{settings}'


def probe_policy(reference: str) -> str:
    return policy(
        "probe",
        f"""  - name: probe
    type: custom
    config:
      probe: "{reference}"
      code: |
        def evaluate(prompt, response, context):
            return {{"score": 1.0, "details": {{"probe": context["evaluator_config"]["probe"]}}}}""",
        "  - {name: r, evaluator: probe}",
    )


def llm_policy(name: str, config: str) -> str:
    return policy(
        name,
        f"""  - name: judge
    type: llm
    config: {{provider: openai, model: m, {config}}}""",
        "  - {name: judged, evaluator: judge, threshold: 0.5, action: warn}",
        "settings: {audit_all_evaluations: true}",
    )


def leaks(text: str) -> list[str]:
    return [v for v in ALL_VALUES if v in text]


# --- the stub provider ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stub() -> Iterator[OpenAIStub]:
    s = OpenAIStub()
    try:
        yield s
    finally:
        s.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("secrets")
    (root / "acme_file_token").write_text(ACME_FILE_V1 + "\n")
    with ServerProcess(root, keys_text=KEYS_FILE, env=SERVER_ENV) as srv:
        yield srv


@pytest.fixture(scope="module")
def plain_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The keys-only file format (no grants) and the same server environment: nothing of that
    environment may be reachable, and no LLM host but the providers' defaults."""
    with ServerProcess(tmp_path_factory.mktemp("plain"), env=SERVER_ENV) as srv:
        yield srv


def client(srv: ServerProcess, tenant: str) -> Client:
    return Client(srv.address, api_key=key(tenant))


# --- a tenant reaches nothing it was not granted --------------------------------------------------


@e2e
def test_tenant_cannot_expand_a_server_environment_variable(plain_server: ServerProcess) -> None:
    with client(plain_server, "acme") as c:
        with pytest.raises(PolicyValidationError) as err:
            c.deploy_policy(probe_policy("${CA_SERVER_ONLY}"))
        issues = c.validate_policy(probe_policy("${CA_SERVER_ONLY}"))
    assert [i.path for i in err.value.issues] == ["evaluators[0].config.probe"]
    assert "CA_SERVER_ONLY" in str(err.value) and "not granted" in str(err.value)
    assert err.value.issues[0].line == 8  # located like every other policy issue
    assert [i.path for i in issues] == ["evaluators[0].config.probe"]
    assert not leaks(str(err.value))


@e2e
def test_tenant_cannot_expand_a_variable_meant_for_another_tenant(plain_server: ServerProcess) -> None:
    e = raw_deploy(plain_server.address, probe_policy("${CA_GLOBEX_TOKEN}"))
    assert e is not None and e.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "CA_GLOBEX_TOKEN" in e.details() and not leaks(e.details())


@e2e
def test_server_wide_provider_key_never_goes_to_a_tenants_host(plain_server: ServerProcess, stub: OpenAIStub) -> None:
    # No api_key: the provider's OPENAI_API_KEY, which the server has but did not grant anyone.
    e = raw_deploy(plain_server.address, llm_policy("llm-default-key", f'base_url: "{stub.url}"'))
    if e is None:  # accepted: then the call must not send the server's key
        with client(plain_server, "acme") as c:
            c.evaluate("llm-default-key", "p", "r", timeout=EVALUATE_TIMEOUT_S)
    assert f"Bearer {SERVER_OPENAI_KEY}" not in stub.authorizations
    # no allowlist: only the providers' default endpoints
    assert e is not None and e.code() is grpc.StatusCode.INVALID_ARGUMENT and "base_url" in e.details()


@e2e
def test_tenant_cannot_expand_another_tenants_secret(server: ServerProcess) -> None:
    for reference in ("${GLOBEX_TOKEN}", "${CA_GLOBEX_TOKEN}", "x-${GLOBEX_TOKEN}-y"):
        e = raw_deploy(server.address, probe_policy(reference))
        assert e is not None and e.code() is grpc.StatusCode.INVALID_ARGUMENT, reference
        assert "evaluators[0].config.probe" in e.details() and reference[reference.index("{") + 1 :].split("}")[0] in (
            e.details()
        )
        assert not leaks(e.details())
    # and not in a webhook header either
    hooked = policy(
        "hooked",
        "  - {name: e, type: custom, config: {code: \"def evaluate(p, r, c):\\n    return {'score': 0.0}\\n\"}}",
        '  - {name: r, evaluator: e, action: custom, action_config: {webhook_url: "https://hooks.example/x", '
        'headers: {Authorization: "Bearer ${GLOBEX_TOKEN}"}}}',
    )
    e = raw_deploy(server.address, hooked)
    assert e is not None and e.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "rules[0].action_config.headers.Authorization" in e.details() and "GLOBEX_TOKEN" in e.details()
    # the owner may use it
    assert raw_deploy(server.address, probe_policy("${GLOBEX_TOKEN}"), tenant="globex") is None


@e2e
def test_unknown_secret_name_is_invalid_argument_naming_it_and_its_location(server: ServerProcess) -> None:
    e = raw_deploy(server.address, llm_policy("unknown-secret", 'api_key: "${NOPE_SECRET}"'))
    assert e is not None and e.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "policy.yaml:7:" in e.details() and "evaluators[0].config.api_key" in e.details()
    assert "secret NOPE_SECRET is not granted" in e.details()


# --- a granted secret: only where placed, masked everywhere it could come back --------------------


@e2e
def test_granted_secret_reaches_custom_code_only_in_its_config_and_is_masked(server: ServerProcess) -> None:
    text = policy(
        "echo-secrets",
        f"""  - name: echo
    type: custom
    config:
      token: "Bearer ${{HOOK_TOKEN}}"
      file_token: "${{FILE_TOKEN}}"
      code: |{ECHO_CODE}
  - name: raiser
    type: custom
    config:
      token: "${{HOOK_TOKEN}}"
      code: |
        def evaluate(prompt, response, context):
            raise ValueError("cannot use " + context["evaluator_config"]["token"])
  - name: blind
    type: custom
    config:
      code: |
        def evaluate(prompt, response, context):
            return {{"score": 1.0, "details": {{"sees_config": "evaluator_config" in context}}}}""",
        """  - {name: echo_rule, evaluator: echo, action: warn}
  - {name: raise_rule, evaluator: raiser, action: warn}
  - {name: blind_rule, evaluator: blind, action: warn}""",
        "settings: {audit_all_evaluations: true}",
    )
    with client(server, "acme") as c:
        c.deploy_policy(text)
        d = c.evaluate("echo-secrets", "p", "r", timeout=EVALUATE_TIMEOUT_S)
        echo = d.rule("echo_rule").evaluators[0]
        assert echo.details["token_sum"] == checksum("Bearer " + ACME_HOOK)  # the code got the real value
        assert echo.details["file_sum"] == checksum(ACME_FILE_V1)  # one trailing newline dropped
        assert echo.details["token"] == "Bearer ***" and echo.details["file"] == "***"
        assert echo.details["***"] == "as a key"
        assert echo.violations == ["leaked Bearer ***", "***"]
        raiser = d.rule("raise_rule").evaluators[0]
        assert raiser.status.value == "error" and "cannot use ***" in (raiser.error or "")
        assert d.rule("blind_rule").evaluators[0].details == {"sees_config": False}
        assert not leaks(d.model_dump_json())

        audit = c.get_decision(d.decision_id)  # read back through the real AuditService
        dumped = json.dumps(dataclasses.asdict(audit), default=str)
        assert not leaks(dumped)
        assert "leaked Bearer ***" in dumped  # violations: stored, masked
        assert "cannot use" not in dumped  # an evaluator's error text is never stored (docs/retention.md)
        assert not leaks(json.dumps([dataclasses.asdict(a) for a in c.list_decisions()], default=str))

        # a rotated file secret takes effect on the next call, with no redeploy
        (server.data_dir / "acme_file_token").write_text(ACME_FILE_V2)
        again = c.evaluate("echo-secrets", "p", "r", timeout=EVALUATE_TIMEOUT_S)
        assert again.rule("echo_rule").evaluators[0].details["file_sum"] == checksum(ACME_FILE_V2)
        assert not leaks(again.model_dump_json())


@e2e
def test_granted_secret_is_the_llm_api_key_for_an_allowlisted_host_and_is_masked(
    server: ServerProcess, stub: OpenAIStub
) -> None:
    explicit = llm_policy("llm-explicit", f'base_url: "{stub.url}", api_key: "${{OPENAI_API_KEY}}"')
    standard = llm_policy("llm-standard", f'base_url: "{stub.url}"')  # the provider's variable, as granted
    with client(server, "acme") as c:
        for name, text in (("llm-explicit", explicit), ("llm-standard", standard)):
            c.deploy_policy(text)
            before = len(stub.authorizations)
            d = c.evaluate(name, "p", "r", timeout=EVALUATE_TIMEOUT_S)
            assert stub.authorizations[before:] == [f"Bearer {ACME_LLM_KEY}"]
            judge = d.rule("judged").evaluators[0]
            assert judge.score == pytest.approx(0.2) and judge.violations == ["saw ***"]
            assert judge.details["reasoning"] == "the key was ***"
            assert not leaks(d.model_dump_json())
            audit = json.dumps(dataclasses.asdict(c.get_decision(d.decision_id)), default=str)
            assert "saw ***" in audit and not leaks(audit)


@e2e
def test_server_wide_provider_key_is_not_a_tenants_default(server: ServerProcess, stub: OpenAIStub) -> None:
    """Even towards an allowlisted host, a tenant's provider key is only what it was granted."""
    with client(server, "globex") as c:  # globex is not granted OPENAI_API_KEY; the server has one
        c.deploy_policy(llm_policy("llm-ungranted", f'base_url: "{stub.url}"'))
        d = c.evaluate("llm-ungranted", "p", "r", timeout=EVALUATE_TIMEOUT_S)
    judge = d.rule("judged").evaluators[0]
    assert judge.status.value == "error" and "no API key" in (judge.error or "")
    assert f"Bearer {SERVER_OPENAI_KEY}" not in stub.authorizations
    text = llm_policy("llm-ref", f'base_url: "{stub.url}", api_key: "${{OPENAI_API_KEY}}"')
    e = raw_deploy(server.address, text, tenant="globex")
    assert e is not None and e.code() is grpc.StatusCode.INVALID_ARGUMENT and "OPENAI_API_KEY" in e.details()


@e2e
def test_llm_base_url_outside_the_allowlist_is_refused(server: ServerProcess, stub: OpenAIStub) -> None:
    for url in (UNROUTABLE_URL, f"http://localhost:{stub.port}/v1", "file:///etc/hostname"):
        text = llm_policy("llm-elsewhere", f'base_url: "{url}", api_key: "${{OPENAI_API_KEY}}"')
        e = raw_deploy(server.address, text)
        assert e is not None and e.code() is grpc.StatusCode.INVALID_ARGUMENT, url
        assert "evaluators[0].config.base_url" in e.details() and "base_url" in e.details()
    # a host that only a granted secret reveals is checked at call time, and not named
    with client(server, "acme") as c:
        c.deploy_policy(llm_policy("llm-secret-host", 'base_url: "${EVIL_URL}", api_key: "${OPENAI_API_KEY}"'))
        d = c.evaluate("llm-secret-host", "p", "r", timeout=EVALUATE_TIMEOUT_S)
    judge = d.rule("judged").evaluators[0]
    assert judge.status.value == "error" and "not allowed" in (judge.error or "")
    assert "198.51.100.7" not in d.model_dump_json()


@e2e
def test_no_secret_in_the_server_log_or_metrics(server: ServerProcess) -> None:
    with client(server, "acme") as c:  # one more echo, in case this test runs alone
        c.deploy_policy(probe_policy("${HOOK_TOKEN}"))
        d = c.evaluate("probe", "p", "r", timeout=EVALUATE_TIMEOUT_S)
    assert d.rule("r").evaluators[0].details == {"probe": "***"}
    metrics = urllib.request.urlopen(f"http://{server.metrics_address}/metrics", timeout=10).read().decode()
    assert "crossaudit_decisions_total" in metrics and not leaks(metrics)
    log = server.log.read_text()
    assert "is granted secrets: EVIL_URL (environment variable CA_EVIL_URL)" in log  # names, not values
    assert not leaks(log)


# --- local convenience: the developer's own environment -------------------------------------------


@e2e
def test_dev_server_reads_the_local_environment(tmp_path: Path) -> None:
    value = "dev-value-" + secrets.token_hex(8)
    srv = ServerProcess(tmp_path, dev=True, env={"CA_DEV_VALUE": value})
    srv.start()
    try:
        with Client(srv.address) as c:
            c.deploy_policy(probe_policy("${CA_DEV_VALUE}"))
            d = c.evaluate("probe", "p", "r", timeout=EVALUATE_TIMEOUT_S)
        assert d.rule("r").evaluators[0].details == {"probe": "***"}  # used, and masked all the same
        assert d.rule("r").evaluators[0].status.value == "pass"
    finally:
        assert srv.stop() == 0
    assert value not in srv.log.read_text()


def test_policy_tester_reads_the_local_environment() -> None:
    value = "tester-value-" + secrets.token_hex(8)
    text = policy(
        "tester-env",
        """  - name: e
    type: custom
    config:
      v: "${CA_TESTER_VALUE}"
      code: |
        def evaluate(prompt, response, context):
            v = context["evaluator_config"]["v"]
            return {"score": 1.0, "details": {"n": len(v), "v": v}}""",
        "  - {name: r, evaluator: e}",
    )
    with PolicyTester(text, env={"CA_TESTER_VALUE": value}) as tester:
        assert tester.policy.warnings == []
        d = tester.evaluate("p", "r")
    assert d.rule("r").evaluators[0].details == {"n": len(value), "v": "***"}
    with PolicyTester(text, env={}) as tester:
        assert tester.policy.warnings == ["environment variable CA_TESTER_VALUE is not set (needed at evaluation time)"]
        ev = tester.evaluate("p", "r").rule("r").evaluators[0]
    assert ev.status.value == "error" and "CA_TESTER_VALUE is not set" in (ev.error or "")
