"""Plain result models shared by evaluators, the engine, the SDK and the service.

Scores are in [0, 1] where **1 means fully compliant**; a rule fails when its score is
below its threshold. These models never carry proto types (the service converts).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from enum import StrEnum
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from crossaudit.kernel.errors import ResultInvalidError

# --- what the wire can carry ------------------------------------------------------------
# Evaluator results travel in google.protobuf.Struct (numbers are doubles), proto strings
# (valid UTF-8) and int32 span offsets. A result that cannot be sent must be refused where it
# enters (ResultInvalidError), never discovered while the answer is being written.
WIRE_INT_MAX = 2**53  # integers beyond ±2^53 are not exact as doubles
WIRE_MAX_DEPTH = 32  # nesting of a result document (= SandboxLimits.result_max_depth)
WIRE_MAX_BYTES = 1024 * 1024  # compact-JSON size of one result (= SandboxLimits.result_bytes)
SPAN_OFFSET_MAX = 2**31 - 1  # Span.start/end are int32 in the service protos


def wire_problem(value: Any) -> str | None:
    """Why one JSON scalar cannot travel (None when it can)."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return None if -WIRE_INT_MAX <= value <= WIRE_INT_MAX else "an integer beyond ±2^53"
    if isinstance(value, float):
        return None if math.isfinite(value) else "a non-finite number (NaN or infinity)"
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "a string that is not valid UTF-8 (a lone surrogate)"
        return None
    return f"a non-JSON value of type {type(value).__name__}"


def check_wire(
    value: Any, *, what: str = "result", max_depth: int = WIRE_MAX_DEPTH, max_bytes: int = WIRE_MAX_BYTES
) -> int:
    """Raise :class:`ResultInvalidError` unless ``value`` is a JSON document the wire can carry:
    finite floats, integers within ±2^53, valid UTF-8 strings and keys, at most ``max_depth``
    levels and about ``max_bytes`` of compact JSON. Returns that approximate size. Iterative,
    so a hostile depth cannot exhaust the stack. The one check of every evaluator kind."""
    size = 0
    stack: list[tuple[Any, int, tuple[str | int, ...]]] = [(value, 1, ())]
    while stack:
        cur, depth, path = stack.pop()
        if isinstance(cur, Mapping | list | tuple):
            if depth > max_depth:
                raise ResultInvalidError(f"{what} is nested deeper than {max_depth} levels (at {_path(what, path)})")
            size += 2
            if isinstance(cur, Mapping):
                for k, v in cur.items():
                    if not isinstance(k, str):
                        raise ResultInvalidError(f"{what} keys must be strings (at {_path(what, path)})")
                    why = wire_problem(k)
                    if why:
                        raise ResultInvalidError(f"{what} has a key that is {why} (at {_path(what, path)})")
                    size += len(k) + 4
                    stack.append((v, depth + 1, (*path, k)))
            else:
                size += len(cur)
                stack.extend((v, depth + 1, (*path, i)) for i, v in enumerate(cur))
        else:
            why = wire_problem(cur)
            if why:
                raise ResultInvalidError(f"{what} contains {why} at {_path(what, path)}")
            size += len(cur) + 2 if isinstance(cur, str) else 8
        if size > max_bytes:
            raise ResultInvalidError(f"{what} is larger than {max_bytes} bytes")
    return size


def _path(what: str, path: tuple[str | int, ...]) -> str:
    out = what
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out[:200]


def wire_text(text: str) -> str:
    """``text`` with lone surrogates replaced (U+FFFD): for messages, which must never fail to send."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def loads_strict(data: str | bytes) -> Any:
    """``json.loads`` refusing the ``NaN``/``Infinity`` literals (ValueError): Python accepts them,
    JSON has no such values and a peer that sends them is broken or hostile. A number that only
    overflows (``1e999``) still parses, to inf, and is refused by :func:`check_wire` where the
    document enters, as every other value the wire cannot carry."""
    return json.loads(data, parse_constant=_refuse_constant)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name}")


# --- the score of an evaluator's result document ------------------------------------------
SCORE_KEYS = ("score", "safety_score", "compliance_score")


def score_key(doc: Mapping[str, Any]) -> str | None:
    """Which key of an evaluator's result document is its score (None when it has none).

    The first of :data:`SCORE_KEYS` present wins. ``score`` comes first because it is the name
    of the score everywhere else (the typed result's field, ``previous_rule.<rule>.score`` in
    the guide), so a document that spells it means it; ``safety_score`` is what the guide's
    example evaluators and llm prompt return; ``compliance_score`` is what some models answer
    with. The one rule of custom results (``sandbox/protocol.py``) and llm answers
    (``orchestrator/evaluators/llm.py``); a custom result keeps its other score keys in
    ``details``.
    """
    return next((k for k in SCORE_KEYS if k in doc), None)


_M = TypeVar("_M", bound=BaseModel)
_setattr = object.__setattr__
_DEFAULTS: dict[type[BaseModel], tuple[dict[str, Any], dict[str, Any], tuple[str, ...], frozenset[str]]] = {}


def trusted(cls: type[_M], values: dict[str, Any]) -> _M:
    """A ``cls`` built from ``values`` without validation (``values`` becomes its ``__dict__``):
    for the engine's hot path, whose values are produced by its own code from models that were
    validated where outside data entered, already of the fields' types. What ``model_construct``
    does, at less than half the cost of a validation (pydantic's ``model_construct`` is Python and
    costs more than one). The caller applies what a field validator would (``wire_text``) and
    passes floats as floats; missing fields get their defaults, a factory's fresh each time.
    ``values`` is the instance's own afterwards (pass a fresh dict)."""
    fields_set = set(values)
    defaults = _DEFAULTS.get(cls)
    if defaults is None:
        static: dict[str, Any] = {}
        factories: dict[str, Any] = {}
        for name, f in cls.model_fields.items():
            if f.default_factory is not None:
                factories[name] = f.default_factory
            elif not f.is_required():
                static[name] = f.default
        defaults = _DEFAULTS[cls] = (static, factories, tuple(cls.model_fields), frozenset(cls.model_fields))
    static, factories, order, names = defaults
    if tuple(values) != order:  # the fields in their declared order (a dump's order), defaults filled
        unknown = values.keys() - names
        if unknown:  # a programming error: never a misspelt field
            raise TypeError(f"{cls.__name__}: unknown fields {sorted(unknown)}")
        try:
            values = {
                k: values[k] if k in values else static[k] if k in static else factories[k]() for k in order
            }
        except KeyError as e:  # a required field not given
            raise TypeError(f"{cls.__name__}: missing field {e}") from None
    obj = cls.__new__(cls)
    _setattr(obj, "__dict__", values)
    _setattr(obj, "__pydantic_fields_set__", fields_set)
    _setattr(obj, "__pydantic_extra__", None)
    _setattr(obj, "__pydantic_private__", None)
    return obj


class Status(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    ERROR = "error"
    TIMEOUT = "timeout"
    SKIPPED = "skipped"


class Action(StrEnum):
    """Rule actions, declared from least to most severe (``severity`` relies on the order)."""

    CONTINUE = "continue"
    ALLOW = "allow"
    WARN = "warn"
    FLAG = "flag"
    MODIFY = "modify"
    CUSTOM = "custom"
    REQUIRE_REVIEW = "require_review"
    BLOCK = "block"

    @property
    def severity(self) -> int:
        return _SEVERITY[self]


# ``custom`` (a webhook) notifies but does not stop content: ranked with ``flag``.
_SEVERITY = {
    Action.CONTINUE: 0,
    Action.ALLOW: 0,
    Action.WARN: 1,
    Action.FLAG: 2,
    Action.CUSTOM: 2,
    Action.MODIFY: 3,
    Action.REQUIRE_REVIEW: 4,
    Action.BLOCK: 5,
}


class Span(BaseModel):
    """A located finding in the response text (used by ``modify``/redact)."""

    model_config = ConfigDict(frozen=True)

    start: int = Field(ge=0, le=SPAN_OFFSET_MAX)
    end: int = Field(ge=0, le=SPAN_OFFSET_MAX)
    label: str = ""
    score: float = Field(default=1.0, ge=0.0, le=1.0)


class Verdict(BaseModel):
    """What one evaluator call produces, before the engine adds timing and attempts."""

    score: float = Field(ge=0.0, le=1.0, description="1 = fully compliant")
    passed: bool | None = Field(default=None, description="the evaluator's own verdict, if it gives one")
    violations: list[str] = Field(default_factory=list)
    details: dict[str, Any] = Field(default_factory=dict)
    spans: list[Span] = Field(default_factory=list)

    @field_validator("score")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("score must be finite")
        return v

    @model_validator(mode="after")
    def rechecked(self) -> Verdict:
        """The wire check again: ``model_copy(update=...)`` skips validators, so whoever receives a
        verdict built that way (the engine, for every evaluator kind) checks it once more."""
        return self._wire()

    def _wire(self) -> Verdict:
        # Raised as ResultInvalidError (not a ValueError, so pydantic passes it through):
        # custom, builtin and llm results fail alike, as a rule error.
        check_wire(self.details, what="details")
        check_wire(self.violations, what="violations")
        for i, span in enumerate(self.spans):
            why = wire_problem(span.label)
            if why:
                raise ResultInvalidError(f"spans[{i}].label is {why}")
        return self


class EvaluatorResult(BaseModel):
    """One evaluator's outcome inside a rule: a verdict, or why there is none."""

    evaluator: str
    kind: str = ""  # llm | builtin | custom
    status: Status
    score: float | None = None
    passed: bool | None = None
    violations: list[str] = Field(default_factory=list)
    details: dict[str, Any] = Field(default_factory=dict)
    spans: list[Span] = Field(default_factory=list)
    latency_ms: float = 0.0
    attempts: int = 0
    cached: bool = False
    error: str | None = None  # human-readable reason for error/timeout
    error_type: str | None = None  # the CrossAuditError class name
    # What produced the verdict (the engine's cache identity: tenant scope, evaluator identity,
    # config); "" when the evaluator could not be built. Replay reuses a recorded result by it.
    identity: str = ""
    # Flat facts about what produced the verdict, for an auditor to reproduce it (docs/provenance.md):
    # ``kind`` and, by kind, code and dependency digests, image ids, model file digests, the LLM
    # provider's response id. Filled by the engine from the evaluator, never from the verdict's content.
    provenance: dict[str, str] = Field(default_factory=dict)

    @field_validator("error")
    @classmethod
    def _sendable(cls, v: str | None) -> str | None:
        return wire_text(v) if v is not None else None  # error messages may quote hostile text


class ActionOutcome(BaseModel):
    """The structured effect of a failed rule's action (rendered action_config)."""

    rule: str
    action: Action
    params: dict[str, Any] = Field(default_factory=dict)


class RuleResult(BaseModel):
    rule: str
    status: Status
    passed: bool
    score: float | None = None
    threshold: float | None = None
    action: Action | None = None  # the action applied (only when the rule failed)
    evaluators: list[EvaluatorResult] = Field(default_factory=list)
    fallback_used: bool = False
    reason: str = ""  # why skipped / errored / how the score was combined
    latency_ms: float = 0.0
    outcome: ActionOutcome | None = None
    disagreement: bool = False  # a split vote sent to review (``on_disagreement``) instead of decided

    @field_validator("reason")
    @classmethod
    def _sendable(cls, v: str) -> str:
        return wire_text(v)


class Decision(BaseModel):
    """The answer to one evaluation request."""

    policy: str
    policy_version: str
    passed: bool
    action: Action
    rules: list[RuleResult]
    modified_response: str | None = None
    outcomes: list[ActionOutcome] = Field(default_factory=list)
    errored_rules: list[str] = Field(default_factory=list)
    latency_ms: float = 0.0
    decision_id: str = ""

    def rule(self, name: str) -> RuleResult:
        for r in self.rules:
            if r.rule == name:
                return r
        raise KeyError(name)
