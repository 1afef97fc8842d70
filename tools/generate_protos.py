"""Regenerate every ``protos/crossaudit/v1/*.proto`` into committed stubs in ``crossaudit/v1/``.

``python -m tools.generate_protos`` (``make proto``) runs grpc_tools' protoc with ``--python_out``,
``--grpc_python_out`` and ``--pyi_out``. The protos' package ``crossaudit.v1`` is also the Python
package they are generated into, so protoc's own imports (``from crossaudit.v1 import x_pb2``)
work unchanged from the installed wheel.
``python -m tools.generate_protos --check`` exits 1 when the committed stubs are stale.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from importlib import resources
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
PROTO_ROOT = REPO_ROOT / "protos"  # the .proto sources, the only copy: protos/crossaudit/v1/*.proto
PROTO_DIR = PROTO_ROOT / "crossaudit" / "v1"
PACKAGE_DIR = REPO_ROOT / "crossaudit" / "v1"  # where the stubs are generated
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")



class GenerateError(Exception):
    """protoc failed; the message carries its output."""


def proto_files() -> list[Path]:
    return sorted(PROTO_DIR.glob("*.proto"))


def generate_to(out_dir: Path) -> list[Path]:
    """Generate stubs for every proto into ``out_dir`` (flat); return the files written."""
    from grpc_tools import protoc

    include = str(resources.files("grpc_tools") / "_proto")
    sources = [str(p.relative_to(PROTO_ROOT)) for p in proto_files()]
    if not sources:
        raise GenerateError(f"no .proto files under {PROTO_DIR}")
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "grpc_tools.protoc",
            f"-I{PROTO_ROOT}",
            f"-I{include}",
            f"--python_out={tmp}",
            f"--grpc_python_out={tmp}",
            f"--pyi_out={tmp}",
            *sources,
        ]
        rc = protoc.main(args)
        if rc != 0:
            raise GenerateError(f"protoc failed with exit code {rc}")
        written = []
        out_dir.mkdir(parents=True, exist_ok=True)
        for produced in sorted((Path(tmp) / "crossaudit" / "v1").iterdir()):
            if not produced.name.endswith(GENERATED_SUFFIXES):
                continue
            target = out_dir / produced.name
            target.write_text(produced.read_text())
            written.append(target)
        return written


def stale_files() -> list[str]:
    """Names of committed stubs that differ from a fresh generation (missing/extra included)."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = {p.name: p.read_text() for p in generate_to(Path(tmp))}
    committed = {p.name: p.read_text() for p in PACKAGE_DIR.iterdir() if p.name.endswith(GENERATED_SUFFIXES)}
    names = set(fresh) | set(committed)
    return sorted(n for n in names if fresh.get(n) != committed.get(n))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.generate_protos", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when committed stubs are stale")
    args = parser.parse_args(argv)
    try:
        if args.check:
            stale = stale_files()
            if stale:
                print("stale generated stubs (run `make proto`): " + ", ".join(stale), file=sys.stderr)
                return 1
            print("generated stubs are up to date")
            return 0
        for old in PACKAGE_DIR.iterdir():
            if old.name.endswith(GENERATED_SUFFIXES):
                old.unlink()
        written = generate_to(PACKAGE_DIR)
    except GenerateError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"generated {len(written)} files in {PACKAGE_DIR.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
