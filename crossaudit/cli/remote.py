"""Client commands of the ``crossaudit`` CLI, each a call to a running server: ``policy
deploy|list|get|rollback`` (``replay``: :mod:`crossaudit.cli.replay`; ``promote|discard|shadow-report``:
:mod:`crossaudit.cli.rollout`), ``evaluator upload|list|get``, ``audit list|get|erase``, ``review
list|resolve``, ``webhooks list|redeliver``.

Server address and key come from ``--server``/``--api-key`` or ``CROSSAUDIT_SERVER``/
``CROSSAUDIT_API_KEY``. Errors are raised as typed CrossAuditErrors, which ``crossaudit.cli.main``
prints as one line (exit 1); usage errors exit 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from crossaudit.api.limits import DEFAULT_ENVIRONMENT
from crossaudit.cli import analyze, connect, display, progress, rollout
from crossaudit.cli.common import EXIT_OK, command_group
from crossaudit.kernel.errors import InvalidInputError

# --- parser -------------------------------------------------------------------------------


def register(subparsers: argparse._SubParsersAction, policy_subparsers: argparse._SubParsersAction) -> None:
    """Add the client commands to the ``crossaudit`` parser; ``policy_subparsers`` (the
    ``policy`` sub-commands) gains deploy/list/get/rollback."""
    common = connect.client_options()
    register_policy(policy_subparsers, common)
    register_evaluator(subparsers, common)
    register_audit(subparsers, common)
    register_review(subparsers, common)
    register_webhooks(subparsers, common)
    from crossaudit.cli import evalreviews  # the lead folds it into `crossaudit eval --from-reviews`

    evalreviews.register(subparsers, common)


def register_policy(policy_subparsers: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """``policy deploy|list|get|rollback``."""
    d = policy_subparsers.add_parser("deploy", parents=[common], help="deploy a policy file to an environment")
    d.add_argument("file", metavar="FILE")
    d.add_argument("--environment", "-e", default=DEFAULT_ENVIRONMENT)
    rollout.add_deploy_options(d)
    analyze.add_deploy_option(d)
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
    from crossaudit.cli import replay

    replay.register(policy_subparsers, common)
    rollout.register(policy_subparsers, common)


def register_evaluator(subparsers: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """``evaluator upload|list|get``."""
    esub = command_group(subparsers, "evaluator", help="upload and inspect custom evaluators", dest="evaluator_command")
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


def register_audit(subparsers: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """``audit list|get|erase``, and ``key|verify|proof|export|receipt`` (:mod:`crossaudit.cli.evidence`)."""
    asub = command_group(subparsers, "audit", help="read the audit log of answered decisions", dest="audit_command")
    al = asub.add_parser("list", parents=[common], help="recent decisions, most recent first")
    al.add_argument("--policy", default="")
    al.add_argument("--limit", type=int, default=20)
    al.set_defaults(func=cmd_audit_list)
    ag = asub.add_parser("get", parents=[common], help="one decision's audit record (JSON)")
    ag.add_argument("decision_id")
    ag.set_defaults(func=cmd_audit_get)
    ae = asub.add_parser(
        "erase",
        parents=[common],
        help="erase retained inputs and raw audit text (a data-subject request; admin keys)",
        description=(
            "Remove the retained inputs (docs/retention.md) and the raw prompt/response of the matching audit "
            "records (their hashes stay) and record the erasure. --context-field matches decisions whose "
            "retained request context had that top-level field with that value."
        ),
    )
    which = ae.add_mutually_exclusive_group(required=True)
    which.add_argument("--decision", metavar="ID", default="", help="one decision")
    which.add_argument(
        "--context-field",
        metavar="NAME=VALUE",
        default="",
        help="e.g. user_id=u-123; NAME=- reads the value from standard input (kept out of argv)",
    )
    ae.set_defaults(func=cmd_audit_erase)
    from crossaudit.cli import evidence

    evidence.register(asub, common)


def register_review(subparsers: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """``review list|resolve``."""
    rsub = command_group(
        subparsers, "review", help="review items created by require_review and flag", dest="review_command"
    )
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


def register_webhooks(subparsers: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """``webhooks list|redeliver``."""
    wsub = command_group(subparsers, "webhooks", help="deliveries of custom actions' webhooks", dest="webhooks_command")
    wl = wsub.add_parser("list", parents=[common], help="list deliveries, most recent first")
    wl.add_argument("--state", default="any", choices=["pending", "delivered", "dead", "any"])
    wl.add_argument("--limit", type=int, default=20)
    wl.set_defaults(func=cmd_webhooks_list)
    wr = wsub.add_parser("redeliver", parents=[common], help="send a dead (or delivered) webhook again")
    wr.add_argument("id", help="the delivery id (the webhook-id header the receiver saw)")
    wr.set_defaults(func=cmd_webhooks_redeliver)


# --- helpers ------------------------------------------------------------------------------


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


def cmd_policy_deploy(args: argparse.Namespace) -> int:
    if not Path(args.file).is_file():
        raise InvalidInputError(f"policy file {args.file} not found")
    refused = analyze.deploy_gate(args)
    if refused is not None:
        return refused
    candidate = rollout.candidate_kwargs(args)
    with progress.build_progress(quiet=args.json) as update, connect.client(args) as c:
        kwargs = {"timeout": args.timeout} if args.timeout else {}
        r = c.deploy_policy(Path(args.file), environment=args.environment, progress=update, **candidate, **kwargs)
    if args.json:
        _print_json(r)
    elif r.candidate is not None:
        print(rollout.describe_candidate(r))
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
    with connect.client(args) as c:
        items = c.list_policies(environment=args.environment)
    if args.json:
        return _print_listing(args, items, "policies", POLICY_COLUMNS)
    rows = [(p, d) for p in items for d in (p.deployments or (None,))]
    return _print_listing(args, rows, "policies", POLICY_COLUMNS)


def cmd_policy_get(args: argparse.Namespace) -> int:
    return connect.answer(
        args,
        lambda c: c.get_policy(args.name, environment=args.environment, version=args.version),
        lambda info: info.content.removesuffix("\n"),  # the content, ending in one line break
    )


def cmd_policy_rollback(args: argparse.Namespace) -> int:
    return connect.answer(
        args,
        lambda c: c.rollback(args.name, environment=args.environment, to_version=args.to_version),
        lambda r: f"{args.name!r} in {r.deployment.environment}: v{r.previous_version} -> v{r.deployment.version}",
    )


def cmd_evaluator_upload(args: argparse.Namespace) -> int:
    code = _read_text(args.file, "evaluator file")
    with progress.build_progress(quiet=args.json) as update, connect.client(args) as c:
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
    with connect.client(args) as c:
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
    with connect.client(args) as c:
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
    with connect.client(args) as c:
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
    with connect.client(args) as c:
        _print_json(c.get_decision(args.decision_id))
    return EXIT_OK


def cmd_audit_erase(args: argparse.Namespace) -> int:
    field = None
    if args.context_field:
        name, sep, value = args.context_field.partition("=")
        if not sep or not name:
            raise InvalidInputError("--context-field takes NAME=VALUE, e.g. user_id=u-123")
        if value == "-":  # the data subject's id kept out of argv (the process list, shell history)
            value = sys.stdin.readline().rstrip("\r\n")
            if not value:
                raise InvalidInputError("--context-field NAME=-: standard input held no value")
        field = (name, value)
    with connect.client(args) as c:
        erasure = c.erase_inputs(decision_id=args.decision, context_field=field)
    if args.json:
        _print_json(erasure)
        return EXIT_OK
    what = f"decision {args.decision}" if field is None else f"context field {field[0]!r}"  # never the value
    print(
        f"erased the retained inputs and raw audit text of {erasure.decisions} decision(s) matching {what}\n"
        f"erasure {erasure.id} by {erasure.actor} at {display.when(erasure.created_at)} "
        f"(selector digest {erasure.selector_digest[:16]}...)"
    )
    return EXIT_OK


def cmd_review_list(args: argparse.Namespace) -> int:
    state = args.state
    with connect.client(args) as c:
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
    with connect.client(args) as c:
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
    return connect.answer(args, lambda c: c.redeliver(args.id), lambda m: f"delivery {m.id} queued again")


def cmd_review_resolve(args: argparse.Namespace) -> int:
    return connect.answer(
        args,
        lambda c: c.resolve_review(args.id, args.state, reviewer=args.reviewer, note=args.note),
        lambda r: f"review {r.id} {r.state.value}",
    )
