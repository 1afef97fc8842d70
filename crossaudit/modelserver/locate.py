"""Where a builtin's model files come from: the resolution order every runtime's ``resolve()`` uses.

1. An explicit path: the evaluator's config field, else its ``CROSSAUDIT_*`` setting (on the
   service only the setting: policies there may not name files, see ``crossaudit/service/hosted.py``).
2. The CrossAudit model store (:mod:`crossaudit.modelserver.store`).
3. The libraries' own places: an installed spaCy package (``en_core_web_lg``), Detoxify's torch
   hub cache (``$TORCH_HOME/hub/checkpoints/<release file>``), the Hugging Face hub cache for
   a Detoxify base model's config and tokenizer.
4. A download from the model's official source into the store (:mod:`crossaudit.modelserver.sources`),
   unless offline mode is on (``CROSSAUDIT_OFFLINE=1`` or ``HF_HUB_OFFLINE=1``).

The first step that has the model wins; the later ones are not looked at. When none has it,
the ConfigurationError lists each place tried with what was found there and names the
``crossaudit models`` command that fixes it; it mentions the network only when a download was
actually tried (and then quotes what failed).

This runs where policies are resolved (the orchestrator, before a model server is asked), so
the model server receives explicit paths. It imports neither spaCy nor torch: installed spaCy
packages are found through their distribution metadata, which is what ``spacy.util.is_package``
and ``get_package_path`` read too.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from crossaudit.kernel.errors import ConfigurationError, CrossAuditError
from crossaudit.kernel.shell import command
from crossaudit.modelserver import onnxfiles, sources
from crossaudit.modelserver.store import ENV_MODEL_STORE, ModelStore, StoreEntry

CHECKPOINT_SUFFIXES = (".ckpt", ".pt", ".pth", ".bin")
TRIED = "Tried, in order:"  # heads the places-tried part of a not-found message
OFFLINE_SKIPPED = "skipped, offline mode is on"  # what a step-4 download says when offline mode stopped it


@dataclass
class Attempts:
    """What one resolution tried, in order, for the error message."""

    subject: str  # e.g. "detoxify checkpoint (variant original)"
    lines: list[str] = field(default_factory=list)

    def add(self, where: str, outcome: str) -> None:
        self.lines.append(f"  {len(self.lines) + 1}. {where}: {outcome}")

    def render(self, fixes: list[str]) -> str:
        """What is missing on the first line (tables and one-line reports show only that), then the
        fixes: the service caps error messages (``crossaudit/kernel/errcodec.py``), and a cut
        message must still say what to do; then the places tried."""
        body = "\n".join(self.lines)
        fix = "\n".join(f"  - {f}" for f in fixes)
        return f"{self.subject}: not found.\nTo fix it:\n{fix}\n{TRIED}\n{body}"

    def error(self, fixes: list[str]) -> ConfigurationError:
        return ConfigurationError(self.render(fixes))


def explicit(
    value: str | None, env: str, environ: Mapping[str, str], variant: str = ""
) -> tuple[str | None, str]:
    """Step 1: the config's path, else ``ENV_<VARIANT>``, else ``ENV``; with what was looked at."""
    names = ([f"{env}_{variant.upper()}"] if variant else []) + [env]
    if value:
        return os.path.abspath(os.path.expanduser(value)), ""
    for name in names:
        if environ.get(name, ""):
            return os.path.abspath(os.path.expanduser(environ[name])), ""
    return None, " / ".join(names)


def _store_outcome(store: ModelStore, name: str, variant: str) -> str:
    return f"model store {store.root} (${ENV_MODEL_STORE}), entry {name}/{variant}"


def without_places(message: str) -> str:
    """A not-found message without its places tried: what is missing and how to fix it. For a
    check that looked without downloading, whose last step would only say it was skipped."""
    return message.split(f"\n{TRIED}\n", 1)[0]


# --- detoxify ---------------------------------------------------------------------------------


def entry_checkpoint(entry: StoreEntry) -> Path | None:
    """The checkpoint of a Detoxify store entry: an ONNX export (the entry's files/ directory), its
    only file, or its one top-level ``*.ckpt``-like file."""
    if onnxfiles.is_onnx_export(entry.files_dir):
        return entry.files_dir
    single = entry.single_file()
    if single is not None:
        return single
    top = [f.path for f in entry.files if "/" not in f.path and f.path.endswith(CHECKPOINT_SUFFIXES)]
    return entry.path_of(top[0]) if len(top) == 1 else None


def entry_hf_dir(entry: StoreEntry) -> Path | None:
    """A Hugging Face config/tokenizer directory in an entry: ``hf/`` or the entry's top level."""
    for rel in ("hf/config.json", "config.json"):
        if any(f.path == rel for f in entry.files):
            return entry.path_of(rel).parent
    return None


def torch_hub_checkpoint(filename: str, environ: Mapping[str, str]) -> Path:
    """Where ``torch.hub.load_state_dict_from_url`` (Detoxify's loader) caches ``filename``."""
    home = environ.get("TORCH_HOME") or os.path.join(environ.get("XDG_CACHE_HOME") or "~/.cache", "torch")
    return Path(os.path.expanduser(home)) / "hub" / "checkpoints" / filename


def hf_hub_cache(environ: Mapping[str, str]) -> Path:
    """The Hugging Face hub cache directory, as ``huggingface_hub`` computes it."""
    if environ.get("HF_HUB_CACHE"):
        return Path(os.path.expanduser(environ["HF_HUB_CACHE"]))
    home = environ.get("HF_HOME") or os.path.join(environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(os.path.expanduser(home)) / "hub"


def hf_cached_snapshot(repo: str, environ: Mapping[str, str]) -> tuple[Path | None, str]:
    """The cached snapshot of ``repo`` (its ``main`` revision) holding every required file."""
    spec = sources.HUB_MODELS[repo]
    cache = hf_hub_cache(environ)
    for name in (repo, *spec.aliases):
        base = cache / f"models--{name.replace('/', '--')}"
        try:
            revision = (base / "refs" / "main").read_text(encoding="utf-8").strip()
        except OSError:
            continue
        snap = base / "snapshots" / revision
        if revision and all((snap / f).is_file() for f in spec.required):
            return snap, ""
    return None, str(cache / f"models--{repo.replace('/', '--')}")


# Long: the documented resolution order (explicit, store, caches, download), read top to bottom;
# each step records what it tried, for the one error message that lists them all.
def locate_detoxify(
    checkpoint: str | None,
    hf_config: str | None,
    variant: str,
    environ: Mapping[str, str],
    *,
    checkpoint_env: str,
    config_env: str,
) -> tuple[str, str | None]:
    """(checkpoint, Hugging Face config directory) for a Detoxify variant, by the resolution order.

    The two are found independently (an explicit checkpoint may use the store's config), except
    that a store entry holding both (an imported directory with ``hf/``) gives both. An ONNX
    export (:mod:`crossaudit.modelserver.onnxfiles`) carries its tokenizer, so with one the
    config directory is whatever was configured, possibly None, and nothing is searched for it.
    """
    variant = sources.detoxify_variant(variant)
    release = sources.DETOXIFY_RELEASES[variant]
    store = ModelStore.from_environ(environ)
    ck_tried = Attempts(f"detoxify checkpoint (variant {variant})")
    hf_tried = Attempts(f"detoxify Hugging Face config/tokenizer for {release.base_model} (variant {variant})")

    ckpt, names = explicit(checkpoint, checkpoint_env, environ, variant)
    if ckpt is None:
        ck_tried.add(f"the evaluator's `checkpoint`, then {names}", "not set")
    hf, names = explicit(hf_config, config_env, environ, variant)
    if hf is None:
        hf_tried.add(f"the evaluator's `huggingface_config_path`, then {names}", "not set")

    def from_store(record: bool = True) -> tuple[str | None, str | None]:
        found_ck = found_hf = None
        entry = store.get(sources.DETOXIFY, variant)
        if ckpt is None:
            path = entry_checkpoint(entry) if entry else None
            found_ck = str(path) if path else None
            if found_ck is None and record:
                ck_tried.add(
                    _store_outcome(store, sources.DETOXIFY, variant),
                    "absent" if entry is None else "holds no single checkpoint file",
                )
        if hf is None:
            hf_dir = entry_hf_dir(entry) if entry else None
            base = store.get(release.base_model) if hf_dir is None else None
            hf_dir = hf_dir or (entry_hf_dir(base) if base else None)
            found_hf = str(hf_dir) if hf_dir else None
            if found_hf is None and record:
                hf_tried.add(
                    f"model store {store.root} (${ENV_MODEL_STORE}), entries {sources.DETOXIFY}/{variant} (hf/) "
                    f"and {release.base_model}/default",
                    "absent",
                )
        return found_ck, found_hf

    if ckpt is None or hf is None:
        got_ck, got_hf = from_store()
        ckpt, hf = ckpt or got_ck, hf or got_hf
    if onnxfiles.is_onnx_export(ckpt):
        return ckpt, hf
    if ckpt is None:
        cached = torch_hub_checkpoint(release.filename, environ)
        if cached.is_file():
            ckpt = str(cached)
        else:
            ck_tried.add("Detoxify's torch hub cache ($TORCH_HOME)", f"no {cached}")
    if hf is None:
        snap, where = hf_cached_snapshot(release.base_model, environ)
        if snap is not None:
            hf = str(snap)
        else:
            hf_tried.add("the Hugging Face hub cache ($HF_HOME / $HF_HUB_CACHE)", f"no complete snapshot in {where}")
    if ckpt is None or hf is None:
        url = sources.detoxify_url(variant, environ) if ckpt is None else sources.hub_url(
            release.base_model, "config.json", environ
        )
        failure = _download(
            lambda: sources.pull(store, sources.DETOXIFY, variant, environ=environ), environ, f"{store.root} {url}"
        )
        if failure is None:
            got_ck, got_hf = from_store(record=False)
            ckpt, hf = ckpt or got_ck, hf or got_hf
            if ckpt is None or hf is None:
                failure = "downloaded, but the store entry holds no usable model"
        if failure:
            (ck_tried if ckpt is None else hf_tried).add(f"download from {url} into the store", failure)
    fixes = [
        f"`{command('crossaudit', 'models', 'pull', 'detoxify', '--variant', variant)}` (downloads the checkpoint "
        f"and {release.base_model}'s config and tokenizer from their official sources into the store)",
        f"`{command('crossaudit', 'models', 'import', 'detoxify', 'PATH', '--variant', variant)}` (a local "
        "checkpoint file, or a directory with the checkpoint and its Hugging Face config/tokenizer in hf/)",
    ]
    if ckpt is None:
        raise ck_tried.error([*fixes, f"or set the evaluator's `checkpoint` or {checkpoint_env}"])
    if hf is None:
        raise hf_tried.error([
            *fixes,
            f"`{command('crossaudit', 'models', 'import', release.base_model, 'DIR')}` (a directory with "
            "config.json and the tokenizer)",
            f"or set the evaluator's `huggingface_config_path` or {config_env}",
        ])
    return ckpt, hf


# --- spaCy (presidio) ---------------------------------------------------------------------------


def installed_spacy_pipeline(package: str) -> tuple[Path | None, str]:
    """The pipeline directory of an installed spaCy package, without importing spaCy or the package.

    Mirrors ``spacy.util.is_package`` (a distribution of that name) + ``get_package_path`` and
    ``load_model_from_init_py`` (``<package dir>/<lang>_<name>-<version>``, from its meta.json).
    """
    try:
        importlib.metadata.distribution(package)
        spec = importlib.util.find_spec(package)
    except (importlib.metadata.PackageNotFoundError, ImportError, ValueError):
        return None, "not installed"
    if spec is None or not spec.submodule_search_locations:
        return None, "not installed"
    pkg_dir = Path(next(iter(spec.submodule_search_locations)))
    try:
        meta = json.loads((pkg_dir / "meta.json").read_text(encoding="utf-8"))
        data = pkg_dir / f"{meta['lang']}_{meta['name']}-{meta['version']}"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return None, f"installed, but its meta.json is unreadable ({type(exc).__name__})"
    if not (data / "config.cfg").is_file():
        return None, f"installed, but {data} holds no config.cfg"
    return data, ""


def entry_spacy_dir(entry: StoreEntry) -> Path | None:
    """The pipeline directory of a store entry: files/ itself (an imported pipeline) or the one
    subdirectory holding config.cfg."""
    for f in entry.files:
        if f.path == "config.cfg" or (f.path.endswith("/config.cfg") and f.path.count("/") == 1):
            return entry.path_of(f.path).parent
    return None


def find_spacy_pipeline(language: str, environ: Mapping[str, str], *, download: bool) -> tuple[str | None, str]:
    """Steps 2-4 for a Presidio config with no explicit pipeline: (directory or None, what was tried).

    Step 1 (``spacy_model_path`` / ``CROSSAUDIT_SPACY_MODEL``) is the runtime's. ``download``: a
    config whose entities all have pattern recognizers runs on a blank pipeline, so it uses a
    pipeline that is already here but never downloads one. The second value lists the places
    tried and the fixes, for the runtime's error when it cannot do without a pipeline.
    """
    package = sources.spacy_package(language, environ)
    tried = Attempts(f"spaCy pipeline {package}")
    tried.add("the evaluator's `spacy_model_path`, then CROSSAUDIT_SPACY_MODEL", "not set")
    store = ModelStore.from_environ(environ)

    def from_store(record: bool = True) -> str | None:
        entry = store.get(package)
        found = entry_spacy_dir(entry) if entry else None
        if found is None and record:
            tried.add(_store_outcome(store, package, "default"), "absent" if entry is None else "holds no config.cfg")
        return str(found) if found else None

    if (found := from_store()) is not None:
        return found, ""
    installed, why = installed_spacy_pipeline(package)
    if installed is not None:
        return str(installed), ""
    tried.add(f"the installed spaCy package {package} (${sources.ENV_SPACY_PACKAGE} names another)", why)
    fixes = [
        f"`{command('crossaudit', 'models', 'pull', package)}` (downloads the official spaCy release into the store)",
        f"`{command('crossaudit', 'models', 'import', package, 'DIR')}` (a local pipeline directory, the one with "
        "config.cfg)",
        f"`{command('python', '-m', 'spacy', 'download', package)}` (installs it as a Python package)",
    ]
    allowed = sources.spacy_download_languages(environ)
    if download and not environ.get(sources.ENV_SPACY_PACKAGE, "").strip() and language.lower() not in allowed:
        tried.add(
            "a download of the official release",
            f"skipped: a call downloads pipelines for {', '.join(allowed) or 'no language'} only "
            f"(${sources.ENV_SPACY_DOWNLOAD_LANGUAGES}); the operator pulls this one",
        )
    elif download:
        try:
            url = sources.spacy_wheel_url(package, environ)
        except CrossAuditError as exc:
            tried.add("a download of the official release", f"skipped: {exc.message}")
        else:
            failure = _download(lambda: sources.pull(store, package, environ=environ), environ, f"{store.root} {url}")
            if failure is None:
                if (found := from_store(record=False)) is not None:
                    return found, ""
                failure = "downloaded, but the store entry holds no pipeline"
            tried.add(f"a download from {url} into the store", failure)
    return None, tried.render(fixes)


# A call-time download that failed is not tried again for this long. Resolution runs at each call
# of an evaluator that has no model yet, and a tenant chooses what is looked for (a Presidio
# `language` names the spaCy package): without this, every call of a policy naming a package
# with no release (404) or a source that is down would make the server send its request again.
# `crossaudit models pull` does not go through here, so the operator can retry at once.
FAILED_DOWNLOAD_RETRY_S = 60.0
_MAX_FAILED_REMEMBERED = 1024
_failed: dict[str, tuple[float, str]] = {}  # key -> (monotonic time, what was reported)
_failed_lock = threading.Lock()


def _download(action: Callable[[], object], environ: Mapping[str, str], key: str = "") -> str | None:
    """Run a pull for step 4; None when it succeeded, else what to report (offline, or the failure).
    ``key`` names the download (store and URL): its failure is reported again, without a new
    attempt, for :data:`FAILED_DOWNLOAD_RETRY_S`."""
    offline = sources.offline_setting(environ)
    if offline:
        return f"{OFFLINE_SKIPPED} ({offline})"
    now = time.monotonic()
    with _failed_lock:
        seen = _failed.get(key) if key else None
    if seen is not None and now - seen[0] < FAILED_DOWNLOAD_RETRY_S:
        return f"{seen[1]} (not retried for {FAILED_DOWNLOAD_RETRY_S:.0f} s; `crossaudit models pull` retries now)"
    try:
        action()
    except CrossAuditError as exc:
        failure = f"failed: {exc.message}"
    except OSError as exc:
        failure = f"failed: {type(exc).__name__}: {exc}"
    else:
        return None
    if key:
        with _failed_lock:
            if len(_failed) >= _MAX_FAILED_REMEMBERED:
                _failed.clear()
            _failed[key] = (now, failure)
    return failure
