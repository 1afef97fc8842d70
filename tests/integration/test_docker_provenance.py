"""A custom evaluator with a pip dependency, in Docker: its recorded provenance names the image that
ran it and the digests of that image's hash-locked dependency list and CycloneDX SBOM, and those
digests are the image's labels and the files inside it (docs/provenance.md).

The dependency image is built before the tests (``make test-images``: ``tests/images.py``'s
``TEST_DEPENDENCY_SETS``); here it is only found.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile

import pytest
import pytest_asyncio

from crossaudit.kernel.depspec import validate_dependencies
from crossaudit.kernel.limits import PoolLimits
from crossaudit.kernel.results import Status
from orchestrator.engine.engine import Engine
from orchestrator.policy import load_policy
from orchestrator.runtime import Runtime
from sandbox.deps import SBOM_SPEC_VERSION
from sandbox.docker.backend import DockerSandbox
from sandbox.docker.container import BUNDLE_LABEL
from sandbox.docker.images import IMAGE_FILES_DIR, LOCK_LABEL, SBOM_LABEL

pytestmark = [pytest.mark.docker]

DEPENDENCY = "six==1.16.0"  # one of tests/images.py's TEST_DEPENDENCY_SETS
CODE = """import six

def evaluate(prompt, response, context):
    forged = {"image_id": "sha256:forged", "dependencies_sha256": "0" * 64, "sbom_sha256": "1" * 64}
    return {"score": 1.0, "passed": True, "provenance": forged, "details": {"six": six.__version__, **forged}}
"""
POLICY = f"""name: P
description: provenance in docker
version: "1.0"
evaluators:
  - name: with_six
    type: custom
    config:
      dependencies: ["{DEPENDENCY}"]
      code: |
{chr(10).join("        " + line for line in CODE.splitlines())}
rules:
  - {{name: r, evaluator: with_six, threshold: 0.5, action: block}}
"""


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def sb(docker_daemon):
    from tests.conftest import need
    from tests.images import TEST_DEPENDENCY_SETS

    assert (DEPENDENCY,) in TEST_DEPENDENCY_SETS
    sandbox = DockerSandbox(pool_limits=PoolLimits(min_size=1, max_size=1))
    await sandbox.start()
    image = sandbox._images.find(validate_dependencies([DEPENDENCY]))
    need(image is not None, f"the {DEPENDENCY} image is not built: run `make test-images` (python -m tests.images)")
    yield sandbox
    await sandbox.aclose()


def image_file(client, image: str, path: str) -> bytes:
    """One file of ``image``, read from a created (never started) container."""
    container = client.containers.create(image, command=["true"])
    try:
        stream, _stat = container.get_archive(path)
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            member = tar.getmembers()[0]
            data = tar.extractfile(member)
            assert data is not None
            return data.read()
    finally:
        container.remove(force=True)


@pytest.mark.asyncio(loop_scope="module")
async def test_provenance_names_the_image_its_lock_and_its_sbom(sb: DockerSandbox) -> None:
    engine = Engine(Runtime(sb))
    try:
        decision = await engine.evaluate(load_policy(POLICY), "p", "r", {}, timeout=120)
    finally:
        await engine.aclose()
    result = decision.rule("r").evaluators[0]
    assert result.status is Status.PASS and result.details["six"] == "1.16.0"
    prov = result.provenance

    client = sb._client
    tag = sb._images.find(validate_dependencies([DEPENDENCY])).tag
    inspected = client.api.inspect_image(tag)
    labels = inspected["Config"]["Labels"]
    assert prov["kind"] == "custom" and prov["backend"] == "docker"
    assert prov["code_sha256"] == hashlib.sha256(CODE.encode()).hexdigest()
    # what custom code claimed is content, never provenance
    assert prov["image_id"] == inspected["Id"] != "sha256:forged"
    assert prov["dependencies_sha256"] == labels[LOCK_LABEL]
    assert prov["sbom_sha256"] == labels[SBOM_LABEL]
    running = client.containers.list(filters={"label": f"{BUNDLE_LABEL}={prov['bundle_sha256'][:32]}"})
    assert running and {c.attrs["Image"] for c in running} == {prov["image_id"]}  # the very image recorded

    lock = image_file(client, tag, f"{IMAGE_FILES_DIR}/requirements.lock")
    sbom = image_file(client, tag, f"{IMAGE_FILES_DIR}/sbom.cdx.json")
    assert hashlib.sha256(lock).hexdigest() == prov["dependencies_sha256"]
    assert hashlib.sha256(sbom).hexdigest() == prov["sbom_sha256"]
    assert lock.decode().startswith("six==1.16.0 \\\n    --hash=sha256:")

    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    assert JsonStrictValidator(SchemaVersion.from_version(SBOM_SPEC_VERSION)).validate_str(sbom.decode()) is None
    doc = json.loads(sbom)
    assert doc["bomFormat"] == "CycloneDX" and doc["specVersion"] == SBOM_SPEC_VERSION
    assert [(c["name"], c["version"], c["purl"]) for c in doc["components"]] == [
        ("six", "1.16.0", "pkg:pypi/six@1.16.0")
    ]
