"""The tiers of ``make test`` see every image they use: a test that runs a deployment image (built
last, beside the Docker suites) carries the marker that makes it run after that build."""

from __future__ import annotations

import re
from pathlib import Path

from tests.images import DEPLOY_IMAGES

TESTS = Path(__file__).resolve().parents[1]


def test_tests_of_deployment_images_are_marked_to_run_last() -> None:
    uses = re.compile(r"built_tag\(\s*[\"'](" + "|".join(map(re.escape, DEPLOY_IMAGES)) + r")[\"']")
    unmarked = [
        str(path.relative_to(TESTS)) for path in sorted(TESTS.rglob("test_*.py"))
        if uses.search(text := path.read_text()) and "pytest.mark.deploy_image" not in text
    ]
    assert not unmarked, f"mark them pytest.mark.deploy_image (pyproject.toml): {unmarked}"
    assert "deploy_image" in (TESTS.parent / "Makefile").read_text()
