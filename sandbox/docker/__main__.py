"""Operator commands of the Docker sandbox: ``python -m sandbox.docker``
``build-base [--force]`` (``make images``), ``build-deps PKG...``, ``prune [--dry-run]``, ``reap``."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from crossaudit.imagebuild.daemon import docker_client
from crossaudit.kernel.depspec import validate_dependencies
from crossaudit.kernel.errors import CrossAuditError
from sandbox.docker.images import DEPS_READY, RUNNER_READY, ImageManager
from sandbox.docker.reaper import reap

CLIENT_TIMEOUT_S = 120  # each daemon call of these commands


def _client_or_none() -> Any:
    try:
        return docker_client(CLIENT_TIMEOUT_S)
    except CrossAuditError:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sandbox.docker",
        description="Build, prune and reap the Docker sandbox's images and containers.",
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build-base", help="build (or find) the base and runner images")
    b.add_argument("--force", action="store_true", help="rebuild even when the content tag exists")
    d = sub.add_parser("build-deps", help="build (or find) the image of a dependency set")
    d.add_argument("deps", nargs="*")
    sub.add_parser("reap", help="remove leftover sandbox containers whose owner process is gone")
    pr = sub.add_parser("prune", help="remove runner/dependency images not built on the current runner")
    pr.add_argument("--dry-run", action="store_true", help="only list what would be removed")
    args = parser.parse_args(argv)

    client = _client_or_none()
    if client is None:
        print("no Docker daemon answers: sandbox images not built (the process backend will be used)")
        return 0
    t0 = time.monotonic()

    def progress_to(end: float):  # type: ignore[no-untyped-def]
        """The image manager's fractions are of a whole evaluator's preparation (the runner is done at
        0.4, a dependency set at 0.9): shown as fractions of this command's own work, ending at 100%."""

        def progress(msg: str, frac: float) -> None:
            print(f"[{min(frac / end, 1.0) * 100:5.1f}%] {msg}", flush=True)

        return progress

    progress = progress_to(1.0)

    mgr = ImageManager(client)
    try:
        if args.cmd == "build-base":
            tag = mgr.ensure_runner(progress_to(RUNNER_READY), force=args.force)
            print(f"runner image: {tag} ({time.monotonic() - t0:.1f}s)")
        elif args.cmd == "build-deps":
            image = mgr.ensure_deps(validate_dependencies(args.deps, mgr.dep_limits), progress_to(DEPS_READY))
            print(f"dependency image: {image.tag} preload={list(image.preload)} ({time.monotonic() - t0:.1f}s)")
        elif args.cmd == "prune":
            stale = mgr.prune(progress, dry_run=args.dry_run)
            print("\n".join(stale))
            print(f"{'would remove' if args.dry_run else 'removed'} {len(stale)} stale image tag(s)")
        elif args.cmd == "reap":
            print(f"removed {reap(client)} leftover sandbox container(s)")
    except CrossAuditError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # docker.errors.*, a daemon that went away: one line, not a traceback
        print(f"error: docker: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
