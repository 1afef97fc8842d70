"""The console shows the text under review wherever the audit log keeps it, escaped and to its
own tenant only, and otherwise says how to keep it (issue 19: it showed digests, no hint)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from crossaudit import Client
from tests.e2e.conftest import ServerProcess, key
from tests.e2e.console_http import console_url, sign_in
from tests.e2e.policies import KEYWORDS

pytestmark = pytest.mark.e2e

# keeps the text under review in the audit log (the policy's own setting)
KEYWORDS_RAW = KEYWORDS.replace("name: keywords", "name: keywords-raw") + "settings:\n  audit_all_evaluations: true\n"
HOSTILE = "<script>alert('x')</script> worse"


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, str]]:
    """Two tenants (acme, globex), the console, the operator keeping hashes only (the default)."""
    with ServerProcess(tmp_path_factory.mktemp("console-text"), extra=("--console-port", "0")) as srv:
        yield srv, console_url(srv.start_line)


def test_the_console_says_how_to_keep_the_text_and_shows_kept_text_to_its_tenant_only(
    console: tuple[ServerProcess, str],
) -> None:
    srv, url = console
    with Client(srv.address, api_key=key("acme")) as acme:
        acme.deploy_policy(KEYWORDS)
        acme.deploy_policy(KEYWORDS_RAW)
        hashed = acme.evaluate("keywords", "a private prompt", "worse", timeout=30)
        kept = acme.evaluate("keywords-raw", "p", HOSTILE, timeout=30)
    h = sign_in(url, key("acme"))
    page = h.get(f"/decisions/{hashed.decision_id}").text
    assert "Not stored" in page and "a private prompt" not in page
    hint = re.search(r'<p class="message keep-text" id="keep-text">(.*?)</p>', page, re.S)
    assert hint, page
    assert "audit_all_evaluations: true" in hint.group(1) and "<strong>keywords</strong>" in hint.group(1)
    assert "--audit-raw-text" in hint.group(1)
    page = h.get(f"/decisions/{kept.decision_id}").text
    assert 'id="keep-text"' not in page and "Not stored" not in page
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; worse" in page and "<script" not in page
    # another tenant's admin: the decision does not exist, and its text appears nowhere
    other = sign_in(url, key("globex"))
    assert other.get(f"/decisions/{kept.decision_id}").status_code == 404
    assert "alert(" not in other.get("/audit").text + other.get("/queue").text
