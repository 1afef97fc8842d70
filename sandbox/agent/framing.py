"""The wire protocol's framing: JSON lines on a private fd, and the error documents frames carry.

Why a module of its own: the warm parent (before the load), the I/O process and the call child
all build the same ``{"type", "message", "limit"}`` errors and must bound what they read and
write the same way; see ``docs/agent-protocol.md``.
"""

from __future__ import annotations

import json
import math
import os

from .state import AgentState

PROTOCOL_IN_MAX = 16 * 1024 * 1024  # longest inbound frame (the orchestrator is trusted; this bounds memory)
MESSAGE_MAX = 2000  # error messages are truncated to this many characters
ENVELOPE_SLACK = 64 * 1024  # room for the child's envelope around the result document


def clip_message(text: object) -> str:
    s = str(text)
    return s if len(s) <= MESSAGE_MAX else s[: MESSAGE_MAX - 3] + "..."


def exc_text(exc: BaseException) -> str:
    try:
        return clip_message(f"{type(exc).__name__}: {exc}")
    except Exception:  # a hostile __str__
        return clip_message(type(exc).__name__)


def error_info(etype: str, message: str, limit: str | None = None) -> dict:
    return {"type": etype, "message": clip_message(message), "limit": limit}


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def depth_ok(obj: object, max_depth: int) -> bool:
    """Iterative nesting check (json.dumps would hit RecursionError long before telling us)."""
    stack = [(obj, 1)]
    seen = 0
    while stack:
        cur, depth = stack.pop()
        seen += 1
        if isinstance(cur, dict):
            if depth > max_depth:
                return False
            stack.extend((v, depth + 1) for v in cur.values())
        elif isinstance(cur, (list, tuple)):
            if depth > max_depth:
                return False
            stack.extend((v, depth + 1) for v in cur)
    return True


def _reject_constant(name: str) -> None:
    raise ValueError(f"non-finite number {name}")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # "1e999" parses to inf
        raise ValueError(f"non-finite number {text}")
    return value


def loads_strict(data: bytes | str):
    """json.loads that refuses NaN/Infinity literals and overflowing floats."""
    return json.loads(data, parse_constant=_reject_constant, parse_float=_finite_float)


class Framing(AgentState):
    """Frame I/O on ``proto_in``/``proto_out``, private duplicates of the original stdin/stdout:
    nothing the evaluator prints can become a frame."""

    def send(self, frame: dict) -> None:
        data = json.dumps(frame, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8", "replace")
        write_all(self.proto_out, data + b"\n")

    def read_line(self) -> bytes:
        """The next protocol line (newline included); b"" at EOF, a line without newline if too long or cut."""
        while True:
            nl = self.inbuf.find(b"\n")
            if nl >= 0 or len(self.inbuf) > PROTOCOL_IN_MAX:
                end = nl + 1 if nl >= 0 else len(self.inbuf)
                line = bytes(self.inbuf[:end])
                del self.inbuf[:end]
                return line
            chunk = os.read(self.proto_in, 1 << 16)
            if not chunk:
                line, self.inbuf = bytes(self.inbuf), bytearray()
                return line
            self.inbuf += chunk
