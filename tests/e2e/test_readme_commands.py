"""The README's commands that need a server, run as written in the README's order against a real
one (the machinery, and what is not run and why: ``tests/e2e/readme.py``). Every command of the
README is checked to be run here, run by ``test_readme_local_commands.py``, or listed as not run."""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import ServerProcess, key
from tests.e2e.readme import (
    OPERATOR_KEY_ENV,
    PLACEHOLDERS,
    PYTHON_NOT_RUN,
    README,
    SKIPPED_COMMANDS,
    TENANT,
    Item,
    is_local,
    readme_items,
    readme_keys,
    run_items,
    workdir,
)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def readme_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with ServerProcess(  # API keys, process sandbox, retained inputs for the README's tenant
        tmp_path_factory.mktemp("readme-server"),
        keys_text=readme_keys(),
        env={OPERATOR_KEY_ENV: base64.b64encode(os.urandom(32)).decode()},
        extra=("--set", f"retention.operator_key_env={OPERATOR_KEY_ENV}"),
    ) as srv:
        yield srv


def test_every_readme_command_is_run_or_listed_as_not_run() -> None:
    items = readme_items()
    commands = {i.command for i in items if i.lang == "bash"}
    stale = sorted(set(SKIPPED_COMMANDS) - commands)
    assert not stale, f"skip entries the README no longer has: {stale}"
    snippets = [i.text for i in items if i.lang == "python"]
    for marker in PYTHON_NOT_RUN:
        assert any(marker in s for s in snippets), f"no README snippet contains {marker!r}"
    for placeholder in PLACEHOLDERS:
        assert re.search(rf"\b{placeholder}\b", README), f"README no longer uses {placeholder}"
    local, served = [i for i in items if is_local(i)], [i for i in items if not is_local(i)]
    assert len(local) >= 10 and len(served) >= 20 and len(local) + len(served) == len(items)


def _check_walkthrough(client: object):  # type: ignore[no-untyped-def]
    from crossaudit.api.models import ServerInfo

    def check(item: Item, scope: dict[str, object]) -> None:
        if "client.server_info()" not in item.text:
            return
        # the SDK walk-through: what it claims, checked
        info = scope["client"].server_info()  # type: ignore[attr-defined]
        assert isinstance(info, ServerInfo) and info.tenant == TENANT and info.version
        assert scope["decision"].action == "block" and not scope["decision"].passed  # type: ignore[attr-defined]
        hostile = scope["hostile"]
        [review_id] = hostile.review_ids  # type: ignore[attr-defined]
        assert client.list_reviews(state="approved")[0].id == review_id  # type: ignore[attr-defined]
        assert scope["ev"].name == "sentiment"  # type: ignore[attr-defined]
        scope["client"].close()  # type: ignore[attr-defined]

    return check


@pytest.mark.timeout(1200)
def test_the_readme_commands_that_need_a_server_run_as_written(readme_server: ServerProcess, tmp_path: Path) -> None:
    from crossaudit import Client

    work, env = workdir(tmp_path)
    env |= {"CROSSAUDIT_SERVER": readme_server.address, "CROSSAUDIT_API_KEY": key(TENANT)}
    env["CROSSAUDIT_SANDBOX"] = "process"
    with Client(readme_server.address, api_key=key(TENANT)) as client:
        ran = run_items([i for i in readme_items() if not is_local(i)], work, env, client, _check_walkthrough(client))

    # the walk-through reached the server: its deploys, decisions and reviews are there
    with Client(readme_server.address, api_key=key(TENANT)) as client:
        assert [p.name for p in client.list_policies(environment="production")] == ["Offline Demo"]
        assert len(client.list_decisions()) >= 3
        assert {r.state.value for r in client.list_reviews(state="any")} == {"approved"}
    assert any(c.startswith("crossaudit review resolve") for c in ran)
    assert len(ran) >= 20, ran
