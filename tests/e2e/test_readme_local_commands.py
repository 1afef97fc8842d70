"""The README's commands that need no server (local policy commands, version, configuration), run
as written in the README's order with no server to reach (``tests/e2e/readme.py``); the evals'
section runs in ``test_readme_eval_commands.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.readme import EVALS_SECTION, is_local, readme_items, run_items, workdir

pytestmark = pytest.mark.e2e


@pytest.mark.timeout(900)
def test_the_readme_commands_that_need_no_server_run_as_written(tmp_path: Path) -> None:
    work, env = workdir(tmp_path)
    env["CROSSAUDIT_SANDBOX"] = "process"
    items = [i for i in readme_items() if is_local(i) and i.section != EVALS_SECTION]
    ran = run_items(items, work, env, client=None)
    assert any(c.startswith("crossaudit policy validate") for c in ran), ran
    assert any(c.startswith("crossaudit config show") for c in ran), ran
    assert len(ran) >= 10, ran
