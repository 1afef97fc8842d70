"""Convert a Detoxify checkpoint to ONNX, so it can be served without torch.

``python -m crossaudit.modelserver.export CHECKPOINT HF_DIR OUT_DIR`` (``crossaudit models export``
calls :func:`export_detoxify`). It loads the checkpoint with ``detoxify.Detoxify`` (torch), exactly
as the torch serving path does, and writes the directory :mod:`crossaudit.modelserver.onnxfiles`
describes:

- ``model.onnx``: the classifier's logits, with dynamic batch and sequence axes, from torch's
  ``torch.export``-based ONNX exporter at opset :data:`OPSET`. It is traced on a padded batch, so
  the attention-mask path is part of the graph.
- ``model.int8.onnx``: ``onnxruntime.quantization.quantize_dynamic`` of it (int8 weights of the
  MatMul/Gemm layers, activations quantized per call): about a quarter of the size, faster on CPU,
  probabilities within about 0.01 of fp32 (measured in ``docs/builtins-and-llm.md``).
- ``tokenizer.json``: the checkpoint's tokenizer as a Hugging Face fast tokenizer.
- ``detoxify-onnx.json``: labels (renamed as Detoxify renames them), sigmoid, truncation length.

This is the only place CrossAudit needs torch for Detoxify: it comes with the ``export`` extra
(``pip install 'crossaudit[export]'``); serving needs only the ``models`` extra.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crossaudit.kernel.canonical import file_sha256
from crossaudit.kernel.errors import ConfigurationError
from crossaudit.modelserver import onnxfiles

OPSET = 18  # onnxruntime >= 1.17 runs it; torch's exporter targets 18 natively
# Tokens of the padded example batch the graph is traced on (any length works after export).
_EXAMPLE_TEXTS = ("hello world", "an example text, a little longer than the first one, for tracing")
_MAX_SANE_LENGTH = 100_000  # transformers' "no limit" model_max_length is ~1e30: use the position table then


@dataclass(frozen=True)
class ExportResult:
    directory: str
    files: dict[str, str]  # precision -> model file path
    labels: tuple[str, ...]


class _DropMessage(logging.Filter):
    def __init__(self, fragment: str) -> None:
        super().__init__()
        self.fragment = fragment

    def filter(self, record: logging.LogRecord) -> bool:
        return self.fragment not in record.getMessage()


def _max_length(tokenizer: Any, config: Any) -> int:
    """The truncation length Detoxify's ``tokenizer(..., truncation=True)`` applies."""
    length = int(getattr(tokenizer, "model_max_length", 0) or 0)
    if 0 < length < _MAX_SANE_LENGTH:
        return length
    positions = int(getattr(config, "max_position_embeddings", 512))
    # RoBERTa-family position ids start after the padding index: 514 positions hold 512 tokens.
    offset = int(getattr(config, "pad_token_id", 0) or 0) + 1 if "roberta" in str(config.model_type) else 0
    return positions - offset


def _fast_tokenizer(tokenizer: Any) -> Any:
    if getattr(tokenizer, "is_fast", False):
        return tokenizer.backend_tokenizer
    from transformers.convert_slow_tokenizer import convert_slow_tokenizer

    return convert_slow_tokenizer(tokenizer)


def export_detoxify(
    checkpoint: str | os.PathLike[str],
    huggingface_config_path: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    variant: str = "original",
    int8: bool = True,
    opset: int = OPSET,
    overwrite: bool = False,
) -> ExportResult:
    """Export ``checkpoint`` (Detoxify's format, with its HF config/tokenizer directory) into ``out_dir``.

    The directory is written whole or not at all: files go to a sibling temporary directory that is
    renamed into place. ``out_dir`` must not exist unless ``overwrite``.
    """
    checkpoint, hf = os.path.abspath(checkpoint), os.path.abspath(huggingface_config_path)
    out = Path(out_dir).absolute()
    if not os.path.isfile(checkpoint):
        raise ConfigurationError(f"export: checkpoint {checkpoint!r} is not a file")
    if not os.path.isdir(hf):
        raise ConfigurationError(f"export: Hugging Face config directory {hf!r} is not a directory")
    if out.exists() and not overwrite:
        raise ConfigurationError(f"export: {str(out)!r} exists (pass overwrite to replace it)")
    loaded = _load_detoxify(variant, checkpoint, hf)
    model, tokenizer, labels = loaded.model.eval(), loaded.tokenizer, tuple(loaded.class_names)
    example = tokenizer(list(_EXAMPLE_TEXTS), return_tensors="pt", padding=True, truncation=True)
    # XLM-R/RoBERTa tokenizers give no token_type_ids: the graph then has two inputs.
    inputs = tuple(n for n in ("input_ids", "attention_mask", "token_type_ids") if n in example)
    if inputs[:2] != ("input_ids", "attention_mask"):
        raise ConfigurationError(f"export: the tokenizer gives {sorted(example)}, not input_ids + attention_mask")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        fp32 = staging / onnxfiles.MODEL_FILES["fp32"]
        _export_graph(model, example, inputs, fp32, opset)
        files = {"fp32": str(out / fp32.name)}
        if int8:
            int8_path = staging / onnxfiles.MODEL_FILES["int8"]
            _quantize(fp32, int8_path)
            files["int8"] = str(out / int8_path.name)
        (staging / onnxfiles.TOKENIZER_FILE).write_text(_fast_tokenizer(tokenizer).to_str(), encoding="utf-8")
        arch = loaded.model.config
        onnxfiles.write_sidecar(staging, onnxfiles.Sidecar(
            labels=labels,
            activation="sigmoid",  # Detoxify.predict: torch.sigmoid over the logits, per label
            max_length=_max_length(tokenizer, arch),
            inputs=inputs,
            pad_id=int(tokenizer.pad_token_id or 0),
            pad_token=str(tokenizer.pad_token),
            precisions=tuple(files),
            source={
                "checkpoint": os.path.basename(checkpoint),
                "sha256": file_sha256(checkpoint),
                "model_type": str(arch.model_type),
                "variant": variant,
                "opset": opset,
            },
        ))  # fmt: skip
        if out.exists():
            shutil.rmtree(out)
        os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return ExportResult(str(out), files, labels)


def _load_detoxify(variant: str, checkpoint: str, hf: str) -> Any:
    """Detoxify's own loader, offline (the config and tokenizer come from ``hf``)."""
    try:
        import torch  # noqa: F401 - the export's own dependency, named in the error
    except ImportError as exc:
        raise ConfigurationError(f"export needs torch ({exc}): pip install 'crossaudit[export]'") from None
    from crossaudit.modelserver.builtins.detoxify import _import_detoxify

    detoxify = _import_detoxify()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        return detoxify.Detoxify(variant, checkpoint=checkpoint, huggingface_config_path=hf)
    except Exception as exc:
        raise ConfigurationError(
            f"export: cannot load checkpoint {checkpoint!r} with config {hf!r}: {type(exc).__name__}: {exc}"
        ) from None


def _export_graph(model: Any, example: Any, inputs: tuple[str, ...], path: Path, opset: int) -> None:
    """The classifier as an fp32 ONNX graph with dynamic batch and sequence axes."""
    import torch

    class Logits(torch.nn.Module):
        """The classifier with positional inputs and one output: what the graph's signature becomes."""

        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any = None) -> Any:
            extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
            return self.inner(input_ids=input_ids, attention_mask=attention_mask, **extra).logits

    batch, sequence = torch.export.Dim("batch"), torch.export.Dim("sequence")
    with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
        # The three inputs share their axes, so the exporter names them once: expected, not a problem.
        warnings.filterwarnings("ignore", message=r"# The axis name", category=UserWarning)
        torch.onnx.export(
            Logits(model).eval(), tuple(example[n] for n in inputs), str(path),
            input_names=list(inputs), output_names=["logits"], opset_version=opset,
            dynamo=True, external_data=False, verbose=False,
            dynamic_shapes={n: ({0: batch, 1: sequence} if n in inputs else None)
                            for n in ("input_ids", "attention_mask", "token_type_ids")},
        )  # fmt: skip


def _quantize(fp32: Path, int8: Path) -> None:
    """Dynamic int8 quantization of the weights (onnxruntime's), next to the fp32 graph."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # Its advice to run shape-inference pre-processing first does not apply: that fails on
    # these graphs' dynamic axes ("Incomplete symbolic shape inference").
    quiet = _DropMessage("pre-processing before quantization")
    logging.getLogger().addFilter(quiet)
    try:
        quantize_dynamic(str(fp32), str(int8), weight_type=QuantType.QInt8)
    finally:
        logging.getLogger().removeFilter(quiet)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The export command's arguments (``crossaudit models export`` and ``python -m`` this module)."""
    ap.add_argument("checkpoint", help="a Detoxify checkpoint file")
    ap.add_argument("huggingface_config_path", help="its Hugging Face config + tokenizer directory")
    ap.add_argument("out_dir", help="the export directory to write (must not exist unless --overwrite)")
    ap.add_argument("--variant", default="original", help="Detoxify variant label (default: original)")
    ap.add_argument("--no-int8", action="store_true", help="skip the dynamic-int8 copy")
    ap.add_argument("--opset", type=int, default=OPSET)
    ap.add_argument("--overwrite", action="store_true")


def run(args: argparse.Namespace) -> int:
    """Export as ``args`` say and print what was written; ConfigurationError propagates."""
    result = export_detoxify(args.checkpoint, args.huggingface_config_path, args.out_dir, variant=args.variant,
                             int8=not args.no_int8, opset=args.opset, overwrite=args.overwrite)  # fmt: skip
    for precision, path in result.files.items():
        print(f"{precision}: {path} ({os.path.getsize(path) / 1e6:.1f} MB)")
    print(f"labels: {', '.join(result.labels)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m crossaudit.modelserver.export", description=__doc__.splitlines()[0])
    add_arguments(ap)
    args = ap.parse_args(argv)
    try:
        return run(args)
    except ConfigurationError as exc:
        ap.exit(2, f"error: {exc}\n")

if __name__ == "__main__":
    raise SystemExit(main())
