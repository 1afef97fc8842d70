"""Static checks on evaluator source before it is stored or accepted in a policy.

Only parsing, never executing: the code must compile and define a top-level
``def evaluate(prompt, response, context)`` callable with three positional arguments.
This is the one entry-point check, authoritative: uploads and policy validation run it before code
is stored or deployed, and both sandbox backends' ``prepare`` before warming agents. The agent
(stdlib only, it cannot import this module, and this kernel imports nothing of the sandbox) keeps
no copy of these rules, so they cannot drift: it only refuses code with no top-level plain ``def``
of that name, and reports an entry point that is not callable when the module body runs
(``sandbox/agent/load.py``).
"""

from __future__ import annotations

import ast

from crossaudit.kernel.errors import EvaluatorCodeError
from crossaudit.kernel.limits import SandboxLimits


def check_code(code: str, *, entrypoint: str = "evaluate", limits: SandboxLimits | None = None) -> None:
    """Raise :class:`EvaluatorCodeError` unless ``code`` is a plausible evaluator module."""
    limits = limits or SandboxLimits()
    if not isinstance(code, str):
        raise EvaluatorCodeError("evaluator code must be text")
    size = len(code.encode("utf-8", "surrogatepass"))
    if size > limits.code_bytes:
        raise EvaluatorCodeError(f"evaluator code is {size} bytes, over the {limits.code_bytes}-byte limit")
    if "\x00" in code:
        raise EvaluatorCodeError("evaluator code contains a NUL byte")
    try:
        tree = ast.parse(code, filename="<evaluator>")
    except SyntaxError as exc:
        where = f"line {exc.lineno}" + (f", column {exc.offset}" if exc.offset else "") if exc.lineno else "?"
        raise EvaluatorCodeError(f"evaluator code does not compile ({where}): {exc.msg}") from None
    except (ValueError, RecursionError, MemoryError) as exc:  # absurd nesting, bad characters
        raise EvaluatorCodeError(f"evaluator code does not compile: {type(exc).__name__}") from None

    found: ast.FunctionDef | ast.AsyncFunctionDef | None = None
    for node in tree.body:  # the last top-level definition wins, as at run time
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == entrypoint:
            found = node
    if found is None:
        raise EvaluatorCodeError(f"evaluator code has no top-level 'def {entrypoint}(prompt, response, context)'")
    if isinstance(found, ast.AsyncFunctionDef):
        raise EvaluatorCodeError(f"'{entrypoint}' must be a plain 'def', not 'async def'")
    args = found.args
    positional = len(args.posonlyargs) + len(args.args)
    required = positional - len(args.defaults)
    if (positional < 3 and args.vararg is None) or required > 3:
        raise EvaluatorCodeError(
            f"'{entrypoint}' must accept exactly three positional arguments (prompt, response, context); "
            f"it takes {positional} ({required} required)"
        )
    if any(default is None for default in args.kw_defaults):
        raise EvaluatorCodeError(f"'{entrypoint}' has keyword-only parameters without defaults")
