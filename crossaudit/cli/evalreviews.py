"""``crossaudit eval-labels NAME --out dataset.jsonl``: a dataset from production labels.

Reads the resolved reviews and feedback labels of the deployed policy NAME (``--since`` back
from now, in ``--environment``) from the server and writes them as dataset rows in JSONL
(docs/calibration.md): per rule what people said it should have done, the recorded scores, and
the retained text where the operator enabled retention. ``crossaudit eval POLICY dataset.jsonl``
reads the file back.

Exit codes: 0 written, 1 the server failed (unreachable, refused the key, an error on its side),
2 bad input (arguments, an unknown policy, an output path that cannot be written, no labels).
Nothing is written unless the whole dataset is (the file appears complete or not at all).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from crossaudit.api.limits import DEFAULT_ENVIRONMENT
from crossaudit.cli.common import EXIT_OK, EXIT_USAGE, parse_when
from crossaudit.kernel.errors import InvalidInputError, NotFoundError

DEFAULT_SINCE = "30d"


def register(subparsers: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser(
        "eval-labels",
        parents=[common],
        help="write a dataset from a deployed policy's resolved reviews and feedback labels",
        description=(
            "Build an eval dataset (JSONL) from the labels people gave a deployed policy's decisions: reviews "
            "approved (the rule should have passed) or rejected (should have failed), feedback false_positive / "
            "false_negative; with the recorded scores and, where retained, the text (docs/calibration.md)."
        ),
    )
    p.add_argument("name", metavar="NAME", help="the deployed policy")
    p.add_argument(
        "--since", default=DEFAULT_SINCE, metavar="WHEN", help="labels given since: a duration (30d) or an ISO time"
    )
    p.add_argument("--environment", "-e", default=DEFAULT_ENVIRONMENT)
    p.add_argument("--out", "-o", required=True, metavar="FILE", help="the JSONL dataset to write")
    p.set_defaults(func=cmd_eval_labels)


def cmd_eval_labels(args: argparse.Namespace) -> int:

    try:
        since = parse_when(args.since, time.time(), "since")
        out = Path(args.out)
        if out.is_dir() or not out.parent.is_dir():
            raise InvalidInputError(f"--out {args.out}: not a file in an existing directory")
    except InvalidInputError as e:
        print(f"error: {e.message}", file=sys.stderr)
        return EXIT_USAGE
    try:  # any other CrossAuditError is reported by main, as every command's (error: ..., EXIT_FAIL)
        summary = _build(args, since, out)
    except (InvalidInputError, NotFoundError) as e:
        print(f"error: {e.message}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as e:
        print(f"error: --out {args.out}: {e.strerror}", file=sys.stderr)
        return EXIT_USAGE
    if summary["rows"] == 0:
        print(f"error: {_nothing(args, summary)}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(_describe(summary))
    return EXIT_OK


def _build(args: argparse.Namespace, since: float | None, out: Path) -> dict[str, Any]:
    from crossaudit.cli.connect import client
    from crossaudit.evals.production import read_labels, rows_from_labels, write_jsonl

    with client(args) as c:
        found = read_labels(c, args.name, since, args.environment)
    rows, skipped = rows_from_labels(found.labels)
    if rows:
        write_jsonl(rows, out)
    return {
        "policy": args.name,
        "environment": args.environment,
        "since": since,
        "out": str(out),
        "labels": len(found.labels),
        "reviews": sum(1 for lab in found.labels if lab.source == "review"),
        "feedback": sum(1 for lab in found.labels if lab.source == "feedback"),
        "rows": len(rows),
        "with_text": sum(1 for r in rows if r.response is not None),
        "skipped": skipped,
        "more": found.more,
    }


def _nothing(args: argparse.Namespace, s: dict[str, Any]) -> str:
    if s["labels"]:
        return (
            f"{s['labels']} label(s) of {args.name!r}, but no decision has retained text or a recorded score: "
            f"nothing to evaluate, {args.out} not written"
        )
    return (
        f"no labels of {args.name!r} in {args.environment} since {args.since}: resolve reviews or submit feedback "
        f"(false_positive / false_negative on a rule) first; {args.out} not written"
    )


def _describe(s: dict[str, Any]) -> str:
    lines = [
        f"wrote {s['rows']} row(s) to {s['out']} from {s['labels']} label(s) "
        f"({s['reviews']} review(s), {s['feedback']} feedback); {s['with_text']} with retained text, "
        f"{s['rows'] - s['with_text']} scored from the recorded scores only"
    ]
    if s["skipped"]:
        lines.append(f"{s['skipped']} labelled decision(s) left out: no retained text and no recorded score")
    if s["more"]:
        lines.append("more labels remain than one dataset takes (MAX_PRODUCTION_LABELS): narrow --since")
    return "\n".join(lines)
