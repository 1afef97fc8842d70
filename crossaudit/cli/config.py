"""``crossaudit config show``: the settings ``crossaudit serve`` would run with, and where each
value came from (default, file, env, flag). Store and decision-log URLs are shown without their
password; secrets passed by reference (``CROSSAUDIT_DECISION_LOG_TOKEN``, the tenants' secrets)
are never settings, so never shown.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from crossaudit.cli.common import EXIT_OK, command_group
from crossaudit.cli.server import add_config_options, settings_flags


def register(subparsers: argparse._SubParsersAction) -> None:
    csub = command_group(
        subparsers,
        "config",
        help="show the server settings in effect and their sources; write a deployment's secret files",
        dest="config_command",
    )
    show = csub.add_parser(
        "show",
        help="every setting of `crossaudit serve`, its value and its source (default/file/env/flag)",
        description="Layering, lowest first: defaults, --config FILE (or $CROSSAUDIT_CONFIG), CROSSAUDIT_* "
        "variables, flags (--set). docs/configuration.md lists the keys.",
    )
    add_config_options(show)
    show.add_argument("--json", action="store_true", help="print JSON: {key: {value, source, origin}}")
    show.add_argument("--changed", action="store_true", help="only the keys a file, variable or flag sets")
    show.set_defaults(func=cmd_config_show)
    from crossaudit.cli import secretfiles

    secretfiles.register(csub)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def cmd_config_show(args: argparse.Namespace) -> int:
    from crossaudit.service.settings import load_settings, unknown_environment
    from crossaudit.service.tracing import describe

    loaded = load_settings(args.config, settings_flags(args))
    rows = [r for r in loaded.rows() if not args.changed or r[2].kind != "default"]
    warnings = unknown_environment()
    if args.json:
        doc = {
            "file": str(loaded.file) if loaded.file else None,
            "settings": {k: {"value": v, "source": o.kind, "origin": o.name} for k, v, o in rows},
            "warnings": warnings,
            "tracing": describe(loaded.config.tracing),
        }
        print(json.dumps(doc, indent=2, sort_keys=True, default=str))
        return EXIT_OK
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    layers = ["defaults", str(loaded.file) if loaded.file else None, "environment", "flags"]
    print("# " + " < ".join(x for x in layers if x))
    print(f"# tracing: {describe(loaded.config.tracing)}")
    width = max((len(k) for k, _, _ in rows), default=3)
    values = [_text(v) for _, v, _ in rows]
    vwidth = min(max((len(v) for v in values), default=5), 40)
    for (key, _, origin), value in zip(rows, values, strict=True):
        print(f"{key:<{width}}  {value:<{vwidth}}  {origin}")
    return EXIT_OK
