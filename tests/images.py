"""Every Docker image the test suites use, built before they run: ``python -m tests.images``
(``make test-images``, a prerequisite of ``make test``).

No test builds one of these inside its timeout: on a new machine the orchestrator image alone takes
minutes (every dependency's wheel fetched by the host's pip), and a test that did it would time out
there while passing on any machine that had built it before. Each image is tagged by its content,
so a run where nothing changed only finds them (a few seconds); after a change, only the images
whose content changed are rebuilt.

Order: the sandbox's base and runner first (everything else builds ``FROM`` the base), then the rest
side by side (their time is mostly the host's pip and apt fetching, and ``docker build`` writing
layers, not CPU). Each step prints one line as it starts and one as it ends, with its time.

The tags that tests look up by name (the orchestrator and PostgreSQL images, which the builders can
only name after preparing a whole build context) are written to :data:`TAGS_FILE`; tests read them
with :func:`built_tag`. Images the tests find by content on their own (the runner, dependency sets,
model servers) need no entry: building them here makes that look-up a hit.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from sandbox.docker.images import ImageManager

ROOT = Path(__file__).resolve().parent.parent
TAGS_FILE = ROOT / ".crossaudit" / "test-images.json"
# Dependency sets that tests run in Docker but do not test the building of (tests/integration/_docker.py).
TEST_DEPENDENCY_SETS: tuple[tuple[str, ...], ...] = (
    ("nltk", "textblob"),
    ("six==1.16.0",),  # tests/integration/test_docker_provenance.py: the image's lock and SBOM
)
MODEL_SERVER_KINDS = ("presidio", "detoxify")
# The deployment images: the longest builds (every locked wheel), needed only by tests marked
# ``deploy_image``, which ``make test`` runs last so the other suites need not wait for them.
DEPLOY_IMAGES = ("orchestrator", "postgres")
PARALLEL_BUILDS = 3  # the builds' time is mostly fetching and layer writes; 2 cores take 3 at once

_print_lock = threading.Lock()


def _say(name: str, message: str) -> None:
    with _print_lock:
        print(f"[images] {name}: {message}", flush=True)


def _timed(name: str, build: Callable[[], str]) -> tuple[str, str, float]:
    _say(name, "finding or building")
    t0 = time.monotonic()
    tag = build()
    took = time.monotonic() - t0
    _say(name, f"{tag} ({took:.0f}s)")
    return name, tag, took


def _builds(manager: ImageManager, base: str) -> dict[str, Callable[[], str]]:
    from crossaudit.kernel.depspec import validate_dependencies
    from crossaudit.modelserver import images as model_images
    from crossaudit.service import image as orchestrator_image

    def deps(names: tuple[str, ...]) -> Callable[[], str]:
        return lambda: manager.ensure_deps(validate_dependencies(list(names), manager.dep_limits)).tag

    def quiet(name: str) -> Callable[[str], None]:
        return lambda message: _say(name, message)

    builds: dict[str, Callable[[], str]] = {
        "orchestrator": lambda: orchestrator_image.build(base, say=quiet("orchestrator"), latest=True),
        "postgres": lambda: orchestrator_image.build_postgres(base, say=quiet("postgres"), latest=True),
    }
    for kind in MODEL_SERVER_KINDS:
        builds[f"modelserver-{kind}"] = lambda kind=kind: model_images.build(kind, base)
    for names in TEST_DEPENDENCY_SETS:
        builds[f"deps {'+'.join(names)}"] = deps(names)
    return builds


def build_all(only: set[str] | None = None, core_ready: Path | None = None) -> dict[str, str]:
    """Build (or find) every test image; returns name -> tag and writes :data:`TAGS_FILE`.

    ``core_ready`` is created once every image but :data:`DEPLOY_IMAGES` is there (those build on),
    so the suites that need no deployment image can start (``make test``)."""
    from crossaudit.imagebuild.daemon import docker_client
    from crossaudit.kernel.errors import ConfigurationError

    try:
        client = docker_client(600, purpose="building the test images")
    except ConfigurationError:
        print("[images] no Docker daemon answers: no test image built (the Docker tests will say so)")
        return {}
    manager = ImageManager(client)
    _, runner, _ = _timed("sandbox runner", lambda: manager.ensure_runner(lambda m, _f: _say("sandbox runner", m)))
    base = manager.ensure_base()
    builds = {name: fn for name, fn in _builds(manager, base).items() if only is None or name in only}
    tags = {"runner": runner, "base": base}
    failures: list[str] = []
    core_pending = {name for name in builds if name not in DEPLOY_IMAGES}

    def core_done() -> None:
        if core_ready is not None and not core_pending and not failures and not core_ready.exists():
            core_ready.parent.mkdir(parents=True, exist_ok=True)
            core_ready.touch()
            _say("core", "every image but the deployment ones is ready")

    core_done()
    with concurrent.futures.ThreadPoolExecutor(PARALLEL_BUILDS) as pool:
        # dict order: the deployment images first, so the longest builds start at once
        futures = {pool.submit(_timed, name, fn): name for name, fn in builds.items()}
        for fut in concurrent.futures.as_completed(futures):
            core_pending.discard(futures[fut])
            try:
                name, tag, _took = fut.result()
                tags[name] = tag
            except Exception as exc:  # say every failure, not only the first
                failures.append(f"{futures[fut]}: {type(exc).__name__}: {exc}")
            core_done()
    if failures:
        raise SystemExit("error: test images not built:\n  " + "\n  ".join(failures))
    TAGS_FILE.parent.mkdir(parents=True, exist_ok=True)
    known = json.loads(TAGS_FILE.read_text()) if TAGS_FILE.is_file() else {}
    TAGS_FILE.write_text(json.dumps({**known, **tags}, indent=2, sort_keys=True) + "\n")
    return tags


def built_tag(name: str) -> str:
    """The tag ``make test-images`` built for ``name``, if the daemon still has it.

    Skips (fails under CI=true) otherwise, naming the command: a test never builds it itself.
    """
    import subprocess

    from tests.conftest import need

    tags = json.loads(TAGS_FILE.read_text()) if TAGS_FILE.is_file() else {}
    tag = tags.get(name, "")
    present = (
        bool(tag)
        and subprocess.run(["docker", "image", "inspect", tag], capture_output=True, timeout=60, check=False).returncode
        == 0
    )
    need(present, f"the {name} image is not built: run `make test-images` (python -m tests.images)")
    return str(tag)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.images", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", help="build only this image (repeatable; default: all)")
    parser.add_argument(
        "--core-ready", type=Path, metavar="FILE", help="create FILE once every image but the deployment ones is ready"
    )
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    if args.core_ready:
        args.core_ready.unlink(missing_ok=True)
    try:
        tags = build_all(set(args.only) if args.only else None, args.core_ready)
    except SystemExit:
        raise
    except Exception as exc:  # no daemon, a failed base: one line, not a traceback
        print(f"error: test images not built: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"[images] {len(tags)} images ready in {time.monotonic() - t0:.0f}s ({os.path.relpath(TAGS_FILE, ROOT)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
