"""Builtin evaluators' provenance through real model servers (subprocesses over gRPC): the server
reports the sha256 of the model files it loaded and the precision it runs, and the engine records
them (docs/provenance.md). The digests are recomputed here from the files, by the documented rule."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from crossaudit.modelserver.pool import InProcessModels, ModelServerPool
from crossaudit.modelserver.testing import build_spacy_pipeline
from orchestrator.engine.engine import Engine
from orchestrator.evaluators.builtin import build_builtin
from orchestrator.policy import load_policy

pytestmark = [pytest.mark.models]


def documented_digest(root: Path) -> str:
    """docs/provenance.md: sha256 over the sorted ``"<relative name> <sha256>\\n"`` lines of the files."""
    lines = sorted(
        f"{p.relative_to(root).as_posix()} {hashlib.sha256(p.read_bytes()).hexdigest()}\n"
        for p in root.rglob("*")
        if p.is_file()
    )
    return hashlib.sha256("".join(lines).encode()).hexdigest()


class Builtins:
    def __init__(self, backend: Any) -> None:
        self.backend = backend

    def build(self, spec: Any, policy: Any) -> Any:
        return build_builtin(spec.name, spec.config, backend=self.backend)


def policy(config: str) -> Any:
    return load_policy(
        "name: P\ndescription: d\nversion: '1'\n"
        f"evaluators:\n  - name: b\n    type: builtin\n    config: {config}\n"
        "rules:\n  - {name: r, evaluator: b, threshold: 0.1, action: warn}\n"
    )


@pytest.fixture
async def pool():
    p = ModelServerPool()
    yield p
    await p.aclose()


async def evaluated(backend: Any, config: str, response: str) -> Any:
    # Prepared first, as a deploy does: the rule's timeout (15 s default) bounds the evaluation,
    # not the server's start (imports of presidio and spaCy: tens of seconds on a loaded machine).
    p = policy(config)
    await build_builtin("b", p.evaluator("b").config, backend=backend).prepare()
    engine = Engine(Builtins(backend))
    try:
        decision = await engine.evaluate(p, "", response, {}, timeout=120)
    finally:
        await engine.aclose()
    return decision.rule("r").evaluators[0]


async def test_langdetect_server_reports_its_profiles_digest(pool: ModelServerPool) -> None:
    import langdetect

    result = await evaluated(pool, "{model: langdetect}", "The quick brown fox jumps over the lazy dog.")
    assert result.details["detected_language"] == "en"
    profiles = Path(langdetect.__file__).parent / "profiles"
    assert result.provenance == {
        "kind": "builtin",
        "model": "langdetect",
        "model_sha256": documented_digest(profiles),
        "precision": "fp64",
    }


async def test_presidio_server_reports_its_pipeline_digest(pool: ModelServerPool, tmp_path: Path) -> None:
    pipeline = build_spacy_pipeline(tmp_path / "pipeline")
    config = f"{{model: presidio, entities: [PERSON, EMAIL], spacy_model_path: '{pipeline}'}}"
    result = await evaluated(pool, config, "Write to John Smith at john@example.com")
    assert result.score == 0.0
    assert result.provenance == {
        "kind": "builtin",
        "model": "presidio",
        "model_sha256": documented_digest(Path(pipeline)),
        "precision": "fp32",
    }


async def test_in_process_models_report_the_same() -> None:
    backend = InProcessModels()
    try:
        served = await evaluated(backend, "{model: langdetect}", "Bonjour, comment allez-vous aujourd'hui ?")
    finally:
        await backend.aclose()
    assert served.provenance["model"] == "langdetect" and served.provenance["precision"] == "fp64"
    assert len(served.provenance["model_sha256"]) == 64


@pytest.mark.docker
async def test_a_containerised_server_adds_its_image_id(docker_daemon, tmp_path: Path) -> None:
    from crossaudit.kernel.errors import ConfigurationError
    from crossaudit.modelserver.images import build
    from crossaudit.modelserver.pool import ModelServerLimits
    from tests.conftest import need

    try:
        image = build("presidio")  # found: make test-images built it (tests/images.py MODEL_SERVER_KINDS)
    except ConfigurationError as exc:
        need(False, f"the presidio model-server image cannot be built here: {exc}")
        raise
    pipeline = build_spacy_pipeline(tmp_path / "pipeline")
    limits = ModelServerLimits(container_memory_bytes=768 * 1024**2, container_pids=128)
    pool = ModelServerPool(limits, isolation="docker", images={"presidio": image})
    try:
        config = f"{{model: presidio, entities: [PERSON, EMAIL], spacy_model_path: '{pipeline}'}}"
        result = await evaluated(pool, config, "Write to John Smith at john@example.com")
    finally:
        await pool.aclose()
    assert result.provenance == {
        "kind": "builtin",
        "model": "presidio",
        "model_sha256": documented_digest(Path(pipeline)),  # mounted elsewhere inside: names are relative
        "precision": "fp32",
        "server": docker_daemon.images.get(image).id,
    }
