"""``crossaudit models list|pull|import|verify``: the model store the builtins resolve from.

The store is ``--store``, else ``CROSSAUDIT_MODEL_STORE``, else ``.crossaudit/models`` (the
default data dir of ``crossaudit serve``); see ``crossaudit/modelserver/store.py``. Sub-commands
are registered one function each, so ``export`` (ONNX, provided by the model-server export
module) can be added beside them. Errors are typed CrossAuditErrors that ``crossaudit.cli.main``
prints as one message (exit 1); ``verify`` exits 1 when a file does not match its manifest.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from crossaudit.cli import display
from crossaudit.cli.common import EXIT_FAIL, EXIT_OK, command_group
from crossaudit.kernel.errors import InvalidInputError
from crossaudit.modelserver import export, sources
from crossaudit.modelserver.download import DownloadError
from crossaudit.modelserver.store import ENV_MODEL_STORE, ModelStore, StoreEntry, format_size, store_root


def register(subparsers: argparse._SubParsersAction) -> argparse._SubParsersAction:
    """Add ``models`` and its sub-commands; returns the sub-command parsers (for ``export``)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--store", default=None, metavar="DIR", help=f"model store directory (default: ${ENV_MODEL_STORE} or "
        ".crossaudit/models)"
    )
    msub = command_group(
        subparsers, "models", help="list, pull, import and verify the builtins' models", dest="models_command"
    )

    ls = msub.add_parser("list", parents=[common], help="the models in the store")
    ls.add_argument("--json", action="store_true", help="print the manifests as JSON")
    ls.set_defaults(func=cmd_list)

    pl = msub.add_parser(
        "pull", parents=[common], help="download a model from its official source into the store",
        description="Known names: detoxify (--variant original|unbiased|multilingual; also pulls its base "
        f"model's config and tokenizer), {', '.join(sources.HUB_MODELS)}, and spaCy packages such as "
        "en_core_web_lg. Any other name needs --url.",
    )
    pl.add_argument("name")
    pl.add_argument("--variant", default=None, help="default: original for detoxify, else 'default'")
    pl.add_argument("--url", default=None, help="download from this URL instead of the official source")
    pl.add_argument("--force", action="store_true", help="replace an entry already in the store")
    pl.set_defaults(func=cmd_pull)

    im = msub.add_parser("import", parents=[common], help="copy a local checkpoint file or pipeline directory")
    im.add_argument("name", help="detoxify, a spaCy package name such as en_core_web_lg, a base model, ...")
    im.add_argument("path", help="a checkpoint file, or a directory (spaCy pipeline; detoxify checkpoint + hf/)")
    im.add_argument("--variant", default=None, help="default: original for detoxify, else 'default'")
    im.add_argument("--force", action="store_true", help="replace an entry already in the store")
    im.set_defaults(func=cmd_import)

    vf = msub.add_parser("verify", parents=[common], help="re-hash the store's files (exit 1 on a mismatch)")
    vf.add_argument("name", nargs="?", default=None, help="only this model (default: all)")
    vf.add_argument("--variant", default=None)
    vf.add_argument("--json", action="store_true")
    vf.set_defaults(func=cmd_verify)

    ex = msub.add_parser(
        "export", help="convert a Detoxify checkpoint to ONNX (fp32 + int8) for serving without torch",
        description="Needs the export extra (torch). Then: `crossaudit models import detoxify OUT_DIR`.",
    )  # fmt: skip
    export.add_arguments(ex)
    ex.set_defaults(func=cmd_export)
    return msub


def cmd_export(args: argparse.Namespace) -> int:
    return export.run(args)


def _store(args: argparse.Namespace) -> ModelStore:
    return ModelStore(args.store) if args.store else ModelStore(store_root())


def _err(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _describe(entry: StoreEntry) -> dict[str, Any]:
    return {"name": entry.name, "variant": entry.variant, "files": len(entry.files), "size": entry.size,
            "source": entry.source, "created": entry.created, "path": str(entry.files_dir)}


def cmd_list(args: argparse.Namespace) -> int:
    store = _store(args)
    entries = store.entries()
    if args.json:
        print(json.dumps({"store": str(store.root), "models": [e.as_json() | {"path": str(e.files_dir)}
                                                                  for e in entries]}, indent=2, sort_keys=True))
        return EXIT_OK
    if not entries:
        print(f"no models in {store.root} (add one with `crossaudit models pull` or `crossaudit models import`)")
        return EXIT_OK
    print(f"store: {store.root}")
    display.print_table(entries, MODEL_COLUMNS, what="models")
    return EXIT_OK


MODEL_COLUMNS = [
    display.Column("Name", lambda e: e.name),
    display.Column("Variant", lambda e: e.variant),
    display.Column("Size", lambda e: format_size(e.size), justify="right"),
    display.Column("Files", lambda e: str(len(e.files)), justify="right"),
    display.Column("Created", lambda e: e.created),
    display.Column("Source", lambda e: e.source),
]


def _import_instead(args: argparse.Namespace, name: str, variant: str | None) -> str:
    """How to add the entry without a download, in the exact form for it (and this --store)."""
    command = sources.import_command(name, variant, ("--store", args.store) if args.store else ())
    return f"add a local copy instead: {command}, copied from a machine that has the model"


def cmd_pull(args: argparse.Namespace) -> int:
    """A failed pull names the import that adds the same entry without a download, and offline
    mode, which keeps calls from trying the download where the model's source cannot be reached."""
    offline = sources.offline_setting(os.environ)
    if offline:
        raise InvalidInputError(
            f"offline mode is on ({offline}): unset it to pull, or {_import_instead(args, args.name, args.variant)}"
        )
    store = _store(args)
    try:
        entries = sources.pull(
            store, args.name, args.variant, url=args.url, environ=os.environ, replace=args.force, progress=_err
        )
    except DownloadError as e:
        name, variant = e.entry or (args.name, args.variant)
        raise DownloadError(
            f"{e.message}\nTo fix it:\n  - {_import_instead(args, name, variant)}\n"
            f"  - where the model's source cannot be reached, set {sources.ENV_OFFLINE}=1 (offline mode): "
            "calls then use what is here and never try the download, and `crossaudit policy validate` "
            "names the rules that need a model"
        ) from None
    for e in entries:
        print(f"{e.name}/{e.variant}: {format_size(e.size)} in {len(e.files)} file(s) at {e.files_dir}")
    return EXIT_OK


def cmd_import(args: argparse.Namespace) -> int:
    variant = args.variant or sources.default_variant(args.name)
    if args.name == sources.DETOXIFY:
        sources.detoxify_variant(variant)
    if not os.path.exists(args.path):
        raise InvalidInputError(f"{args.path} does not exist")
    entry = _store(args).import_path(args.name, args.path, variant, replace=args.force)
    print(f"{entry.name}/{entry.variant}: {format_size(entry.size)} in {len(entry.files)} file(s) at {entry.files_dir}")
    return EXIT_OK


def cmd_verify(args: argparse.Namespace) -> int:
    store = _store(args)
    checked, problems = store.verify(args.name, args.variant)
    if args.json:
        print(json.dumps({
            "store": str(store.root),
            "checked": [f"{e.name}/{e.variant}" for e in checked],
            "mismatches": [{"name": p.name, "variant": p.variant, "path": p.path, "problem": p.problem}
                           for p in problems],
        }, indent=2, sort_keys=True))
    else:
        bad = {(p.name, p.variant) for p in problems}
        for e in checked:
            print(f"{e.name}/{e.variant}: {'MISMATCH' if (e.name, e.variant) in bad else 'ok'} ({len(e.files)} files)")
        for p in problems:
            print(f"  {p.name}/{p.variant}: {p.path}: {p.problem}")
        if not checked:
            print(f"no models in {store.root}")
    return EXIT_FAIL if problems else EXIT_OK
