"""Running the README's commands as written: what the README-commands tests share.

Every command of the README's ```bash blocks and every ```python snippet runs as written, in
the README's order: the sections that need no server in ``test_readme_local_commands.py`` (the
evals' in ``test_readme_eval_commands.py``), the rest against a real server in
``test_readme_commands.py``: three files, so the workers share them.

How "as written" is kept:

* Each bash line runs through ``bash -c`` exactly as the README prints it (comments, quotes,
  globs, redirections, ``eval "$(…)"``), in a temporary directory holding a copy of the
  repository's ``policies/`` and ``deploy/`` and a ``.venv/bin/crossaudit`` that runs this
  interpreter's CLI (also first on ``PATH``, for the bare ``crossaudit``).
* The commands' environment is what the README tells a user to set: ``CROSSAUDIT_SERVER`` and
  ``CROSSAUDIT_API_KEY`` name the test server (started on an ephemeral port; the README's
  default 127.0.0.1:50051 is not ours to take), and ``CROSSAUDIT_SANDBOX=process`` so local
  commands need no Docker daemon.
* The only substitutions are the placeholders the README documents: ``REVIEW_ID`` and
  ``DECISION_ID`` (``PLACEHOLDERS``), replaced by real ids the earlier commands produced.
* A command is expected to exit 0, unless its comment says ``exit N:``.
* What is not run is listed below, one named set per reason, each entry the exact command (or
  a line that identifies the snippet); an entry the README no longer contains fails the test,
  and so does a command that is neither run nor listed.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.e2e.conftest import ROOT, TENANT_KEYS

README = (ROOT / "README.md").read_text()
COMMAND_TIMEOUT_S = 300
TENANT = "acme"

# --- what is not run, and why -------------------------------------------------------------------

# Commands that start a server (or the proxy) and serve until stopped: this test starts its own
# server (tests/e2e/conftest.py ServerProcess); `serve` itself is covered by test_e2e_serve.py.
LONG_RUNNING = {
    "make serve": "creates .venv, then serves until stopped",
    "crossaudit serve --api-keys keys.yaml --sandbox docker --metrics-port 9464"
    " --data-dir /var/lib/crossaudit": "serves until stopped; needs Docker and a system directory",
    "crossaudit serve --api-keys keys.yaml --console-port 8081": "serves the review console until stopped",
    "crossaudit serve --api-keys keys.yaml --workers auto": "serves until stopped (test_workers.py runs workers)",
    "crossaudit serve --dev &": "a background server on the fixed port 50051",
}  # fmt: skip
# Needs an OpenAI-compatible model upstream (tests/e2e/test_proxy.py runs the proxy against a stub).
NEEDS_A_MODEL = {
    'crossaudit proxy --dev --upstream http://127.0.0.1:11434/v1 --policy'
    ' "Offline Demo"': "the guard proxy serves until stopped, in front of a model on port 11434",
}
# Runs every test suite (this one included) and builds the Docker images and models.
RUNS_THE_TEST_SUITES = {"make test": "the whole CI run, recursively"}
# Python snippets not run, by a line that identifies each.
PYTHON_NOT_RUN = {
    "from openai import OpenAI": "talks to the guard proxy and a model upstream (tests/e2e/test_proxy.py)",
}
SKIPPED_COMMANDS = {**LONG_RUNNING, **NEEDS_A_MODEL, **RUNS_THE_TEST_SUITES}

# What some commands must write into the work directory (command prefix -> file, text it holds).
WRITES = {
    "crossaudit policy schema > policy.schema.json": ("policy.schema.json", '"$schema"'),
}
# Placeholders the README documents ("REVIEW_ID and DECISION_ID stand for ids the list commands
# print"), and where the real value comes from.
PLACEHOLDERS: dict[str, Callable[[object], str]] = {
    "REVIEW_ID": lambda client: _only(client.list_reviews(state="open")).id,  # type: ignore[attr-defined]
    "DECISION_ID": lambda client: client.list_decisions(limit=1)[0].decision_id,  # type: ignore[attr-defined]
}
# What some commands must show, beyond exiting as the README says (command prefix -> text).
SHOWS = {
    "crossaudit policy list": "production",
    "crossaudit policy rollback": "'Offline Demo' in production: v1 -> v1",
    "crossaudit evaluator list": "textblob>=0.18",
    "crossaudit review resolve": "approved",
    "crossaudit audit get": '"decision_id"',
    "crossaudit --version": "crossaudit ",
    "crossaudit policy test policies/demo_offline.yaml --input": "thanks_pass",
    "crossaudit eval policies/demo_offline.yaml policies/demo_offline.eval.jsonl --target": "no_profanity",
    "crossaudit eval policies/demo_offline.yaml policies/demo_offline.eval.jsonl --fail-under": "test_cases:",
    "crossaudit eval --compare": "McNemar",
    'crossaudit policy diff "Offline Demo" v2.yaml': "rule 'redact_emails': threshold 0.5 -> 0.0",
    'crossaudit policy replay v2.yaml --against "Offline Demo" --since 7d': "modify->allow",
    'crossaudit policy deploy v2.yaml --shadow': "shadow",
    'crossaudit policy promote "Offline Demo"': "Offline Demo",
    "crossaudit audit erase --context-field user_id=u-123": "1 decision",
}


@dataclass(frozen=True)
class Item:
    lang: str  # bash | python
    text: str  # one bash line, or one python snippet
    line: int  # in README.md
    section: str = ""  # the ## or ### heading it stands under ("" before the first)

    @property
    def command(self) -> str:
        """The bash line without its trailing comment (the key of the skip sets)."""
        return re.sub(r"\s+#\s.*$", "", self.text).strip()

    @property
    def expected_exit(self) -> int:
        found = re.search(r"#.*\bexit (\d+):", self.text)
        return int(found.group(1)) if found else 0


def _section_at(offset: int) -> str:
    headings = re.findall(r"^#{2,3} .+$", _outside_code(README[:offset]), flags=re.M)
    return headings[-1] if headings else ""


def _outside_code(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def readme_items() -> list[Item]:
    items: list[Item] = []
    for m in re.finditer(r"^```(bash|python)\n(.*?)^```", README, flags=re.S | re.M):
        start = README.count("\n", 0, m.start()) + 2
        section = _section_at(m.start())
        if m.group(1) == "python":
            items.append(Item("python", m.group(2), start, section))
            continue
        for offset, line in enumerate(m.group(2).splitlines()):
            if line.strip() and not line.lstrip().startswith("#"):
                items.append(Item("bash", line, start + offset, section))
    return items


# The sections whose commands need no server (local policy commands, evals, configuration): run
# on their own, with no CROSSAUDIT_SERVER, so a command that quietly needed one fails there.
LOCAL_SECTIONS = frozenset({
    "",
    "### Validate and test policies (no server, no Docker)",
    "### Version and shell completion",
    "### Measure a policy: labelled evals",
    "### Configure it",
    "### Custom evaluators",
})


# The evals section is most of the local commands' time: a file of its own, so another worker runs it.
EVALS_SECTION = "### Measure a policy: labelled evals"


def is_local(item: Item) -> bool:
    return item.section in LOCAL_SECTIONS


def _only(reviews: list) -> object:
    assert len(reviews) == 1, f"expected one open review, found {len(reviews)}"
    return reviews[0]


# --- the run --------------------------------------------------------------------------------------


# The README's change-safety commands replay retained decisions: the server keeps the inputs of
# the README's tenant, as the README tells an operator to set it up (docs/retention.md).
OPERATOR_KEY_ENV = "README_OPERATOR_KEY"


def readme_keys() -> str:
    lines = ["tenants:"]
    for tenant, k in TENANT_KEYS.items():
        lines.append(f"  {tenant}:\n    keys: [{k}]" + ("\n    retention: {inputs: 7d}" if tenant == TENANT else ""))
    return "\n".join(lines) + "\n"


def workdir(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A copy of what the README's commands read, a ``.venv/bin/crossaudit``, and the environment."""
    work = tmp_path / "repo"
    work.mkdir()
    for name in ("policies", "deploy"):
        shutil.copytree(ROOT / name, work / name)
    bin_dir = work / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    shim = bin_dir / "crossaudit"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m crossaudit.cli "$@"\n')
    shim.chmod(0o755)
    (bin_dir / "activate").write_text(f'export PATH="{bin_dir}:$PATH"\n')  # what `source .venv/bin/activate` does
    env = {k: v for k, v in os.environ.items() if not k.startswith("CROSSAUDIT_")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return work, env


def run_bash(item: Item, work: Path, env: dict[str, str], client: object) -> None:
    text = item.text
    for placeholder, real in PLACEHOLDERS.items():
        if re.search(rf"\b{placeholder}\b", item.command):
            text = re.sub(rf"\b{placeholder}\b", real(client), text)
    proc = subprocess.run(
        ["bash", "-c", text], cwd=work, env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
    )
    shown = f"README.md:{item.line}: {item.text}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
    assert proc.returncode == item.expected_exit, shown
    assert "Traceback" not in proc.stdout + proc.stderr, shown
    for prefix, text_shown in SHOWS.items():
        if item.command.startswith(prefix):
            assert text_shown in proc.stdout, shown
    for prefix, (written, text_held) in WRITES.items():
        if item.command.startswith(prefix):
            assert text_held in (work / written).read_text(), shown


def run_python(item: Item, work: Path, env: dict[str, str]) -> dict[str, object]:
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    cwd = Path.cwd()
    os.chdir(work)
    scope: dict[str, object] = {"__name__": "readme"}
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(item.text, f"README.md:{item.line}", "exec"), scope)
    finally:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(saved)
    return scope




def run_items(items: list[Item], work: Path, env: dict[str, str], client: object,
              check_python: Callable[[Item, dict[str, object]], None] | None = None) -> list[str]:
    """Run ``items`` in order (skipping the listed ones); returns what ran."""
    ran: list[str] = []
    for item in items:
        if item.lang == "bash":
            if item.command in SKIPPED_COMMANDS:
                continue
            run_bash(item, work, env, client)
            ran.append(item.command)
            continue
        if any(marker in item.text for marker in PYTHON_NOT_RUN):
            continue
        scope = run_python(item, work, env)
        ran.append(f"python snippet at README.md:{item.line}")
        if check_python is not None:
            check_python(item, scope)
    return ran
