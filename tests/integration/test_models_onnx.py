"""Detoxify as an ONNX export: export with torch, serve with onnxruntime and no torch, parity with torch.

The model is a random-weight BERT of the real architecture in Detoxify's checkpoint format
(``crossaudit.modelserver.testing``), exported by the real exporter. Parity compares the torch
serving path (``detoxify.Detoxify``) with the ONNX one on the same weights and texts.
Under CI=true a missing torch/onnx stack fails instead of skipping.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from crossaudit.cli.main import main as cli_main
from crossaudit.kernel.errors import ConfigurationError
from crossaudit.modelserver import onnxfiles
from crossaudit.modelserver.builtins.detoxify import DetoxifyRuntime
from crossaudit.modelserver.export import export_detoxify
from crossaudit.modelserver.pool import ModelServerPool
from crossaudit.modelserver.testing import ORIGINAL_CATEGORIES, build_tiny_detoxify
from orchestrator.evaluators.base import EvaluationInput
from orchestrator.evaluators.builtin import DetoxifyEvaluator
from tests.conftest import need

pytestmark = [pytest.mark.models, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
# Short, long (truncated at the tokenizer's 128 tokens), empty, unknown words, repeated tokens.
TEXTS = [
    "you are an idiot",
    "hello world",
    "",
    "what a nice day, thank you, i love this",
    "I hate this " * 60,
    "zzz qqq ünïcode 🙂 words the tokenizer does not know",
    "the the the a a a bad good",
    "Hello World! Is this good? What is bad?",
]
FP32_TOLERANCE = 1e-4  # the bound on max |Δp| between torch and ONNX fp32
INT8_TOLERANCE = 0.05  # measured ≈ 0.005 on bert-base-sized weights (docs/builtins-and-llm.md): a wide margin


def _need_stack() -> None:
    mods = ("torch", "transformers", "detoxify", "onnx", "onnxscript", "onnxruntime", "tokenizers")
    missing = [m for m in mods if importlib.util.find_spec(m) is None]
    need(not missing, f"{', '.join(missing)} not installed (make export-deps)")


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory):
    """A 4-layer random BERT checkpoint and its export, through `crossaudit models export`."""
    _need_stack()
    root = tmp_path_factory.mktemp("onnx")
    tiny = build_tiny_detoxify(root / "ckpt", hidden_size=64, num_layers=4, num_heads=4, seed=7)
    out = root / "export"
    assert cli_main(["models", "export", tiny.checkpoint, tiny.config_dir, str(out)]) == 0
    return tiny, str(out)


def _probs(runtime: DetoxifyRuntime, cfg: dict, texts: list[str]) -> list[dict[str, float]]:
    results = runtime.analyze_batch([(cfg, "", t) for t in texts])
    for r in results:
        assert not isinstance(r, Exception), r
    return [r.details["categories"] for r in results]  # type: ignore[union-attr]


def _max_delta(a: list[dict[str, float]], b: list[dict[str, float]]) -> float:
    assert [list(x) for x in a] == [list(y) for y in b]
    return max(abs(x[k] - y[k]) for x, y in zip(a, b, strict=True) for k in x)


def test_export_writes_the_documented_directory(exported) -> None:
    tiny, out = exported
    assert onnxfiles.is_onnx_export(out) and not onnxfiles.is_onnx_export(tiny.checkpoint)
    sidecar = onnxfiles.read_sidecar(out)
    assert sidecar.labels == ORIGINAL_CATEGORIES  # renamed as Detoxify renames them
    assert sidecar.activation == "sigmoid" and sidecar.max_length == 128
    assert sidecar.inputs == ("input_ids", "attention_mask", "token_type_ids")
    assert sidecar.precisions == ("fp32", "int8")
    assert sidecar.source["checkpoint"] == "tiny.ckpt" and len(sidecar.source["sha256"]) == 64
    fp32, int8 = (os.path.getsize(os.path.join(out, onnxfiles.MODEL_FILES[p])) for p in ("fp32", "int8"))
    assert int8 < fp32
    with pytest.raises(ConfigurationError, match="exists"):
        export_detoxify(tiny.checkpoint, tiny.config_dir, out)


def test_parity_with_torch_fp32_and_int8(exported) -> None:
    tiny, out = exported
    runtime = DetoxifyRuntime()
    base = {"model": "detoxify", "categories": []}
    torch_cfg = {**base, "checkpoint": tiny.checkpoint, "huggingface_config_path": tiny.config_dir}
    reference = _probs(runtime, torch_cfg, TEXTS)
    # One by one too: padding in a batch must not change a text's probabilities.
    alone = [_probs(runtime, torch_cfg, [t])[0] for t in TEXTS]
    assert _max_delta(reference, alone) <= FP32_TOLERANCE

    fp32 = _probs(runtime, {**base, "checkpoint": out, "precision": "fp32"}, TEXTS)
    fp32_alone = [_probs(runtime, {**base, "checkpoint": out, "precision": "fp32"}, [t])[0] for t in TEXTS]
    int8 = _probs(runtime, {**base, "checkpoint": out, "precision": "int8"}, TEXTS)
    # Dynamic int8 quantizes activations with one scale per tensor, i.e. per batch: a text's
    # probabilities move slightly with its batch-mates (bounded like the int8-vs-torch difference).
    int8_alone = [_probs(runtime, {**base, "checkpoint": out, "precision": "int8"}, [t])[0] for t in TEXTS]
    print(f"int8 batched vs one by one: max |Δp| {_max_delta(int8, int8_alone):.2e}")
    assert _max_delta(int8, int8_alone) <= INT8_TOLERANCE
    # The default, "auto", serves the int8 copy an export holds: the same model, loaded once.
    assert _probs(runtime, {**base, "checkpoint": out}, TEXTS) == int8
    d32, d32_alone, d8 = _max_delta(reference, fp32), _max_delta(alone, fp32_alone), _max_delta(reference, int8)
    print(f"max |Δp| vs torch: fp32 {d32:.2e} (batched), {d32_alone:.2e} (one by one); int8 {d8:.2e}")
    assert d32 <= FP32_TOLERANCE and d32_alone <= FP32_TOLERANCE
    assert d8 <= INT8_TOLERANCE
    assert {x.split(":")[-1] for x in runtime.loaded() if x.startswith(out)} == {"fp32", "int8"}


def test_serving_an_export_never_imports_torch(exported) -> None:
    """The serving stack alone, in a fresh interpreter: same numbers, and torch never loaded."""
    tiny, out = exported
    code = (
        "import json, sys\n"
        "from crossaudit.modelserver.builtins.detoxify import DetoxifyRuntime\n"
        "rt = DetoxifyRuntime()\n"
        "cfg = {'model': 'detoxify', 'categories': [], 'checkpoint': sys.argv[1], 'precision': 'fp32'}\n"
        "one = rt.analyze(cfg, '', sys.argv[2]).details['categories']\n"
        "many = [v.details['categories'] for v in rt.analyze_batch([(cfg, '', t) for t in json.loads(sys.argv[3])])]\n"
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))\n"
        "assert 'transformers' not in sys.modules and 'detoxify' not in sys.modules\n"
        "print(json.dumps({'one': one, 'many': many}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code, out, TEXTS[0], json.dumps(TEXTS)], capture_output=True,
                          text=True, timeout=120, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    reference = _probs(DetoxifyRuntime(), {"model": "detoxify", "categories": [], "checkpoint": tiny.checkpoint,
                                           "huggingface_config_path": tiny.config_dir}, TEXTS)
    assert _max_delta(reference, got["many"]) <= FP32_TOLERANCE
    assert _max_delta(reference[:1], [got["one"]]) <= FP32_TOLERANCE


async def test_model_server_serves_the_export_without_torch(exported, monkeypatch) -> None:
    """Through the real model server, the export named by the operator setting (as in the image):
    preload warms onnxruntime only, and the server process never maps torch's libraries."""
    tiny, out = exported
    monkeypatch.setenv("CROSSAUDIT_DETOXIFY_CHECKPOINT", out)
    monkeypatch.delenv("CROSSAUDIT_DETOXIFY_CONFIG", raising=False)
    pool = ModelServerPool()
    try:
        ev = DetoxifyEvaluator("tox", {"model": "detoxify", "categories": [], "precision": "fp32"}, backend=pool)
        v = await ev.evaluate(EvaluationInput("", TEXTS[0]), timeout=120)
        q = await DetoxifyEvaluator("tox8", {"model": "detoxify", "categories": []},  # auto: int8
                                    backend=pool).evaluate(EvaluationInput("", TEXTS[0]), timeout=120)
        health = await pool.health("detoxify")
        maps = Path(f"/proc/{health['pid']}/maps").read_text()
    finally:
        await pool.aclose()
    reference = _probs(DetoxifyRuntime(), {"model": "detoxify", "categories": [], "checkpoint": tiny.checkpoint,
                                           "huggingface_config_path": tiny.config_dir}, TEXTS[:1])
    assert _max_delta(reference, [v.details["categories"]]) <= FP32_TOLERANCE
    assert _max_delta(reference, [q.details["categories"]]) <= INT8_TOLERANCE
    assert v.details["precision"] == "fp32" and q.details["precision"] == "int8"
    assert sorted(health["loaded"]) == sorted([f"{out}:fp32", f"{out}:int8"])
    assert "onnxruntime" in maps and "libtorch" not in maps


def test_configuration_errors_name_the_fix(exported, tmp_path) -> None:
    tiny, out = exported
    runtime = DetoxifyRuntime()
    torch_cfg = {"model": "detoxify", "checkpoint": tiny.checkpoint, "huggingface_config_path": tiny.config_dir}
    with pytest.raises(ConfigurationError, match=r"int8.*crossaudit models export"):
        runtime.analyze({**torch_cfg, "precision": "int8"}, "", "x")
    with pytest.raises(ConfigurationError, match="not an ONNX export"):
        runtime.analyze({"model": "detoxify", "checkpoint": str(tmp_path)}, "", "x")
    fp32_only = tmp_path / "fp32-only"
    export_detoxify(tiny.checkpoint, tiny.config_dir, fp32_only, int8=False)
    auto = runtime.analyze({"model": "detoxify", "checkpoint": str(fp32_only)}, "", "x")
    assert auto.details["categories"] and auto.details["precision"] == "fp32"  # auto: the copy it has
    with pytest.raises(ConfigurationError, match="no int8 model"):
        runtime.analyze({"model": "detoxify", "checkpoint": str(fp32_only), "precision": "int8"}, "", "x")
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in (onnxfiles.TOKENIZER_FILE, onnxfiles.SIDECAR_FILE):
        (broken / name).write_bytes((Path(out) / name).read_bytes())
    (broken / onnxfiles.MODEL_FILES["fp32"]).write_bytes(b"not a graph")
    with pytest.raises(ConfigurationError, match="cannot load the ONNX export"):
        runtime.analyze({"model": "detoxify", "checkpoint": str(broken), "precision": "fp32"}, "", "x")
    with pytest.raises(ConfigurationError, match=r"model\.int8\.onnx.*not an existing file"):  # auto: int8
        runtime.analyze({"model": "detoxify", "checkpoint": str(broken)}, "", "x")
    (broken / onnxfiles.SIDECAR_FILE).write_text(json.dumps({"format": 1, "labels": []}))
    with pytest.raises(ConfigurationError, match="not a valid ONNX export sidecar"):
        DetoxifyRuntime().analyze({"model": "detoxify", "checkpoint": str(broken)}, "", "x")
