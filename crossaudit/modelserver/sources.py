"""Where the builtins' models officially come from, and ``pull``: download one into the model store.

The sources are the ones the libraries themselves use, each base URL a setting so a mirror (or
a test's local HTTP server) can stand in:

- Detoxify checkpoints: the release assets ``detoxify.detoxify.MODEL_URLS`` names
  (``CROSSAUDIT_DETOXIFY_URL`` = their base; ``CROSSAUDIT_DETOXIFY_URL_<VARIANT>`` = one whole URL).
  Their file names carry a SHA-256 prefix, checked as ``torch.hub`` does.
- The Hugging Face config + tokenizer of each Detoxify variant's base model (``bert-base-uncased``,
  ``roberta-base``, ``xlm-roberta-base``), which Detoxify otherwise fetches from the hub at load:
  ``<endpoint>/<repo>/resolve/main/<file>`` with ``CROSSAUDIT_HF_ENDPOINT``, else ``HF_ENDPOINT``
  (the hub library's own setting), else the public hub.
- spaCy pipelines: the release wheel ``spacy download`` installs
  (``CROSSAUDIT_SPACY_MODELS_URL`` = the release base; the version is the installed spaCy's
  ``<major>.<minor>.0``, or ``CROSSAUDIT_SPACY_MODEL_VERSION``). The pipeline directory inside
  the wheel is unpacked into the store; nothing is installed into the Python environment.

Any other name can be pulled from an explicit ``--url`` (one file, stored as is).
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

from crossaudit.kernel.errors import InvalidInputError
from crossaudit.kernel.shell import command
from crossaudit.modelserver.download import DownloadError, check_url, download
from crossaudit.modelserver.store import (
    FILES,
    PRIVATE_DIR_MODE,
    PRIVATE_FILE_MODE,
    ModelStore,
    ModelStoreLimits,
    StoreEntry,
    validate_name,
)

ENV_DETOXIFY_URL = "CROSSAUDIT_DETOXIFY_URL"
DEFAULT_DETOXIFY_URL = "https://github.com/unitaryai/detoxify/releases/download/"
ENV_HF_ENDPOINT = "CROSSAUDIT_HF_ENDPOINT"
DEFAULT_HF_ENDPOINT = "https://huggingface.co"
ENV_SPACY_MODELS_URL = "CROSSAUDIT_SPACY_MODELS_URL"
DEFAULT_SPACY_MODELS_URL = "https://github.com/explosion/spacy-models/releases/download/"
ENV_SPACY_MODEL_VERSION = "CROSSAUDIT_SPACY_MODEL_VERSION"
ENV_SPACY_PACKAGE = "CROSSAUDIT_SPACY_PACKAGE"
ENV_OFFLINE = "CROSSAUDIT_OFFLINE"
# Languages whose spaCy pipeline a call may download on its own (comma-separated). A tenant's
# Presidio `language` picks the package, so without a bound a policy could make the server fetch
# every language's ~500 MB release; the operator pulls any other (`crossaudit models pull`).
ENV_SPACY_DOWNLOAD_LANGUAGES = "CROSSAUDIT_SPACY_DOWNLOAD_LANGUAGES"
DEFAULT_SPACY_DOWNLOAD_LANGUAGES = ("en",)
HF_OFFLINE = "HF_HUB_OFFLINE"

DETOXIFY = "detoxify"


@dataclass(frozen=True)
class DetoxifyRelease:
    path: str  # under the release base URL; the file name is also the torch hub cache's name
    base_model: str  # the Hugging Face repository of its config and tokenizer

    @property
    def filename(self) -> str:
        return PurePosixPath(self.path).name


# detoxify.detoxify.MODEL_URLS for the variants a DetoxifyConfig accepts.
DETOXIFY_RELEASES: dict[str, DetoxifyRelease] = {
    "original": DetoxifyRelease("v0.1-alpha/toxic_original-c1212f89.ckpt", "bert-base-uncased"),
    "unbiased": DetoxifyRelease("v0.3-alpha/toxic_debiased-c7548aa0.ckpt", "roberta-base"),
    "multilingual": DetoxifyRelease("v0.4-alpha/multilingual_debiased-0b549669.ckpt", "xlm-roberta-base"),
}


@dataclass(frozen=True)
class HubModel:
    """A base model's config and tokenizer files: ``required`` must exist, ``optional`` may 404."""

    required: tuple[str, ...]
    optional: tuple[str, ...] = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
    aliases: tuple[str, ...] = ()  # other repository names of the same files (for the hub cache)


HUB_MODELS: dict[str, HubModel] = {
    "bert-base-uncased": HubModel(("config.json", "vocab.txt"), aliases=("google-bert/bert-base-uncased",)),
    "roberta-base": HubModel(("config.json", "vocab.json", "merges.txt"), aliases=("FacebookAI/roberta-base",)),
    "xlm-roberta-base": HubModel(("config.json", "sentencepiece.bpe.model"), aliases=("FacebookAI/xlm-roberta-base",)),
}

# spaCy's package names: <lang>_<type>_<genre>_<size>, e.g. en_core_web_lg, de_core_news_md, xx_ent_wiki_sm.
SPACY_PACKAGE_RE = re.compile(r"[a-z]{2,3}_[a-z]+_[a-z]+_[a-z0-9]+")
_SPACY_DEFAULTS = {"en": "en_core_web_lg", "zh": "zh_core_web_lg"}  # else <lang>_core_news_lg

Progress = Callable[[str], None]


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in {"1", "true", "yes", "on"}


def offline_setting(environ: Mapping[str, str]) -> str:
    """The setting that turned offline mode on ('' when downloads are allowed)."""
    for env in (ENV_OFFLINE, HF_OFFLINE):
        if _truthy(environ.get(env)):
            return f"{env}={environ.get(env)}"
    return ""


def detoxify_variant(variant: str | None) -> str:
    v = variant or "original"
    if v not in DETOXIFY_RELEASES:
        raise InvalidInputError(f"detoxify has no variant {v!r} (expected one of {sorted(DETOXIFY_RELEASES)})")
    return v


def detoxify_url(variant: str, environ: Mapping[str, str]) -> str:
    override = environ.get(f"{ENV_DETOXIFY_URL}_{variant.upper()}", "").strip()
    if override:
        return override
    base = environ.get(ENV_DETOXIFY_URL, "").strip() or DEFAULT_DETOXIFY_URL
    return base.rstrip("/") + "/" + DETOXIFY_RELEASES[variant].path


def hub_endpoint(environ: Mapping[str, str]) -> str:
    return (environ.get(ENV_HF_ENDPOINT, "").strip() or environ.get("HF_ENDPOINT", "").strip()
            or DEFAULT_HF_ENDPOINT).rstrip("/")


def hub_url(repo: str, filename: str, environ: Mapping[str, str]) -> str:
    return f"{hub_endpoint(environ)}/{repo}/resolve/main/{filename}"


def spacy_package(language: str, environ: Mapping[str, str]) -> str:
    """The spaCy package a Presidio config of ``language`` uses when it names no pipeline."""
    configured = environ.get(ENV_SPACY_PACKAGE, "").strip()
    return configured or _SPACY_DEFAULTS.get(language, f"{language}_core_news_lg")


def spacy_download_languages(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The languages whose pipeline a call may download (``CROSSAUDIT_SPACY_DOWNLOAD_LANGUAGES``)."""
    raw = environ.get(ENV_SPACY_DOWNLOAD_LANGUAGES)
    if raw is None:
        return DEFAULT_SPACY_DOWNLOAD_LANGUAGES
    return tuple(dict.fromkeys(x.strip().lower() for x in raw.split(",") if x.strip()))


def spacy_model_version(environ: Mapping[str, str]) -> str:
    """The pipeline version for the installed spaCy: models are released per <major>.<minor>."""
    configured = environ.get(ENV_SPACY_MODEL_VERSION, "").strip()
    if configured:
        return configured
    try:
        major, minor = importlib.metadata.version("spacy").split(".")[:2]
    except (importlib.metadata.PackageNotFoundError, ValueError):
        raise InvalidInputError(
            f"spaCy is not installed, so the pipeline version is unknown: set {ENV_SPACY_MODEL_VERSION}"
        ) from None
    return f"{major}.{minor}.0"


def spacy_wheel_url(package: str, environ: Mapping[str, str]) -> str:
    version = spacy_model_version(environ)
    base = (environ.get(ENV_SPACY_MODELS_URL, "").strip() or DEFAULT_SPACY_MODELS_URL).rstrip("/")
    return f"{base}/{package}-{version}/{package}-{version}-py3-none-any.whl"


def known_names() -> list[str]:
    return [DETOXIFY, *HUB_MODELS, "<spaCy package, e.g. en_core_web_lg>"]


def source_url(name: str, variant: str | None, environ: Mapping[str, str]) -> str:
    """The URL ``pull`` would use for ``name`` without ``--url`` ('' when it needs one)."""
    if name == DETOXIFY:
        return detoxify_url(detoxify_variant(variant), environ)
    if name in HUB_MODELS:
        return hub_url(name, HUB_MODELS[name].required[0], environ)
    if SPACY_PACKAGE_RE.fullmatch(name):
        return spacy_wheel_url(name, environ)
    return ""


def default_variant(name: str) -> str:
    return "original" if name == DETOXIFY else "default"


def import_command(name: str, variant: str | None = None, options: Sequence[str] = ()) -> str:
    """The ``crossaudit models import`` command that adds entry ``name`` without a download, and
    what its PATH must be: the one fix where the model's source cannot be reached. ``options``
    (e.g. ``--store DIR``) are appended to the command."""
    variant = variant or default_variant(name)
    flags = ("--variant", variant) if variant != default_variant(name) or name == DETOXIFY else ()
    if name == DETOXIFY:
        what = "a checkpoint file, or a directory with the checkpoint and its Hugging Face config/tokenizer in hf/"
    elif name in HUB_MODELS:
        what = "a directory with config.json and the tokenizer files"
    elif SPACY_PACKAGE_RE.fullmatch(name):
        what = "the pipeline directory, the one with config.cfg"
    else:
        what = "the model file or directory"
    return f"`{command('crossaudit', 'models', 'import', name, 'PATH', *flags, *options)}` (PATH: {what})"


def _attempt(name: str, variant: str, pull_one: Callable[[], StoreEntry]) -> StoreEntry:
    """``pull_one()``, its DownloadError naming the entry it was pulling."""
    try:
        return pull_one()
    except DownloadError as exc:
        if exc.entry is None:
            exc.entry = (name, variant)
        raise


def pull(
    store: ModelStore,
    name: str,
    variant: str | None = None,
    *,
    url: str | None = None,
    environ: Mapping[str, str] | None = None,
    replace: bool = False,
    progress: Progress | None = None,
) -> list[StoreEntry]:
    """Download ``name`` (and what it needs: a Detoxify variant's base-model config) into the store.

    An entry already present is kept (and returned) unless ``replace``. Returns the entries.
    """
    environ = os.environ if environ is None else environ
    say = progress or (lambda _msg: None)
    validate_name(name)
    variant = variant or default_variant(name)
    validate_name(variant, "variant")
    if url:
        check_url(url)
    entries: list[StoreEntry] = []
    if name == DETOXIFY:
        variant = detoxify_variant(variant)
        ck_url = url or detoxify_url(variant, environ)
        entries.append(_attempt(name, variant, lambda: _pull_file(store, name, variant, ck_url, replace, say)))
        base = DETOXIFY_RELEASES[variant].base_model
        entries.append(_attempt(base, "default", lambda: _pull_hub(store, base, environ, False, say)))
    elif name in HUB_MODELS:
        if url:
            raise InvalidInputError(f"{name} is several files from the hub: pull it without --url")
        entries.append(_attempt(name, variant, lambda: _pull_hub(store, name, environ, replace, say)))
    elif SPACY_PACKAGE_RE.fullmatch(name):
        wheel = url or spacy_wheel_url(name, environ)
        entries.append(_attempt(name, variant, lambda: _pull_spacy(store, name, variant, wheel, replace, say)))
    elif url:
        entries.append(_attempt(name, variant, lambda: _pull_file(store, name, variant, url, replace, say)))
    else:
        raise InvalidInputError(
            f"no official source is known for {name!r}: give --url, or pull one of {', '.join(known_names())}"
        )
    return entries


def _existing(store: ModelStore, name: str, variant: str, replace: bool, say: Progress) -> StoreEntry | None:
    entry = None if replace else store.get(name, variant)
    if entry is not None:
        say(f"{name}/{variant} is already in the store ({entry.source})")
    return entry


def _pull_file(store: ModelStore, name: str, variant: str, url: str, replace: bool, say: Progress) -> StoreEntry:
    with store.entry_lock(name, variant):
        if (entry := _existing(store, name, variant, replace, say)) is not None:
            return entry
        filename = PurePosixPath(urlsplit(url).path).name or "model"
        validate_file_name(filename)
        say(f"downloading {url}")
        with store.staging() as staged:
            got = download(url, staged / FILES / filename, limits=store.limits)
            assert got is not None
            checked = f" (checked against {got.verified})" if got.verified else ""
            say(f"  {got.size} bytes, sha256 {got.sha256}{checked}")
            return store.commit(staged, name, variant, url, replace=replace, extra=_verified(got.verified))


def _pull_hub(store: ModelStore, repo: str, environ: Mapping[str, str], replace: bool, say: Progress) -> StoreEntry:
    spec = HUB_MODELS[repo]
    with store.entry_lock(repo, "default"):
        if (entry := _existing(store, repo, "default", replace, say)) is not None:
            return entry
        sources: dict[str, str] = {}
        with store.staging() as staged:
            for filename in (*spec.required, *spec.optional):
                file_url = hub_url(repo, filename, environ)
                say(f"downloading {file_url}")
                got = download(
                    file_url, staged / FILES / filename, limits=store.limits, optional=filename in spec.optional
                )
                if got is not None:
                    sources[filename] = file_url
            return store.commit(
                staged, repo, "default", f"{hub_endpoint(environ)}/{repo}", file_sources=sources, replace=replace
            )


def _pull_spacy(store: ModelStore, package: str, variant: str, url: str, replace: bool, say: Progress) -> StoreEntry:
    with store.entry_lock(package, variant):
        if (entry := _existing(store, package, variant, replace, say)) is not None:
            return entry
        say(f"downloading {url}")
        with store.staging() as staged:
            wheel = staged / "download.whl"
            got = download(url, wheel, limits=store.limits)
            assert got is not None
            say(f"  {got.size} bytes, sha256 {got.sha256}; unpacking the pipeline")
            pipeline = extract_spacy_pipeline(wheel, package, staged / FILES, store)
            wheel.unlink()
            return store.commit(
                staged, package, variant, url,
                extra={"archive_sha256": got.sha256, "pipeline": pipeline, **_verified(got.verified)},
                replace=replace,
            )


def _verified(verified: str) -> dict[str, str]:
    return {"verified_against": verified} if verified else {}


def validate_file_name(filename: str) -> str:
    if filename in ("", ".", "..") or "/" in filename or "\\" in filename or filename.startswith("."):
        raise InvalidInputError(f"cannot store a file named {filename!r}")
    return filename


def extract_spacy_pipeline(wheel: Path, package: str, dest: Path, store: ModelStore) -> str:
    """Unpack the pipeline directory of a spaCy model wheel (``<pkg>/<pkg>-<version>/``, the one
    holding ``config.cfg``) into ``dest``; every member is checked (no absolute or ``..`` paths,
    member count and sizes capped, bytes counted as they are written: a zip may lie about sizes)."""
    limits = store.limits
    try:
        _check_archive_index(wheel, limits)
        with zipfile.ZipFile(wheel) as zf:
            infos = zf.infolist()
            if len(infos) > limits.max_archive_members:
                raise DownloadError(f"{wheel.name} has more than {limits.max_archive_members} members")
            roots = sorted(
                str(PurePosixPath(i.filename).parent)
                for i in infos
                if PurePosixPath(i.filename).name == "config.cfg" and len(PurePosixPath(i.filename).parts) == 3
                and PurePosixPath(i.filename).parts[0] == package
            )
            if len(roots) != 1:
                raise DownloadError(f"the archive holds no single {package}/<{package}-version>/config.cfg pipeline")
            prefix = roots[0] + "/"
            total = count = 0
            for info in infos:
                if not info.filename.startswith(prefix) or info.is_dir():
                    continue
                rel = PurePosixPath(info.filename[len(prefix):])
                if rel.is_absolute() or any(p in ("", ".", "..") for p in rel.parts) or "\\" in info.filename:
                    raise DownloadError(f"the archive has an unsafe member {info.filename!r}")
                count += 1
                if count > limits.max_entry_files:
                    raise DownloadError(f"the pipeline has more than {limits.max_entry_files} files")
                target = dest.joinpath(*rel.parts)
                _mkdirs_private(dest, target.parent)
                fd = os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY, PRIVATE_FILE_MODE)
                written = 0
                with zf.open(info) as src, os.fdopen(fd, "wb") as out:
                    while chunk := src.read(1024 * 1024):
                        written += len(chunk)
                        total += len(chunk)
                        if written > limits.max_file_bytes or total > limits.max_entry_bytes:
                            raise DownloadError("the pipeline is larger than the store's limits")
                        out.write(chunk)
            return roots[0].split("/")[-1]
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError) as exc:
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(mode=PRIVATE_DIR_MODE, exist_ok=True)
        raise DownloadError(f"cannot unpack the spaCy model archive: {type(exc).__name__}: {exc}") from None


def _check_archive_index(wheel: Path, limits: ModelStoreLimits) -> None:
    """Refuse an archive whose end record announces more members, or a larger central directory,
    than the limits, before zipfile reads that directory into memory and parses every entry of it
    (a hostile source could send a 4 GiB index of tens of millions of empty members)."""
    with wheel.open("rb") as fh:
        end = zipfile._EndRecData(fh)  # type: ignore[attr-defined]  # the end record, zip64 included
    if not end:
        raise zipfile.BadZipFile("File is not a zip file")
    members, index_bytes = int(end[zipfile._ECD_ENTRIES_TOTAL]), int(end[zipfile._ECD_SIZE])  # type: ignore[attr-defined]
    if members > limits.max_archive_members:
        raise DownloadError(f"{wheel.name} has more than {limits.max_archive_members} members")
    if index_bytes > limits.max_archive_index_bytes:
        raise DownloadError(
            f"{wheel.name} has a member index of {index_bytes} bytes, more than {limits.max_archive_index_bytes}"
        )


def _mkdirs_private(top: Path, directory: Path) -> None:
    missing = []
    d = directory
    while d != top and not d.exists():
        missing.append(d)
        d = d.parent
    for m in reversed(missing):
        m.mkdir(mode=PRIVATE_DIR_MODE)
