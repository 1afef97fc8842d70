"""A streamed answer released window by window (docs/proxy.md#streaming).

The upstream's events are read as they come; the answer's text is evaluated in windows of at
least ``window_chars`` new characters, each with the last ``context_chars`` of the text already
released before it, and the last ``context_chars`` of each window are held back (released with
the next one). So a match of at most ``context_chars`` characters is evaluated whole before any
of it is released. A window's evaluation is provisional (audited by the server only when it
blocks); the last one is the final decision on the whole answer, audited once. A block stops the
stream: nothing after the released text reaches the caller. A redaction is released redacted.

One choice (``n: 1``) without ``logprobs``; other streams are buffered (stages.py).
"""

from __future__ import annotations

import asyncio
import codecs
import io
import json
import logging
import re
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx

from crossaudit.proxy import chat
from crossaudit.proxy.chat import DONE, SSE_DONE, Chunks, ProxyError
from crossaudit.proxy.guard import Verdict
from crossaudit.proxy.toolstream import CallJudge, HeldCall, HeldCalls, call_text

log = logging.getLogger("crossaudit.proxy")

# Changed regions of a redaction closer than this are one: a few letters of a replacement
# ("[EMAIL_ADDRESS]") equal to the text it replaced must not split the region.
MIN_ANCHOR_CHARS = 8
# Aligning a redaction with the text it was made of (align(), each release of a window that was
# redacted): linear in the texts, never a diff (difflib on a 40,000-character answer took 36 s on
# the event loop every caller shares).
DIFF_BLOCK_CHARS = 64  # equal text is compared in slices from this many characters, doubling
RESYNC_SPAN_CHARS = 1024  # a change is aligned when it replaced at most this many characters with at most as many
DIFF_WORK_PER_CHAR = 32  # characters compared per character of the two texts, at most (plus DIFF_WORK_BASE) ...
DIFF_WORK_BASE = 65536  # ... past it the rest of the answer is one changed region
RELEASE_INLINE_CHARS = 32768  # a redacted release of more text than this is aligned in a worker thread
_EOL = re.compile(r"\r\n|\r|\n")  # what ends an SSE line


@dataclass(frozen=True)
class Windows:
    """The sizes a policy's streams are evaluated with (ProxyLimits, or the policy's own)."""

    window_chars: int
    context_chars: int


@dataclass(frozen=True)
class Blocked:
    """The stream stops here: a block (``verdict``), or a redaction of text the guard cannot
    rewrite (``unredactable``: tool-call arguments, reasoning); ``window`` counts from 1."""

    verdict: Verdict
    window: int
    unredactable: bool = False
    stage: str = "output"  # or "tool_call": a tool call blocked (on_block: error)


@dataclass(frozen=True)
class Alignment:
    """The changed regions ``(i1, i2, j1, j2)`` of a redaction, and the characters compared to find them."""

    regions: list[tuple[int, int, int, int]]
    work: int


def _common(a: str, i: int, b: str, j: int, most: int, *, tail: bool = False) -> tuple[int, int]:
    """How many characters ``a[i:]`` and ``b[j:]`` share from their starts (``tail``: ``a`` and
    ``b`` at their ends), at most ``most``, and how many were compared: slices of doubling length
    until one differs, then halving ones; so about twice the shared run's length."""
    same, work, size, found = 0, 0, DIFF_BLOCK_CHARS, False
    la, lb = len(a), len(b)
    while same < most and size:
        step = min(size, most - same)
        work += step
        if tail:
            equal = a[la - same - step : la - same] == b[lb - same - step : lb - same]
        else:
            equal = a[i + same : i + same + step] == b[j + same : j + same + step]
        if equal:
            same += step
            size = size if found else size * 2
        else:
            found = True  # the first difference is within this step: halve until it is pinned
            size = step // 2
    return same, work


def align(evaluated: str, modified: str) -> Alignment:
    """The changed regions of a redaction, in work linear in the texts' lengths (never a diff).

    The common start and end are skipped; between them, after each change the next
    ``MIN_ANCHOR_CHARS`` equal characters are looked for within ``RESYNC_SPAN_CHARS`` of it on
    each side (nearest first, spans doubling from ``DIFF_BLOCK_CHARS``), so changes closer than
    that are one region. Once ``DIFF_WORK_PER_CHAR`` characters per character of the two texts
    (plus ``DIFF_WORK_BASE``) were compared, or no anchor is found, the rest up to the common end
    is one changed region: held back whole while it straddles a window's end, released as the
    redaction once it is whole. Any alignment found is exact (its equal parts are equal)."""
    n, m = len(evaluated), len(modified)
    budget = DIFF_WORK_PER_CHAR * (n + m) + DIFF_WORK_BASE
    head, work = _common(evaluated, 0, modified, 0, min(n, m))
    tail, w = _common(evaluated, 0, modified, 0, min(n, m) - head, tail=True)
    work += w
    end_a, end_b = n - tail, m - tail  # from here both texts are the same to their ends
    regions: list[tuple[int, int, int, int]] = []
    i = j = head
    while i < end_a or j < end_b:
        found: tuple[int, int] | None = None
        span = DIFF_BLOCK_CHARS
        while found is None and work <= budget:
            found, w = _anchor(evaluated, i, modified, j, min(span, RESYNC_SPAN_CHARS), end_a - i, end_b - j)
            work += w
            if span >= RESYNC_SPAN_CHARS:
                break
            span *= 2
        if found is None:  # past the bound: the rest is one changed region
            regions.append((i, end_a, j, end_b))
            break
        da, db = found
        regions.append((i, i + da, j, j + db))
        i, j = i + da, j + db
        same, w = _common(evaluated, i, modified, j, min(end_a - i, end_b - j))
        work += w
        i, j = i + same, j + same
    return Alignment(regions, work)


def _anchor(
    a: str, i: int, b: str, j: int, span: int, to_end_a: int, to_end_b: int
) -> tuple[tuple[int, int] | None, int]:
    """The nearest ``(da, db)`` (least ``da + db``, each at most ``span``) where ``a[i + da:]`` and
    ``b[j + db:]`` start ``MIN_ANCHOR_CHARS`` equal characters, or where both reach the common end;
    and the characters searched."""
    best = (to_end_a, to_end_b) if to_end_a <= span and to_end_b <= span else None
    cost = to_end_a + to_end_b if best is not None else 2 * span + 1
    work = 0
    for db in range(min(span, to_end_b - MIN_ANCHOR_CHARS) + 1):
        if db >= cost:
            break
        hi = min(len(a), i + min(span, cost - db - 1) + MIN_ANCHOR_CHARS)
        if hi - i < MIN_ANCHOR_CHARS:
            continue
        work += hi - i
        pos = a.find(b[j + db : j + db + MIN_ANCHOR_CHARS], i, hi)
        if pos >= 0 and (pos - i) + db < cost:
            best, cost = (pos - i, db), (pos - i) + db
    return best, work


def _regions(evaluated: str, modified: str) -> list[tuple[int, int, int, int]]:
    return align(evaluated, modified).regions


def release(evaluated: str, modified: str | None, start: int, cut: int) -> tuple[str, int]:
    """What to send of ``evaluated[start:cut]`` (``start``: where the released text ends, ``cut``:
    where this release may end) given the decision's redaction of ``evaluated``, and where in
    ``evaluated`` the release really ends: a redaction that straddles ``cut`` is held back whole
    (the next window sees it again), one that straddles ``start`` is sent whole after what was
    already released of it (a match longer than the context, released in part before it was
    whole)."""
    if modified is None or modified == evaluated:
        return evaluated[start:cut], cut
    regions = _regions(evaluated, modified)
    for i1, i2, _j1, _j2 in regions:
        if i1 < cut < i2:
            cut = i1
    if cut <= start:
        return "", start

    def mapped(p: int) -> int:  # a position outside every region, in the modified text
        shift = sum((j2 - j1) - (i2 - i1) for i1, i2, j1, j2 in regions if i2 <= p and i1 < p)
        return p + shift

    begin = mapped(start)
    for i1, i2, j1, _j2 in regions:
        if i1 < start < i2:
            begin = j1
    return modified[begin : mapped(cut)], cut


Judge = Callable[[str, int, bool], Awaitable[Verdict]]  # (text, window, final) -> the content's verdict
OutsideJudge = Callable[[str], Awaitable[Verdict]]


class StreamGuard:
    """One streamed choice: ``run()`` yields the SSE bytes to send, or one :class:`Blocked`
    (then nothing more). ``judge`` evaluates a window (``final``: the whole answer, audited);
    ``outside`` the text the choice carries outside its content, at the end."""

    def __init__(
        self,
        resp: httpx.Response,
        windows: Windows,
        judge: Judge,
        outside: OutsideJudge,
        *,
        deadline: float,
        max_bytes: int,
        include_usage: bool,
        max_text_bytes: int | None = None,
        fields: chat.Fields | None = None,
        tools: CallJudge | None = None,
        refusal: str | None = None,
    ) -> None:
        self.resp = resp
        # Each tool call held until complete, judged, then released or dropped (toolstream.py);
        # without a judge the calls stay with the other text outside the content, to the end.
        self.calls = HeldCalls(tools, max_bytes=max_text_bytes, on_judged=self._wake) if tools is not None else None
        self.refusal = refusal  # on_block: refusal: a blocked call is dropped, this said in its place
        self.fields = fields if fields is not None else chat.Fields(None)  # the answer's id, model, ... as sent
        self.windows = windows
        self.judge = judge
        self.outside = outside
        self.deadline = deadline
        self.max_bytes = max_bytes
        # The answer's text must fit the final (audited) decision's request: beyond this, reading
        # stops before any more is released, so nothing reaches the caller that cannot be audited.
        self.max_text_bytes = max_text_bytes
        self.text_bytes = 0
        self.include_usage = include_usage
        self._text = io.StringIO()  # the answer's content so far, as the upstream wrote it (appends O(1))
        self.length = 0
        self.chunks = Chunks()  # the events carrying more than content: outside text, the finish, usage
        self.ended = False
        self.failure: ProxyError | None = None  # the upstream's, once reading stopped on it
        self.final: list[Verdict] = []  # the final decisions (content, then outside), once made
        self.windows_done = 0
        self._grew = asyncio.Event()
        self._base: dict[str, Any] = {}
        self._role_sent = False
        self.early = False  # text went out before the final decision: its ids ride on the last chunk
        self.released = 0  # characters of the text released so far
        self.recorded = False  # an audited decision covers what was released (the final one, or a block)

    # -- reading ---------------------------------------------------------------------------

    async def _events(self) -> AsyncIterator[dict[str, Any]]:
        """The upstream's events as JSON objects, up to ``[DONE]`` (SSE: ``data:`` lines, a blank
        line ends an event; other fields and comments are ignored)."""
        data: list[str] = []
        async for line in self._lines():
            if line:
                if line.startswith("data:"):
                    data.append(line[5:].removeprefix(" "))
                continue
            if not data:
                continue
            text, data = "\n".join(data), []
            if text == DONE:
                return
            yield _event(text)
        if data and "\n".join(data) != DONE:
            yield _event("\n".join(data))

    async def _lines(self) -> AsyncIterator[str]:
        """The body's lines (SSE: CR LF, LF or CR ends one), its bytes counted as they arrive: a
        line that never ends is cut at ``max_bytes`` too, not held whole until its end comes."""
        seen = 0
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        pending: list[str] = []  # the line being read, in pieces (joined once its end comes: linear)
        async for piece in self.resp.aiter_bytes():
            seen += len(piece)
            if seen > self.max_bytes:
                raise ProxyError(
                    502,
                    f"the upstream's answer is over {self.max_bytes} bytes, the most the guard holds",
                    "server_error",
                    "upstream_response_too_large",
                )
            text = decoder.decode(piece)
            if "\n" not in text and "\r" not in text:
                pending.append(text)
                continue
            buf = "".join(pending) + text
            cut = len(buf) - 1 if buf.endswith("\r") else len(buf)  # a CR last may be half of a CR LF
            *lines, tail = _EOL.split(buf[:cut])
            pending = [tail + buf[cut:]]
            for line in lines:
                yield line
        *lines, tail = _EOL.split("".join(pending) + decoder.decode(b"", final=True))
        for line in [*lines, tail] if tail else lines:
            yield line

    async def _read(self) -> None:
        try:
            async with asyncio.timeout_at(self.deadline):
                async for obj in self._events():
                    self._take(obj)
                    self._grew.set()
                if self.calls is not None:
                    self.calls.complete()  # a stream that ends without a finish reason ends its last call
        except ProxyError as e:
            self.failure = e
        except TimeoutError:
            self.failure = ProxyError(
                504,
                "the upstream did not finish its answer in time (limits.upstream_timeout_s)",
                "server_error",
                "upstream_timeout",
            )
        except httpx.HTTPError as e:
            self.failure = ProxyError(
                502, f"the upstream connection failed: {type(e).__name__}", "server_error", "upstream_error"
            )
        except Exception as e:  # whatever stopped the reading, the rest is not released unevaluated
            log.error("reading the upstream's stream failed", exc_info=e)
            self.failure = ProxyError(502, "reading the upstream's stream failed", "server_error", "upstream_error")
        finally:
            self.ended = True
            self._grew.set()

    def _take(self, obj: dict[str, Any]) -> None:
        """One event: its choices checked (choice 0 only, once), its content added to the text."""
        choices = obj.get("choices")
        if choices is not None:
            if not isinstance(choices, list):
                raise _invalid("an event's choices are not a list")
            try:
                indices = [chat._index(c, "a streamed choice") for c in choices]
            except ValueError as e:
                raise _invalid(str(e)) from None
            if any(i != 0 for i in indices) or len(indices) > 1:
                raise _invalid("a stream of one choice carries another choice index, or choice 0 twice in an event")
            for k, choice in enumerate(choices):
                delta = choice.get("delta")
                content = delta.get("content") if isinstance(delta, dict) else None
                if content is not None and not isinstance(content, str):
                    raise _invalid("a delta's content is not text")
                if content:
                    self._count(content)
                    self._text.seek(self.length)
                    self.length += self._text.write(content)
                if self.calls is not None and isinstance(delta, dict) and "tool_calls" in delta:
                    self._take_calls(delta["tool_calls"])
                    choices = [*choices[:k], {**choice, "delta": {x: v for x, v in delta.items() if x != "tool_calls"}},
                               *choices[k + 1 :]]  # fmt: skip
                    obj = {**obj, "choices": choices}
                if self.calls is not None and choice.get("finish_reason"):
                    self.calls.complete()
        if not self._base:
            base = {k: obj[k] for k in ("id", "created", "model", "system_fingerprint") if k in obj}
            self._base = self.fields.top(base)
            self._base["object"] = "chat.completion.chunk"
        if obj.get("usage") is not None or any(_more_than_content(c) for c in choices or []):
            self.chunks.raw.append("")
            self.chunks.parsed.append(obj)

    def _take_calls(self, pieces: Any) -> None:
        assert self.calls is not None
        try:
            self.calls.take(pieces)
        except ValueError as e:
            raise _invalid(str(e)) from None
        except OverflowError:
            raise ProxyError(
                502,
                f"a tool call's arguments are over {self.max_text_bytes} bytes, the most its decision can carry "
                "(limits.max_request_bytes, less the prompt and context)",
                "server_error",
                "upstream_response_too_large",
            ) from None

    def _wake(self) -> None:
        self._grew.set()

    def _count(self, content: str) -> None:
        if self.max_text_bytes is None:
            return
        self.text_bytes += len(content.encode("utf-8", "surrogatepass"))
        if self.text_bytes > self.max_text_bytes:
            raise ProxyError(
                502,
                f"the upstream's answer is over {self.max_text_bytes} bytes of text, the most its decision can "
                "carry (limits.max_request_bytes, less the prompt and context)",
                "server_error",
                "upstream_response_too_large",
            )

    def text(self, begin: int, end: int) -> str:
        self._text.seek(begin)
        return self._text.read(end - begin)

    # -- releasing -------------------------------------------------------------------------

    async def run(self) -> AsyncGenerator[bytes | Blocked, None]:
        reader = asyncio.create_task(self._read())
        try:
            async for item in self._windows():
                yield item
        finally:
            reader.cancel()
            if self.calls is not None:
                self.calls.cancel()
            # Its own task: a caller that hung up cancels this generator, not the closing and the audit.
            settle = asyncio.ensure_future(self._settle(reader))
            _SETTLING.add(settle)
            settle.add_done_callback(_SETTLING.discard)
            await asyncio.shield(settle)

    async def _settle(self, reader: asyncio.Task[None]) -> None:
        """The upstream closed; text released under provisional decisions only (the upstream
        failed, or the caller hung up, before the final one) gets its audited decision."""
        await asyncio.gather(reader, return_exceptions=True)
        await self.resp.aclose()
        if self.released and not self.recorded:
            try:
                await self.judge(self.text(0, self.released), self.windows_done, True)
            except Exception as e:
                log.error("auditing the text released before the stream broke off failed", exc_info=e)

    def _window_ready(self, last_end: int) -> bool:
        size, context = self.windows.window_chars, self.windows.context_chars
        return self.length - self.released >= size and self.length >= last_end + size - context

    async def _windows(self) -> AsyncIterator[bytes | Blocked]:
        context = self.windows.context_chars
        last_end = 0  # where the last evaluation ended
        while True:
            while not (self.ended or self._window_ready(last_end) or self._call_judged()):
                self._grew.clear()
                await self._grew.wait()
            if self.failure is not None:
                raise self.failure
            async for item in self._release_calls(wait=False):  # judged calls go out beside the text
                yield item
                if isinstance(item, Blocked):
                    return
            if not (self.ended or self._window_ready(last_end)):
                continue
            final = self.ended
            end = self.length
            begin = 0 if final else max(0, self.released - context)  # the final decision covers the whole answer
            evaluated = self.text(begin, end)
            self.windows_done += 1
            if final:
                verdict, outside = await self._final(evaluated)
            else:
                verdict, outside = await self.judge(evaluated, self.windows_done, False), None
            self.recorded = final or verdict.blocked  # a block is audited, final or not
            if verdict.blocked:
                yield Blocked(verdict, self.windows_done)
                return
            if outside is not None and (outside.blocked or outside.text is not None):
                yield Blocked(outside, self.windows_done, unredactable=not outside.blocked)
                return
            if final:  # every call, judged, before the last text: a block now is still an HTTP error
                async for item in self._release_calls(wait=True):
                    yield item
                    if isinstance(item, Blocked):
                        return
            cut = end - begin if final else end - begin - context
            args = (evaluated, verdict.text, self.released - begin, cut)
            if verdict.text is not None and len(evaluated) > RELEASE_INLINE_CHARS and verdict.text != evaluated:
                sent, upto = await asyncio.to_thread(release, *args)  # bounded, yet not on every caller's loop
            else:
                sent, upto = release(*args)
            self.released, last_end = begin + upto, end
            if sent or (final and not self._role_sent):
                self.early = self.early or not final
                yield self._content(sent)
            if final:
                for event in self._ending():
                    yield event
                return

    async def _final(self, whole: str) -> tuple[Verdict, Verdict | None]:
        """The whole answer's decision (audited), and its outside text's when it has some."""
        text = chat.outside_text(self._outside_parts())
        if text is None:
            verdict = await self.judge(whole, self.windows_done, True)
            self.final = [verdict]
            return verdict, None
        verdict, outside = await asyncio.gather(self.judge(whole, self.windows_done, True), self.outside(text))
        self.final = [verdict, outside]
        return verdict, outside if outside.blocked or (outside.text is not None and outside.text != text) else None

    def _call_judged(self) -> bool:
        return self.calls is not None and self.calls.head() is not None

    async def _release_calls(self, *, wait: bool) -> AsyncIterator[bytes | Blocked]:
        """The judged calls, in the order they began (``wait``: every one, once judged): a call
        that passes goes out whole in one delta, its arguments redacted when a rule redacts them;
        a blocked one is dropped (on_block: refusal) or stops the stream (its policy's error), and
        so does a call whose text the output stage blocks or would redact (it cannot be rewritten
        there: docs/proxy.md)."""
        if self.calls is None:
            return
        while not self.calls.all_handled:
            held = self.calls.head()
            if held is None:
                if not wait:
                    return
                await asyncio.wait(self.calls.pending(), return_when=asyncio.FIRST_COMPLETED)
                continue
            assert held.task is not None
            tool, output = held.task.result()  # a failed evaluation raises: the stream ends on its error
            whole = held.whole()
            changed = not tool.blocked and tool.text is not None and tool.text != whole.arguments
            if output.blocked or (output.text is not None and output.text != call_text(whole)):
                self.calls.done(held, tool, output, sent=False)
                yield Blocked(output, self.windows_done, unredactable=not output.blocked)
                return
            if tool.blocked:
                self.calls.done(held, tool, output, sent=False)
                if self.refusal is None:
                    yield Blocked(tool, self.windows_done, stage="tool_call")
                    return
                continue  # dropped: the refusal is said at the end, in the content
            index = self.calls.sent
            self.calls.done(held, tool, output, sent=True)
            self.early = self.early or not self.final
            yield self._call_event(held, index, tool.text if changed and tool.text is not None else whole.arguments)

    def _call_event(self, held: HeldCall, index: int, arguments: str) -> bytes:
        call: dict[str, Any] = {"index": index}
        if held.call_id is not None:
            call["id"] = held.call_id
        if held.type is not None:
            call["type"] = held.type
        call["function"] = {"name": held.name, "arguments": arguments}
        return self._delta({"tool_calls": [call]})

    def decided(self, stage: str) -> list[Verdict]:
        """The decisions made so far at ``stage`` ("output": the content's and outside text's, then
        each released or dropped call's text; "tool_call": each call's), in order."""
        if self.calls is None:
            return list(self.final) if stage == "output" else []
        if stage == "output":
            return [*self.final, *self.calls.output_verdicts]
        return list(self.calls.tool_verdicts)

    def _outside_parts(self) -> dict[str, list[str]]:
        parts: dict[str, list[str]] = {}
        for obj in self.chunks.parsed:
            for choice in obj.get("choices") or []:
                chat.outside_parts(choice.get("delta"), parts)
        return parts

    def _content(self, text: str) -> bytes:
        return self._delta({"content": text})

    def _delta(self, delta: dict[str, Any]) -> bytes:
        if not self._role_sent:
            delta = {"role": "assistant", **delta}
            self._role_sent = True
        choice = {"index": 0, "delta": self.fields.message(delta), "finish_reason": None}
        return chat.encode_event({**self._base, "choices": [choice]})

    def _ending(self) -> list[bytes]:
        """The held events: the choice's fields outside its content (evaluated), its finish, the
        usage; then ``[DONE]``."""
        out: list[bytes] = []
        finish = "stop"
        usage = None
        for obj in self.chunks.parsed:
            if obj.get("usage") is not None:
                usage = obj["usage"]
            for choice in obj.get("choices") or []:
                if choice.get("finish_reason"):
                    finish = self.fields.finish(choice["finish_reason"])
                delta = choice.get("delta")
                if isinstance(delta, dict) and chat.outside_parts(delta):
                    kept = self.fields.message({k: v for k, v in delta.items() if k not in ("role", "content")})
                    out.append(chat.encode_event({**self._base, "choices": [{"index": 0, "delta": kept}]}))
        if self.calls is not None and self.calls.dropped:  # blocked calls, dropped: the refusal says so
            out.append(self._content(self.refusal or ""))
            if not self.calls.sent:
                finish = chat.REFUSAL_FINISH_REASON
        last: dict[str, Any] = {**self._base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}
        if self.early:  # the response's headers went out before these decisions were made
            output = self.decided("output")
            last["crossaudit"] = {
                "output_decision_id": ",".join(v.decision_id for v in output if v.decision_id),
                "output_action": ",".join(v.action for v in output),
            }
            calls = self.decided("tool_call")
            if calls:
                last["crossaudit"]["tool_call_decision_id"] = ",".join(v.decision_id for v in calls if v.decision_id)
                last["crossaudit"]["tool_call_action"] = ",".join(v.action for v in calls)
        out.append(chat.encode_event(last))
        if self.include_usage and usage is not None:
            out.append(chat.encode_event({**self._base, "choices": [], "usage": usage}))
        out.append(SSE_DONE)
        return out

    def cut(self, refusal: str | None, error: ProxyError | None) -> list[bytes]:
        """The end of a stream stopped after text was sent: the refusal and ``content_filter``,
        or an OpenAI-style error event; no ``[DONE]`` after an error (the SDKs raise on it)."""
        if error is not None:
            return [chat.encode_event(error.body())]
        base = self._base or {"object": "chat.completion.chunk"}
        choice = {"index": 0, "delta": {"content": refusal}, "finish_reason": chat.REFUSAL_FINISH_REASON}
        return [chat.encode_event({**base, "choices": [choice]}), SSE_DONE]


_SETTLING: set[asyncio.Future[None]] = set()  # streams closing after their caller left (a task needs a reference)


def _more_than_content(choice: Any) -> bool:
    delta = choice.get("delta") if isinstance(choice, dict) else None
    return bool(choice.get("finish_reason") or chat.outside_parts(delta)) if isinstance(choice, dict) else False


def _event(text: str) -> dict[str, Any]:
    try:
        obj = json.loads(text)
    except ValueError:
        raise _invalid("a streamed event is not JSON") from None
    if not isinstance(obj, dict):
        raise _invalid("a streamed event is not a JSON object")
    if "error" in obj:
        err = obj["error"]
        message = err.get("message") if isinstance(err, dict) else err
        raise ProxyError(
            502, f"the upstream reported an error mid-stream: {str(message)[:500]}", "server_error", "upstream_error"
        )
    return obj


def _invalid(message: str) -> ProxyError:
    return ProxyError(
        502, f"the upstream's answer is not a chat completion: {message}", "server_error", "upstream_invalid_response"
    )
