"""Orchestrator side of the agent protocol (``docs/agent-protocol.md``), shared by both backends.

* :class:`AgentChannel` encodes/decodes JSON-lines frames with a hard line-length cap, so a
  sandbox can never make the orchestrator buffer or parse an unbounded line.
* :func:`parse_result` re-validates the result document: the agent's checks run inside the
  sandbox, so the orchestrator trusts none of them.
* :func:`error_from_frame` turns the agent's typed error frames into ``crossaudit.kernel.errors``.
"""

from __future__ import annotations

import asyncio
import json
import math
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from crossaudit.kernel.canonical import canonical_json
from crossaudit.kernel.errors import (
    CrossAuditError,
    EvaluatorCodeError,
    EvaluatorTimeoutError,
    ProtocolError,
    ResultInvalidError,
    SandboxCodeError,
    SandboxCrashedError,
    SandboxError,
    SandboxLimitError,
    SandboxSecurityError,
)
from crossaudit.kernel.limits import SandboxLimits
from crossaudit.kernel.results import (
    SCORE_KEYS,
    SPAN_OFFSET_MAX,
    Span,
    Verdict,
    check_wire,
    loads_strict,
    score_key,
    wire_text,
)

MESSAGE_MAX = 2000  # characters of a sandbox error message passed on to users
KNOWN_KEYS = frozenset({*SCORE_KEYS, "violations", "passed", "details", "spans"})


# --------------------------------------------------------------------------- result validation


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ResultInvalidError(f"{what} must be a number, got {type(value).__name__}")
    try:
        f = float(value)
    except OverflowError:  # an int beyond float range
        raise ResultInvalidError(f"{what} is out of range") from None
    if not math.isfinite(f):
        raise ResultInvalidError(f"{what} must be finite")
    return f


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _spans(raw: Any, limits: SandboxLimits) -> list[Span]:
    if not isinstance(raw, list):
        raise ResultInvalidError("'spans' must be a list")
    if len(raw) > limits.result_max_violations:
        raise ResultInvalidError(f"too many spans (> {limits.result_max_violations})")
    out = []
    for i, item in enumerate(raw):
        if not isinstance(item, Mapping):
            raise ResultInvalidError(f"spans[{i}] must be an object")
        start, end = item.get("start"), item.get("end")
        if not (isinstance(start, int) and isinstance(end, int) and _is_int(start) and _is_int(end)) or not (
            0 <= start <= end <= SPAN_OFFSET_MAX
        ):
            raise ResultInvalidError(f"spans[{i}] needs integers 0 <= start <= end <= {SPAN_OFFSET_MAX}")
        label = item.get("label", "")
        if not isinstance(label, str):
            raise ResultInvalidError(f"spans[{i}].label must be a string")
        score = _number(item.get("score", 1.0), f"spans[{i}].score")
        if not 0.0 <= score <= 1.0:
            raise ResultInvalidError(f"spans[{i}].score must be in [0, 1]")
        out.append(Span(start=start, end=end, label=label, score=score))
    return out


def parse_result(obj: Any, limits: SandboxLimits | None = None) -> Verdict:
    """Validate an evaluator's returned document and build a :class:`Verdict`.

    Shape (the guide's): ``{"safety_score"|"score": float in [0,1], "violations": [...],
    "passed": bool, "details": {...}}`` plus optional ``spans``; which key is the score is
    :func:`~crossaudit.kernel.results.score_key`'s rule. Unknown top-level keys move into
    ``details``; non-string violations become compact JSON. Anything else raises
    :class:`ResultInvalidError`.
    """
    limits = limits or SandboxLimits()
    if not isinstance(obj, Mapping):
        raise ResultInvalidError(f"evaluate must return a dict, got {type(obj).__name__}")
    # What the wire can carry (finite, ±2^53, UTF-8, depth, size): the check every evaluator
    # kind shares (Verdict repeats it), so an unsendable result is this rule's error.
    check_wire(obj, max_depth=limits.result_max_depth, max_bytes=limits.result_bytes)
    try:
        size = len(canonical_json(obj, ascii=False).encode())
    except (TypeError, ValueError, RecursionError) as exc:
        raise ResultInvalidError(f"result is not JSON-serialisable: {exc}") from None
    if size > limits.result_bytes:
        raise ResultInvalidError(f"result is {size} bytes, over the {limits.result_bytes}-byte limit")

    key = score_key(obj)
    if key is None:
        raise ResultInvalidError(f"result has no score ({' or '.join(map(repr, SCORE_KEYS))})")
    score = _number(obj[key], key)
    if not 0.0 <= score <= 1.0:
        raise ResultInvalidError(f"{key} must be in [0, 1], got {score}")

    passed = obj.get("passed")
    if passed is not None and not isinstance(passed, bool):
        raise ResultInvalidError("'passed' must be a boolean")

    raw_violations = obj.get("violations", [])
    if raw_violations is None:
        raw_violations = []
    if not isinstance(raw_violations, list):
        raise ResultInvalidError("'violations' must be a list")
    if len(raw_violations) > limits.result_max_violations:
        raise ResultInvalidError(f"too many violations (> {limits.result_max_violations})")
    violations = [v if isinstance(v, str) else canonical_json(v, ascii=False) for v in raw_violations]

    details_raw = obj.get("details", {})
    if details_raw is None:
        details_raw = {}
    if not isinstance(details_raw, Mapping):
        raise ResultInvalidError("'details' must be an object")
    details = dict(details_raw)
    for k, v in obj.items():
        if k not in KNOWN_KEYS or (k in SCORE_KEYS and k != key):
            details.setdefault(k, v)

    try:
        spans = _spans(obj["spans"], limits) if obj.get("spans") is not None else []
        return Verdict(score=score, passed=passed, violations=violations, details=details, spans=spans)
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        raise ResultInvalidError(f"invalid result: {exc}") from None


# --------------------------------------------------------------------------- errors


def _clip(text: Any) -> str:
    s = wire_text(str(text)) if text is not None else ""  # the message reaches users and gRPC headers
    return s if len(s) <= MESSAGE_MAX else s[: MESSAGE_MAX - 3] + "..."


def error_from_frame(frame: Mapping[str, Any]) -> CrossAuditError:
    """Map an agent error (a whole ``loaded``/``result`` frame or just its ``error``) to a typed error."""
    err = frame.get("error", frame) if isinstance(frame, Mapping) else {}
    if not isinstance(err, Mapping):
        return SandboxCrashedError("sandbox reported a malformed error")
    etype = err.get("type")
    message = _clip(err.get("message") or etype or "sandbox error")
    limit = err.get("limit")
    if etype == "code_error":
        return SandboxCodeError(f"evaluator raised {message}")
    if etype == "crashed":
        return SandboxCrashedError(message)
    if etype == "limit":
        if limit == "timeout":
            return EvaluatorTimeoutError(message)
        return SandboxLimitError(limit if isinstance(limit, str) and limit else "unknown", message)
    if etype == "security":
        return SandboxSecurityError(message)
    if etype == "invalid_result":
        return ResultInvalidError(message)
    if etype == "load_error":
        return EvaluatorCodeError(message)
    if etype == "protocol":
        return ProtocolError(message)
    return SandboxError(message)


# --------------------------------------------------------------------------- framing


class AgentChannel:
    """Encode/decode agent frames (one JSON object per ``\\n``-terminated line) under a size cap.

    ``max_frame_bytes`` bounds every line *read from* the sandbox; the orchestrator never
    buffers more. Use :meth:`read_frame` with an ``asyncio.StreamReader`` or :meth:`feed`
    with raw bytes (e.g. a container's attach socket).
    """

    def __init__(self, max_frame_bytes: int) -> None:
        self.max_frame_bytes = int(max_frame_bytes)
        self._buf = bytearray()

    @classmethod
    def for_limits(cls, limits: SandboxLimits) -> AgentChannel:
        return cls(limits.frame_bytes)

    # -- encoding (orchestrator -> agent)
    @staticmethod
    def encode(frame: Mapping[str, Any]) -> bytes:
        """One frame as bytes. Raises ``ValueError`` on non-finite numbers (never sent)."""
        return json.dumps(frame, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode() + b"\n"

    @staticmethod
    def load_frame(
        code: str,
        *,
        entrypoint: str = "evaluate",
        preload: Sequence[str] = (),
        restricted: bool,
        limits: SandboxLimits,
        rlimit_nproc: bool = True,
        reset: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The ``load`` frame. ``rlimit_nproc=False`` skips RLIMIT_NPROC (use a cgroup pids limit instead).

        ``reset`` (``{"paths": [absolute dirs], "ipc": bool, "idle": bool}``) asks the agent to empty
        those directories (and remove SysV IPC objects) after every call and to report each reset
        with a ``reset`` frame; ``idle``: a finished call's process exits at idle CPU priority.
        """
        keys = ("timeout_s", "memory_bytes", "cpu_s", "pids", "nofile", "file_bytes", "output_bytes",
                "result_bytes", "result_max_depth", "result_max_violations", "cleanup_s")  # fmt: skip
        frame = {
            "op": "load",
            "code": code,
            "entrypoint": entrypoint,
            "preload": list(preload),
            "restricted": restricted,
            "rlimit_nproc": rlimit_nproc,
            "limits": {k: getattr(limits, k) for k in keys},
        }
        if reset is not None:
            frame["reset"] = {
                "paths": list(reset.get("paths", ())),
                "ipc": bool(reset.get("ipc", False)),
                "idle": bool(reset.get("idle", False)),
            }
        return frame

    @staticmethod
    def call_frame(prompt: str, response: str, context: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        """A call frame with a fresh random nonce; answers carrying another id are dropped."""
        call_id = secrets.token_hex(16)
        return call_id, {"op": "call", "id": call_id, "prompt": prompt, "response": response, "context": context}

    # -- decoding (agent -> orchestrator)
    def decode(self, line: bytes) -> dict[str, Any]:
        if len(line) > self.max_frame_bytes:
            raise ProtocolError(f"agent frame over {self.max_frame_bytes} bytes")
        try:
            frame = loads_strict(line)
        except (ValueError, RecursionError) as exc:
            raise ProtocolError(f"agent sent invalid JSON: {_clip(exc)}") from None
        if not isinstance(frame, dict) or not isinstance(frame.get("op"), str):
            raise ProtocolError("agent frame is not an object with an 'op'")
        return frame

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        """Add raw bytes; return the complete frames they finish. Raises on an oversized line."""
        self._buf += data
        frames: list[dict[str, Any]] = []
        while True:
            nl = self._buf.find(b"\n")
            if nl < 0:
                if len(self._buf) > self.max_frame_bytes:
                    self._buf.clear()
                    raise ProtocolError(f"agent frame over {self.max_frame_bytes} bytes")
                return frames
            line = bytes(self._buf[:nl])
            del self._buf[: nl + 1]
            if line.strip():
                frames.append(self.decode(line))

    async def read_frame(self, reader: asyncio.StreamReader) -> dict[str, Any]:
        """Next frame from a StreamReader (created with ``limit`` >= max_frame_bytes)."""
        try:
            line = await reader.readuntil(b"\n")
        except asyncio.IncompleteReadError:
            raise ProtocolError("agent closed its channel") from None
        except asyncio.LimitOverrunError:
            raise ProtocolError(f"agent frame over {self.max_frame_bytes} bytes") from None
        return self.decode(line)

    async def read_answer(
        self, reader: asyncio.StreamReader, op: str, call_id: str | None = None, *, max_frames: int = 64
    ) -> dict[str, Any]:
        """Read until the frame answering ``op`` (and ``call_id``); stray frames are dropped."""
        for _ in range(max_frames):
            frame = await self.read_frame(reader)
            if frame.get("op") == "error":
                raise error_from_frame(frame)
            if frame.get("op") == op and (call_id is None or frame.get("id") == call_id):
                return frame
        raise ProtocolError(f"no '{op}' answer within {max_frames} frames")
