"""The README's labelled-evals section, run as written with no server to reach (``tests/e2e/readme.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.readme import EVALS_SECTION, readme_items, run_items, workdir

pytestmark = pytest.mark.e2e


@pytest.mark.timeout(900)
def test_the_readme_eval_commands_run_as_written(tmp_path: Path) -> None:
    work, env = workdir(tmp_path)
    env["CROSSAUDIT_SANDBOX"] = "process"
    ran = run_items([i for i in readme_items() if i.section == EVALS_SECTION], work, env, client=None)
    assert any(c.startswith("crossaudit eval --compare") for c in ran), ran
    assert len(ran) >= 4, ran
