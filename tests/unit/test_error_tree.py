"""Every error class is declared once, drawn once, and decodes to itself anywhere.

A server raises errors from the store, the sandbox, the model servers; its clients import only
the codec. So every CrossAuditError subclass must be declared in ``crossaudit.kernel.errors``
(the codec's whole vocabulary), appear in the tree its docstring draws, and come back as its own
class in a fresh interpreter that imported nothing but ``crossaudit.kernel.errcodec``.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
from typing import Any

from crossaudit.kernel import errcodec
from crossaudit.kernel import errors as E
from crossaudit.kernel.errors import CrossAuditError, ErrorCode
from tests.errorcases import all_error_classes, example

# A line of the drawn tree: the branch drawing, the class name, then its columns.
TREE_LINE = re.compile(r"^(?P<branch>[ │├└─]*?)(?P<name>[A-Z]\w*Error)\b(?P<rest>.*)$")
CODES = {c.value for c in ErrorCode}


def drawn_tree() -> dict[str, tuple[str | None, str]]:
    """Each class the docstring draws -> (its drawn parent, its drawn columns)."""
    doc = E.__doc__ or ""
    block = doc[doc.index("::") + 2 :]
    drawn: dict[str, tuple[str | None, str]] = {}
    parents: list[str] = []  # the open branch, one name per depth
    for line in block.splitlines():
        m = TREE_LINE.match(line)
        if m is None:
            continue
        depth = (len(m["branch"]) - 4) // 4  # four spaces of literal-block indent, four per level
        assert depth >= 0 and m["name"] not in drawn, line
        del parents[depth:]
        drawn[m["name"]] = (parents[-1] if parents else None, m["rest"])
        parents.append(m["name"])
    return drawn


def test_every_error_class_is_declared_in_the_errors_module() -> None:
    classes = all_error_classes()
    assert len(classes) > 30
    strays = [f"{c.__module__}.{c.__qualname__}" for c in classes if c.__module__ != E.__name__]
    assert not strays, f"declare these in crossaudit/kernel/errors.py (and re-export them): {strays}"
    assert {c.__name__ for c in classes} == set(E.error_classes())
    for cls in classes:
        assert E.error_class(cls.__name__) is cls


def test_the_drawn_tree_names_every_class_under_its_parent() -> None:
    drawn = drawn_tree()
    declared = E.error_classes()
    assert set(drawn) == set(declared), (set(declared) - set(drawn), set(drawn) - set(declared))
    for name, (parent, columns) in drawn.items():
        cls = declared[name]
        if parent is None:
            assert cls is CrossAuditError
        else:
            assert cls.__bases__ == (declared[parent],), f"{name} is drawn under {parent}"
        drawn_codes = [word for word in columns.split() if word in CODES]
        if drawn_codes:  # a class that draws its code has that code
            assert drawn_codes[0] == cls.code.value, name


# Runs in a fresh interpreter: the peer that never imported the modules that raise these errors.
CLIENT = r"""
import base64, json, sys

import grpc

from crossaudit.kernel import errcodec

loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("crossaudit", "orchestrator", "sandbox"))
assert loaded == ["crossaudit", "crossaudit.kernel", "crossaudit.kernel.errcodec", "crossaudit.kernel.errors"], loaded


def value(v):
    return base64.b64decode(v["b64"]) if isinstance(v, dict) else v


def seen(exc):
    return {"type": type(exc).__name__, "module": type(exc).__module__, "retryable": exc.retryable,
            "message": exc.message, "data": exc.wire_data()}


out = []
for case in json.load(sys.stdin):
    metadata = [(k, value(v)) for k, v in case["metadata"]]
    status = errcodec.decode(grpc.StatusCode[case["code"]], case["details"], metadata)
    item = errcodec.from_item(**case["item"])
    out.append({"status": seen(status), "item": seen(item)})
json.dump(out, sys.stdout)
"""


def _jsonable(v: Any) -> Any:
    return {"b64": base64.b64encode(v).decode()} if isinstance(v, bytes) else v


def test_a_client_that_imports_only_the_codec_decodes_every_class_to_itself() -> None:
    sent = [example(cls) for cls in all_error_classes()]
    cases = []
    for exc in sent:
        status = errcodec.encode(exc)
        cases.append(
            {
                "code": status.code.name,
                "details": status.details,
                "metadata": [(k, _jsonable(v)) for k, v in status.trailing_metadata],
                "item": errcodec.item_fields(exc),
            }
        )
    run = subprocess.run(
        [sys.executable, "-c", CLIENT], input=json.dumps(cases), capture_output=True, text=True, timeout=60, check=False
    )
    assert run.returncode == 0, run.stderr
    back = json.loads(run.stdout)
    assert len(back) == len(sent)
    for exc, got in zip(sent, back, strict=True):
        wire = errcodec.document(exc)  # what was sent: PolicyValidationError's issues as fitted
        for edge in ("status", "item"):
            seen = got[edge]
            assert (seen["type"], seen["module"]) == (type(exc).__name__, E.__name__), (edge, seen)
            assert seen["retryable"] is exc.retryable, (edge, seen)
            assert seen["data"] == wire["data"], (edge, seen)
            if not isinstance(exc, E.PolicyValidationError):  # its message is rebuilt from the issues
                assert seen["message"] == exc.message, (edge, seen)
