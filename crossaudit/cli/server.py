"""``crossaudit serve``: run the gRPC orchestrator service with the layered settings.

Its flags are derived from the settings' fields (``crossaudit.service.config.ServerConfig``): each
field marked ``CLI`` is a flag of its own, with the field's type, choices and description; every
setting, flagged or not, is also ``--set KEY=VALUE``. A flag not given is no value, so it leaves
the key to the file, the environment or the default (docs/configuration.md).
"""

from __future__ import annotations

import argparse
import logging
import os
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

from crossaudit.cli.common import EXIT_OK
from crossaudit.service.config import SettingField, setting_fields


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``serve`` to the ``crossaudit`` parser."""
    s = subparsers.add_parser(
        "serve",
        help="run the gRPC orchestrator service",
        description="Settings come from the defaults, then --config FILE (or $CROSSAUDIT_CONFIG), then "
        "CROSSAUDIT_* variables, then these flags; `crossaudit config show` prints the result "
        "(docs/configuration.md).",
    )
    add_config_options(s)
    add_setting_flags(s)
    s.set_defaults(func=cmd_serve)


def add_config_options(p: argparse.ArgumentParser) -> None:
    """``--config FILE`` and ``--set KEY=VALUE`` (``serve`` and ``config show``)."""
    p.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="settings file, YAML or TOML (default: $CROSSAUDIT_CONFIG); environment and flags override it",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any setting, above every other source, e.g. --set limits.max_inflight_evaluations_per_tenant=64 "
        "(repeatable; the value is YAML)",
    )


def flagged_settings() -> list[SettingField]:
    """The settings that are flags of their own, in their fields' order."""
    return [f for f in setting_fields() if f.flag is not None]


def add_setting_flags(p: argparse.ArgumentParser) -> None:
    """One flag per flagged setting, its type, choices and help taken from the field."""
    for f in flagged_settings():
        p.add_argument(str(f.flag), dest=f.key, default=None, **_argument(f))


def _leaves(annotation: Any) -> list[Any]:
    """The types a value may have, constraints and unions taken apart; a Literal's values as themselves."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _leaves(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [leaf for arg in typing.get_args(annotation) for leaf in _leaves(arg)]
    if origin is Literal:
        return [("literal", v) for v in typing.get_args(annotation)]
    return [annotation]


def _argument(f: SettingField) -> dict[str, Any]:
    leaves = _leaves(f.annotation)
    choices = [v for leaf in leaves if isinstance(leaf, tuple) for v in leaf[1:]]
    kwargs: dict[str, Any] = {"help": _help(f)}
    if f.cli is not None and f.cli.metavar:
        kwargs["metavar"] = f.cli.metavar
    if bool in leaves:
        return {**kwargs, "action": "store_true"}
    if any(typing.get_origin(leaf) is tuple for leaf in leaves):
        return {**kwargs, "action": "append"}
    if int in leaves and choices:
        return {**kwargs, "type": _int_or(choices)}
    if choices:
        return {**kwargs, "choices": choices}
    if int in leaves:
        return {**kwargs, "type": int}
    return kwargs


def _int_or(words: list[str]) -> Any:
    """A number, or one of the field's words (``--console-port off``)."""

    def parse(text: str) -> int | str:
        if text.strip().lower() in words:
            return text.strip().lower()
        try:
            return int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"give a number or {' or '.join(words)}") from None

    return parse


def _help(f: SettingField) -> str:
    text = f.description.replace("%", "%%")  # argparse formats help with %
    if f.default is None or f.default is False or f.default == ():
        return text
    return f"{text}; default {f.default}"


def _optional(f: SettingField) -> bool:
    return type(None) in _leaves(f.annotation)


def settings_flags(args: argparse.Namespace) -> list[Any]:
    """The flags given on this command line, as settings (flags not given leave the key to the
    file, the environment or the default)."""
    from crossaudit.service.settings import Flag, parse_set

    flags: list[Any] = []
    for f in flagged_settings():
        value = getattr(args, f.key, None)
        if value is None:
            continue
        if value == "" and _optional(f):
            value = None  # --policies-dir '': deploy nothing on first start
        flags.append(Flag(f.path, value, str(f.flag)))
    flags.extend(parse_set(item) for item in getattr(args, "set", None) or [])
    return flags


def cmd_serve(args: argparse.Namespace) -> int:
    import asyncio

    from crossaudit.modelserver.store import ENV_MODEL_STORE, STORE_SUBDIR
    from crossaudit.service.logs import configure_logging
    from crossaudit.service.server import serve
    from crossaudit.service.settings import load_settings, unknown_environment

    loaded = load_settings(args.config, settings_flags(args))
    config = loaded.config
    configure_logging(config.log_level, config.log_format)
    log = logging.getLogger("crossaudit.service")
    for problem in unknown_environment():
        log.warning("%s", problem)
    if loaded.file is not None:
        log.info("settings from %s (crossaudit config show: every value and its source)", loaded.file)
    loaded.apply_environment()  # model locations and image settings, read where they are used
    # The builtins' model store is the operator's: <data dir>/models unless set otherwise.
    os.environ.setdefault(ENV_MODEL_STORE, str(Path(config.data_dir).resolve() / STORE_SUBDIR))
    try:
        asyncio.run(serve(config))
    except KeyboardInterrupt:  # a second Ctrl-C during shutdown
        return 130
    return EXIT_OK
