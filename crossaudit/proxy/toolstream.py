"""A streamed answer's tool calls, each held until it is complete and judged on its own
(docs/agents.md#streams): a call's argument fragments are held from its first delta until the
next call's index starts or the choice finishes (or the stream ends), then the whole call is
judged (at ``tool_call``, and its text at the output stage beside it) while the answer's text
goes on streaming; judged calls are released in the order they began, each in one delta with
its whole arguments (the redacted ones when a rule redacts them), or dropped when blocked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from crossaudit.proxy import chat
from crossaudit.proxy.guard import Verdict

# One complete call judged: its tool_call verdict, and the output stage's on its text
CallJudge = Callable[[chat.ToolCall], Coroutine[Any, Any, tuple[Verdict, Verdict]]]


def call_text(tc: chat.ToolCall) -> str:
    """A tool call's text as the output stage reads it (its name and arguments, as outside_text)."""
    parts = chat.outside_parts({"tool_calls": [{"function": {"name": tc.name, "arguments": tc.arguments}}]})
    return chat.outside_text(parts) or ""


@dataclass
class HeldCall:
    """One streamed tool call as its deltas arrive: its index in the stream, id, type and name as
    first given, its argument fragments, and (once complete) the task judging it."""

    index: int
    position: int  # the order it began in, from 0
    call_id: Any = None
    type: Any = None
    name: str = ""
    fragments: list[str] = field(default_factory=list)
    size: int = 0  # the arguments' UTF-8 bytes so far
    task: asyncio.Task[tuple[Verdict, Verdict]] | None = None

    def whole(self) -> chat.ToolCall:
        call_id = self.call_id if isinstance(self.call_id, str) else ""
        return chat.ToolCall(0, self.position, call_id, self.name, "".join(self.fragments))


class HeldCalls:
    """The tool calls of one streamed choice. ``take`` each delta's ``tool_calls`` (ValueError
    when the upstream breaks the stream's form), ``complete`` at the choice's finish or the
    stream's end; ``head`` is the next call to release, once judged."""

    def __init__(self, judge: CallJudge, *, max_bytes: int | None, on_judged: Callable[[], None]) -> None:
        self.judge = judge
        self.max_bytes = max_bytes  # one call's arguments: at most what its decision's request carries
        self.on_judged = on_judged
        self.calls: list[HeldCall] = []
        self._by_index: dict[int, HeldCall] = {}
        self._open: HeldCall | None = None
        self._next = 0  # the position of the next call to release or drop
        self.sent = 0  # calls released (each with its index in the caller's stream: 0, 1, ...)
        self.dropped = 0  # calls blocked and dropped (on_block: refusal)
        self.tool_verdicts: list[Verdict] = []  # in the order the calls were released or dropped
        self.output_verdicts: list[Verdict] = []

    def take(self, pieces: Any) -> None:
        if not isinstance(pieces, list):
            raise ValueError("a delta's tool_calls is not a list")
        for piece in pieces:
            if not isinstance(piece, dict):
                raise ValueError("a streamed tool call is not an object")
            idx = piece.get("index")
            if isinstance(idx, bool) or not isinstance(idx, int):
                raise ValueError("a streamed tool call's index is not an integer")
            held = self._by_index.get(idx)
            if held is None:
                self.complete()  # the next call began: the one before it is whole
                held = HeldCall(idx, len(self.calls))
                self.calls.append(held)
                self._by_index[idx] = held
                self._open = held
            elif held is not self._open:
                raise ValueError(f"tool call {idx}'s arguments resumed after the next call began")
            _, name, arguments = chat._call_fields(piece)
            if held.call_id is None and piece.get("id") is not None:
                held.call_id = piece["id"]
            if held.type is None and piece.get("type") is not None:
                held.type = piece["type"]
            held.name = held.name or name
            if arguments:
                held.size += len(arguments.encode("utf-8", "surrogatepass"))
                if self.max_bytes is not None and held.size > self.max_bytes:
                    raise OverflowError(f"a tool call's arguments are over {self.max_bytes} bytes")
                held.fragments.append(arguments)

    def complete(self) -> None:
        """The open call is whole: judged from now on (the text around it goes on streaming)."""
        held, self._open = self._open, None
        if held is None:
            return
        held.task = asyncio.get_running_loop().create_task(self.judge(held.whole()))
        held.task.add_done_callback(lambda _t: self.on_judged())

    @property
    def open(self) -> bool:
        return self._open is not None

    def head(self) -> HeldCall | None:
        """The next call to release or drop, once it has been judged."""
        if self._next < len(self.calls):
            held = self.calls[self._next]
            if held.task is not None and held.task.done():
                return held
        return None

    def pending(self) -> list[asyncio.Task[tuple[Verdict, Verdict]]]:
        return [h.task for h in self.calls[self._next :] if h.task is not None]

    def done(self, held: HeldCall, tool: Verdict, output: Verdict, *, sent: bool) -> None:
        self._next += 1
        self.tool_verdicts.append(tool)
        self.output_verdicts.append(output)
        if sent:
            self.sent += 1
        else:
            self.dropped += 1

    @property
    def all_handled(self) -> bool:
        return self._next >= len(self.calls)

    def cancel(self) -> None:
        for h in self.calls:
            if h.task is not None and not h.task.done():
                h.task.cancel()
