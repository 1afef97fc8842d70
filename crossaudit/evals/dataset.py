"""The labelled dataset of ``crossaudit eval``: JSONL or CSV rows (``policies/dataset.schema.json``).

Each row holds the text to evaluate (``prompt``, ``response``, ``context``) and what the policy
*should* answer: at the decision level (``passed``, ``action``) and/or per rule (``rules``:
name -> ``pass``|``fail``). Production rows without retained text carry recorded ``scores``
instead. A row may name its ``stage``: a ``tool_call`` row is one tool call the model wants to
make (``tool: {name, arguments, call_id?}``, the arguments evaluated as the response, as
``Client.evaluate_tool_call`` sends them), a ``tool_result`` row a tool's output (``response``,
evaluated as prompt and response, ``tool: {name?, call_id?}``). Every problem of a file is
reported at once, each with its line (JSONL; CSV: the physical line its record starts on, the
header being line 1); a label for a rule the policy lacks is named. A value nested deeper than
:data:`MAX_NESTING` is a problem of its row, found while the file is read (a deeper one would
exhaust the interpreter's stack in the JSON decoder, the engine's copy of the context or the
client's Struct).
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crossaudit.kernel.errors import InvalidInputError
from crossaudit.kernel.results import Action

# Bounds of what a dataset file may hold: a file is read whole, so it is capped; the number of
# problems listed is capped too (the count of the rest is said).
MAX_DATASET_BYTES = 256 * 1024 * 1024
MAX_ROWS = 1_000_000
MAX_LISTED_PROBLEMS = 200
# Levels a row's values may nest (its context, labels, scores; the row object itself is not
# counted, a context object is level 1): the depth a server takes a request's context at
# (limits.max_struct_depth's default), so a row that loads can be evaluated locally and remotely.
MAX_NESTING = 32
SHOWN_VALUE_CHARS = 80  # a bad value quoted in a problem is cut to this many characters
RULE_COLUMN_PREFIX = "rule:"  # CSV: one column per rule, ``rule:<name>``
LABELS = {"pass": True, "fail": False}
ACTIONS = tuple(a.value for a in Action if a is not Action.CONTINUE)
FIELDS = ("id", "stage", "prompt", "response", "tool", "context", "passed", "action", "rules", "scores")
STAGES = ("input", "output", "tool_call", "tool_result")  # a row's stage; none: every rule runs
TOOL_STAGES = ("tool_call", "tool_result")
TOOL_FIELDS = {"tool_call": ("name", "arguments", "call_id"), "tool_result": ("name", "call_id")}


@dataclass(frozen=True)
class Row:
    line: int  # 1-based line (JSONL), or the line its record starts on (CSV, header = line 1)
    id: str  # the row's "id" field, else f"line-{line}"
    prompt: str | None  # None: text not available (a production row without retained inputs)
    response: str | None
    context: dict[str, Any]
    passed: bool | None  # expected decision-level outcome (None: not labelled)
    action: str | None  # expected decision action (allow, warn, flag, modify, custom, require_review, block)
    rules: dict[str, bool]  # expected per-rule outcome: True = the rule should pass, False = should fail
    scores: dict[str, float]  # recorded per-rule scores (production rows without text), else empty
    source: str = ""  # where the row came from ("file", "review:<id>", "feedback:<id>")
    # The stage the row is evaluated at ("": every rule). A tool row's prompt, response and
    # context are what is sent: at tool_call the response is the arguments' JSON text and the
    # context's ``tool`` is {name, call_id}; at tool_result the tool's output is prompt and response.
    stage: str = ""


@dataclass
class _Problems:
    where: str
    items: list[tuple[int, str]] = field(default_factory=list)

    def add(self, line: int, message: str) -> None:
        self.items.append((line, message))

    def raise_if_any(self) -> None:
        if not self.items:
            return
        ordered = sorted(self.items, key=lambda item: item[0])  # stable: a line's problems keep their order
        listed = [f"  {self.where}:{line}: {msg}" for line, msg in ordered[:MAX_LISTED_PROBLEMS]]
        more = len(self.items) - MAX_LISTED_PROBLEMS
        if more > 0:
            listed.append(f"  … and {more} more")
        raise InvalidInputError(f"{self.where}: {len(self.items)} problem(s):\n" + "\n".join(listed))


def load_dataset(path: str | Path, rules: Iterable[str] | None = None) -> list[Row]:
    """Every row of a ``.jsonl`` or ``.csv`` file (by its suffix; ``.json`` lines are JSONL too).

    ``rules``: the policy's rule names; a label or score naming another rule is a problem.
    Raises InvalidInputError listing every problem with its line, or naming an empty dataset."""
    p = Path(path)
    try:
        size = p.stat().st_size
    except FileNotFoundError:
        raise InvalidInputError(f"dataset {p}: file not found") from None
    except OSError as e:
        raise InvalidInputError(f"dataset {p}: cannot read: {e.strerror}") from None
    if size > MAX_DATASET_BYTES:
        raise InvalidInputError(f"dataset {p}: {size} bytes, over the {MAX_DATASET_BYTES} a dataset may hold")
    try:
        text = p.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise InvalidInputError(f"dataset {p}: not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise InvalidInputError(f"dataset {p}: cannot read: {e.strerror}") from None
    problems = _Problems(str(p))
    known = set(rules) if rules is not None else None
    records = _csv_records(text, problems) if p.suffix.lower() == ".csv" else _jsonl_records(text, problems)
    out: list[Row] = []
    seen: dict[str, int] = {}
    for line, doc in records:
        row = row_from_mapping(doc, line, problems, known)
        if row is None:
            continue
        if row.id in seen:
            problems.add(line, f"id {row.id!r} repeats line {seen[row.id]}'s")
        seen.setdefault(row.id, line)
        out.append(row)
    problems.raise_if_any()
    if not out:
        raise InvalidInputError(f"dataset {p}: no rows (an empty dataset measures nothing)")
    return out


def check_rows(rows: list[Row], rules: Iterable[str], where: str = "rows") -> None:
    """Rows built elsewhere (production labels) against the policy's rules: the same problems."""
    problems = _Problems(where)
    known = set(rules)
    for row in rows:
        for name in sorted((set(row.rules) | set(row.scores)) - known):
            problems.add(row.line, _unknown_rule(name, known))
    problems.raise_if_any()
    if not rows:
        raise InvalidInputError(f"{where}: no rows (an empty dataset measures nothing)")


def _jsonl_records(text: str, problems: _Problems) -> list[tuple[int, Any]]:
    out: list[tuple[int, Any]] = []
    # Lines end at LF, CRLF or CR only: str.splitlines() also splits at U+2028, U+0085 and others,
    # which a JSON string may hold raw, and would number the following lines wrong.
    for n, raw in enumerate(text.replace("\r\n", "\n").replace("\r", "\n").split("\n"), start=1):
        if not raw.strip():
            continue
        if len(out) >= MAX_ROWS:
            problems.add(n, f"more than {MAX_ROWS} rows")
            break
        try:
            doc = json.loads(raw, parse_constant=_no_constant)
        except ValueError as e:
            col = f" column {e.colno}" if isinstance(e, json.JSONDecodeError) else ""
            problems.add(n, f"invalid JSON{col}: {getattr(e, 'msg', e)}")
            continue
        except RecursionError:  # deeper than the decoder can go: far deeper than MAX_NESTING
            problems.add(n, _too_deep())
            continue
        deep = _too_deep_fields(doc)
        if deep:
            for name in deep:
                problems.add(n, _too_deep(name))
            continue
        out.append((n, doc))
    return out


def nesting(value: Any) -> int:
    """Levels of mappings and sequences in ``value`` (a scalar: 0), without recursion; past
    ``MAX_NESTING + 2`` it does not count further (deeper is too deep already)."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        cur, depth = stack.pop()
        if isinstance(cur, dict | list):
            deepest = max(deepest, depth)
            if depth <= MAX_NESTING + 1:
                stack.extend((v, depth + 1) for v in (cur.values() if isinstance(cur, dict) else cur))
    return deepest


def _too_deep_fields(doc: Any) -> list[str]:
    """The fields of a row document nested deeper than MAX_NESTING ("" for a document that is
    not an object and nests deeper than a row could)."""
    if isinstance(doc, dict):
        return [str(k) for k, v in doc.items() if nesting(v) > MAX_NESTING]
    return [""] if nesting(doc) > MAX_NESTING + 1 else []


def _too_deep(name: str = "") -> str:
    where = f"{_shown_key(name)}: " if name else ""
    return f"{where}nested deeper than {MAX_NESTING} levels (the dataset's MAX_NESTING, as a server takes a context)"


def _shown(value: Any) -> str:
    """``repr(value)``, cut to SHOWN_VALUE_CHARS characters."""
    text = repr(value)
    return text if len(text) <= SHOWN_VALUE_CHARS else text[: SHOWN_VALUE_CHARS - 1] + "…"


def _shown_key(key: str) -> str:
    """A field or column name as a problem names it: as it is when short, else quoted and cut."""
    return key if key.isprintable() and len(key) <= SHOWN_VALUE_CHARS else _shown(key)


def _no_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name}")


def _csv_records(text: str, problems: _Problems) -> list[tuple[int, Any]]:
    """Each record with the physical line it starts on: a quoted value may span lines, and the
    reader's ``line_num`` counts the lines read so far (not the one a malformed record stopped on)."""
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    out: list[tuple[int, Any]] = []
    start = 1
    try:
        header = next(reader, [])
        for name in header:
            if name not in FIELDS and not name.startswith(RULE_COLUMN_PREFIX):
                problems.add(1, f"unknown column {_shown(name)} (columns: {', '.join(FIELDS)}, or rule:<name>)")
        while True:
            start = reader.line_num + 1
            values = next(reader, None)
            if values is None:
                break
            if not values:  # a blank line
                continue
            if len(out) >= MAX_ROWS:
                problems.add(start, f"more than {MAX_ROWS} rows")
                break
            if len(values) > len(header):
                problems.add(start, f"{len(values) - len(header)} value(s) more than the header's columns")
                continue
            rec: dict[str, str | None] = dict.fromkeys(header)
            rec.update(zip(header, values, strict=False))
            out.append((start, _csv_doc(rec, start, problems)))
    except csv.Error as e:
        problems.add(start, f"invalid CSV: {e}")
    return out


def _csv_doc(rec: Mapping[str, str | None], line: int, problems: _Problems) -> dict[str, Any]:
    """A CSV record as the JSONL document it stands for: JSON columns parsed, empty cells absent."""
    doc: dict[str, Any] = {}
    per_rule: dict[str, str] = {}
    for key, value in rec.items():
        if value is None or value == "":
            continue
        if key.startswith(RULE_COLUMN_PREFIX):
            per_rule[key[len(RULE_COLUMN_PREFIX) :]] = value.strip()
        elif key in ("context", "rules", "scores", "tool"):
            try:
                parsed = json.loads(value, parse_constant=_no_constant)
            except ValueError as e:
                problems.add(line, f"{key}: invalid JSON: {getattr(e, 'msg', e)}")
                continue
            except RecursionError:  # deeper than the decoder can go: far deeper than MAX_NESTING
                problems.add(line, _too_deep(key))
                continue
            if nesting(parsed) > MAX_NESTING:
                problems.add(line, _too_deep(key))
                continue
            doc[key] = parsed
        elif key == "passed":
            low = value.strip().lower()
            doc[key] = {"true": True, "false": False, "1": True, "0": False}.get(low, value)
        else:
            doc[key] = value
    if per_rule:
        if "rules" in doc:
            problems.add(line, "rules given twice: a rules column and rule:<name> columns")
        else:
            doc["rules"] = per_rule
    return doc


def row_from_mapping(doc: Any, line: int, problems: _Problems, rules: set[str] | None) -> Row | None:
    """One row from its document; its problems (all of them) go to ``problems``; None if any."""
    before = len(problems.items)
    if not isinstance(doc, Mapping):
        problems.add(line, f"expected a JSON object, got {type(doc).__name__}")
        return None
    for key in doc:
        if key not in FIELDS:
            problems.add(line, f"unknown field {_shown(key)} (fields: {', '.join(FIELDS)})")
    rid = doc.get("id", f"line-{line}")
    if not isinstance(rid, str | int) or isinstance(rid, bool) or rid == "":
        problems.add(line, "id: expected a non-empty string")
        rid = f"line-{line}"
    texts: dict[str, str | None] = {}
    for key in ("prompt", "response"):
        value = doc.get(key)
        if value is not None and not isinstance(value, str):
            problems.add(line, f"{key}: expected a string, got {type(value).__name__}")
        texts[key] = value if isinstance(value, str) else None
    context = doc.get("context", {})
    if not isinstance(context, Mapping):
        problems.add(line, f"context: expected an object, got {type(context).__name__}")
        context = {}
    passed = doc.get("passed")
    if passed is not None and not isinstance(passed, bool):
        problems.add(line, f"passed: expected true or false, got {_shown(passed)}")
    action = doc.get("action")
    if action is not None and action not in ACTIONS:
        problems.add(line, f"action: {_shown(action)} is not one of {', '.join(ACTIONS)}")
    labels = _labels(doc.get("rules", {}), line, problems, rules)
    scores = _scores(doc.get("scores", {}), line, problems, rules)
    if passed is None and action is None and not doc.get("rules"):
        problems.add(line, "no label: give passed, action or rules")
    stage = _stage(doc, line, problems)
    context = dict(context)
    if stage in TOOL_STAGES:
        _tool_row(doc, stage, line, problems, texts, context)
    elif "tool" in doc:
        problems.add(line, "tool: only a row of stage tool_call or tool_result names a tool")
    if texts["response"] is None and not scores and stage != "tool_call":  # a tool call's problems are named
        problems.add(line, "no response (and no recorded scores): nothing to evaluate")
    if len(problems.items) > before:
        return None
    return Row(
        line=line,
        id=str(rid),
        prompt=texts["prompt"] if texts["prompt"] is not None or texts["response"] is None else "",
        response=texts["response"],
        context=context,
        passed=passed,
        action=action,
        rules=labels,
        scores=scores,
        source="file",
        stage=stage,
    )


def _stage(doc: Mapping[str, Any], line: int, problems: _Problems) -> str:
    stage = doc.get("stage", "")
    if stage == "" and "stage" not in doc:
        return ""
    if not isinstance(stage, str) or stage not in STAGES:
        problems.add(line, f"stage: {_shown(stage)} is not one of {', '.join(STAGES)}")
        return ""
    return stage


def _tool_row(
    doc: Mapping[str, Any], stage: str, line: int, problems: _Problems, texts: dict[str, str | None], context: dict
) -> None:
    """A tool row's text and context as sent (Row.stage), into ``texts`` and ``context``; its
    problems to ``problems``. The tool is the row's ``tool`` field, never the context's."""
    tool = doc.get("tool")
    if "tool" in context:
        problems.add(line, "context.tool: a tool row names its tool in the row's tool field")
    if stage == "tool_call":
        if texts["response"] is not None or "response" in doc:
            problems.add(line, "response: a tool_call row's text is tool.arguments (the JSON the model sent)")
        if tool is None:
            problems.add(line, "tool: a tool_call row needs tool: {name, arguments}")
            return
    elif texts["prompt"] is not None or "prompt" in doc:
        problems.add(line, "prompt: a tool_result row's text is its response (the tool's output: prompt and response)")
    if tool is None:
        texts["prompt"] = texts["response"]
        return
    if not isinstance(tool, Mapping):
        problems.add(line, f"tool: expected an object, got {type(tool).__name__}")
        return
    allowed = TOOL_FIELDS[stage]
    for key in tool:
        if key not in allowed:
            problems.add(
                line, f"tool.{_shown_key(str(key))}: not a field of a {stage} row's tool ({', '.join(allowed)})"
            )
    named: dict[str, str] = {}
    for key in ("name", "call_id"):
        value = tool.get(key)
        if value is None:
            continue
        if not isinstance(value, str) or not value:
            problems.add(line, f"tool.{key}: expected a non-empty string, got {_shown(value)}")
        else:
            named[key] = value
    if stage == "tool_call":
        if "name" not in tool:
            problems.add(line, "tool.name: a tool_call row names the tool called")
        texts["response"] = _arguments(tool.get("arguments"), "arguments" in tool, line, problems)
    else:
        texts["prompt"] = texts["response"]
    context["tool"] = named


def _arguments(value: Any, given: bool, line: int, problems: _Problems) -> str | None:
    """A tool call's arguments as the text evaluated: a string as the model sent it (JSON), else
    an object or array written as JSON (as ``Client.evaluate_tool_call`` sends one)."""
    if not given:
        problems.add(line, "tool.arguments: a tool_call row gives the call's arguments (JSON text or an object)")
        return None
    if isinstance(value, Mapping | list):
        return json.dumps(value, ensure_ascii=False)
    if not isinstance(value, str):
        problems.add(line, f"tool.arguments: expected the JSON text or an object, got {_shown(value)}")
        return None
    try:
        parsed = json.loads(value, parse_constant=_no_constant)
    except ValueError as e:
        col = f" column {e.colno}" if isinstance(e, json.JSONDecodeError) else ""
        problems.add(line, f"tool.arguments: not JSON{col}: {getattr(e, 'msg', e)} (the text {_shown(value)})")
        return None
    except RecursionError:
        problems.add(line, _too_deep("tool.arguments"))
        return None
    if nesting(parsed) > MAX_NESTING:
        problems.add(line, _too_deep("tool.arguments"))
        return None
    return value


def _unknown_rule(name: str, known: set[str]) -> str:
    import difflib

    close = difflib.get_close_matches(name, sorted(known), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else f" (its rules: {', '.join(sorted(known)) or 'none'})"
    return f"rule {_shown(name)} is not in the policy{hint}"


def _labels(value: Any, line: int, problems: _Problems, rules: set[str] | None) -> dict[str, bool]:
    if not isinstance(value, Mapping):
        problems.add(line, f"rules: expected an object of rule -> pass|fail, got {type(value).__name__}")
        return {}
    out = {}
    for name, label in value.items():
        if rules is not None and name not in rules:
            problems.add(line, f"rules.{name}: {_unknown_rule(name, rules)}")
        if isinstance(label, str) and label in LABELS:
            out[name] = LABELS[label]
        else:
            problems.add(line, f"rules.{_shown_key(name)}: expected pass or fail, got {_shown(label)}")
    return out


def _scores(value: Any, line: int, problems: _Problems, rules: set[str] | None) -> dict[str, float]:
    if not isinstance(value, Mapping):
        problems.add(line, f"scores: expected an object of rule -> number, got {type(value).__name__}")
        return {}
    out = {}
    for name, score in value.items():
        if rules is not None and name not in rules:
            problems.add(line, f"scores.{name}: {_unknown_rule(name, rules)}")
        if isinstance(score, int | float) and not isinstance(score, bool) and math.isfinite(score) and 0 <= score <= 1:
            out[name] = float(score)
        else:
            problems.add(line, f"scores.{_shown_key(name)}: expected a number in [0, 1], got {_shown(score)}")
    return out


def row_to_json(row: Row) -> dict[str, Any]:
    """A row as one JSONL document of the dataset format (what :func:`load_dataset` reads back)."""
    doc: dict[str, Any] = {"id": row.id}
    context = dict(row.context)
    prompt, response = row.prompt, row.response
    if row.stage:
        doc["stage"] = row.stage
    if row.stage in TOOL_STAGES:
        tool = dict(context.pop("tool", None) or {})
        prompt = None if row.stage == "tool_result" else prompt
        if row.stage == "tool_call":
            tool["arguments"], response = response, None
        if tool:
            doc["tool"] = tool
    if prompt is not None:
        doc["prompt"] = prompt
    if response is not None:
        doc["response"] = response
    if context:
        doc["context"] = context
    if row.passed is not None:
        doc["passed"] = row.passed
    if row.action is not None:
        doc["action"] = row.action
    if row.rules:
        doc["rules"] = {k: "pass" if v else "fail" for k, v in row.rules.items()}
    if row.scores:
        doc["scores"] = row.scores
    return doc
