"""Secret sources, the one ``${NAME}`` expander, masking, LLM host allowlists, the API-keys file's
grants and the client-side inlining of local files."""

from __future__ import annotations

from pathlib import Path

import pytest

from crossaudit.kernel.errors import ConfigurationError, PolicyValidationError, SandboxCodeError
from crossaudit.service.auth import load_tenants_file
from orchestrator.policy import envvars, load_policy
from orchestrator.policy.inline import inline_local_code
from orchestrator.secrets import (
    MASK,
    EnvironmentSecrets,
    HostAllowlist,
    SecretGrant,
    SecretUse,
    TenantSecrets,
)
from sandbox.base import RunDiagnostics

K1, K2 = "k1-" + "a" * 20, "k2-" + "b" * 20
HEAD = 'name: t\ndescription: d\nversion: "1.0"\n'


# --- the expander -------------------------------------------------------------------------------


def test_one_expander_empty_counts_as_unset_and_values_are_recorded() -> None:
    use = SecretUse()
    env = {"A": "alpha", "EMPTY": ""}
    assert envvars.expand({"x": ["${A}-${A}"], "n": 3}, env, use) == {"x": ["alpha-alpha"], "n": 3}
    assert use and use.mask("say alpha") == f"say {MASK}"
    with pytest.raises(ConfigurationError, match="environment variable EMPTY is not set"):
        envvars.expand("${EMPTY}", env)
    with pytest.raises(ConfigurationError, match=r"^f: environment variable NOPE is not set$"):
        envvars.expand("${NOPE}", env, where="f")


def test_tenant_source_reaches_only_its_grants(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CA_UNIT_GRANTED", "g-value")
    monkeypatch.setenv("CA_UNIT_OTHER", "o-value")
    (tmp_path / "f").write_text("file-value\n")
    src = TenantSecrets("t", {"G": SecretGrant("G", env="CA_UNIT_GRANTED"), "F": SecretGrant("F", file=tmp_path / "f")})
    assert envvars.expand("${G}/${F}", src) == "g-value/file-value"
    for ref in ("${CA_UNIT_OTHER}", "${CA_UNIT_GRANTED}"):
        with pytest.raises(ConfigurationError, match="is not granted to this tenant") as err:
            envvars.expand(ref, src)
        assert "value" not in str(err.value)
    (tmp_path / "f").write_text("")
    with pytest.raises(ConfigurationError, match="secret F is unavailable"):
        envvars.expand("${F}", src)
    big = TenantSecrets("t", {"F": SecretGrant("F", file=tmp_path / "f")}, max_bytes=4)
    (tmp_path / "f").write_text("12345")
    assert big.get("F") is None


def test_references_are_located_only_in_expanded_fields() -> None:
    text = HEAD + (
        "evaluators:\n"
        "  - name: c\n    type: custom\n    config:\n      p: '${IN_PARAM}'\n"
        "      code: \"def evaluate(p, r, c):\\n    return {'score': 1, 'x': '${IN_CODE}'}\\n\"\n"
        "  - name: l\n    type: llm\n    config: {model: m, api_key: '${IN_KEY}', system_prompt: 'say ${IN_PROMPT}'}\n"
        "rules:\n  - {name: r, evaluator: c}\n  - {name: r2, evaluator: l}\n"
    )
    policy = load_policy(text, env={})
    assert envvars.locate(policy) == [
        (("evaluators", 0, "config", "p"), "IN_PARAM"),
        (("evaluators", 1, "config", "api_key"), "IN_KEY"),
    ]
    with pytest.raises(PolicyValidationError) as err:
        load_policy(text, env=TenantSecrets("t"))
    assert [(i.path, i.line) for i in err.value.issues] == [
        ("evaluators[0].config.p", 8),
        ("evaluators[1].config.api_key", 12),
    ]


# --- masking ------------------------------------------------------------------------------------


def test_masking_covers_escaped_forms_lines_keys_and_errors() -> None:
    use = SecretUse()
    use.add('tok"en\nsecond-line')
    use.add("short")
    assert use.mask('json: "tok\\"en\\nsecond-line"') == f'json: "{MASK}"'
    assert use.mask("log: second-line") == f"log: {MASK}"
    assert use.scrub({"short": ["a short b", 1]}) == {MASK: [f"a {MASK} b", 1]}
    err = SandboxCodeError("ValueError: short")
    err.diagnostics = RunDiagnostics(stdout="printed short", stderr="")  # type: ignore[attr-defined]
    use.mask_error(err)
    assert err.message == f"ValueError: {MASK}" and str(err) == f"ValueError: {MASK}"
    assert err.diagnostics.stdout == f"printed {MASK}"  # type: ignore[attr-defined]
    assert SecretUse().mask("short") == "short"  # nothing used, nothing masked


# --- LLM hosts ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("patterns", "url", "ok"),
    [
        (["127.0.0.1"], "http://127.0.0.1:8000/v1", True),
        (["127.0.0.1:9000"], "http://127.0.0.1:8000/v1", False),
        (["llm.example.com:443"], "https://llm.example.com/v1", True),
        (["*.example.com"], "https://a.b.example.com/v1", True),
        (["*.example.com"], "https://example.com/v1", False),
        (["llm.example.com"], "https://LLM.example.com./v1", True),
        (["[::1]:8080"], "http://[::1]:8080/v1", True),
        (["llm.example.com"], "ftp://llm.example.com/v1", False),
        ([], "https://llm.example.com/v1", False),
    ],
)
def test_host_allowlist(patterns: list[str], url: str, ok: bool) -> None:
    assert (HostAllowlist(patterns).url_problem(url) is None) is ok


def test_host_allowlist_hides_the_host_when_asked() -> None:
    problem = HostAllowlist(["a.example"]).url_problem("https://secret-host.example/v1", show_host=False)
    assert problem is not None and "secret-host" not in problem
    with pytest.raises(ValueError, match="invalid LLM host"):
        HostAllowlist(["bad host"])


# --- the API-keys file --------------------------------------------------------------------------


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "keys.yaml"
    p.write_text(text)
    p.chmod(0o600)
    return p


def test_keys_file_grants_secrets_and_hosts_and_keeps_the_old_form(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        f"""llm_base_url_hosts: [llm.example]
tenants:
  acme:
    keys: [{K1}]
    secrets:
      OPENAI_API_KEY: {{env: ACME_OPENAI_KEY}}
      HOOK_TOKEN: {{file: secrets/hook}}
    llm_base_url_hosts: ["vllm.acme.example:8000"]
  globex: [{K2}]
""",
    )
    tf = load_tenants_file(path)
    assert tf.keys == {"acme": [K1], "globex": [K2]}
    acme = tf.grants.secrets["acme"]
    assert acme["OPENAI_API_KEY"].env == "ACME_OPENAI_KEY"
    assert acme["HOOK_TOKEN"].file == (tmp_path / "secrets/hook").resolve()
    assert tf.grants.hosts("acme").patterns == ("llm.example", "vllm.acme.example:8000")
    assert tf.grants.hosts("globex").patterns == ("llm.example",)
    assert isinstance(tf.grants.source("globex"), TenantSecrets) and not tf.grants.source("globex").granted("X")
    assert tf.grants.with_hosts(["127.0.0.1"]).hosts("globex").patterns == ("llm.example", "127.0.0.1")


@pytest.mark.parametrize(
    ("entry", "match"),
    [
        (f"{{keys: [{K1}], secret: {{}}}}", "unknown field"),
        (f"{{keys: [{K1}], secrets: {{'bad-name': {{env: X}}}}}}", "invalid secret name"),
        (f"{{keys: [{K1}], secrets: {{A: {{env: X, file: y}}}}}}", "exactly one of"),
        (f"{{keys: [{K1}], secrets: {{A: {{env: 'a b'}}}}}}", "environment variable name"),
        (f"{{keys: [{K1}], llm_base_url_hosts: ['http://x']}}", "LLM host"),
        ("{secrets: {}}", "needs a list of keys"),
    ],
)
def test_bad_grants_are_configuration_errors(tmp_path: Path, entry: str, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        load_tenants_file(write(tmp_path, f"tenants:\n  acme: {entry}\n"))


def test_unknown_top_level_field_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="unknown field"):
        load_tenants_file(write(tmp_path, f"llm_hosts: [a]\ntenants:\n  acme: [{K1}]\n"))


def test_dev_grants_read_the_local_environment() -> None:
    from crossaudit.service.grants import TenantGrants

    dev = TenantGrants.dev()
    assert isinstance(dev.source("default"), EnvironmentSecrets) and dev.hosts("default") is None
    assert dev.with_hosts(["llm.example"]).hosts("default").patterns == ("llm.example",)


# --- inlining local files -----------------------------------------------------------------------

CODE = "def evaluate(prompt, response, context):\n    return {'score': 1.0}\n"


def test_nothing_to_inline_leaves_the_text_byte_identical(tmp_path: Path) -> None:
    text = HEAD + f"evaluators:\n  - name: e\n    type: custom\n    config: {{code: {CODE!r}}}\nrules: []\n"
    assert inline_local_code(text, tmp_path).text == text
    assert inline_local_code("not: [valid", tmp_path).text == "not: [valid"


def test_inlining_keeps_layout_and_maps_lines_back(tmp_path: Path) -> None:
    (tmp_path / "evaluators").mkdir()
    (tmp_path / "evaluators/named.py").write_text(CODE)
    (tmp_path / "impl.py").write_text(CODE.replace("1.0", "0.5"))
    text = HEAD + (
        "evaluators:\n"
        "  - name: named     # found by name\n    type: custom\n    config:\n      words: [a]\n"
        "  - name: filed\n    type: custom\n    config: {code_file: impl.py, n: 1}\n"
        "  - name: llm\n    type: llm\n    config: {provider: openai, model: m}\n"
        "rules:\n  - {name: r, evaluator: nope}\n"
    )
    out = inline_local_code(text, tmp_path, filename="p.yaml")
    assert out.files == ("evaluators/named.py", "impl.py") and out.inserted_lines == (8,)
    assert "# found by name" in out.text and "code_file" not in out.text
    with pytest.raises(PolicyValidationError) as err:
        load_policy(out.text, "p.yaml")
    (issue,) = out.relocate(err.value).issues
    assert (
        issue.path == "rules[0].evaluator"
        and issue.line == text.splitlines().index("  - {name: r, evaluator: nope}") + 1
    )
    policy = load_policy(out.text.replace("evaluator: nope", "evaluator: named"), "p.yaml", env={})
    assert policy.evaluator("named").typed_config.code == CODE
    assert policy.evaluator("named").typed_config.parameters == {"words": ["a"]}
    assert policy.evaluator("filed").typed_config.code == CODE.replace("1.0", "0.5")


def test_a_missing_code_file_is_reported_at_its_field(tmp_path: Path) -> None:
    text = HEAD + "evaluators:\n  - name: e\n    type: custom\n    config:\n      code_file: gone.py\nrules: []\n"
    with pytest.raises(PolicyValidationError) as err:
        inline_local_code(text, tmp_path, filename="p.yaml")
    (issue,) = err.value.issues
    assert issue.path == "evaluators[0].config.code_file" and issue.line == 8 and "file not found" in issue.message


def test_a_secret_cut_by_a_length_cap_is_still_masked() -> None:
    """Messages are capped where they are made (SDK errors, the sandbox) before masking sees them."""
    from orchestrator.secrets import SecretUse

    use = SecretUse()
    use.add("sk-SECRETVALUE-0123456789abcdef")
    cut = ("A" * 245 + " bad key Bearer sk-SECRETVALUE-012345")[:300]
    assert "SECRETVALUE" not in use.mask(cut) and use.mask(cut).endswith("Bearer ***")
    assert use.mask(cut + "...") == use.mask(cut) + "..."
    assert "sk-SECRE" not in use.mask("got 'sk-SECRE'")
    assert use.mask("short sk-S") == "short sk-S"  # under 8 characters: ordinary text stays
