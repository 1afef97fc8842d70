"""The guide's `toxicity_detector`, with no model path configured, after `crossaudit models import`
of a local checkpoint and after `crossaudit models pull` from a local HTTP server (a real model
server loads what the resolution found in the store)."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

import pytest

from crossaudit.cli.main import main
from crossaudit.modelserver.pool import ModelServerPool
from crossaudit.modelserver.store import ModelStore
from crossaudit.modelserver.testing import build_tiny_detoxify
from orchestrator.evaluators.base import EvaluationInput
from orchestrator.evaluators.builtin import DetoxifyEvaluator
from tests.conftest import need
from tests.http_files import file_server

pytestmark = [pytest.mark.models, pytest.mark.slow]

# policies/guide/03_evaluator_types.yaml
GUIDE_TOXICITY = {"model": "detoxify", "threshold": 0.8,
                  "categories": ["toxicity", "severe_toxicity", "obscene", "threat"]}
PROBS = [0.9, 0.1, 0.2, 0.3, 0.4, 0.05]  # toxic, severe_toxic, obscene, threat, insult, identity_hate


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    ok = all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers", "detoxify"))
    need(ok, "torch/transformers/detoxify not installed (make models)")
    return build_tiny_detoxify(tmp_path_factory.mktemp("detox"), fixed_probabilities=PROBS)


@pytest.fixture
async def pool():
    p = ModelServerPool()
    yield p
    await p.aclose()


@pytest.fixture
def store_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("CROSSAUDIT_DETOXIFY_CHECKPOINT", "CROSSAUDIT_DETOXIFY_CONFIG", "CROSSAUDIT_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CROSSAUDIT_MODEL_STORE", str(tmp_path / "store"))
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    return tmp_path / "store"


async def _score(pool: ModelServerPool) -> dict[str, float]:
    v = await DetoxifyEvaluator("toxicity_detector", GUIDE_TOXICITY, backend=pool).evaluate(
        EvaluationInput("p", "you are an idiot"), timeout=180
    )
    assert v.passed is False and v.violations == ["toxicity"]
    assert v.score == pytest.approx(0.1, abs=1e-4)
    return v.details["categories"]


async def test_guide_toxicity_detector_after_import(tiny, store_env: Path, pool) -> None:
    assert main(["models", "import", "detoxify", str(Path(tiny.checkpoint).parent)]) == 0
    entry = ModelStore(store_env).get("detoxify", "original")
    assert {f.path for f in entry.files} >= {"tiny.ckpt", "hf/config.json", "hf/vocab.txt"}
    cats = await _score(pool)
    assert cats["threat"] == pytest.approx(0.3, abs=1e-4)
    health = await pool.health("detoxify")
    assert any(str(entry.files_dir) in x for x in health["loaded"])


async def test_guide_toxicity_detector_after_pull_from_a_local_server(
    tiny, store_env: Path, pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    data = Path(tiny.checkpoint).read_bytes()
    with file_server() as srv:
        url = srv.add(f"/v0.1-alpha/toxic_original-{hashlib.sha256(data).hexdigest()[:8]}.ckpt", data)
        for f in Path(tiny.config_dir).iterdir():
            srv.add(f"/bert-base-uncased/resolve/main/{f.name}", f.read_bytes())
        monkeypatch.setenv("CROSSAUDIT_DETOXIFY_URL_ORIGINAL", url)
        monkeypatch.setenv("CROSSAUDIT_HF_ENDPOINT", srv.url)
        assert main(["models", "pull", "detoxify"]) == 0
        assert main(["models", "verify"]) == 0
        served = len(srv.requests)
    store = ModelStore(store_env)
    assert store.get("detoxify", "original").source == url
    assert {f.path for f in store.get("bert-base-uncased").files} == {p.name for p in Path(tiny.config_dir).iterdir()}
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # from now on only the store serves
    await _score(pool)
    assert served >= 5
