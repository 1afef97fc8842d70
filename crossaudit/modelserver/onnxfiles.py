"""The files of a Detoxify ONNX export: written by :mod:`crossaudit.modelserver.export`, served by
:class:`crossaudit.modelserver.builtins.detoxify.DetoxifyRuntime` without torch.

An export is one directory::

    model.onnx          the classifier, fp32, inputs (batch, sequence) -> logits (batch, labels)
    model.int8.onnx     the same with dynamically quantized int8 weights (optional)
    tokenizer.json      the Hugging Face *fast* tokenizer (``tokenizers.Tokenizer.from_file``)
    detoxify-onnx.json  the sidecar: labels, output activation, truncation length, inputs, source

The sidecar carries what the torch checkpoint knew and the ONNX graph does not: the class names
(already renamed the way Detoxify renames them), that Detoxify applies a sigmoid per label, and
the tokenizer's truncation length. This module is standard library only, so model resolution
(:mod:`crossaudit.modelserver.locate`) can recognise an export without importing a model stack.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Literal

from crossaudit.kernel.errors import ConfigurationError
from crossaudit.kernel.files import read_capped

FORMAT = 1
MODEL_FILES = {"fp32": "model.onnx", "int8": "model.int8.onnx"}
TOKENIZER_FILE = "tokenizer.json"
SIDECAR_FILE = "detoxify-onnx.json"
ACTIVATIONS = ("sigmoid", "softmax")
MAX_SIDECAR_BYTES = 64 * 1024  # a sidecar is a few hundred bytes; a larger one is refused unread
MAX_LABELS = 64  # Detoxify predicts 6-16 labels
MAX_LENGTH = 1_000_000  # tokens; Detoxify's models truncate at 512


@dataclass(frozen=True)
class Sidecar:
    """What ``detoxify-onnx.json`` says about an export."""

    labels: tuple[str, ...]
    activation: Literal["sigmoid", "softmax"]
    max_length: int  # tokens, [CLS]/[SEP] included: the torch tokenizer's truncation length
    inputs: tuple[str, ...]  # graph inputs fed from the tokenizer (input_ids, attention_mask, token_type_ids)
    pad_id: int
    pad_token: str
    precisions: tuple[str, ...]  # which of MODEL_FILES the export holds
    source: dict[str, Any]  # where it came from (checkpoint name and sha256, base model): informational

    def as_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "model": "detoxify",
            "labels": list(self.labels),
            "activation": self.activation,
            "max_length": self.max_length,
            "inputs": list(self.inputs),
            "pad_id": self.pad_id,
            "pad_token": self.pad_token,
            "files": {p: MODEL_FILES[p] for p in self.precisions},
            "source": self.source,
        }


def is_onnx_export(path: str | os.PathLike[str] | None) -> bool:
    """Whether ``path`` is an export directory (a sidecar and a tokenizer in it), not a torch checkpoint."""
    if not path:
        return False
    return os.path.isfile(os.path.join(path, SIDECAR_FILE)) and os.path.isfile(os.path.join(path, TOKENIZER_FILE))


def read_sidecar(directory: str | os.PathLike[str]) -> Sidecar:
    """Parse and check the sidecar of an export; ConfigurationError names the file and the problem."""
    path = os.path.join(directory, SIDECAR_FILE)
    raw = read_capped(path, MAX_SIDECAR_BYTES, "detoxify: the export's sidecar", ConfigurationError)
    try:
        doc = json.loads(raw)
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ValueError(f"expected a JSON object with format {FORMAT}")
        labels = tuple(str(x) for x in doc["labels"])
        activation = doc.get("activation", "sigmoid")
        files = doc.get("files") or {"fp32": MODEL_FILES["fp32"]}
        if not labels or len(labels) > MAX_LABELS or len(set(labels)) != len(labels):
            raise ValueError(f"labels must be 1 to {MAX_LABELS} distinct names")
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}")
        if not isinstance(files, dict) or any(MODEL_FILES.get(k) != v for k, v in files.items()):
            raise ValueError(f"files must map precisions to {MODEL_FILES}")
        max_length = int(doc["max_length"])
        # A truncation length of 0 (or less) would feed the graph nothing of any text: every text
        # would get the same score, silently. A real one is a few hundred tokens.
        if not 1 <= max_length <= MAX_LENGTH:
            raise ValueError(f"max_length must be 1 to {MAX_LENGTH}")
        return Sidecar(
            labels=labels,
            activation=activation,
            max_length=max_length,
            inputs=tuple(str(x) for x in doc["inputs"]),
            pad_id=int(doc.get("pad_id", 0)),
            pad_token=str(doc.get("pad_token", "[PAD]")),
            precisions=tuple(files),
            source=dict(doc.get("source") or {}),
        )
    # RecursionError: JSON nested deeper than the parser's stack fits in 64 KiB; OverflowError: a
    # number such as 1e999 (infinity) given where an integer is expected. Both are a bad sidecar.
    except (ValueError, KeyError, TypeError, RecursionError, OverflowError) as exc:
        raise ConfigurationError(f"detoxify: {path!r} is not a valid ONNX export sidecar: {exc}") from None


def write_sidecar(directory: str | os.PathLike[str], sidecar: Sidecar) -> str:
    path = os.path.join(directory, SIDECAR_FILE)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(sidecar.as_json(), fh, indent=2, sort_keys=True)
        fh.write("\n")
    return path
