"""Names that look like another: a tenant's policy or evaluator names spelt so that a person (a
reviewer in the console, an operator reading `policy list` or the audit log) takes one for
another. Two Unicode spellings of one name (precomposed "é" or "e" + a combining accent), a
right-to-left override that makes a name display reversed, a zero-width character, a trailing
line break: each made a second, distinct name. Attacked through a real server.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from crossaudit import Client
from crossaudit.kernel.errors import InvalidInputError, PolicyValidationError
from tests.e2e.conftest import ServerProcess, key
from tests.e2e.policies import trivial

pytestmark = [pytest.mark.security, pytest.mark.e2e]

NFC = "Caf\u00e9 guard"  # é precomposed
NFD = "Cafe\u0301 guard"  # e + COMBINING ACUTE ACCENT: looks the same
CODE = "def evaluate(prompt, response, context):\n    return {'score': 1.0}\n"


def policy(name: str, version: str = "1.0") -> str:
    quoted = name.encode("unicode_escape").decode("ascii").replace('"', '\\"')
    return trivial(f'"{quoted}"', version=version, rule="r", threshold=None)


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[Client]:
    with Client(server.address, api_key=key("acme")) as c:
        yield c


def test_two_spellings_of_one_name_are_one_policy(client: Client) -> None:
    first = client.deploy_policy(policy(NFC, "1.0"))
    second = client.deploy_policy(policy(NFD, "1.1"))
    names = [p.name for p in client.list_policies() if "guard" in p.name]
    assert names == [NFC], names  # stored once, in NFC: the second deploy is its version 2
    assert (first.version.version, second.version.version) == (1, 2)
    for spelling in (NFC, NFD):  # looked up by either spelling
        assert client.get_policy(spelling).version.name == NFC
        assert client.evaluate(spelling, "p", "r", timeout=30).passed


@pytest.mark.parametrize(
    ("name", "what"),
    [
        ("pay\u202eroll guard", "U+202E"),  # RIGHT-TO-LEFT OVERRIDE: displays as "payllor draug"
        ("\u2067admin\u2069", "U+2067"),  # RIGHT-TO-LEFT ISOLATE
        ("admin\u200b guard", "U+200B"),  # ZERO WIDTH SPACE
        ("admin\u200d", "U+200D"),  # ZERO WIDTH JOINER
        ("\ufeffadmin", "U+FEFF"),  # ZERO WIDTH NO-BREAK SPACE (BOM)
        ("admin\u061c", "U+061C"),  # ARABIC LETTER MARK
        ("admin\u00a0guard", "U+00A0"),  # NO-BREAK SPACE: "admin guard" to the eye
        ("admin guard ", "whitespace"),
    ],
)
def test_invisible_characters_in_a_policy_name_are_a_located_error(client: Client, name: str, what: str) -> None:
    with pytest.raises(PolicyValidationError) as info:
        client.deploy_policy(policy(name))
    [issue] = [i for i in info.value.issues if i.path == "name"]
    assert what in issue.message and issue.line == 1, info.value.issues
    with pytest.raises(InvalidInputError, match=re.escape(what)):  # nor can a lookup name one
        client.evaluate(name, "p", "r", timeout=30)


def test_an_evaluator_name_with_a_trailing_line_break_is_not_another_evaluator(client: Client) -> None:
    client.upload_evaluator("scorer", CODE)
    with pytest.raises(InvalidInputError, match="invalid evaluator name"):
        client.upload_evaluator("scorer\n", CODE)
    assert [e.name for e in client.list_evaluators()] == ["scorer"]
