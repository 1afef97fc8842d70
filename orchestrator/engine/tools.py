"""A tool call's arguments at the ``tool_call`` stage (docs/agents.md): read, bounded, as the JSON
text the model sent, and redacted inside their values so that a redacted call is still valid JSON.

The evaluated text of a tool call is its arguments as sent, each string written plainly
(:func:`plain_arguments`: an escape a string does not need, such as ``\u0040`` for ``@``, is
written as the character it spells, so an evaluator reads what the tool will read; evaluators
locate findings in that text); :func:`parse_arguments` reads it for the context
(``tool.arguments``), refusing what a tool could read differently from the guard: text that is not
JSON, ``NaN``/``Infinity``, a number out of a double's range, a lone surrogate (``\ud800``), a key
given twice in one object, nesting deeper than ``engine_limits.max_tool_arguments_depth``.
:func:`redact_arguments` applies a ``modify`` rule's redactions to the JSON text, each within the
string, number or literal it falls in: a string keeps being a string (its findings replaced), a
number, ``true``/``false``/``null`` touched by a finding becomes the replacement as a string, and
an object's key touched by one is redacted too (made unique within its object, so the result
never holds a key twice). Whitespace and punctuation between tokens are never changed.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from typing import Any

from crossaudit.kernel.errors import InvalidInputError
from crossaudit.kernel.limits import EngineLimits
from crossaudit.kernel.names import name_problem
from crossaudit.kernel.results import Span

# A string literal (JSON's: no raw control characters are checked here, json.loads did that),
# possessive: no backtracking, so a string that never ends costs one pass, not one per quote.
_LITERAL = r'"[^"\\]*+(?:\\.[^"\\]*+)*+"'
_TOKEN = re.compile(_LITERAL + r"|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null", re.S)
_COLON = re.compile(r"\s*:")
_STRING = re.compile(_LITERAL, re.S)
_UNTIL_CLOSED = re.compile(_LITERAL + "?", re.S)  # text not yet parsed: a string left open runs to the end
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_SHOWN = 80  # characters of a JSON error's message shown


def nesting_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in ``text`` (strings' brackets not counted),
    without parsing: checked before the parser, whose recursion a deep text could exhaust."""
    brackets = re.sub(r"[^\[\]{}]", "", _UNTIL_CLOSED.sub("", text))
    depth = deepest = 0
    for ch in brackets:
        if ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):  # 1e999: Python reads inf, other parsers an error or a clamp
        raise ValueError(f"the number {literal[:32]} is out of range")
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"the key {key[:64]!r} is given twice in one object")
        out[key] = value
    return out


def parse_arguments(text: str, max_depth: int) -> Any:
    """A tool call's arguments as the context's ``tool.arguments``; InvalidInputError (naming the
    problem and the limit) for text a tool could read otherwise than the guard."""
    depth = nesting_depth(text)
    if depth > max_depth:
        raise InvalidInputError(
            f"the tool call's arguments are nested {depth} deep, over the {max_depth} levels a tool call may have "
            "(engine_limits.max_tool_arguments_depth)"
        )
    try:
        return json.loads(text, parse_constant=_no_constant, parse_float=_finite, object_pairs_hook=_unique_keys)
    except (ValueError, RecursionError) as e:
        raise InvalidInputError(
            f"the tool call's arguments are not valid JSON (the text as the model sent it): {str(e)[:_SHOWN]}"
        ) from None


def plain_arguments(text: str) -> str:
    """``text`` (valid JSON, as :func:`parse_arguments` accepted) with each string that has an
    escape written plainly (only ``"``, ``\\`` and control characters stay escaped): the text the
    evaluators judge, so that ``"jane\\u0040example.com"`` is read as the tool reads it.
    InvalidInputError for a lone surrogate, which no UTF-8 text (and no two parsers alike) holds.
    Everything outside such strings is kept byte for byte."""
    out: list[str] = []
    last = 0
    for m in _STRING.finditer(text):
        token = m.group()
        if "\\" not in token:
            continue
        value = json.loads(token)
        try:
            value.encode()
        except UnicodeEncodeError:
            raise InvalidInputError(
                "the tool call's arguments are not valid JSON (the text as the model sent it): "
                "a string holds a lone surrogate (an unpaired \\ud800-\\udfff escape)"
            ) from None
        plain = json.dumps(value, ensure_ascii=False)
        if plain != token:
            out.append(text[last : m.start()])
            out.append(plain)
            last = m.end()
    if not out:
        return text
    out.append(text[last:])
    return "".join(out)


def _decoded(raw: str) -> tuple[str, list[int], list[int]]:
    """A string literal's content (between its quotes) decoded, and for each raw position the
    decoded offset where its character starts and where it ends (an escape is one character)."""
    out: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    i = 0
    while i < len(raw):
        ch, size = raw[i], 1
        if ch == "\\":
            kind = raw[i + 1]
            if kind == "u":
                code, size = int(raw[i + 2 : i + 6], 16), 6
                if 0xD800 <= code < 0xDC00 and raw[i + 6 : i + 8] == "\\u":
                    low = int(raw[i + 8 : i + 12], 16)
                    if 0xDC00 <= low < 0xE000:
                        code, size = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00), 12
                ch = chr(code)
            else:
                ch, size = _ESCAPES[kind], 2
        at = len(out)
        out.append(ch)
        starts.extend([at] * size)
        ends.extend([at + 1] * size)
        i += size
    return "".join(out), starts, ends


def _encode(value: str) -> str:
    try:
        value.encode()
    except UnicodeEncodeError:  # a lone surrogate (an escape the model wrote): kept escaped
        return json.dumps(value)
    return json.dumps(value, ensure_ascii=False)


def _redact_string(raw: str, s: int, cuts: list[tuple[int, int, str]]) -> str:
    """The literal at ``s`` (quotes included) with ``cuts`` (raw positions) applied inside it."""
    value, starts, ends = _decoded(raw[1:-1])
    inner = [(max(a, s + 1) - s - 1, min(b, s + len(raw) - 1) - s - 1, text) for a, b, text in cuts]
    pieces: list[str] = []  # joined once: linear in the string, however many cuts it has
    kept = 0  # the decoded offset up to which value is written
    for a, b, text in sorted(inner):
        if a >= b:
            continue
        pieces.append(value[kept : starts[a]])
        pieces.append(text)
        kept = max(kept, ends[b - 1])
    pieces.append(value[kept:])
    return _encode("".join(pieces))


def redact_arguments(text: str, spans: Iterable[tuple[Span, str]]) -> str:
    """``text`` (valid JSON, as :func:`parse_arguments` accepted) with each span replaced by its
    replacement (``{label}`` filled in) inside the value or key it falls in: valid JSON again."""
    cuts: list[tuple[int, int, str]] = []  # merged: overlapping findings are one cut (the first's text)
    for sp, rep in sorted(spans, key=lambda x: (x[0].start, -x[0].end)):
        if sp.start >= sp.end:
            continue
        if cuts and sp.start < cuts[-1][1]:
            cuts[-1] = (cuts[-1][0], max(cuts[-1][1], sp.end), cuts[-1][2])
        else:
            cuts.append((sp.start, sp.end, rep.replace("{label}", sp.label)))
    if not cuts:
        return text
    first = 0  # the first cut that may still touch a token
    out: list[str] = []
    last = 0
    keys: list[_Keys] = []  # the keys written so far in each open object
    pos = 0
    for m in _TOKEN.finditer(text):
        s, e = m.span()
        # brackets between tokens: track the objects open, for unique redacted keys
        for ch in _STRING.sub("", text[pos:s]):
            if ch == "{":
                keys.append(_Keys())
            elif ch == "}" and keys:
                keys.pop()
        pos = e
        while first < len(cuts) and cuts[first][1] <= s:
            first += 1
        touching = []
        i = first  # indexed, not sliced: a slice of the cuts left would copy them at every token
        while i < len(cuts) and cuts[i][0] < e:
            touching.append(cuts[i])
            i += 1
        token = m.group()
        is_key = token.startswith('"') and _COLON.match(text, e) is not None
        if touching:
            # a number or literal with a finding in it becomes the replacement, as a string
            token = _redact_string(token, s, touching) if token.startswith('"') else _encode(touching[0][2])
        if is_key and keys:
            token = _unique(token, keys[-1])
        if token != m.group():
            out.append(text[last:s])
            out.append(token)
            last = e
    out.append(text[last:])
    return "".join(out)


class _Keys:
    """The keys written so far in one open object, and for each key that collided the number its
    next copy tries: the numbering resumes where it stopped, so many keys redacted alike are made
    unique in linear time (not by trying 2, 3, ... again for each)."""

    __slots__ = ("next", "seen")

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.next: dict[str, int] = {}


def _unique(token: str, keys: _Keys) -> str:
    """A key (as JSON) not yet in its object: a redacted key that collides gets a number."""
    key = json.loads(token)
    candidate, n = key, keys.next.get(key, 1)
    while candidate in keys.seen:
        n += 1
        candidate = f"{key} ({n})"
    if n > 1:
        keys.next[key] = n
    keys.seen.add(candidate)
    return token if candidate == key else _encode(candidate)


def tool_context(stage: str, context: Any, text: str, limits: EngineLimits) -> tuple[dict[str, Any], str]:
    """The context's ``tool`` at a tool stage: the caller's ``tool.name`` (required at
    ``tool_call``) and ``tool.call_id`` (optional), checked, and at ``tool_call`` the arguments
    parsed from ``text`` (the engine's own: a caller's ``tool.arguments`` is replaced, so a
    condition reads exactly what the evaluators judged); and the text the evaluators judge: at
    ``tool_call`` the arguments written plainly (:func:`plain_arguments`), else ``text``."""
    max_depth, max_name_chars = limits.max_tool_arguments_depth, limits.max_tool_name_chars
    given = context.get("tool") if isinstance(context, dict) else None
    if given is not None and not isinstance(given, dict):
        raise InvalidInputError(f"context tool must be an object (name, call_id) at the {stage} stage")
    given = given or {}
    tool: dict[str, Any] = {k: v for k, v in given.items() if k != "arguments"}
    for key in ("name", "call_id"):
        value = given.get(key)
        if value is None:
            tool.pop(key, None)
            continue
        if not isinstance(value, str) or len(value) > max_name_chars:
            raise InvalidInputError(
                f"context tool.{key} must be a string of at most {max_name_chars} characters "
                "(engine_limits.max_tool_name_chars)"
            )
        problem = name_problem(value)  # shown in decisions, receipts and the console: nothing that displays as another
        if problem is not None:
            raise InvalidInputError(f"context tool.{key} cannot be judged: {problem}")
    if stage == "tool_call":
        if not tool.get("name"):
            raise InvalidInputError("a tool call is evaluated with its tool's name: context tool.name")
        tool["arguments"] = parse_arguments(text, max_depth)
        text = plain_arguments(text)
    return tool, text
