"""What every builtin's runtime shares: load once, score many texts, and locate model files.

A runtime is synchronous and thread-safe for ``analyze`` (the model server runs it in a
bounded thread pool). Heavy imports (torch, detoxify, presidio, spaCy) happen inside
``_load`` so importing a runtime module stays cheap and a missing extra is a clear
ConfigurationError, not an ImportError at startup. Nothing here reaches the network.

Besides the model code, a runtime class carries what the rest of CrossAudit needs to know
about its builtin's model files and container image, so that knowledge lives in the builtin's
own module: :attr:`ModelRuntime.model_paths` (config field → operator setting),
:meth:`ModelRuntime.resolve` (fill those fields from the environment; the orchestrator calls it
through :func:`crossaudit.modelserver.builtins.resolve_paths`) and
:attr:`ModelRuntime.image_requirements`.
"""

from __future__ import annotations

import abc
import hashlib
import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from crossaudit.kernel.builtins import parse_config
from crossaudit.kernel.canonical import file_sha256
from crossaudit.kernel.errors import ConfigurationError

# Declared in the one hierarchy, so a peer that imports only the codec decodes it; re-exported.
from crossaudit.kernel.errors import ModelRequiredError as ModelRequiredError
from crossaudit.kernel.lru import EvictingLRU
from crossaudit.kernel.results import Verdict

MAX_LOADED_MODELS = 4  # distinct model instances (paths/variants) one server keeps in memory
MAX_MODEL_FILES = 10_000  # files of one model hashed for its provenance (a spaCy pipeline has a few dozen)


def model_digest(files: Iterable[tuple[str, Path]]) -> str:
    """``model_sha256`` of the files a model loaded (docs/provenance.md): one file's own sha256; for
    several, the sha256 of their sorted ``"<name> <sha256>\n"`` lines (name: the path relative to
    the model's directory, ``/``-separated), so anyone with the files can recompute it."""
    hashed = sorted((name, file_sha256(path)) for name, path in files)
    if len(hashed) == 1:
        return hashed[0][1]
    return hashlib.sha256("".join(f"{name} {sha}\n" for name, sha in hashed).encode()).hexdigest()


def tree_files(root: str | os.PathLike[str]) -> list[tuple[str, Path]]:
    """(relative name, path) of every regular file under ``root`` (at most :data:`MAX_MODEL_FILES`)."""
    base = Path(root)
    found: list[tuple[str, Path]] = []
    for path in sorted(base.rglob("*")):
        if path.is_file():
            if len(found) >= MAX_MODEL_FILES:
                raise ConfigurationError(f"{base} holds more than {MAX_MODEL_FILES} files: not hashed as one model")
            found.append((path.relative_to(base).as_posix(), path))
    return found


def _text(cfg: Any, prompt: str, response: str) -> str:
    return prompt if cfg.text == "prompt" else response


class ModelRuntime(abc.ABC):
    """One builtin's model code. Instances are cached per load key (paths, variant), LRU-bounded."""

    kind: ClassVar[str]  # the builtin's name in crossaudit.kernel.builtins.BUILTIN_MODELS
    # Config fields naming model files, each with the environment variable that supplies it when
    # the config does not (the service refuses these fields: there, models are the operator's).
    model_paths: ClassVar[Mapping[str, str]] = {}
    # pip requirements of this builtin's model-server image; None = no image (subprocess servers only).
    image_requirements: ClassVar[tuple[str, ...] | None] = None
    # Whether the model server micro-batches this runtime's calls (crossaudit.modelserver.batching):
    # worth it where one call over many texts costs less than many calls (a forward pass, a pipeline).
    batching: ClassVar[bool] = False

    def __init__(self, max_loaded: int = MAX_LOADED_MODELS) -> None:
        self._max_loaded = max(1, max_loaded)  # also bounds what a runtime keeps per model (Detoxify's precision)
        # an evicted model is only dropped (the GC frees it) with its load time
        self._models: EvictingLRU[tuple[str, ...], Any] = EvictingLRU(max_loaded, self._evicted)
        self._lock = threading.Lock()
        self._key_locks: dict[tuple[str, ...], threading.Lock] = {}
        self.load_ms: dict[tuple[str, ...], float] = {}
        self._provenance: dict[tuple[str, ...], dict[str, str]] = {}  # by load key, computed at load

    def _evicted(self, key: tuple[str, ...], _model: Any) -> None:
        self.load_ms.pop(key, None)
        self._provenance.pop(key, None)

    @classmethod
    def resolve(cls, cfg: Any, environ: Mapping[str, str]) -> Any:
        """``cfg`` with its model paths made absolute and explicit (from ``environ`` when the config
        names none), so the server receives settings, not lookups; ConfigurationError names a missing one."""
        return cfg

    @abc.abstractmethod
    def _key(self, cfg: Any) -> tuple[str, ...]: ...

    @abc.abstractmethod
    def _load(self, cfg: Any) -> Any: ...

    @abc.abstractmethod
    def _analyze(self, model: Any, cfg: Any, text: str) -> Verdict: ...

    def model_for(self, cfg: Any) -> Any:
        """The loaded model for ``cfg``, loading it once even under concurrent first calls."""
        key = self._key(cfg)
        with self._lock:
            if key in self._models:
                return self._models[key]  # marks it used
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        with key_lock:
            with self._lock:
                if key in self._models:
                    return self._models[key]
            t0 = time.perf_counter()
            model = self._load(cfg)
            facts = self._facts(cfg, model)  # the files as loaded, hashed once per load
            with self._lock:
                self.load_ms[key] = (time.perf_counter() - t0) * 1000
                self._models[key] = model  # beyond max_loaded: the least recently used is evicted
                self._provenance[key] = facts
            return model

    # -- provenance (docs/provenance.md) --

    def model_files(self, cfg: Any, model: Any) -> list[tuple[str, Path]]:
        """(name, path) of the files the model for ``cfg`` was loaded from; none by default."""
        return []

    def precision(self, cfg: Any, model: Any) -> str:
        """The numeric precision the loaded model computes in ("" when it has none to speak of)."""
        return ""

    def _facts(self, cfg: Any, model: Any) -> dict[str, str]:
        files = self.model_files(cfg, model)
        facts = {"model": self.kind, "model_sha256": model_digest(files) if files else "",
                 "precision": self.precision(cfg, model)}  # fmt: skip
        return {k: v for k, v in facts.items() if v}

    def provenance(self, config: Mapping[str, Any] | Any) -> dict[str, str]:
        """``model``, ``model_sha256`` and ``precision`` of the model loaded for ``config`` (just
        ``model`` when it is not loaded: nothing was scored with it)."""
        try:
            key = self._key(parse_config(self.kind, config))
        except Exception:  # a config no model was loaded for: nothing more to say than the kind
            return {"model": self.kind}
        with self._lock:
            return dict(self._provenance.get(key) or {"model": self.kind})

    def analyze(self, config: Mapping[str, Any] | Any, prompt: str, response: str) -> Verdict:
        cfg = parse_config(self.kind, config)
        model = self.model_for(cfg)
        return self._analyze(model, cfg, _text(cfg, prompt, response))

    def batch_key(self, cfg: Any) -> tuple[str, ...]:
        """Calls with equal keys run on the same loaded model, so the server may batch them together."""
        return self._key(cfg)

    def analyze_batch(self, calls: Sequence[tuple[Any, str, str]]) -> list[Verdict | Exception]:
        """Score ``calls`` (config, prompt, response): one verdict or exception per call, in order.

        The default runs them one by one, so an error stays with its own call; a runtime whose model
        scores many texts at once for less (Detoxify's forward pass) overrides it.
        """
        out: list[Verdict | Exception] = []
        for config, prompt, response in calls:
            try:
                out.append(self.analyze(config, prompt, response))
            except Exception as exc:
                out.append(exc)
        return out

    def preload_from_env(self) -> bool:
        """Import the model stack and load the model named by the environment, if any (warm start)."""
        return False

    def loaded(self) -> list[str]:
        with self._lock:
            return [":".join(k) for k in self._models]


def path_setting(
    value: str | None, env: str, field: str, kind: str, what: str, environ: Mapping[str, str], variant: str = ""
) -> str:
    """Config first, then ``ENV_<VARIANT>`` (one model per variant), then ``ENV``; made absolute."""
    path = value or (environ.get(f"{env}_{variant.upper()}", "") if variant else "") or environ.get(env, "")
    if not path:
        raise ConfigurationError(
            f"{kind}: no {what} configured: set the evaluator's `{field}` or the {env} environment variable"
        )
    return os.path.abspath(os.path.expanduser(path))


def check_exists(path: str, field: str, env: str, kind: str, *, directory: bool) -> None:
    """Raise ConfigurationError when a resolved model path is missing (names the setting)."""
    ok = os.path.isdir(path) if directory else os.path.isfile(path)
    if not ok:
        what = "directory" if directory else "file"
        raise ConfigurationError(
            f"{kind}: {field} {path!r} is not an existing {what} (set the evaluator's `{field}` or {env})"
        )
