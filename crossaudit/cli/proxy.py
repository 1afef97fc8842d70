"""``crossaudit proxy``: the OpenAI-compatible guard proxy (crossaudit.proxy; docs/proxy.md).

Settings come from ``--config FILE`` (callers, upstream, limits), then these flags. CrossAudit is
reached at ``--server`` (default ``$CROSSAUDIT_SERVER``) with each caller's CrossAudit key (default
``$CROSSAUDIT_API_KEY``); the upstream key is read from the variable ``--upstream-api-key-env``
names, never from the command line. It starts only once CrossAudit answers and accepts every
caller's key (docs/proxy.md#failures); otherwise one ``error:`` line, exit 1.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from pathlib import Path

from crossaudit.cli.common import EXIT_OK
from crossaudit.proxy import config as proxy_config
from crossaudit.sdk.options import API_KEY_ENV, DEFAULT_SERVER, SERVER_ENV


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "proxy",
        help="serve an OpenAI-compatible /v1/chat/completions that applies a policy before and after the model",
        description="The guard proxy: each chat completion is evaluated by a running CrossAudit server "
        "(the policy's input rules) before it goes upstream, and the answer (output rules) before it "
        "comes back. It starts only once CrossAudit answers and accepts the callers' keys. "
        "Settings: --config FILE, then these flags (docs/proxy.md).",
    )
    p.add_argument("--config", default=None, metavar="FILE", help="the proxy's YAML configuration (callers, limits)")
    p.add_argument("--upstream", default=None, metavar="URL", help="base URL of the OpenAI-compatible API (…/v1)")
    p.add_argument(
        "--upstream-api-key-env",
        default=None,
        metavar="VAR",
        help="environment variable holding the upstream key (the operator's; default: upstream.api_key, or none)",
    )
    p.add_argument(
        "--anthropic-upstream",
        default=None,
        metavar="URL",
        help="base URL of an Anthropic-compatible API (…/v1): serves /v1/messages (default: anthropic_upstream.url)",
    )
    p.add_argument(
        "--anthropic-upstream-api-key-env",
        default=None,
        metavar="VAR",
        help="environment variable holding its key, sent as x-api-key (default: anthropic_upstream.api_key)",
    )
    p.add_argument(
        "--server", default=None, metavar="HOST:PORT", help=f"CrossAudit (default: ${SERVER_ENV} or {DEFAULT_SERVER})"
    )
    p.add_argument("--tls", action="store_true", help="connect to CrossAudit with TLS (system roots)")
    p.add_argument("--ca-cert", default=None, metavar="PEM", help="connect to CrossAudit trusting this CA certificate")
    p.add_argument("--environment", "-e", default=None, help="where the policies are deployed (default production)")
    p.add_argument(
        "--dev",
        action="store_true",
        help=f"no caller keys (loopback only): every call may name any policy of the ${API_KEY_ENV} tenant",
    )
    p.add_argument("--policy", default=None, metavar="NAME", help="with --dev: the policy of calls that name none")
    p.add_argument(
        "--on-block", choices=["error", "refusal"], default=None, help="a block as an error (default) or a refusal"
    )
    p.add_argument(
        "--fail-open", action="store_true", default=None, help="pass calls through when CrossAudit cannot decide"
    )
    p.add_argument(
        "--input-messages",
        choices=["last_user", "all"],
        default=None,
        help="what the input stage evaluates: the last user message (default) or every message",
    )
    p.add_argument("--host", default=None, help=f"listen address (default {proxy_config.DEFAULT_HOST})")
    p.add_argument("--port", type=int, default=None, help=f"listen port (default {proxy_config.DEFAULT_PORT}; 0 = any)")
    p.add_argument("--tls-cert", default=None, metavar="PEM", help="serve HTTPS with this certificate")
    p.add_argument("--tls-key", default=None, metavar="PEM", help="… and this private key (mode 0600)")
    p.add_argument("--log-format", choices=["text", "json"], default="text", help="log lines on stderr")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    p.set_defaults(func=cmd_proxy)


def cmd_proxy(args: argparse.Namespace) -> int:
    from crossaudit.proxy.server import serve
    from crossaudit.service.logs import configure_logging

    file = proxy_config.read_file(Path(args.config)) if args.config else None
    config = proxy_config.build(
        file,
        config_dir=Path(args.config).resolve().parent if args.config else None,
        upstream=args.upstream,
        upstream_key_env=args.upstream_api_key_env,
        anthropic_upstream=args.anthropic_upstream,
        anthropic_key_env=args.anthropic_upstream_api_key_env,
        server=args.server,
        environment=args.environment,
        policy=args.policy,
        on_block=args.on_block,
        fail_open=args.fail_open,
        input_messages=args.input_messages,
        dev=args.dev,
        host=args.host,
        port=args.port,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        crossaudit_tls=args.ca_cert or (True if args.tls else None),
    )
    configure_logging(args.log_level, args.log_format)
    if args.log_level != "DEBUG":  # httpx logs every upstream request at INFO
        logging.getLogger("httpx").setLevel(logging.WARNING)
    asyncio.run(serve(config))
    return EXIT_OK
