"""The Detoxify builtin's runtime: real ``detoxify.Detoxify`` from local files, no hub.

Its config is :class:`crossaudit.kernel.builtins.detoxify.DetoxifyConfig`. Detoxify loads a
local checkpoint plus a local Hugging Face config/tokenizer directory, located by
:func:`crossaudit.modelserver.locate.locate_detoxify` (the evaluator's config or the
``CROSSAUDIT_DETOXIFY_*`` settings, one pair per variant allowed; the model store; the torch and
Hugging Face caches; a download into the store).

Two forms of model are served. A Detoxify torch checkpoint (plus its HF directory) runs through
``detoxify.Detoxify``, which needs torch. An ONNX export of one (``crossaudit models export``,
:mod:`crossaudit.modelserver.export`; the files are described in :mod:`crossaudit.modelserver.onnxfiles`)
runs on onnxruntime with the ``tokenizers`` library and never imports torch: that is the serving
install (``pip install crossaudit[models]``) and the model-server image. ``checkpoint`` naming an
export directory selects it; ``precision`` picks its fp32 or int8 copy (``auto``, the default,
serves int8 when the export holds it: the latency targets in the README are met only by int8, and
it moves a probability by at most about 0.005).

Both forms score a micro-batch in one forward pass over the padded batch
(:meth:`DetoxifyRuntime.analyze_batch`, fed by :mod:`crossaudit.modelserver.batching`).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from crossaudit.kernel.builtins import parse_config
from crossaudit.kernel.builtins.detoxify import DetoxifyConfig
from crossaudit.kernel.errors import ConfigurationError, InvalidInputError
from crossaudit.kernel.results import Verdict
from crossaudit.modelserver import onnxfiles
from crossaudit.modelserver.builtins.base import ModelRuntime, _text, check_exists, tree_files
from crossaudit.modelserver.locate import locate_detoxify

ENV_DETOXIFY_CHECKPOINT = "CROSSAUDIT_DETOXIFY_CHECKPOINT"
ENV_DETOXIFY_CONFIG = "CROSSAUDIT_DETOXIFY_CONFIG"

_detox_lock = threading.Lock()


def _import_detoxify() -> Any:
    """Import detoxify and make its loader honour ``huggingface_config_path`` fully.

    ``detoxify.detoxify.get_model_and_tokenizer`` first calls
    ``config_class.from_pretrained(model_type)`` with the checkpoint's hub name (for example
    ``bert-base-uncased``) even when a local config directory is given, and then ignores that
    config. Offline that call fails, so when a local directory is given we pass it as
    ``model_type`` too: every read then comes from the directory; the rest of detoxify's
    loading (checkpoint format, class names, state dict, tokenizer) runs unchanged.
    """
    with _detox_lock:
        try:
            import detoxify.detoxify as dd  # torch + transformers come with it
        except ImportError as exc:
            raise ConfigurationError(
                f"detoxify is not installed ({exc}); install the model extras with `make models`"
            ) from None
        if not getattr(dd.get_model_and_tokenizer, "_crossaudit_offline", False):
            upstream = dd.get_model_and_tokenizer

            def offline(model_type, model_name, tokenizer_name, num_classes, state_dict, huggingface_config_path=None):
                return upstream(
                    huggingface_config_path or model_type,
                    model_name,
                    tokenizer_name,
                    num_classes,
                    state_dict,
                    huggingface_config_path=huggingface_config_path,
                )

            offline._crossaudit_offline = True  # type: ignore[attr-defined]
            dd.get_model_and_tokenizer = offline
    return dd


class DetoxifyRuntime(ModelRuntime):
    """Real ``detoxify.Detoxify`` loaded from a local checkpoint + local HF config directory.

    The checkpoint is Detoxify's own format: ``{"config": {"arch": {"args": {model_type,
    model_name, tokenizer_name, num_classes}}, "dataset": {"args": {"classes": [...]}}},
    "state_dict": {...}}``; ``huggingface_config_path`` holds ``config.json`` and the tokenizer
    files, read with ``local_files_only`` so no hub is contacted. A ``checkpoint`` that is an ONNX
    export directory is served by onnxruntime instead (:class:`_OnnxDetoxify`; no torch, no HF directory).
    """

    kind = DetoxifyConfig.model_kind
    model_paths = {"checkpoint": ENV_DETOXIFY_CHECKPOINT, "huggingface_config_path": ENV_DETOXIFY_CONFIG}
    # The image serves ONNX exports only: no torch (kept in step with pyproject.toml's `models` extra).
    image_requirements = ("onnxruntime>=1.17,<2", "tokenizers>=0.15,<1", "numpy>=1.26,<3")
    batching = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # export directory -> the precision "auto" chose there; paths come from operator settings
        # and the store (tenants cannot name model paths), and it is cleared with the model cache.
        self._auto_precision: dict[str, str] = {}

    @classmethod
    def resolve(cls, cfg: DetoxifyConfig, environ: Mapping[str, str]) -> DetoxifyConfig:
        # Config/env, the model store, the torch and HF hub caches, a download: crossaudit.modelserver.locate.
        ckpt, hf = locate_detoxify(
            cfg.checkpoint,
            cfg.huggingface_config_path,
            cfg.variant,
            environ,
            checkpoint_env=ENV_DETOXIFY_CHECKPOINT,
            config_env=ENV_DETOXIFY_CONFIG,
        )
        return cfg.model_copy(update={"checkpoint": ckpt, "huggingface_config_path": hf})

    def _key(self, cfg: DetoxifyConfig) -> tuple[str, ...]:
        # With an explicit checkpoint Detoxify ignores the variant name while loading: the files
        # are the model, so one load serves every variant label that points at them.
        if onnxfiles.is_onnx_export(cfg.checkpoint):
            return (cfg.checkpoint or "", self._precision(cfg))
        return (cfg.checkpoint or "", cfg.huggingface_config_path or "")

    def _precision(self, cfg: DetoxifyConfig) -> str:
        """``auto`` made concrete for an export: int8 when it holds one. Remembered per directory, like
        the loaded model itself, so "auto" and an explicit "int8" share one load and ``loaded()`` and
        ``details.precision`` name the copy that scores."""
        if cfg.precision != "auto":
            return cfg.precision
        path = cfg.checkpoint or ""
        chosen = self._auto_precision.get(path)
        if chosen is None:
            try:
                chosen = "int8" if "int8" in onnxfiles.read_sidecar(path).precisions else "fp32"
            except Exception:  # a broken sidecar: let the load report it, with the export's name
                return "fp32"
            if len(self._auto_precision) >= self._max_loaded:
                self._auto_precision.clear()
            self._auto_precision[path] = chosen
        return chosen

    def _load(self, cfg: DetoxifyConfig) -> Any:
        if cfg.checkpoint and onnxfiles.is_onnx_export(cfg.checkpoint):
            return _OnnxDetoxify.load(cfg.checkpoint, self._precision(cfg))
        if cfg.checkpoint and os.path.isdir(cfg.checkpoint):
            raise ConfigurationError(
                f"detoxify: checkpoint {cfg.checkpoint!r} is a directory but not an ONNX export (it needs "
                f"{onnxfiles.SIDECAR_FILE} and {onnxfiles.TOKENIZER_FILE}; `crossaudit models export` writes one)"
            )
        if cfg.precision == "int8":
            raise ConfigurationError(
                f"detoxify: precision {cfg.precision!r} needs an ONNX export, and {cfg.checkpoint!r} is a torch "
                "checkpoint: convert it with `crossaudit models export` (python -m crossaudit.modelserver.export)"
            )
        if not cfg.checkpoint or not cfg.huggingface_config_path:
            raise ConfigurationError(
                f"detoxify: checkpoint and huggingface_config_path must be set "
                f"(evaluator config or {ENV_DETOXIFY_CHECKPOINT} / {ENV_DETOXIFY_CONFIG})"
            )
        check_exists(cfg.checkpoint, "checkpoint", ENV_DETOXIFY_CHECKPOINT, "detoxify", directory=False)
        check_exists(
            cfg.huggingface_config_path, "huggingface_config_path", ENV_DETOXIFY_CONFIG, "detoxify", directory=True
        )
        detoxify = _import_detoxify()
        # Belt and braces: transformers must never try a hub from a model server.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        try:
            model = detoxify.Detoxify(
                cfg.variant, checkpoint=cfg.checkpoint, huggingface_config_path=cfg.huggingface_config_path
            )
        except Exception as exc:  # unpickling, missing keys, shape mismatch...: all mean "bad model files"
            raise ConfigurationError(
                f"detoxify: cannot load checkpoint {cfg.checkpoint!r} with config {cfg.huggingface_config_path!r}: "
                f"{type(exc).__name__}: {exc}"
            ) from None
        return _TorchDetoxify(model)

    def _analyze(self, model: Any, cfg: DetoxifyConfig, text: str) -> Verdict:
        return self._verdict(model.predict([text])[0], cfg, model.precision)

    def model_files(self, cfg: DetoxifyConfig, model: Any) -> list[tuple[str, Path]]:
        """An export: its sidecar, tokenizer and the graph of the precision loaded; a torch
        checkpoint: the checkpoint file and every file of its Hugging Face config directory."""
        if isinstance(model, _OnnxDetoxify):
            root = Path(cfg.checkpoint or "")
            names = (onnxfiles.SIDECAR_FILE, onnxfiles.TOKENIZER_FILE, onnxfiles.MODEL_FILES[model.precision])
            return [(name, root / name) for name in names]
        checkpoint = Path(cfg.checkpoint or "")
        config = [(f"huggingface_config/{name}", path) for name, path in tree_files(cfg.huggingface_config_path or "")]
        return [(checkpoint.name, checkpoint), *config]

    def precision(self, cfg: DetoxifyConfig, model: Any) -> str:
        return model.precision or "fp32"  # the torch path runs Detoxify's float32 weights as loaded

    def analyze_batch(self, calls: Sequence[tuple[Any, str, str]]) -> list[Verdict | Exception]:
        """One forward pass per loaded model over the padded texts of ``calls``.

        Calls are grouped by load key (one batch may mix checkpoints or precisions; the server
        groups by key already). A config that does not parse, or asks for a category the model
        lacks, fails alone. If the batched forward itself fails, each text is retried alone, so
        one text that breaks the model does not take its batch-mates down with it.
        """
        out: list[Verdict | Exception | None] = [None] * len(calls)
        groups: dict[tuple[str, ...], list[tuple[int, DetoxifyConfig, str]]] = {}
        for i, (config, prompt, response) in enumerate(calls):
            try:
                cfg = parse_config(self.kind, config)
                groups.setdefault(self._key(cfg), []).append((i, cfg, _text(cfg, prompt, response)))
            except Exception as exc:
                out[i] = exc
        for members in groups.values():
            try:
                model = self.model_for(members[0][1])
            except Exception as exc:  # one model, one load: every call on it shares the error
                for i, _, _ in members:
                    out[i] = exc
                continue
            rows: list[dict[str, float]] | None
            try:
                rows = model.predict([text for _, _, text in members])
            except Exception:
                rows = None
            for j, (i, cfg, text) in enumerate(members):
                try:
                    out[i] = self._verdict(
                        rows[j] if rows is not None else model.predict([text])[0], cfg, model.precision
                    )
                except Exception as exc:
                    out[i] = exc
        return [r if r is not None else RuntimeError("no result") for r in out]

    def _verdict(self, probs: Mapping[str, float], cfg: DetoxifyConfig, precision: str | None) -> Verdict:
        selected = list(cfg.categories) or list(probs)
        unknown = [c for c in selected if c not in probs]
        if unknown:
            raise InvalidInputError(f"detoxify: unknown categories {unknown}; this checkpoint predicts {sorted(probs)}")
        chosen = {c: min(1.0, max(0.0, float(probs[c]))) for c in selected}
        top = max(chosen, key=lambda c: chosen[c])
        top_p = chosen[top]
        violations = [c for c in selected if chosen[c] >= cfg.threshold]
        details: dict[str, Any] = {
            "categories": chosen,
            "max_category": top,
            "max_probability": top_p,
            "threshold": cfg.threshold,
            "variant": cfg.variant,
            "checkpoint": os.path.basename(cfg.checkpoint or ""),
        }
        if precision is not None:  # ONNX exports: which copy scored (auto resolves at load)
            details["precision"] = precision
        return Verdict(score=1.0 - top_p, passed=top_p < cfg.threshold, violations=violations, details=details)

    def preload_from_env(self) -> bool:
        """Warm the stack the environment's model needs: onnxruntime for an export (or when no model
        is named and onnxruntime is installed), torch + detoxify only for a torch checkpoint, so a
        server that serves exports never imports torch (seconds and hundreds of MB)."""
        ckpt, hf = os.environ.get(ENV_DETOXIFY_CHECKPOINT), os.environ.get(ENV_DETOXIFY_CONFIG)
        if ckpt and onnxfiles.is_onnx_export(ckpt):
            self.model_for(DetoxifyConfig(model="detoxify", checkpoint=os.path.abspath(ckpt)))
            return True
        if not (ckpt and hf):
            with contextlib.suppress(ConfigurationError):  # a torch-only install: detoxify loads on first use
                _import_onnx()
            return False
        _import_detoxify()  # torch + transformers: seconds, paid before the server reports ready
        self.model_for(
            DetoxifyConfig(
                model="detoxify", checkpoint=os.path.abspath(ckpt), huggingface_config_path=os.path.abspath(hf)
            )
        )
        return True


def _labelled(labels: Sequence[str], matrix: Any) -> list[dict[str, float]]:
    return [{label: float(p) for label, p in zip(labels, row, strict=True)} for row in matrix]


class _TorchDetoxify:
    """``detoxify.Detoxify``, one call at a time: Hugging Face fast tokenizers raise "Already
    borrowed" when two threads set truncation/padding at once, and torch's intra-op threads
    already use every core for one call."""

    precision = None  # reported for ONNX exports only

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.lock = threading.Lock()

    def predict(self, texts: Sequence[str]) -> list[dict[str, float]]:
        import torch

        with self.lock, torch.inference_mode():
            # Detoxify.predict over a list: one padded batch (truncation + attention mask), sigmoid.
            raw = self.inner.predict(list(texts))
        columns = {str(k): (v if isinstance(v, list | tuple) else [v]) for k, v in raw.items()}
        return [{k: float(v[j]) for k, v in columns.items()} for j in range(len(texts))]


def _import_onnx() -> tuple[Any, Any, Any]:
    try:
        import numpy as np
        import onnxruntime as ort
        import tokenizers
    except ImportError as exc:
        raise ConfigurationError(
            f"onnxruntime/tokenizers are not installed ({exc}); install the serving extra: "
            "pip install 'crossaudit[models]' (make models)"
        ) from None
    return np, ort, tokenizers


class _OnnxDetoxify:
    """An ONNX export on onnxruntime: the same tokenization, graph and activation as the torch path.

    ``InferenceSession.run`` is thread-safe and the tokenizer is configured once at load (encoding
    only reads it), so no lock: the model server bounds concurrency with its worker threads.
    """

    def __init__(self, session: Any, tokenizer: Any, sidecar: onnxfiles.Sidecar, np: Any, precision: str) -> None:
        self.precision = precision
        self.session = session
        self.tokenizer = tokenizer
        self.sidecar = sidecar
        self.np = np
        self.feeds = [i.name for i in session.get_inputs()]

    @classmethod
    def load(cls, directory: str, precision: str) -> _OnnxDetoxify:
        np, ort, tokenizers = _import_onnx()
        sidecar = onnxfiles.read_sidecar(directory)
        if precision == "auto":
            precision = "int8" if "int8" in sidecar.precisions else "fp32"
        if precision not in sidecar.precisions:
            raise ConfigurationError(
                f"detoxify: the ONNX export {directory!r} has no {precision} model (it holds "
                f"{', '.join(sidecar.precisions)}): export again with `crossaudit models export`"
            )
        model_path = os.path.join(directory, onnxfiles.MODEL_FILES[precision])
        check_exists(model_path, "checkpoint", ENV_DETOXIFY_CHECKPOINT, "detoxify", directory=False)
        try:
            tokenizer = tokenizers.Tokenizer.from_file(os.path.join(directory, onnxfiles.TOKENIZER_FILE))
            tokenizer.enable_truncation(max_length=sidecar.max_length)
            tokenizer.enable_padding(pad_id=sidecar.pad_id, pad_token=sidecar.pad_token)
            options = ort.SessionOptions()
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            session = ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # a corrupt graph or tokenizer file: "bad model files", like a bad checkpoint
            raise ConfigurationError(
                f"detoxify: cannot load the ONNX export {directory!r} ({precision}): {type(exc).__name__}: {exc}"
            ) from None
        model = cls(session, tokenizer, sidecar, np, precision)
        unknown = [name for name in model.feeds if name not in ("input_ids", "attention_mask", "token_type_ids")]
        outputs = session.get_outputs()
        if unknown or len(outputs) != 1:
            raise ConfigurationError(
                f"detoxify: {model_path!r} is not a Detoxify export (inputs {model.feeds}, {len(outputs)} outputs)"
            )
        return model

    def predict(self, texts: Sequence[str]) -> list[dict[str, float]]:
        np = self.np
        encodings = self.tokenizer.encode_batch(list(texts))
        columns = {
            "input_ids": [e.ids for e in encodings],
            "attention_mask": [e.attention_mask for e in encodings],
            "token_type_ids": [e.type_ids for e in encodings],
        }
        feed = {name: np.asarray(columns[name], dtype=np.int64) for name in self.feeds}
        (logits,) = self.session.run(None, feed)
        logits = np.asarray(logits, dtype=np.float64)
        if logits.shape != (len(texts), len(self.sidecar.labels)):
            raise ConfigurationError(
                f"detoxify: the ONNX model returned shape {logits.shape} for {len(texts)} texts and "
                f"{len(self.sidecar.labels)} labels"
            )
        if self.sidecar.activation == "sigmoid":
            probs = 1.0 / (1.0 + np.exp(-logits))
        else:
            shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
            probs = shifted / shifted.sum(axis=1, keepdims=True)
        return _labelled(self.sidecar.labels, probs)
