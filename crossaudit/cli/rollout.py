"""``crossaudit policy deploy --shadow | --canary``, ``policy promote|discard|shadow-report``
(docs/rollout.md): a candidate tried beside the active version, then promoted or discarded."""

from __future__ import annotations

import argparse
import math
from typing import Any

from crossaudit.api.limits import DEFAULT_ENVIRONMENT
from crossaudit.cli import connect, display
from crossaudit.kernel.errors import InvalidInputError
from crossaudit.kernel.shell import command

DEFAULT_SAMPLE = 0.1  # a shadow's sampled fraction unless --sample says otherwise


def add_deploy_options(d: argparse.ArgumentParser) -> None:
    """The candidate flags of ``policy deploy``."""
    g = d.add_argument_group("shadow and canary (docs/rollout.md): store the policy as a candidate, not active")
    mode = g.add_mutually_exclusive_group()
    mode.add_argument(
        "--shadow", action="store_true", help="evaluate it off the answer path on a sample of decisions; never answers"
    )
    mode.add_argument(
        "--canary", default=None, metavar="PERCENT", help="answer this sticky share of requests with it (e.g. 5%%)"
    )
    g.add_argument(
        "--sample",
        type=float,
        default=None,
        metavar="FRACTION",
        help=f"--shadow: decisions sampled (default {DEFAULT_SAMPLE})",
    )
    g.add_argument("--canary-key", default="", metavar="FIELD", help="--canary: the request-context field kept sticky")
    g.add_argument("--notify", default="", metavar="URL", help="--canary: webhook announcing an automatic rollback")


def register(policy_subparsers: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """``policy promote|discard|shadow-report``."""
    for name, func, text in (
        ("promote", cmd_promote, "make the running shadow or canary candidate the active version"),
        ("discard", cmd_discard, "end the running shadow or canary candidate (the active version stays)"),
        ("shadow-report", cmd_shadow_report, "a candidate's diffs against the active version"),
    ):
        p = policy_subparsers.add_parser(name, parents=[common], help=text)
        p.add_argument("name")
        p.add_argument("--environment", "-e", default=DEFAULT_ENVIRONMENT)
        p.set_defaults(func=func)


def parse_share(text: str, what: str) -> float:
    """``5%`` or ``0.05`` as a fraction in (0, 1]; a bare number above 1 is refused (ambiguous)."""
    raw = text.strip()
    percent = raw.endswith("%")
    try:
        value = float(raw[:-1] if percent else raw)
    except ValueError:
        raise InvalidInputError(
            f"{what} must be a percentage such as 5% or a fraction such as 0.05, not {text!r}"
        ) from None
    if percent:
        value /= 100
    if not math.isfinite(value) or not 0 < value <= 1:
        raise InvalidInputError(f"{what} must be more than 0% and at most 100%, not {text!r}")
    return value


def candidate_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """What ``Client.deploy_policy`` takes for the flags given (empty for a plain deploy)."""
    if args.canary is not None:
        if args.sample is not None:
            raise InvalidInputError("--sample is for --shadow; a canary's share is --canary PERCENT")
        if not args.canary_key:
            raise InvalidInputError("--canary needs --canary-key FIELD: the request-context field that keeps it sticky")
        return {"canary": parse_share(args.canary, "--canary"), "canary_key": args.canary_key, "notify": args.notify}
    if args.canary_key or args.notify:
        raise InvalidInputError("--canary-key and --notify are options of --canary")
    if args.shadow:
        sample = DEFAULT_SAMPLE if args.sample is None else parse_share(str(args.sample), "--sample")
        return {"shadow": sample}
    if args.sample is not None:
        raise InvalidInputError("--sample is an option of --shadow")
    return {}


def describe_candidate(r: Any) -> str:
    """What started, then the commands that follow it, one a line: each pastes into a shell as is
    (the policy's name quoted: ``Offline Demo`` is one word), in the candidate's environment."""
    c = r.candidate
    share = (
        f"sampling {c.share:.1%} of decisions"
        if c.mode.value == "shadow"
        else f"answering {c.share:.1%} by {c.canary_key}"
    )
    where = ("--environment", c.environment) if c.environment != DEFAULT_ENVIRONMENT else ()
    follow = [
        command("crossaudit", "policy", verb, r.version.name, *where)
        for verb in ("shadow-report", "promote", "discard")
    ]
    return (
        f"{c.mode.value} candidate {r.version.name!r} v{c.version} started in {c.environment} ({share}); "
        f"v{c.active_version} stays active. See it, then promote or discard it:\n"
        + "\n".join(f"  {line}" for line in follow)
    )


def cmd_promote(args: argparse.Namespace) -> int:
    return connect.answer(
        args,
        lambda c: c.promote(args.name, environment=args.environment),
        lambda r: (
            f"promoted {args.name!r} v{r.deployment.version} ({r.candidate.mode.value} candidate) to "
            f"{r.deployment.environment}; v{r.candidate.active_version} was active"
        ),
    )


def cmd_discard(args: argparse.Namespace) -> int:
    return connect.answer(
        args,
        lambda c: c.discard(args.name, environment=args.environment),
        lambda cand: (
            f"discarded the {cand.mode.value} candidate v{cand.version} of {args.name!r} in {cand.environment}"
        ),
    )


def cmd_shadow_report(args: argparse.Namespace) -> int:
    return connect.answer(
        args,
        lambda c: c.shadow_report(args.name, environment=args.environment),
        lambda report: "\n".join(report_lines(report)),
    )


def report_lines(r: Any) -> list[str]:
    """The report in words: the candidate, the totals, per-rule flips and sample decision ids."""
    c = r.candidate
    head = f"{c.mode.value} candidate v{c.version} of {c.name!r} in {c.environment} against v{c.active_version}"
    head += f": {c.state.value}"
    lines = [head + (f" ({c.reason})" if c.reason and c.reason != c.state.value else "")]
    if c.mode.value == "shadow":
        agree = f"{c.agreed / c.evaluated:.1%}" if c.evaluated else "-"
        lines += [
            f"  sampled {c.share:.1%}: {c.evaluated} evaluated, agreement {agree} ({c.agreed}), "
            f"{c.errors} candidate errors, {c.dropped} dropped (queue full)",
            f"  pass -> fail: {c.pass_to_fail}   fail -> pass: {c.fail_to_pass}   action changes: {c.action_changes}",
        ]
    else:
        lines += [
            f"  canary {c.share:.1%} by {c.canary_key}: {_counts(r.canary)}",
            f"  active v{c.active_version}: {_counts(r.active)}",
        ]
    for rule, n in sorted(r.rule_flips.items(), key=lambda kv: (-kv[1], kv[0])):
        lines.append(f"  rule {rule}: {n} flips")
    for d in r.samples:
        what = (
            f"error: {d.error}"
            if d.error
            else (f"{_answer(d.live_passed, d.live_action)} -> {_answer(d.candidate_passed, d.candidate_action)}")
        )
        flipped = ", ".join(x["rule"] for x in d.rules if x.get("flipped"))
        lines.append(f"  {d.decision_id}  {what}" + (f"  (flipped: {flipped})" if flipped else ""))
    for h in r.history[:5]:
        lines.append(f"  {display.when(h.at)}  {h.kind} v{h.version}")
    return lines


def _answer(passed: bool, action: str) -> str:
    return f"{'pass' if passed else 'fail'}/{action}"


def _counts(n: Any) -> str:
    if not n.decisions:
        return "no decisions yet"
    return (
        f"{n.decisions} decisions, {n.errored} with an errored rule ({n.errored / n.decisions:.1%}), "
        f"{n.blocked} blocked ({n.blocked / n.decisions:.1%})"
    )
