"""Service commands of the ``crossaudit`` CLI: ``serve`` and the client commands
(``policy deploy|list|get|rollback``, ``evaluator upload|list|get``, ``review list|resolve``,
``audit list|get``).

Server address and key come from ``--server``/``--api-key`` or ``CROSSAUDIT_SERVER``/
``CROSSAUDIT_API_KEY``. Errors are raised as typed CrossAuditErrors, which ``crossaudit.cli.main``
prints as one line (exit 1); usage errors exit 2.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

from crossaudit.cli import display, progress
from crossaudit.cli.common import EXIT_OK
from crossaudit.kernel.errors import InvalidInputError
from crossaudit.sdk.options import API_KEY_ENV, DEFAULT_SERVER, SERVER_ENV
from crossaudit.service.config import CONSOLE_OFF, DEFAULT_ENVIRONMENT, DEV_CONSOLE_PORT

API_KEYS_FILE_ENV = "CROSSAUDIT_API_KEYS_FILE"
DEFAULT_PORT = 50051


# --- parser -------------------------------------------------------------------------------


def _client_options() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("server connection")
    g.add_argument("--server", default=None, metavar="HOST:PORT", help=f"default: ${SERVER_ENV} or {DEFAULT_SERVER}")
    g.add_argument("--api-key", default=None, metavar="KEY", help=f"default: ${API_KEY_ENV}")
    g.add_argument("--tls", action="store_true", help="connect with TLS (system roots)")
    g.add_argument("--ca-cert", default=None, metavar="PEM", help="connect with TLS trusting this CA certificate")
    g.add_argument("--timeout", type=float, default=None, metavar="SECONDS", help="call deadline")
    g.add_argument("--json", action="store_true", help="print JSON")
    return p


def register(subparsers: argparse._SubParsersAction, policy_subparsers: argparse._SubParsersAction) -> None:
    """Add the service commands to the ``crossaudit`` parser; ``policy_subparsers`` (the
    ``policy`` sub-commands) gains deploy/list/get/rollback."""
    common = _client_options()

    s = subparsers.add_parser(
        "serve",
        help="run the gRPC orchestrator service",
        description="Settings come from the defaults, then --config FILE (or $CROSSAUDIT_CONFIG), then "
        "CROSSAUDIT_* variables, then these flags; `crossaudit config show` prints the result "
        "(docs/configuration.md).",
    )
    add_config_options(s)
    s.add_argument("--host", default=None, help="listen address (default 127.0.0.1)")
    s.add_argument("--port", type=int, default=None, help=f"listen port (default {DEFAULT_PORT}; 0 = any)")
    s.add_argument("--data-dir", default=None, help="SQLite database directory (default .crossaudit)")
    s.add_argument(
        "--sandbox",
        choices=["docker", "process", "auto"],
        default=None,
        help="where custom code runs (default auto: docker where a daemon answers, else process)",
    )
    s.add_argument(
        "--model-servers",
        choices=["subprocess", "docker"],
        default=None,
        help="how builtin model servers run: subprocess (default) or docker (no network, read-only root, "
        "models mounted read-only; default: $CROSSAUDIT_MODEL_SERVERS or subprocess)",
    )
    s.add_argument(
        "--allow-process-sandbox",
        action="store_true",
        default=None,
        help="with API keys, accept the process sandbox (weaker isolation than docker) for custom code",
    )
    s.add_argument(
        "--api-keys",
        default=None,
        metavar="FILE",
        help=f"tenants file 'tenants: {{name: [key, ...]}}' or 'tenants: {{name: {{keys: [...], secrets: "
        f"{{NAME: {{env: VAR}}}}}}}}' (default: ${API_KEYS_FILE_ENV})",
    )
    s.add_argument("--dev", action="store_true", default=None, help="no keys, one 'default' tenant; loopback only")
    s.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus /metrics on this port")
    s.add_argument("--metrics-host", default=None, help="metrics listen address (default 127.0.0.1)")
    s.add_argument(
        "--console-port",
        type=_console_port,
        default=None,
        metavar="PORT|off",
        help=f"serve the review console (web UI) on this port (0 = any; 'off' = none; default: off, with --dev "
        f"{DEV_CONSOLE_PORT}, or any free port with --port 0; docs/review-console.md)",
    )
    s.add_argument(
        "--console-host",
        default=None,
        help="review console listen address (default 127.0.0.1; any other needs --tls-cert/--tls-key)",
    )
    s.add_argument("--tls-cert", default=None, metavar="PEM")
    s.add_argument("--tls-key", default=None, metavar="PEM")
    s.add_argument(
        "--policies-dir",
        default=None,
        help=f"policies/*.yaml deployed to {DEFAULT_ENVIRONMENT!r} on first start (default policies; '' = none)",
    )
    s.add_argument(
        "--audit-raw-text",
        action="store_true",
        default=None,
        help="store prompt/response text in the audit log (default: SHA-256 hashes only)",
    )
    s.add_argument(
        "--store",
        default=None,
        metavar="URL",
        help="postgresql://user:password@host/db: state shared by every replica (default: SQLite in the "
        "data dir; also CROSSAUDIT_STORE)",
    )
    s.add_argument(
        "--decision-log-url",
        default=None,
        metavar="URL",
        help="push every decision to this HTTP endpoint in gzip'd JSON batches, at least once "
        "(Bearer $CROSSAUDIT_DECISION_LOG_TOKEN when set; docs/decision-log.md)",
    )
    s.add_argument(
        "--decision-log-dir",
        default=None,
        metavar="DIR",
        help="append every decision to DIR/decisions-YYYY-MM-DD.jsonl, at least once",
    )
    s.add_argument(
        "--llm-base-url-host",
        action="append",
        default=None,
        metavar="HOST",
        help="a host every tenant's LLM base_url may name (repeatable; also llm_base_url_hosts in the "
        "API-keys file); with API keys and none listed, only the providers' default endpoints",
    )
    s.add_argument("--log-level", default=None, choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="default INFO")
    s.add_argument(
        "--log-format",
        default=None,
        choices=["text", "json"],
        help="text (default) or json: one JSON object per line, with the decision id on a decision's lines",
    )
    s.set_defaults(func=cmd_serve)

    d = policy_subparsers.add_parser("deploy", parents=[common], help="deploy a policy file to an environment")
    d.add_argument("file", metavar="FILE")
    d.add_argument("--environment", "-e", default=DEFAULT_ENVIRONMENT)
    d.set_defaults(func=cmd_policy_deploy)
    pl = policy_subparsers.add_parser("list", parents=[common], help="list deployed policies")
    pl.add_argument("--environment", "-e", default="", help="only policies deployed there")
    pl.set_defaults(func=cmd_policy_list)
    pg = policy_subparsers.add_parser("get", parents=[common], help="print a deployed policy's YAML")
    pg.add_argument("name")
    pg.add_argument("--environment", "-e", default=DEFAULT_ENVIRONMENT)
    pg.add_argument("--version", type=int, default=0, help="a stored version instead of the deployed one")
    pg.set_defaults(func=cmd_policy_get)
    pr = policy_subparsers.add_parser("rollback", parents=[common], help="deploy an earlier version again")
    pr.add_argument("name")
    pr.add_argument("--environment", "-e", default=DEFAULT_ENVIRONMENT)
    pr.add_argument("--to-version", type=int, default=0, help="default: the previously deployed version")
    pr.set_defaults(func=cmd_policy_rollback)

    ev = subparsers.add_parser("evaluator", help="upload and inspect custom evaluators")
    esub = ev.add_subparsers(dest="evaluator_command", metavar="SUBCOMMAND")
    esub.required = True
    eu = esub.add_parser("upload", parents=[common], help="upload evaluator code (validated, image built)")
    eu.add_argument("file", metavar="FILE", help="Python source defining evaluate(prompt, response, context)")
    eu.add_argument("--name", required=True)
    eu.add_argument(
        "--dependency",
        "-d",
        action="append",
        default=[],
        metavar="REQ",
        help="pip requirement such as 'textblob>=0.18' (repeatable)",
    )
    eu.add_argument("--description", default="")
    eu.set_defaults(func=cmd_evaluator_upload)
    el = esub.add_parser("list", parents=[common], help="list uploaded evaluators")
    el.add_argument("--name", default="")
    el.set_defaults(func=cmd_evaluator_list)
    eg = esub.add_parser("get", parents=[common], help="show one evaluator")
    eg.add_argument("id", nargs="?", default="", help="evaluator id (or use --name)")
    eg.add_argument("--name", default="")
    eg.add_argument("--version", type=int, default=0)
    eg.add_argument("--code", action="store_true", help="include the source")
    eg.set_defaults(func=cmd_evaluator_get)

    au = subparsers.add_parser("audit", help="read the audit log of answered decisions")
    asub = au.add_subparsers(dest="audit_command", metavar="SUBCOMMAND")
    asub.required = True
    al = asub.add_parser("list", parents=[common], help="recent decisions, most recent first")
    al.add_argument("--policy", default="")
    al.add_argument("--limit", type=int, default=20)
    al.set_defaults(func=cmd_audit_list)
    ag = asub.add_parser("get", parents=[common], help="one decision's audit record (JSON)")
    ag.add_argument("decision_id")
    ag.set_defaults(func=cmd_audit_get)

    rv = subparsers.add_parser("review", help="review items created by require_review and flag")
    rsub = rv.add_subparsers(dest="review_command", metavar="SUBCOMMAND")
    rsub.required = True
    rl = rsub.add_parser("list", parents=[common], help="list reviews (default: open ones)")
    rl.add_argument("--state", default="open", choices=["open", "approved", "rejected", "dismissed", "any"])
    rl.add_argument("--policy", default="")
    rl.add_argument("--limit", type=int, default=0)
    rl.set_defaults(func=cmd_review_list)
    rr = rsub.add_parser("resolve", parents=[common], help="resolve an open review")
    rr.add_argument("id")
    rr.add_argument("--state", required=True, choices=["approved", "rejected", "dismissed"])
    rr.add_argument("--reviewer", default="")
    rr.add_argument("--note", default="")
    rr.set_defaults(func=cmd_review_resolve)

    wh = subparsers.add_parser("webhooks", help="deliveries of custom actions' webhooks")
    wsub = wh.add_subparsers(dest="webhooks_command", metavar="SUBCOMMAND")
    wsub.required = True
    wl = wsub.add_parser("list", parents=[common], help="list deliveries, most recent first")
    wl.add_argument("--state", default="any", choices=["pending", "delivered", "dead", "any"])
    wl.add_argument("--limit", type=int, default=20)
    wl.set_defaults(func=cmd_webhooks_list)
    wr = wsub.add_parser("redeliver", parents=[common], help="send a dead (or delivered) webhook again")
    wr.add_argument("id", help="the delivery id (the webhook-id header the receiver saw)")
    wr.set_defaults(func=cmd_webhooks_redeliver)


# --- helpers ------------------------------------------------------------------------------


def _console_port(text: str) -> int | str:
    """``--console-port``: a port number or ``off`` (the setting's own values)."""
    if text.strip().lower() == CONSOLE_OFF:
        return CONSOLE_OFF
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"give a port number, 0 for any free port, or {CONSOLE_OFF}") from None


def _client(args: argparse.Namespace) -> Any:
    from crossaudit.sdk.client import Client

    tls: Any = args.ca_cert or bool(args.tls)
    # No --server / --api-key: the Client falls back to $CROSSAUDIT_SERVER / $CROSSAUDIT_API_KEY.
    options = {"timeout": args.timeout} if args.timeout else {}
    return Client(args.server or None, api_key=args.api_key or None, tls=tls, **options)


def _print_json(value: Any) -> None:
    """The record as JSON, its timestamps as ISO-8601 UTC (crossaudit/cli/display.py)."""
    display.print_json(value)


def _read_text(path: str, what: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InvalidInputError(f"{what} {path} not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidInputError(f"cannot read {what} {path}: {e}") from None


# --- commands -----------------------------------------------------------------------------


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


# serve's own flags: (argparse dest, settings key)
SERVE_FLAGS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("host", ("host",)),
    ("port", ("port",)),
    ("data_dir", ("data_dir",)),
    ("sandbox", ("sandbox",)),
    ("model_servers", ("model_servers",)),
    ("allow_process_sandbox", ("allow_process_sandbox",)),
    ("api_keys", ("api_keys_file",)),
    ("dev", ("dev",)),
    ("metrics_port", ("metrics_port",)),
    ("metrics_host", ("metrics_host",)),
    ("console_port", ("console_port",)),
    ("console_host", ("console_host",)),
    ("tls_cert", ("tls_cert",)),
    ("tls_key", ("tls_key",)),
    ("policies_dir", ("policies_dir",)),
    ("audit_raw_text", ("audit_raw_text",)),
    ("store", ("store_url",)),
    ("decision_log_url", ("decision_log_url",)),
    ("decision_log_dir", ("decision_log_dir",)),
    ("llm_base_url_host", ("llm_base_url_hosts",)),
    ("log_level", ("log_level",)),
    ("log_format", ("log_format",)),
)


def settings_flags(args: argparse.Namespace) -> list[Any]:
    """The flags given on this command line, as settings (flags not given leave the key to the
    file, the environment or the default)."""
    from crossaudit.service.settings import Flag, parse_set

    flags: list[Any] = []
    for dest, path in SERVE_FLAGS:
        value = getattr(args, dest, None)
        if value is None:
            continue
        if value == "" and dest == "policies_dir":
            value = None  # --policies-dir '': deploy nothing on first start
        flags.append(Flag(path, value, "--" + dest.replace("_", "-")))
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


def cmd_policy_deploy(args: argparse.Namespace) -> int:
    if not Path(args.file).is_file():
        raise InvalidInputError(f"policy file {args.file} not found")
    with progress.build_progress(quiet=args.json) as update, _client(args) as c:
        kwargs = {"timeout": args.timeout} if args.timeout else {}
        r = c.deploy_policy(Path(args.file), environment=args.environment, progress=update, **kwargs)
    if args.json:
        _print_json(r)
    else:
        what = "new version" if r.created else "existing version"
        print(
            f"deployed {r.version.name!r} v{r.version.version} ({what}, declared {r.version.declared_version}) "
            f"to {r.deployment.environment}"
        )
    return EXIT_OK


def _print_listing(args: argparse.Namespace, items: list[Any], what: str, columns: list[display.Column]) -> int:
    """Every ``list`` command's output: JSON with ``--json``, else a table (or "no <what>")."""
    if args.json:
        _print_json(items)
        return EXIT_OK
    display.print_table(items, columns, what=what)
    return EXIT_OK


# one row per (policy, environment it is deployed to): a piped listing stays one line per row
POLICY_COLUMNS = [
    display.Column("Policy", lambda row: row[0].name),
    display.Column("Latest", lambda row: f"v{row[0].latest_version}", justify="right"),
    display.Column("Environment", lambda row: row[1].environment if row[1] else "not deployed"),
    display.Column("Deployed", lambda row: f"v{row[1].version}" if row[1] else "-", justify="right"),
    display.Column("Deployed at", lambda row: display.when(row[1].deployed_at) if row[1] else "-"),
]


def cmd_policy_list(args: argparse.Namespace) -> int:
    with _client(args) as c:
        items = c.list_policies(environment=args.environment)
    if args.json:
        return _print_listing(args, items, "policies", POLICY_COLUMNS)
    rows = [(p, d) for p in items for d in (p.deployments or (None,))]
    return _print_listing(args, rows, "policies", POLICY_COLUMNS)


def cmd_policy_get(args: argparse.Namespace) -> int:
    with _client(args) as c:
        info = c.get_policy(args.name, environment=args.environment, version=args.version)
    if args.json:
        _print_json(info)
    else:
        sys.stdout.write(info.content if info.content.endswith("\n") else info.content + "\n")
    return EXIT_OK


def cmd_policy_rollback(args: argparse.Namespace) -> int:
    with _client(args) as c:
        r = c.rollback(args.name, environment=args.environment, to_version=args.to_version)
    if args.json:
        _print_json(r)
    else:
        print(f"{args.name!r} in {r.deployment.environment}: v{r.previous_version} -> v{r.deployment.version}")
    return EXIT_OK


def cmd_evaluator_upload(args: argparse.Namespace) -> int:
    code = _read_text(args.file, "evaluator file")
    with progress.build_progress(quiet=args.json) as update, _client(args) as c:
        kwargs = {"timeout": args.timeout} if args.timeout else {}
        info = c.upload_evaluator(args.name, code, args.dependency, update, description=args.description, **kwargs)
    if args.json:
        _print_json(info)
    else:
        state = "uploaded" if info.created else "already uploaded"
        print(f"{state} evaluator {info.name!r} v{info.version}: id {info.id}")
        print(f'reference it in a policy as:  evaluators: [{{id: "{info.id}", name: {info.name}, type: custom}}]')
    return EXIT_OK


def cmd_evaluator_list(args: argparse.Namespace) -> int:
    with _client(args) as c:
        items = c.list_evaluators(name=args.name)
    return _print_listing(args, items, "evaluators", EVALUATOR_COLUMNS)


EVALUATOR_COLUMNS = [
    display.Column("Id", lambda e: e.id, key=True),
    display.Column("Name", lambda e: e.name),
    display.Column("Version", lambda e: f"v{e.version}", justify="right"),
    display.Column("Dependencies", lambda e: ", ".join(e.dependencies) or "-"),
    display.Column("Created", lambda e: display.when(e.created_at)),
]


def cmd_evaluator_get(args: argparse.Namespace) -> int:
    if not args.id and not args.name:
        raise InvalidInputError("give an evaluator id or --name")
    with _client(args) as c:
        e = c.get_evaluator(args.id, name=args.name, version=args.version, include_code=args.code)
    if args.json:
        _print_json(e)
        return EXIT_OK
    print(
        f"id: {e.id}\nname: {e.name}\nversion: {e.version}\nlanguage: {e.language}\n"
        f"dependencies: {', '.join(e.dependencies) or '-'}\ndigest: {e.digest}\ncreated: {display.when(e.created_at)}"
    )
    if args.code:
        print("---")
        sys.stdout.write(e.code if e.code.endswith("\n") else e.code + "\n")
    return EXIT_OK


def cmd_audit_list(args: argparse.Namespace) -> int:
    with _client(args) as c:
        items = c.list_decisions(policy=args.policy, limit=args.limit)
    return _print_listing(args, items, "decisions", DECISION_COLUMNS)


DECISION_COLUMNS = [
    display.Column("Decision", lambda d: d.decision_id, key=True),
    display.Column("Policy", lambda d: f"{d.policy} v{d.policy_revision} ({d.environment})"),
    display.Column("Result", lambda d: f"{'passed' if d.passed else 'failed'} {d.action}"),
    display.Column("Errored rules", lambda d: ", ".join(d.errored_rules) or "-"),
    display.Column("Latency", lambda d: f"{d.latency_ms:.1f} ms", justify="right"),
    display.Column("Created", lambda d: display.when(d.created_at)),
]


def cmd_audit_get(args: argparse.Namespace) -> int:
    with _client(args) as c:
        _print_json(c.get_decision(args.decision_id))
    return EXIT_OK


def cmd_review_list(args: argparse.Namespace) -> int:
    state = args.state
    with _client(args) as c:
        items = c.list_reviews(state=state, policy=args.policy, limit=args.limit)
    return _print_listing(args, items, "reviews", REVIEW_COLUMNS)


def _review_state(r: Any) -> str:
    marks = [m for m in ("escalated", "overdue") if getattr(r, m, False)]
    return r.state.value + "".join(f" [{m}]" for m in marks)


REVIEW_COLUMNS = [
    display.Column("Review", lambda r: r.id, key=True),
    display.Column("State", _review_state),
    display.Column("Kind", lambda r: r.kind.value),
    display.Column("Policy / rule", lambda r: f"{r.policy} / {r.rule}"),
    display.Column("Decision", lambda r: r.decision_id, key=True),
    display.Column("Created", lambda r: display.when(r.created_at)),
    display.Column("Resolved", lambda r: display.when(r.resolved_at)),
]


def cmd_webhooks_list(args: argparse.Namespace) -> int:
    with _client(args) as c:
        items = c.list_deliveries(state=None if args.state == "any" else args.state, limit=args.limit)
    return _print_listing(args, items, "deliveries", DELIVERY_COLUMNS)


def _delivery_error(m: Any) -> str:
    return m.last_error if m.last_error and m.state.value != "delivered" else "-"


DELIVERY_COLUMNS = [
    display.Column("Delivery", lambda m: m.id, key=True),
    display.Column("State", lambda m: m.state.value),
    display.Column("Attempts", lambda m: str(m.attempts), justify="right"),
    display.Column("Last answer", lambda m: f"HTTP {m.last_status}" if m.last_status else "-"),
    display.Column("Request", lambda m: f"{m.payload.get('method', '')} {m.payload.get('url', '')}".strip() or m.kind),
    display.Column("Rule", lambda m: m.rule or "-"),
    display.Column("Decision", lambda m: m.decision_id, key=True),
    display.Column("Created", lambda m: display.when(m.created_at)),
    display.Column("Error", _delivery_error),
]


def cmd_webhooks_redeliver(args: argparse.Namespace) -> int:
    with _client(args) as c:
        m = c.redeliver(args.id)
    if args.json:
        _print_json(m)
    else:
        print(f"delivery {m.id} queued again")
    return EXIT_OK


def cmd_review_resolve(args: argparse.Namespace) -> int:
    with _client(args) as c:
        r = c.resolve_review(args.id, args.state, reviewer=args.reviewer, note=args.note)
    if args.json:
        _print_json(r)
    else:
        print(f"review {r.id} {r.state.value}")
    return EXIT_OK
