"""One layered configuration for ``crossaudit serve`` (pydantic-settings), lowest to highest:
the defaults, a file (``--config FILE`` / ``CROSSAUDIT_CONFIG``; YAML or TOML), the environment
(``CROSSAUDIT_<KEY>``, nested keys joined by ``__``), then command-line flags.

Each setting is declared once, as a typed field of :class:`~crossaudit.service.config.ServerConfig`
or of a limits dataclass it holds: its annotation carries the constraint and the description, its
default is the dataclass's. The settings model takes ServerConfig's fields as they are (pydantic
validates the dataclasses directly), ``setting_fields()`` (beside ServerConfig) lists every setting
for the flags (``crossaudit.cli.server``) and the docs (``tools/generate_settings_docs.py``), and
what the code receives is that same frozen ``ServerConfig``. Besides it, a few operator settings
that the code reads from the environment where it runs (model locations, image builds: model
servers are child processes) are settings too; ``serve`` exports them.
docs/configuration.md describes the keys, docs/limits.md every limit.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import Field, ValidationError, create_model, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict

from crossaudit.kernel.configfile import ConfigFile, read_config_text, read_yaml_file
from crossaudit.kernel.errors import ConfigurationError
from crossaudit.kernel.pricing import DEFAULT_LLM_PRICES
from crossaudit.service.config import (
    CONSOLE_OFF,
    ENV_DELIMITER,
    ENV_PREFIX,
    ServerConfig,
    env_name,
    section_of,
    setting_fields,
)
from crossaudit.store.postgres import mask_url

CONFIG_ENV = "CROSSAUDIT_CONFIG"  # the configuration file, when --config is not given
# Older variable names that keep working (deploy/k8s passes the store URL as CROSSAUDIT_STORE).
LEGACY_ENV: Mapping[str, tuple[str, ...]] = {"CROSSAUDIT_STORE": ("store_url",)}
# The OpenTelemetry SDK's standard variables (docs/observability.md) set the tracing keys: above the
# file, below CROSSAUDIT_TRACING__*. A signal's own variable follows the general one (and wins).
STANDARD_ENV: Mapping[str, tuple[str, ...]] = {
    "OTEL_SDK_DISABLED": ("tracing", "sdk_disabled"),
    "OTEL_TRACES_EXPORTER": ("tracing", "exporter"),
    "OTEL_EXPORTER_OTLP_ENDPOINT": ("tracing", "endpoint"),
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": ("tracing", "traces_endpoint"),
    "OTEL_EXPORTER_OTLP_PROTOCOL": ("tracing", "protocol"),
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": ("tracing", "protocol"),
    "OTEL_SERVICE_NAME": ("tracing", "service_name"),
    "OTEL_TRACES_SAMPLER": ("tracing", "sampler"),
    "OTEL_TRACES_SAMPLER_ARG": ("tracing", "sampler_arg"),
    "OTEL_BSP_MAX_QUEUE_SIZE": ("tracing", "max_queue_size"),
    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": ("tracing", "max_export_batch_size"),
    "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT": ("tracing", "max_attributes_per_span"),
    "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT": ("tracing", "max_attribute_length"),
}
# Every other name of a setting: older ones, then the standard ones.
ALIAS_ENV: Mapping[str, tuple[str, ...]] = {**LEGACY_ENV, **STANDARD_ENV}
# Keys that were renamed: the old one stops the start with the new name, rather than a guess.
RENAMED: Mapping[str, str] = {"limits.max_receive_message_bytes": "limits.max_request_bytes"}
# CROSSAUDIT_* variables that are not server settings: the client's, secrets passed by reference,
# build tools', the CLI's. A variable outside both lists is reported as a probable typo.
OTHER_ENV: Mapping[str, str] = {
    CONFIG_ENV: "the configuration file (crossaudit serve, crossaudit config show)",
    "CROSSAUDIT_SERVER": "client: where a Client / the remote CLI commands connect",
    "CROSSAUDIT_API_KEY": "client: the key a Client / the remote CLI commands send",
    "CROSSAUDIT_DEBUG": "CLI: 1 = show tracebacks of internal errors",
    "CROSSAUDIT_DECISION_LOG_TOKEN": "secret: Bearer token for --decision-log-url (never in the file)",
    "CROSSAUDIT_WEBHOOK_SIGNING_SECRET": "secret: webhook signing in dev mode / PolicyTester",
    "CROSSAUDIT_APT_SOURCES": "image builds: apt sources files for the local base image",
    "CROSSAUDIT_MODEL_WORKERS": "a standalone model server's default --workers",
    "CROSSAUDIT_SECRETS_DIR": "deploy/compose.yaml: where its secret files are",
}
# Per-variant model settings (CROSSAUDIT_DETOXIFY_CHECKPOINT_MULTILINGUAL, ...): environment only.
VARIANT_ENV_PREFIXES = ("CROSSAUDIT_DETOXIFY_CHECKPOINT_", "CROSSAUDIT_DETOXIFY_CONFIG_", "CROSSAUDIT_DETOXIFY_URL_")
# shown without their password
SECRET_URL_KEYS = frozenset({"store_url", "decision_log_url", "tracing.endpoint", "tracing.traces_endpoint"})

# --- the configuration file --------------------------------------------------------------------


def read_config_file(path: str | os.PathLike[str]) -> ConfigFile:
    """A YAML (``.yaml``/``.yml``) or TOML (``.toml``) file whose top level is a mapping."""
    p = Path(path)
    if p.suffix.lower() not in (".yaml", ".yml", ".toml"):
        raise ConfigurationError(f"config file {p}: use a .yaml, .yml or .toml file")
    if p.suffix.lower() != ".toml":
        return read_yaml_file(p, "config file")
    text = read_config_text(p, "config file")
    try:
        data: Any = tomllib.loads(text) if text.strip() else {}
    except tomllib.TOMLDecodeError as e:
        raise ConfigurationError(f"config file {p}: {e}") from None
    return ConfigFile(p, data)


# --- the settings model ------------------------------------------------------------------------


class FileSource(PydanticBaseSettingsSource):
    def __init__(self, settings_cls: type[BaseSettings], file: ConfigFile | None) -> None:
        super().__init__(settings_cls)
        self.file = file

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        data = self.file.data if self.file else {}
        return data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self.file.data) if self.file else {}


class LegacyEnvSource(PydanticBaseSettingsSource):
    """:data:`ALIAS_ENV`: older names and the standard ones, below the current ones."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, path in ALIAS_ENV.items():
            value = os.environ.get(name)
            if value:
                _put(out, path, value)
        return out


class _SettingsBase(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_DELIMITER,
        env_ignore_empty=True,
        case_sensitive=False,
        extra="forbid",
        validate_default=True,
        protected_namespaces=(),
    )
    config_file: ClassVar[ConfigFile | None] = None

    # Operator settings the code reads from the environment where it runs (the model servers are
    # child processes); ``serve`` exports each one that is set as CROSSAUDIT_<NAME>. Unset: the
    # default of the code that reads it (docs/builtins-and-llm.md, docs/sandbox-docker.md).
    model_store: Annotated[
        str | None, Field(description="the builtins' model store (`serve`: `<data_dir>/models`)")
    ] = None
    model_roots: Annotated[str | None, Field(description="`:`-separated directories every model path must lie in")] = (
        None
    )
    offline: Annotated[bool | None, Field(description="`true`: never download a model")] = None
    hf_endpoint: Annotated[str | None, Field(description="where base-model configs and tokenizers come from")] = None
    detoxify_url: Annotated[str | None, Field(description="Detoxify release base")] = None
    detoxify_checkpoint: Annotated[str | None, Field(description="Detoxify checkpoint")] = None
    detoxify_config: Annotated[str | None, Field(description="Detoxify config directory")] = None
    spacy_model: Annotated[str | None, Field(description="Presidio's spaCy pipeline")] = None
    spacy_models_url: Annotated[str | None, Field(description="where spaCy pipelines are downloaded from")] = None
    spacy_model_version: Annotated[str | None, Field(description="the spaCy pipeline's version")] = None
    spacy_package: Annotated[str | None, Field(description="the spaCy pipeline's package")] = None
    spacy_download_languages: Annotated[
        str | None, Field(description="languages whose spaCy pipelines are downloaded")
    ] = None
    base_image: Annotated[
        str | None, Field(description="the local Python 3.11 image custom-code images build FROM")
    ] = None
    cache_dir: Annotated[str | None, Field(description="wheelhouse and dependency sets")] = None

    @field_validator("llm_prices", mode="before", check_fields=False)
    @classmethod
    def _merge_prices(cls, value: Any) -> Any:
        """Entries given are added to the built-in table (or replace an entry of it)."""
        if isinstance(value, Mapping):
            return {**DEFAULT_LLM_PRICES, **value}
        return value

    @field_validator("console_port", mode="before", check_fields=False)
    @classmethod
    def _console_off(cls, value: Any) -> Any:
        """``off`` however it arrives: YAML 1.1 (``--set console_port=off``) reads it as false,
        which must not become port 0 (bool is an int); ``true`` is no port at all."""
        if value is False or (isinstance(value, str) and value.strip().lower() == CONSOLE_OFF):
            return CONSOLE_OFF
        if value is True:
            raise ValueError(f"give a port number, 0 for any free port, or {CONSOLE_OFF}")
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, env_settings, LegacyEnvSource(settings_cls), FileSource(settings_cls, cls.config_file)


ENVIRONMENT_KEYS = tuple(n for n in _SettingsBase.model_fields)
# ServerConfig's fields, each as declared (annotation, constraint, description, default): pydantic-
# settings reads a model, so the settings model is the environment settings above plus these.
_SERVER_HINTS = typing.get_type_hints(ServerConfig, include_extras=True)
Settings: type[_SettingsBase] = create_model(  # type: ignore[call-overload]
    "Settings",
    __base__=_SettingsBase,
    **{
        f.name: (_SERVER_HINTS[f.name], Field(default_factory=f.default_factory))
        if f.default_factory is not dataclasses.MISSING
        else (_SERVER_HINTS[f.name], f.default)
        for f in dataclasses.fields(ServerConfig)
    },
)


def _put(target: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for part in path[:-1]:
        target = target.setdefault(part, {})
    target[path[-1]] = value


def _leaves(data: Any, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    if isinstance(data, Mapping) and (data or not prefix):
        out: dict[tuple[str, ...], Any] = {}
        for k, v in data.items():
            out.update(_leaves(v, (*prefix, str(k))))
        return out
    return {prefix: data}


# --- loading -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Origin:
    kind: str  # default | file | env | flag
    name: str = ""  # file:line:col, the variable, or the flag

    def __str__(self) -> str:
        return f"{self.kind} {self.name}" if self.name else self.kind


@dataclass(frozen=True)
class Flag:
    """A command-line value: its settings key path, the value, how it was given."""

    path: tuple[str, ...]
    value: Any
    flag: str


@dataclass(frozen=True)
class LoadedSettings:
    config: ServerConfig
    environment: dict[str, str]  # CROSSAUDIT_<NAME> of each environment setting that is set
    values: dict[str, Any]  # dotted key -> value in effect (plain data)
    origins: dict[str, Origin]  # dotted key -> where that value came from
    file: Path | None

    def apply_environment(self, environ: typing.MutableMapping[str, str] | None = None) -> None:
        """Export the environment settings for the code (and child processes) that read them."""
        target = os.environ if environ is None else environ
        target.update(self.environment)

    def rows(self) -> list[tuple[str, Any, Origin]]:
        """(key, value, origin) in key order, secrets masked: what ``crossaudit config show`` prints."""
        return [(k, _masked(k, v), self.origins[k]) for k, v in sorted(self.values.items())]


def _masked(key: str, value: Any) -> Any:
    if key in SECRET_URL_KEYS and isinstance(value, str):
        return mask_url(value)
    return value


class _Origins:
    """Which source gave each key (the highest one that has it)."""

    def __init__(self, flags: list[Flag], env: dict[str, Any], legacy: dict[str, Any], file: ConfigFile | None):
        self.flags = {f.path: f.flag for f in flags}
        self.env = _leaves(env)
        self.legacy = _leaves(legacy)
        self.file = file
        self.file_leaves = _leaves(file.data) if file else {}
        self.environ = {k.upper(): k for k in os.environ}

    def of(self, path: tuple[str, ...]) -> Origin:
        for table, kind in ((self.flags, "flag"), (self.env, "env"), (self.legacy, "env"), (self.file_leaves, "file")):
            for i in range(len(path), 0, -1):
                if path[:i] in table:
                    return Origin(kind, self._name(kind, path[:i], table))
            below = next((k for k in table if k[: len(path)] == path), None)  # a mapping given there
            if below is not None:
                return Origin(kind, self._name(kind, below, table) if kind != "file" else self._name(kind, path, table))
        return Origin("default")

    def _name(self, kind: str, path: tuple[str, ...], table: Mapping[tuple[str, ...], Any]) -> str:
        if kind == "flag":
            return str(table[path])
        if kind == "file":
            return self.file.where(path) if self.file else ""
        if table is self.legacy:
            names = [n for n, p in ALIAS_ENV.items() if p == path[: len(p)] and os.environ.get(n)]
            return names[-1]  # the one that won (LegacyEnvSource: the later one)
        for i in range(len(path), 0, -1):  # a nested value may come whole, as JSON, in a parent's variable
            if env_name(path[:i]) in self.environ:
                return self.environ[env_name(path[:i])]
        return env_name(path)


def _nested_fields(path: tuple[str, ...]) -> list[str]:
    """The keys allowed at ``path`` (for "did you mean")."""
    if not path:
        return list(Settings.model_fields)
    section: type | None = ServerConfig
    for part in path:
        hint = typing.get_type_hints(section, include_extras=True).get(part) if section is not None else None
        section = section_of(hint) if hint is not None else None
    return [f.name for f in dataclasses.fields(section)] if section is not None else []


def _describe(e: Mapping[str, Any], origins: _Origins) -> str:
    loc = tuple(str(p) for p in e["loc"])
    key = ".".join(loc)
    origin = origins.of(loc)
    if e["type"] in ("extra_forbidden", "unexpected_keyword_argument"):  # a model's, a dataclass's
        if key in RENAMED:
            return f"unknown key {key!r} ({origin}): it is now {RENAMED[key]!r}"
        options = _nested_fields(loc[:-1])
        match = difflib.get_close_matches(loc[-1], options, n=1, cutoff=0.6)
        hint = f"; did you mean {'.'.join((*loc[:-1], match[0]))!r}?" if match else ""
        return f"unknown key {key!r} ({origin}){hint}"
    shown = json.dumps(e.get("input"), default=str)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return f"{key} = {shown} ({origin}): {e['msg']}"


def load_settings(
    config_file: str | os.PathLike[str] | None = None,
    flags: list[Flag] | None = None,
) -> LoadedSettings:
    """Defaults < ``config_file`` (else ``$CROSSAUDIT_CONFIG``) < environment < ``flags``.

    Raises ConfigurationError naming every bad key, its value and its source."""
    flags = list(flags or [])
    path = config_file or os.environ.get(CONFIG_ENV) or None
    file = read_config_file(path) if path else None
    init: dict[str, Any] = {}
    for f in flags:
        _put(init, f.path, f.value)
    cls = type("Settings", (Settings,), {"config_file": file})
    try:
        settings = cls(**init)
    except ValidationError as exc:
        origins = _origins(cls, flags, file)
        problems = [_describe(e, origins) for e in exc.errors()]
        raise ConfigurationError("invalid configuration:\n  " + "\n  ".join(problems)) from None
    origins = _origins(cls, flags, file)
    config = ServerConfig(**{f.name: getattr(settings, f.name) for f in dataclasses.fields(ServerConfig)})
    env_values = {k: getattr(settings, k) for k in ENVIRONMENT_KEYS}
    # --dev ignores a keys file that only the environment names (a shared shell or ConfigMap).
    if config.dev and config.api_keys_file and origins.of(("api_keys_file",)).kind == "env":
        config = dataclasses.replace(config, api_keys_file=None)
    data = dataclasses.asdict(config)
    values = {".".join(k): _jsonable(v) for k, v in _leaves({**data, **env_values}).items()}
    return LoadedSettings(
        config=config,
        environment={env_name((k,)): _env_text(v) for k, v in env_values.items() if v is not None},
        values=values,
        origins={k: origins.of(tuple(k.split("."))) for k in values},
        file=file.path if file else None,
    )


def _origins(cls: type[BaseSettings], flags: list[Flag], file: ConfigFile | None) -> _Origins:
    cfg = cls.model_config
    env = EnvSettingsSource(
        cls,
        case_sensitive=cfg.get("case_sensitive"),
        env_prefix=cfg.get("env_prefix"),
        env_nested_delimiter=cfg.get("env_nested_delimiter"),
        env_ignore_empty=cfg.get("env_ignore_empty"),
    )
    try:
        env_data = env()
    except Exception:  # an unparsable JSON value: pydantic-settings reports it itself
        env_data = {}
    return _Origins(flags, env_data, LegacyEnvSource(cls)(), file)


def _jsonable(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return list(value)
    return value


def _env_text(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def unknown_environment(environ: Mapping[str, str] | None = None) -> list[str]:
    """``CROSSAUDIT_*`` variables that are neither a setting nor one of :data:`OTHER_ENV`,
    each with a "did you mean" when one is close (a typo would otherwise go unnoticed)."""
    environ = os.environ if environ is None else environ
    known = {env_name((name,)) for name in Settings.model_fields} | set(OTHER_ENV) | set(LEGACY_ENV)
    nested = {env_name(f.path[:1]) + ENV_DELIMITER for f in setting_fields() if len(f.path) > 1}
    out = []
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX) or upper in known or upper.startswith(VARIANT_ENV_PREFIXES):
            continue
        if any(upper.startswith(n) for n in nested):
            continue  # a nested key: an unknown one is an error when the settings load
        match = difflib.get_close_matches(upper, sorted(known), n=1, cutoff=0.8)
        out.append(f"{name} is not a setting" + (f" (did you mean {match[0]}?)" if match else ""))
    return out


def parse_set(text: str) -> Flag:
    """``--set KEY=VALUE``: a dotted key and a YAML value (``64``, ``true``, ``[a, b]``)."""
    import yaml

    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigurationError(f"--set {text!r}: give KEY=VALUE, e.g. limits.max_inflight_evaluations_per_tenant=64")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return Flag(tuple(key.split(".")), value, f"--set {key}")
