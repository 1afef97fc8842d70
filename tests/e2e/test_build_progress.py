"""Issue 19: ``crossaudit evaluator upload`` from a pipe was silent while the image built (a
progress bar draws only on a terminal), and deploy had no progress at all. Through a real server:
piped, the CLI prints one line per build step on stderr; ``Client`` and ``AsyncClient``
``deploy_policy(progress=...)`` hear the preparation of the policy's custom evaluators."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from crossaudit import AsyncClient, Client
from crossaudit.kernel.errors import PolicyValidationError
from tests.e2e.conftest import ServerProcess, key, run_cli

pytestmark = pytest.mark.e2e

SCORER = "def evaluate(prompt, response, context):\n    return {'score': 1.0}\n"
STEP = re.compile(r"^\[ *\d+\.\ds +\d+%\] \S")  # "[   0.3s  92%] starting warm sandbox"

POLICY = """\
name: progress-{n}
description: a custom evaluator the server prepares before it answers
version: "1.0"
evaluators:
  - name: scorer
    type: custom
    config:
      code: |
        def evaluate(prompt, response, context):
            return {{"score": {n} / 10}}
rules:
  - {{name: scored, evaluator: scorer, threshold: 0.5}}
"""


def cli(server: ServerProcess, *args: str):
    return run_cli(*args, server=server, timeout=300)


def test_a_piped_upload_prints_one_line_per_step(server: ServerProcess, tmp_path: Path) -> None:
    code = tmp_path / "scorer.py"
    code.write_text(SCORER)
    res = cli(server, "evaluator", "upload", str(code), "--name", "piped-scorer")
    assert res.returncode == 0, res.stderr
    steps = res.stderr.splitlines()
    assert steps and all(STEP.match(line) for line in steps), res.stderr
    assert steps[-1].endswith("100%] ready")  # the last step reaches the pipe too
    assert len(steps) == len(set(line.split("] ", 1)[1] for line in steps))  # each step once
    assert "uploaded evaluator 'piped-scorer'" in res.stdout and "[" not in res.stdout.splitlines()[0]
    as_json = cli(server, "evaluator", "upload", str(code), "--name", "piped-scorer-2", "--json")
    assert json.loads(as_json.stdout)["name"] == "piped-scorer-2"  # stdout stays the answer
    assert as_json.stderr and all(STEP.match(line) for line in as_json.stderr.splitlines())


def test_a_piped_deploy_prints_each_evaluators_steps(server: ServerProcess, tmp_path: Path) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text(POLICY.format(n=1))
    res = cli(server, "policy", "deploy", str(policy))
    assert res.returncode == 0, res.stderr
    steps = res.stderr.splitlines()
    assert steps and all(STEP.match(line) for line in steps), res.stderr
    assert all("] scorer: " in line for line in steps) and steps[-1].endswith("100%] scorer: ready")
    assert res.stdout.startswith("deployed 'progress-1' v1")


def test_the_sdk_deploys_with_a_progress_callback(server: ServerProcess, tmp_path: Path) -> None:
    heard: list[tuple[str, float]] = []
    with Client(server.address, api_key=key("globex")) as c:
        r = c.deploy_policy(POLICY.format(n=2), progress=lambda m, f: heard.append((m, f)))
        assert r.version.name == "progress-2" and r.created
        assert heard and heard[-1] == ("scorer: ready", 1.0)
        assert all(0.0 <= f <= 1.0 and m.startswith("scorer: ") for m, f in heard)
        assert c.evaluate("progress-2", "p", "r", timeout=30).passed is False  # 0.2 < 0.5: deployed and ready
        # an invalid policy is the same typed error, located in the author's file
        bad = tmp_path / "bad.yaml"
        bad.write_text("name: x\ndescription: d\nversion: '1'\nrules:\n  - {name: r, evaluator: nope}\n")
        with pytest.raises(PolicyValidationError) as info:
            c.deploy_policy(bad, progress=lambda m, f: None)
        assert any(i.file == str(bad) and i.line == 5 for i in info.value.issues)

    async def deploy_async() -> list[tuple[str, float]]:
        events: list[tuple[str, float]] = []
        async with AsyncClient(server.address, api_key=key("globex")) as ac:
            r = await ac.deploy_policy(POLICY.format(n=3), progress=lambda m, f: events.append((m, f)))
            assert r.version.name == "progress-3"
        return events

    events = asyncio.run(deploy_async())
    assert events and events[-1] == ("scorer: ready", 1.0)
