"""check_code: parse-only validation of uploaded evaluator code."""

from __future__ import annotations

import pytest

from crossaudit.kernel.codecheck import check_code
from crossaudit.kernel.errors import EvaluatorCodeError
from crossaudit.kernel.limits import SandboxLimits

GOOD = [
    "def evaluate(prompt, response, context):\n    return {'score': 1.0}\n",
    "def evaluate(prompt, response, context=None):\n    return {}\n",
    "def evaluate(prompt, response, context, extra=1, *, flag=False):\n    return {}\n",
    "def evaluate(*args):\n    return {}\n",
    "def evaluate(prompt, /, response, context):\n    return {}\n",
    "import re\nfrom typing import Dict, Any\n\n"
    "def evaluate(prompt: str, response: str, context: Dict[str, Any]) -> Dict[str, Any]:\n    return {}\n",
]

BAD = [
    "",
    "x = 1\n",
    "def evaluate(prompt, response):\n    return {}\n",
    "def evaluate(a, b, c, d):\n    return {}\n",
    "def evaluate(prompt, response, context, *, must):\n    return {}\n",
    "async def evaluate(prompt, response, context):\n    return {}\n",
    "class X:\n    def evaluate(self, prompt, response, context):\n        return {}\n",
    "def evaluate(prompt, response, context)\n    return {}\n",
    "def other(prompt, response, context):\n    return {}\n",
    "if True:\n    def evaluate(p, r, c):\n        return {}\n",
    "def evaluate(p, r, c):\n    return {}\nx = \x00\n",
    "x = " + "(" * 500 + ")" * 500 + "\ndef evaluate(p, r, c):\n    pass\n",
]


@pytest.mark.parametrize("code", GOOD)
def test_accepts(code: str) -> None:
    check_code(code)


@pytest.mark.parametrize("code", BAD)
def test_rejects(code: str) -> None:
    with pytest.raises(EvaluatorCodeError):
        check_code(code)


def test_last_definition_wins() -> None:
    with pytest.raises(EvaluatorCodeError):
        check_code("def evaluate(p, r, c):\n    pass\ndef evaluate(p):\n    pass\n")


def test_size_cap() -> None:
    code = "def evaluate(p, r, c):\n    return {}\n" + "#" * 2000 + "\n"
    check_code(code, limits=SandboxLimits(code_bytes=4000))
    with pytest.raises(EvaluatorCodeError, match="limit"):
        check_code(code, limits=SandboxLimits(code_bytes=1000))


def test_not_text() -> None:
    with pytest.raises(EvaluatorCodeError):
        check_code(b"def evaluate(p, r, c): pass")  # type: ignore[arg-type]


def test_custom_entrypoint() -> None:
    check_code("def run(p, r, c):\n    return {}\n", entrypoint="run")
    with pytest.raises(EvaluatorCodeError):
        check_code("def run(p, r, c):\n    return {}\n")


def test_syntax_error_message_locates() -> None:
    with pytest.raises(EvaluatorCodeError, match="line 2"):
        check_code("def evaluate(p, r, c):\n    return {\n")
