"""One default environment (issue 19): ``serve --dev`` deploys policies/*.yaml where
``crossaudit evaluate NAME --server`` and the Client look by default, and a policy missing from
an environment names the environments where it is deployed — the caller's tenant's only."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from crossaudit import Client
from crossaudit.api.limits import DEFAULT_ENVIRONMENT
from crossaudit.kernel.errors import NotFoundError
from tests.e2e.conftest import ServerProcess, key, run_cli
from tests.e2e.policies import KEYWORDS

pytestmark = pytest.mark.e2e

STAGED = KEYWORDS.replace("name: keywords", "name: staged")


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """``serve --dev`` as ``make serve`` runs it (ephemeral ports), with one policy file."""
    srv = ServerProcess(tmp_path_factory.mktemp("dev"), dev=True)
    (srv.policies_dir / "keywords.yaml").write_text(KEYWORDS)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def test_serve_dev_then_evaluate_server_finds_the_policy(dev: ServerProcess) -> None:
    assert DEFAULT_ENVIRONMENT == "production"
    res = run_cli("evaluate", "keywords", "--server", "--response", "fine", server=dev)
    assert res.returncode == 0 and "PASSED" in res.stdout and "(production)" in res.stdout, res.stderr
    with Client(dev.address) as c:
        assert c.evaluate("keywords", "p", "fine", timeout=30).environment == "production"
        assert [d.environment for d in c.get_policy("keywords").deployments] == ["production"]


def test_not_deployed_names_the_environments_of_the_callers_tenant_only(server: ServerProcess) -> None:
    with Client(server.address, api_key=key("acme")) as acme:
        acme.deploy_policy(STAGED, environment="staging")
        acme.deploy_policy(STAGED, environment="canary")
    expected = (
        "policy 'staged' is not deployed to 'production'; it is deployed to: canary, staging "
        "(pass --environment canary, or environment='canary' to the Client)"
    )
    res = run_cli("evaluate", "staged", "--server", "--response", "fine", server=server, api_key=key("acme"))
    assert res.returncode == 1 and res.stderr == f"error: {expected}\n" and res.stdout == ""
    with Client(server.address, api_key=key("acme")) as acme:
        for call in (lambda: acme.get_policy("staged"), lambda: acme.rollback("staged")):
            with pytest.raises(NotFoundError) as e:
                call()
            assert e.value.message == expected
        with pytest.raises(NotFoundError, match="deployed to: canary, staging"):
            acme.evaluate("staged", "p", "r", environment="qa")
        with pytest.raises(NotFoundError, match="no earlier deployment"):  # deployed there: its own error
            acme.rollback("staged", environment="staging")
    # globex sees its own deployments only: acme's are never named, and a policy globex does not
    # have reads exactly like one that exists nowhere
    res = run_cli("evaluate", "staged", "--server", "--response", "fine", server=server, api_key=key("globex"))
    none = run_cli("evaluate", "nowhere", "--server", "--response", "fine", server=server, api_key=key("globex"))
    assert res.returncode == 1 and "staging" not in res.stderr and "canary" not in res.stderr
    assert res.stderr == none.stderr.replace("nowhere", "staged")
    with Client(server.address, api_key=key("globex")) as globex:
        globex.deploy_policy(STAGED, environment="qa")
        with pytest.raises(NotFoundError) as e:
            globex.evaluate("staged", "p", "r")
    assert "deployed to: qa (" in e.value.message and "staging" not in e.value.message
