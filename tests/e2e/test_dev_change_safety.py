"""The README's change-safety section, run as written after ``make serve``.

The server is started with the flags the README says ``make serve`` passes (its comment
``# = crossaudit serve --dev ...``; the port is ours, the data directory the test's), deploys
``policies/*.yaml`` on its first start as ``make serve`` does, and is reached with no API key.
Before ``--retain-inputs`` the section did not run there: the dev tenant retained nothing, so the
replay gate read 4 records, replayed none and exited 0, and ``audit erase`` had no operator key.
The operator key the server made is checked too: 0600 in the data directory, in no log line,
nowhere in the working directory."""

from __future__ import annotations

import re
import shlex
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from crossaudit import Client
from tests.e2e.conftest import ROOT, ServerProcess
from tests.e2e.readme import README, Item, readme_items, run_bash, workdir

pytestmark = pytest.mark.e2e

SECTION = "### Change a policy safely: diff, replay, shadow, canary"
OURS = {"--host": "the test's loopback address", "--port": "an ephemeral port (50051 is not ours to take)"}
DEMO = "Offline Demo"


def make_serve_flags() -> list[str]:
    """What the README says ``make serve`` runs, less --dev (ServerProcess passes it) and OURS."""
    found = re.search(r"^make serve\s+# = crossaudit serve (.+)$", README, flags=re.M)
    assert found, "the README no longer says what `make serve` runs"
    words = shlex.split(found.group(1))
    assert "--dev" in words, words
    flags: list[str] = []
    it = iter(w for w in words if w != "--dev")
    for word in it:
        if word in OURS:
            next(it)
            continue
        flags.append(word)
    return flags


def section_items() -> list[Item]:
    start = README.count("\n", 0, README.index(f"\n{SECTION}\n")) + 2
    following = re.search(r"^#{2,3} ", README[README.index(f"\n{SECTION}\n") + len(SECTION) + 2 :], flags=re.M)
    end = start + (README.count("\n", 0, following.start()) if following else len(README))
    return [i for i in readme_items() if i.lang == "bash" and start <= i.line <= end]


@pytest.fixture(scope="module")
def make_serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path_factory.mktemp("make-serve"), dev=True, extra=tuple(make_serve_flags()))
    shutil.copytree(ROOT / "policies", srv.policies_dir, dirs_exist_ok=True)  # make serve's policies/*.yaml
    with srv:
        with Client(srv.address) as client:
            # The first start deploys them; on a loaded machine that deploy's sandbox may time out
            # (the log says so, the server serves on): then deploy the demo as that start would have.
            if DEMO not in [p.name for p in client.list_policies()]:
                client.deploy_policy(ROOT / "policies" / "demo_offline.yaml")
        yield srv


@pytest.mark.timeout(900)
def test_the_change_safety_section_runs_as_written_after_make_serve(make_serve: ServerProcess, tmp_path: Path) -> None:
    items = section_items()
    commands = [i.command for i in items]
    assert any("--fail-on-flips 0" in c for c in commands)
    assert any(c.startswith("crossaudit audit erase") for c in commands)
    work, env = workdir(tmp_path)
    env["CROSSAUDIT_SERVER"] = make_serve.address  # and no CROSSAUDIT_API_KEY: --dev takes none
    env["CROSSAUDIT_SANDBOX"] = "process"
    with Client(make_serve.address) as client:
        for item in items:
            run_bash(item, work, env, client)  # its exit status as the README says, and what it SHOWS
    key = make_serve.data_dir / "data" / "retention-operator.key"
    assert key.is_file() and key.stat().st_mode & 0o777 == 0o600
    log = make_serve.log.read_text()
    assert "tenants retaining inputs: default" in log and key.read_text().strip() not in log
    assert not [p for p in work.rglob("*") if p.name.endswith(".key")], "a key in the working directory"
