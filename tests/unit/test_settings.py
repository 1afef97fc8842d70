"""The layered configuration: defaults < file < environment < flags, every limit reachable, clear
errors naming the key and its source, `crossaudit config show`, JSON log lines."""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import typing
from pathlib import Path

import pytest

from crossaudit.cli.main import main
from crossaudit.kernel.errors import ConfigurationError
from crossaudit.service.config import ServerConfig, ServiceLimits
from crossaudit.service.logs import configure_logging, decision_scope, end_scope
from crossaudit.service.settings import (
    ENVIRONMENT_KEYS,
    Flag,
    env_name,
    load_settings,
    parse_set,
    unknown_environment,
)

KEY = "limits.max_inflight_evaluations_per_tenant"
ENV = "CROSSAUDIT_LIMITS__MAX_INFLIGHT_EVALUATIONS_PER_TENANT"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only what a test sets: no CROSSAUDIT_* of the shell running the tests."""
    import os

    for name in list(os.environ):
        if name.upper().startswith("CROSSAUDIT_"):
            monkeypatch.delenv(name)


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_nothing_given_is_exactly_the_dataclass_defaults() -> None:
    """One definition of each default: the settings model takes the dataclasses' fields as they are."""
    loaded = load_settings()
    assert loaded.config == ServerConfig()
    assert loaded.environment == {}
    assert all(o.kind == "default" for _, _, o in loaded.rows())


def test_file_then_environment_then_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = write(
        tmp_path / "crossaudit.yaml",
        "port: 6001\nlimits:\n  max_inflight_evaluations_per_tenant: 10\n  max_stream_items: 5\n"
        "engine_limits: {cache_entries: 7}\n",
    )
    only_file = load_settings(cfg)
    assert only_file.config.port == 6001 and only_file.config.limits.max_inflight_evaluations_per_tenant == 10
    assert only_file.config.engine_limits.cache_entries == 7

    monkeypatch.setenv(ENV, "64")
    monkeypatch.setenv("CROSSAUDIT_PORT", "6002")
    env_over_file = load_settings(cfg)
    assert env_over_file.config.limits.max_inflight_evaluations_per_tenant == 64
    assert env_over_file.config.port == 6002
    assert env_over_file.config.limits.max_stream_items == 5  # the file's sibling key is kept (deep merge)

    flags = [Flag(("port",), 6003, "--port"), parse_set(f"{KEY}=128")]
    top = load_settings(cfg, flags)
    assert top.config.port == 6003 and top.config.limits.max_inflight_evaluations_per_tenant == 128
    assert top.config.limits.max_stream_items == 5 and top.config.engine_limits.cache_entries == 7

    origins = {k: o for k, _, o in top.rows()}
    assert str(origins["port"]) == "flag --port"
    assert str(origins[KEY]) == f"flag --set {KEY}"
    assert str(origins["limits.max_stream_items"]) == f"file {cfg}:4:3"
    assert origins["limits.max_concurrent_rpcs"].kind == "default"
    assert str(env_over_file.origins[KEY]) == f"env {ENV}"


def test_config_file_from_the_environment_and_toml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = write(tmp_path / "c.toml", "[limits]\nmax_request_bytes = 2048\n[console_limits]\npage_items = 9\n")
    monkeypatch.setenv("CROSSAUDIT_CONFIG", str(cfg))
    loaded = load_settings()
    assert loaded.file == cfg
    assert loaded.config.limits.max_request_bytes == 2048 and loaded.config.console_limits.page_items == 9


def test_a_renamed_key_says_its_new_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """limits.max_receive_message_bytes became limits.max_request_bytes (one request limit for the
    server, the SDK, the CLI and the proxy): an old file or variable stops the start, naming it."""
    old = write(tmp_path / "old.yaml", "limits:\n  max_receive_message_bytes: 2048\n")
    with pytest.raises(ConfigurationError, match=r"max_receive_message_bytes' \(file .*old.yaml:2:3\): it is now "):
        load_settings(old)
    monkeypatch.setenv("CROSSAUDIT_LIMITS__MAX_RECEIVE_MESSAGE_BYTES", "2048")
    with pytest.raises(ConfigurationError, match=r"it is now 'limits\.max_request_bytes'"):
        load_settings()


def test_every_service_limit_is_reachable_from_the_file_and_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    defaults = ServiceLimits()
    hints = typing.get_type_hints(ServiceLimits)
    wanted = {}
    for f in dataclasses.fields(ServiceLimits):
        value = getattr(defaults, f.name)
        wanted[f.name] = value + 1 if hints[f.name] is int else round(min(value * 0.5 + 0.01, 0.9), 3)
    text = "limits:\n" + "".join(f"  {k}: {v}\n" for k, v in wanted.items())
    from_file = load_settings(write(tmp_path / "all.yaml", text)).config.limits
    assert dataclasses.asdict(from_file) == wanted
    for name, value in wanted.items():
        monkeypatch.setenv(env_name(("limits", name)), str(value))
    assert dataclasses.asdict(load_settings().config.limits) == wanted


def test_every_limit_dataclass_field_is_a_setting() -> None:
    """Each limits dataclass ServerConfig holds: every field of it has a key (the model servers'
    isolation is no field of theirs: its one key is model_servers)."""
    keys = set(load_settings().values)
    missing = []

    def walk(dc: type, prefix: str) -> None:
        hints = typing.get_type_hints(dc)
        for f in dataclasses.fields(dc):
            tp = hints[f.name]
            if dataclasses.is_dataclass(tp):
                walk(tp, f"{prefix}{f.name}.")
            elif f"{prefix}{f.name}" not in keys and not any(k.startswith(f"{prefix}{f.name}.") for k in keys):
                missing.append(f"{prefix}{f.name}")

    walk(ServerConfig, "")
    assert missing == []


def test_unknown_key_in_the_file_is_an_error_with_its_place_and_a_suggestion(tmp_path: Path) -> None:
    cfg = write(tmp_path / "c.yaml", "port: 1\nlimits:\n  max_inflight_evaluations_per_tennant: 3\nmetrics_prot: 9\n")
    with pytest.raises(ConfigurationError) as e:
        load_settings(cfg)
    text = e.value.message
    assert f"unknown key 'limits.max_inflight_evaluations_per_tennant' (file {cfg}:3:3)" in text
    assert "did you mean 'limits.max_inflight_evaluations_per_tenant'?" in text
    assert f"unknown key 'metrics_prot' (file {cfg}:4:1); did you mean 'metrics_port'?" in text


def test_invalid_values_name_the_key_the_value_and_the_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = write(tmp_path / "c.yaml", "limits:\n  max_stream_items: -5\nsandbox: dockr\n")
    monkeypatch.setenv(ENV, "lots")
    monkeypatch.setenv("CROSSAUDIT_ENGINE_LIMITS__DEFAULT_TIMEOUT_S", "nan")
    with pytest.raises(ConfigurationError) as e:
        load_settings(cfg, [Flag(("port",), 70000, "--port")])
    text = e.value.message
    assert f"limits.max_stream_items = -5 (file {cfg}:2:3): Input should be greater than or equal to 1" in text
    assert f"sandbox = \"dockr\" (file {cfg}:3:1): Input should be 'docker', 'process' or 'auto'" in text
    assert f'{KEY} = "lots" (env {ENV}): Input should be a valid integer' in text
    assert 'engine_limits.default_timeout_s = "nan" (env CROSSAUDIT_ENGINE_LIMITS__DEFAULT_TIMEOUT_S)' in text
    assert "port = 70000 (flag --port): Input should be less than or equal to 65535" in text


def test_unknown_nested_environment_key_is_an_error_and_top_level_typos_are_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CROSSAUDIT_LIMITS__MAX_STREAM_ITEMZ", "3")
    with pytest.raises(ConfigurationError, match=r"unknown key 'limits.max_stream_itemz' \(env CROSSAUDIT_LIMITS__"):
        load_settings()
    monkeypatch.delenv("CROSSAUDIT_LIMITS__MAX_STREAM_ITEMZ")
    monkeypatch.setenv("CROSSAUDIT_METRICS_PORTT", "1")
    monkeypatch.setenv("CROSSAUDIT_SERVER", "127.0.0.1:1")  # the client's: known, not a server setting
    monkeypatch.setenv("CROSSAUDIT_DETOXIFY_CHECKPOINT_MULTILINGUAL", "/m")  # per-variant: environment only
    typo = "CROSSAUDIT_METRICS_PORTT is not a setting (did you mean CROSSAUDIT_METRICS_PORT?)"
    assert unknown_environment() == [typo]


def test_hostile_or_broken_files_are_refused_plainly(tmp_path: Path) -> None:
    cases = {
        "alias.yaml": ("a: &x 1\nport: *x\n", r"alias.yaml:1:4: YAML anchors and aliases are not allowed$"),
        "dup.yaml": ("port: 1\nport: 2\n", "dup.yaml:2:1: duplicate key 'port'"),
        "list.yaml": ("- port\n", "top level must be a mapping"),
        "bad.toml": ("port = \n", r"bad.toml: Invalid value \(at line 1, column 8\)"),
        "c.ini": ("port=1", "use a .yaml, .yml or .toml file"),
    }
    for name, (text, expected) in cases.items():
        with pytest.raises(ConfigurationError, match=expected):
            load_settings(write(tmp_path / name, text))
    with pytest.raises(ConfigurationError, match="not found"):
        load_settings(tmp_path / "missing.yaml")


def test_legacy_store_variable_and_dev_ignoring_an_ambient_keys_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CROSSAUDIT_STORE", "postgresql://app:s3cret@db/crossaudit")
    monkeypatch.setenv("CROSSAUDIT_API_KEYS_FILE", "/etc/keys.yaml")
    loaded = load_settings(None, [Flag(("dev",), True, "--dev")])
    assert loaded.config.store_url == "postgresql://app:s3cret@db/crossaudit"
    assert str(loaded.origins["store_url"]) == "env CROSSAUDIT_STORE"
    assert loaded.config.api_keys_file is None  # --dev and an inherited keys file: dev wins
    assert load_settings().config.api_keys_file == Path("/etc/keys.yaml")
    monkeypatch.setenv("CROSSAUDIT_STORE_URL", "postgresql://other@db2/x")  # the current name wins
    assert load_settings().config.store_url == "postgresql://other@db2/x"


def test_environment_settings_are_exported_under_the_names_their_readers_use(tmp_path: Path) -> None:
    from crossaudit.modelserver.builtins import ENV_MODEL_ROOTS
    from crossaudit.modelserver.builtins.detoxify import ENV_DETOXIFY_CHECKPOINT, ENV_DETOXIFY_CONFIG
    from crossaudit.modelserver.builtins.presidio import ENV_SPACY_MODEL
    from crossaudit.modelserver.sources import (
        ENV_DETOXIFY_URL,
        ENV_HF_ENDPOINT,
        ENV_OFFLINE,
        ENV_SPACY_DOWNLOAD_LANGUAGES,
        ENV_SPACY_MODEL_VERSION,
        ENV_SPACY_MODELS_URL,
        ENV_SPACY_PACKAGE,
    )
    from crossaudit.modelserver.store import ENV_MODEL_STORE
    from sandbox.deps import ENV_CACHE_DIR
    from sandbox.docker.images import ENV_BASE_IMAGE

    readers = {
        ENV_MODEL_STORE, ENV_MODEL_ROOTS, ENV_OFFLINE, ENV_HF_ENDPOINT, ENV_DETOXIFY_URL, ENV_DETOXIFY_CHECKPOINT,
        ENV_DETOXIFY_CONFIG, ENV_SPACY_MODEL, ENV_SPACY_MODELS_URL, ENV_SPACY_MODEL_VERSION, ENV_SPACY_PACKAGE,
        ENV_SPACY_DOWNLOAD_LANGUAGES, ENV_BASE_IMAGE, ENV_CACHE_DIR,
    }  # fmt: skip
    assert {env_name((k,)) for k in ENVIRONMENT_KEYS} == readers
    cfg = write(tmp_path / "c.yaml", "model_store: /srv/models\noffline: true\nbase_image: python:3.11-local\n")
    loaded = load_settings(cfg)
    env: dict[str, str] = {}
    loaded.apply_environment(env)
    assert env == {ENV_MODEL_STORE: "/srv/models", ENV_OFFLINE: "1", ENV_BASE_IMAGE: "python:3.11-local"}


def test_llm_prices_add_to_the_built_in_table(tmp_path: Path) -> None:
    text = "llm_prices:\n  judge-1: {prompt: 0.5, completion: 1.5}\n  gpt-4o: {prompt: 0, completion: 0}\n"
    cfg = write(tmp_path / "c.yaml", text)
    prices = load_settings(cfg).config.llm_prices
    assert prices["judge-1"].prompt == 0.5 and prices["gpt-4o"].completion == 0.0
    assert prices["gpt-4o-mini"].prompt > 0  # the rest of the built-in table stays
    with pytest.raises(ConfigurationError, match=r"llm_prices.judge-2.completion .*Field required"):
        load_settings(write(tmp_path / "d.yaml", "llm_prices:\n  judge-2: {prompt: 1}\n"))


def test_config_show_prints_values_and_sources_and_masks_passwords(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = write(tmp_path / "c.yaml", "decision_log_url: https://log:hunter2@logs.example/v1\nport: 6001\n")
    monkeypatch.setenv("CROSSAUDIT_STORE", "postgresql://app:s3cret@db/crossaudit")
    monkeypatch.setenv(ENV, "64")
    assert main(["config", "show", "--config", str(cfg), "--set", "metrics_port=9464", "--json"]) == 0
    out = capsys.readouterr().out
    assert "s3cret" not in out and "hunter2" not in out
    doc = json.loads(out)["settings"]
    masked = "postgresql://app:***@db/crossaudit"
    assert doc["store_url"] == {"value": masked, "source": "env", "origin": "CROSSAUDIT_STORE"}
    assert doc[KEY] == {"value": 64, "source": "env", "origin": ENV}
    assert doc["port"]["source"] == "file" and doc["port"]["origin"].startswith(f"{cfg}:")
    assert doc["metrics_port"] == {"value": 9464, "source": "flag", "origin": "--set metrics_port"}
    assert doc["limits.max_concurrent_rpcs"]["source"] == "default"

    assert main(["config", "show", "--config", str(cfg), "--changed"]) == 0
    text = capsys.readouterr().out
    assert "hunter2" not in text and "log:***@logs.example" in text
    lines = {line.split()[0]: line for line in text.splitlines() if not line.startswith("#")}
    assert set(lines) == {"decision_log_url", "port", "store_url", KEY}
    assert lines[KEY].split()[1:] == ["64", "env", ENV]

    bad = write(tmp_path / "bad.yaml", "limitz: {}\n")
    assert main(["config", "show", "--config", str(bad)]) == 1
    assert "unknown key 'limitz'" in capsys.readouterr().err


def test_json_log_lines_carry_the_decision_and_escape_tenant_text() -> None:
    stream = io.StringIO()
    handler = configure_logging("INFO", "json", stream)
    try:
        log = logging.getLogger("crossaudit.test")
        log.info("outside")
        token = decision_scope("d-123", "acme", 'evil\n{"level": "ERROR"}', "req-9")
        try:
            log.warning("inside %s", "a decision")
        finally:
            end_scope(token)
        log.info("after")
    finally:
        logging.getLogger().removeHandler(handler)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3  # a policy name with a newline stays inside its JSON string
    outside, inside, after = (json.loads(line) for line in lines)
    assert set(outside) == {"time", "level", "logger", "message"} and outside["message"] == "outside"
    import datetime as dt

    assert dt.datetime.fromisoformat(outside["time"]).tzinfo is not None
    assert inside["level"] == "WARNING" and inside["logger"] == "crossaudit.test"
    assert inside["message"] == "inside a decision"
    assert (inside["decision_id"], inside["tenant"], inside["request_id"]) == ("d-123", "acme", "req-9")
    assert inside["policy"] == 'evil\n{"level": "ERROR"}'
    assert "decision_id" not in after


def test_serve_flags_left_out_leave_the_key_to_the_file() -> None:
    """A flag not given is not a flag value (argparse defaults would otherwise beat the file)."""
    from crossaudit.cli.main import build_parser
    from crossaudit.cli.server import settings_flags

    args = build_parser().parse_args(["serve", "--port", "0", "--dev", "--set", "limits.max_stream_items=3"])
    flags = {f.flag: (f.path, f.value) for f in settings_flags(args)}
    assert flags == {
        "--port": (("port",), 0),
        "--dev": (("dev",), True),
        "--set limits.max_stream_items": (("limits", "max_stream_items"), 3),
    }


def test_readme_configure_commands_run_as_written(monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's "Configure it" commands, from the repository root, with the example file."""
    import os
    import re
    import shlex
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    readme = (root / "README.md").read_text()
    part = readme[readme.index("\n### Configure it\n") :]
    part = part[: part.index("\n### ", 5)]
    (block,) = re.findall(r"```bash\n(.*?)```", part, flags=re.S)
    commands = [line for line in block.splitlines() if line.strip()]
    assert commands
    for command in commands:
        argv = shlex.split(command)
        env = {k: v for k, v in os.environ.items() if not k.upper().startswith("CROSSAUDIT_")}
        while "=" in argv[0]:
            name, value = argv.pop(0).split("=", 1)
            env[name] = value
        assert argv[0] == "crossaudit"
        argv = [sys.executable, "-m", "crossaudit.cli", *argv[1:]]
        proc = subprocess.run(argv, capture_output=True, text=True, cwd=root, env=env, timeout=120, check=False)
        assert proc.returncode == 0, f"{command}: {proc.stderr[-1500:]}"
        if "--json" in argv:
            shown = json.loads(proc.stdout)["settings"]
            assert shown[KEY]["value"] == 32 and shown[KEY]["source"] == "env"
            assert shown["log_format"] == {"value": "json", "source": "file", "origin": shown["log_format"]["origin"]}
        else:
            assert "limits.max_inflight_evaluations_per_tenant" in proc.stdout


def test_docs_name_every_limit_key_and_its_variable() -> None:
    root = Path(__file__).resolve().parents[2]
    limits_doc = (root / "docs" / "limits.md").read_text()
    config_doc = (root / "docs" / "configuration.md").read_text()
    sections = tuple(
        f"{s}." for s in ("limits", "console_limits", "engine_limits", "sandbox_limits", "pool_limits",
                          "dependency_limits", "delivery_limits", "postgres_limits", "model_server_limits",
                          "metrics_limits")
    )  # fmt: skip
    keys = [k for k in load_settings().values if k.startswith(sections)]
    missing = [k for k in keys if f"`{k}`" not in limits_doc or f"`{env_name(tuple(k.split('.')))}`" not in limits_doc]
    assert not missing, f"docs/limits.md lacks: {missing}"
    top = [k for k in load_settings().values if "." not in k and not k.startswith("llm_prices")]
    assert not [k for k in top if f"`{k}`" not in config_doc], "docs/configuration.md lacks a top-level key"


def test_every_setting_is_a_described_field_and_numbers_carry_a_constraint() -> None:
    """Each setting is declared once, as a field with its description; a number without a bound
    would let a typo such as 0 or -5 through, so each one carries its constraint."""
    import annotated_types

    from crossaudit.service.config import setting_fields

    fields = setting_fields()
    shown = {k for k in load_settings().values if k not in ENVIRONMENT_KEYS and not k.startswith("llm_prices.")}
    assert shown == {f.key for f in fields} - {"llm_prices"}
    assert not [f.key for f in fields if not f.description], "a setting without a description"

    def bounded(annotation: typing.Any) -> bool:
        args = typing.get_args(annotation)
        if typing.get_origin(annotation) is typing.Annotated:
            metadata = [m for x in args[1:] for m in getattr(x, "metadata", [x])]
            if any(isinstance(m, annotated_types.Ge | annotated_types.Gt) for m in metadata):
                return True
            return bounded(args[0])
        if args and typing.get_origin(annotation) is not typing.Literal:
            return all(bounded(a) for a in args if a is not type(None) and typing.get_origin(a) is not typing.Literal)
        return annotation not in (int, float)

    assert not [f.key for f in fields if not bounded(f.annotation)], "a number setting without a constraint"


def test_serve_flags_are_the_fields_marked_cli_with_their_description() -> None:
    from crossaudit.cli.main import build_parser
    from crossaudit.cli.server import flagged_settings

    parser = build_parser()
    serve = parser._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    actions = {a.option_strings[0]: a for a in serve._actions if a.option_strings}
    flagged = flagged_settings()
    assert {"--port", "--api-keys", "--store", "--llm-base-url-host", "--console-port"} <= {f.flag for f in flagged}
    for f in flagged:
        assert f.flag in actions and str(actions[f.flag].help).startswith(f.description.replace("%", "%%"))
    args = parser.parse_args(["serve", "--console-port", "off", "--llm-base-url-host", "a", "--llm-base-url-host", "b"])
    from crossaudit.cli.server import settings_flags

    loaded = load_settings(None, settings_flags(args))
    assert loaded.config.console_port == "off" and loaded.config.llm_base_url_hosts == ("a", "b")
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--console-port", "of"])


def test_settings_docs_are_generated_from_the_fields() -> None:
    """docs/limits.md's and docs/configuration.md's settings tables are the fields' own."""
    from tools import generate_settings_docs

    assert generate_settings_docs.stale() == [], "run python -m tools.generate_settings_docs"
