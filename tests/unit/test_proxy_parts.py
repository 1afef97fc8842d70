"""The guard proxy's pure parts: its configuration (what an operator may and may not write) and
the chat-completions format (texts, buffered streams put back with a change). End to end, with
the openai SDK, a real server and an upstream stub: tests/e2e/test_proxy.py."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from crossaudit.kernel.errors import (
    ConfigurationError,
    CrossAuditError,
    DeadlineExceededError,
    InvalidInputError,
    NotFoundError,
    RateLimitedError,
    ServerUnavailableError,
    StoreUnavailableError,
    UnauthenticatedError,
)
from crossaudit.proxy import chat
from crossaudit.proxy.chat import Change, ProxyError
from crossaudit.proxy.config import PolicyRun, build, read_file
from crossaudit.proxy.guard import Guard
from crossaudit.proxy.stream import StreamGuard, Windows, release

KEY = "caller-key-0123456789abcdef"


def write(tmp_path: Path, doc: dict[str, Any], mode: int = 0o600) -> Path:
    path = tmp_path / "proxy.yaml"
    path.write_text(yaml.safe_dump(doc))
    path.chmod(mode)
    return path


def caller(**kw: Any) -> dict[str, Any]:
    return {"keys": [KEY], "policies": ["p"], **kw}


def test_a_configuration_with_caller_keys_must_be_private(tmp_path: Path) -> None:
    doc = {"upstream": {"url": "http://127.0.0.1:9/v1"}, "callers": {"app": caller()}}
    with pytest.raises(ConfigurationError, match="group or others"):
        read_file(write(tmp_path, doc, 0o644))
    config = build(read_file(write(tmp_path, doc)))
    assert config.caller(KEY) is not None and config.caller(KEY).name == "app"  # type: ignore[union-attr]
    assert config.caller("caller-key-0123456789abcdeX") is None and config.caller(None) is None


@pytest.mark.parametrize(
    ("doc", "problem"),
    [
        ({"callers": {"app": caller(keys=["short"])}}, "at least 16"),
        ({"callers": {"app": caller(default_policy="q")}}, "not among the caller's policies"),
        ({"callers": {"a": caller(), "b": caller()}}, "also given to caller 'a'"),
        ({"callers": {"app": caller()}, "limits": {"max_request_byte": 5}}, "unknown limit"),
        ({"callers": {"app": caller()}, "limits": {"max_messages": 0}}, "positive"),
        ({"callers": {"app": caller()}, "limits": {"max_messages": 1.5}}, "whole number"),
        ({"callers": {"app": caller()}, "upstream": {"url": "ftp://x"}}, "http:// or https://"),
        ({"callers": {"app": caller()}, "upstream": {"url": "http://x", "headers": {"Authorization": "k"}}}, "api_key"),
        ({"callers": {"app": caller()}, "upstream": {"url": "http://x", "api_key": {"env": "A", "file": "b"}}}, "one"),
        ({"callers": {"app": caller()}, "upsteam": {}}, "upsteam"),
        ({}, "no callers"),
    ],
)
def test_configuration_mistakes_are_one_clear_error(tmp_path: Path, doc: dict[str, Any], problem: str) -> None:
    doc = {"upstream": {"url": "http://127.0.0.1:9/v1"}, **doc}
    with pytest.raises(ConfigurationError, match=problem):
        build(read_file(write(tmp_path, doc)))


def test_dev_mode_and_non_loopback_addresses(tmp_path: Path) -> None:
    dev = build(None, upstream="http://127.0.0.1:9/v1", dev=True, policy="p")
    assert dev.caller(None) is dev.caller("anything") is dev.dev_caller
    assert dev.dev_caller is not None and dev.dev_caller.may_use("any policy") and dev.dev_caller.default_policy == "p"
    with pytest.raises(ConfigurationError, match="loopback only"):
        build(None, upstream="http://127.0.0.1:9/v1", dev=True, host="0.0.0.0")
    doc = {"upstream": {"url": "http://127.0.0.1:9/v1"}, "callers": {"app": caller()}}
    with pytest.raises(ConfigurationError, match="TLS"):
        build(read_file(write(tmp_path, doc)), host="0.0.0.0")
    with pytest.raises(ConfigurationError, match="--dev serves without caller keys"):
        build(read_file(write(tmp_path, doc)), dev=True)


def test_per_caller_overrides(tmp_path: Path) -> None:
    doc = {
        "upstream": {"url": "http://127.0.0.1:9/v1"},
        "on_block": "refusal",
        "callers": {"a": caller(), "b": caller(keys=["other-key-0123456789abcdef"], on_block="error", fail_open=True)},
    }
    config = build(read_file(write(tmp_path, doc)))
    a, b = config.caller(KEY), config.caller("other-key-0123456789abcdef")
    assert a is not None and b is not None
    assert (a.on_block, a.fail_open) == ("refusal", False) and (b.on_block, b.fail_open) == ("error", True)


def test_yaml_errors_say_where(tmp_path: Path) -> None:
    path = tmp_path / "proxy.yaml"
    path.write_text("callers:\n  app: [\n")
    with pytest.raises(ConfigurationError, match=r"proxy configuration .*proxy\.yaml:\d+:\d+: YAML syntax"):
        read_file(path)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("callers: {}\ncallers: {}\n", r"proxy\.yaml:2:1: duplicate key 'callers'"),
        ("a: &x 1\nb: *x\n", r"proxy\.yaml:1:4: YAML anchors and aliases are not allowed"),
        ("- callers\n", r"proxy\.yaml: the top level must be a mapping"),
        ("callers:\n  app: {keys: [short], policies: [p]}\n", r"proxy\.yaml:2:\d+: callers\.app\.keys: .*at least 16"),
    ],
)
def test_the_configuration_is_read_like_the_servers(tmp_path: Path, text: str, problem: str) -> None:
    """The server's hardened reader: no duplicate keys or aliases, a mapping, mistakes at line:col."""
    path = tmp_path / "proxy.yaml"
    path.write_text(text)
    path.chmod(0o600)
    with pytest.raises(ConfigurationError, match=problem):
        read_file(path)


def test_a_configuration_over_the_servers_limit_is_refused_unread(tmp_path: Path) -> None:
    from crossaudit.kernel.configfile import MAX_CONFIG_FILE_BYTES

    path = tmp_path / "proxy.yaml"
    path.write_text("#" * (MAX_CONFIG_FILE_BYTES + 1))
    with pytest.raises(ConfigurationError, match=f"larger than {MAX_CONFIG_FILE_BYTES} bytes"):
        read_file(path)
    path.write_text("# comments only\n")
    assert read_file(path).callers == {}


def test_request_parsing_and_texts() -> None:
    payload = chat.parse_request(
        json.dumps(
            {
                "model": "m",
                "messages": [
                    {"role": "system", "content": "be nice"},
                    {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                    {"role": "assistant", "content": None, "tool_calls": []},
                    {"role": "user", "content": "last"},
                ],
            }
        ).encode(),
        max_messages=10,
        max_choices=2,
    )
    msgs = payload["messages"]
    assert chat.input_targets(msgs, "last_user") == [3]
    assert chat.input_targets(msgs, "all") == [0, 1, 2, 3]  # a tool-call turn has text outside content
    assert chat.message_text(msgs[1], "m") == "a\nb"
    assert chat.message_text(msgs[2], "m") is None
    with pytest.raises(ProxyError) as info:
        chat.message_text({"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}, "messages[0]")
    assert info.value.code == "unsupported_content" and info.value.status == 400
    with pytest.raises(ProxyError, match="4 messages: at most 1"):
        chat.parse_request(json.dumps({"messages": msgs}).encode(), max_messages=1, max_choices=2)


def test_text_outside_content_is_put_back_together() -> None:
    """Tool-call arguments stream in pieces (by the call's own index); each field is evaluated whole."""
    message = {
        "role": "assistant",
        "content": "hi",
        "name": "bot",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}],
    }
    assert chat.outside_text(chat.outside_parts(message)) == 'bot\nf\n{"a": 1}'
    assert chat.outside_text(chat.outside_parts({"role": "user", "content": "x"})) is None
    pieces = ['{"t": "TOP-', 'SECRET"}']
    chunks = chat.parse_stream(
        sse(
            *(
                {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 1, "function": {"arguments": p}}]}}]}
                for p in pieces
            ),
            {"choices": [{"index": 0, "delta": {"reasoning_content": "why"}}]},
        )
    )
    assert chunks.outside() == {0: '{"t": "TOP-SECRET"}\nwhy'}
    assert b"TOP" not in b"".join(chunks.replay({0: chat.Change("no", refused=True)}))


def sse(*chunks: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b": keep-alive\n\ndata: [DONE]\n\n"


def delta(index: int, content: str | None = None, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    d: dict[str, Any] = dict(extra)
    if content is not None:
        d["content"] = content
    return {
        "id": "c",
        "object": "chat.completion.chunk",
        "choices": [{"index": index, "delta": d, "finish_reason": finish}],
    }


def test_a_buffered_stream_is_replayed_with_only_the_changed_choice_rewritten() -> None:
    body = sse(
        delta(0, "", role="assistant"),
        delta(1, "", role="assistant"),
        delta(0, "mail bo"),
        delta(1, "fine"),
        delta(0, "b@x.io"),
        delta(0, finish="stop"),
        delta(1, finish="stop"),
        {"id": "c", "object": "chat.completion.chunk", "choices": [], "usage": {"total_tokens": 3}},
    )
    chunks = chat.parse_stream(body)
    assert chunks.texts() == {0: "mail bob@x.io", 1: "fine"}
    events = chunks.replay({0: Change("mail [EMAIL]")})
    assert events[-1] == chat.SSE_DONE
    replayed = chat.parse_stream(b"".join(events))
    assert replayed.texts() == {0: "mail [EMAIL]", 1: "fine"}
    assert replayed.parsed[-1]["usage"] == {"total_tokens": 3}
    unchanged = [e for e, raw in zip(events, chunks.raw, strict=False) if e == f"data: {raw}\n\n".encode()]
    assert len(unchanged) >= 4  # the other choice's chunks and the usage chunk go out byte for byte
    refused = chat.parse_stream(b"".join(chunks.replay({1: Change("no", refused=True)})))
    assert refused.texts() == {0: "mail bob@x.io", 1: "no"}
    finishes = [
        c["choices"][0]["finish_reason"] for c in refused.parsed if c["choices"] and c["choices"][0]["index"] == 1
    ]
    assert finishes[-1] == "content_filter"


def test_stream_failures_are_errors() -> None:
    with pytest.raises(ValueError, match="mid-stream: overloaded"):
        chat.parse_stream(sse(delta(0, "a"), {"error": {"message": "overloaded"}}))
    with pytest.raises(ValueError, match="not JSON"):
        chat.parse_stream(b"data: {oops\n\n")
    with pytest.raises(ValueError, match="not text"):
        chat.parse_stream(sse({"choices": [{"index": 0, "delta": {"content": 5}}]})).texts()


def test_a_completion_as_a_stream_and_a_refusal() -> None:
    completion = chat.refusal_completion("m", "no", 2)
    assert chat.completion_texts(completion) == {0: "no", 1: "no"}
    events = chat.completion_chunks(completion, include_usage=True)
    replayed = chat.parse_stream(b"".join(events))
    assert replayed.texts() == {0: "no", 1: "no"}
    assert replayed.parsed[-1]["usage"]["total_tokens"] == 0
    rewritten = chat.rewrite_completion(completion, {1: Change("yes")})
    assert chat.completion_texts(rewritten) == {0: "no", 1: "yes"} and chat.completion_texts(completion)[1] == "no"


def answer(*indices: Any) -> dict[str, Any]:
    choices = [{"message": {"role": "assistant", "content": f"text {k}"}} for k in range(len(indices))]
    for choice, idx in zip(choices, indices, strict=True):
        if idx is not None:
            choice["index"] = idx
    return {"choices": choices}


@pytest.mark.parametrize(
    ("indices", "asked", "problem"),
    [
        ((0, 0), 2, r"choice index 0 appears twice \(choices\[0\] and choices\[1\]\)"),
        ((1, "1"), 2, r"choices\[1\]'s index is a string, not an integer"),
        ((1, 1.0), 2, "a number with a fraction part"),
        ((1, True), 2, "a boolean"),
        ((1, None), 2, r"choices\[1\] has no index"),
        ((0, 2), 2, r"indices are 0, 2, not 0..1 each once"),
        ((1,), 2, r"indices are 1, not 0..0"),
        ((0, 1), 1, "2 choices, but the request asked for 1"),
    ],
)
def test_answer_choice_indices_are_exactly_0_to_n_minus_1(indices: tuple[Any, ...], asked: int, problem: str) -> None:
    """Read by index, a repeated or non-integer index let one choice go unevaluated; the JSON
    answer's choices are taken by position once their indices are exactly 0..n-1."""
    with pytest.raises(ValueError, match=problem):
        chat.completion_texts(answer(*indices), asked=asked)
    with pytest.raises(ValueError, match=problem):
        chat.completion_outside(answer(*indices), asked=asked)
    assert chat.completion_texts(answer(1, 0), asked=2) == {1: "text 0", 0: "text 1"}  # any order, once each


@pytest.mark.parametrize(
    ("chunks", "problem"),
    [
        ([[(0, "a"), (0, "b")]], "event 0 carries choice index 0 twice"),
        ([[(0, "a")], [(1, "b"), (0.0, "c")]], r"event 1's choices\[1\]'s index is a number with a fraction part"),
        ([[(0, "a")], [("0", "b")]], "a string"),
        ([[(None, "a")]], "has no index"),
        ([[(1, "a")], [(2, "b")]], "indices are 1, 2, not 0..1"),
        ([[(0, "a")], [(1, "b")], [(2, "c")]], "3 choices, but the request asked for 2"),
    ],
)
def test_stream_choice_indices_are_integers_once_per_chunk(chunks: list[list[tuple[Any, str]]], problem: str) -> None:
    def event(choices: list[tuple[Any, str]]) -> dict[str, Any]:
        out = []
        for idx, text in choices:
            choice: dict[str, Any] = {"delta": {"content": text}}
            if idx is not None:
                choice["index"] = idx
            out.append(choice)
        return {"choices": out}

    parsed = chat.parse_stream(sse(*(event(c) for c in chunks)))
    for read in (parsed.texts, parsed.outside):
        with pytest.raises(ValueError, match=problem):
            read(asked=2)


def test_stream_choices_may_interleave() -> None:
    body = sse(delta(1, "TOP-"), delta(0, "fi"), delta(1, "SECRET"), delta(0, "ne"), delta(1, finish="stop"))
    chunks = chat.parse_stream(body)
    assert chunks.texts(asked=2) == {1: "TOP-SECRET", 0: "fine"}
    refused = chat.parse_stream(b"".join(chunks.replay({1: Change("no", refused=True)})))
    assert refused.texts() == {1: "no", 0: "fine"}


@pytest.mark.parametrize(
    ("error", "fail_open", "status", "code"),
    [
        (StoreUnavailableError("down"), False, 503, "guard_unavailable"),
        (StoreUnavailableError("down"), True, None, None),  # fail_open: the stage passes
        (DeadlineExceededError("slow"), True, None, None),
        (RateLimitedError("too many in flight"), True, 503, "guard_overloaded"),  # a caller can cause it: closed
        (NotFoundError("no such policy"), True, 404, "policy_not_found"),
        (UnauthenticatedError("bad key"), True, 503, "guard_unavailable"),  # the operator's mistake: closed
        (ServerUnavailableError("cannot reach 127.0.0.1:1"), False, 503, "guard_unavailable"),
        (InvalidInputError("too long"), False, 400, "guard_rejected"),
    ],
)
def test_what_crossaudit_errors_become(
    error: CrossAuditError, fail_open: bool, status: int | None, code: str | None
) -> None:
    config = build(None, upstream="http://127.0.0.1:9/v1", dev=True, fail_open=fail_open)
    assert config.dev_caller is not None
    guard = Guard(config)
    if status is None:
        verdict = guard._failed(error, config.dev_caller, "p", "input")
        assert (
            verdict.action == "fail-open" and not verdict.blocked and verdict.text is None and not verdict.decision_id
        )
        return
    with pytest.raises(ProxyError) as info:
        guard._failed(error, config.dev_caller, "p", "input")
    assert (info.value.status, info.value.code) == (status, code)
    # the guard's failures are not retried by the openai SDKs (they honour x-should-retry) and say
    # why; an overloaded tenant is a rate limit, which a later retry may pass
    unavailable = code == "guard_unavailable"
    assert (info.value.headers.get("x-should-retry") == "false") is unavailable
    if unavailable:
        assert info.value.message.startswith("the guard could not evaluate the request: ")


def test_streaming_settings_per_policy(tmp_path: Path) -> None:
    doc = {
        "upstream": {"url": "http://127.0.0.1:9/v1"},
        "callers": {"a": caller()},
        "input_mode": "parallel",
        "policies": {"slow": {"input_mode": "blocking", "stream_window_chars": 512}, "whole": {"stream": "buffered"}},
        "limits": {"stream_window_chars": 128, "stream_context_chars": 32},
    }
    config = build(read_file(write(tmp_path, doc)))
    assert config.policy_run("other") == PolicyRun("parallel", "windows", 128, 32)
    assert config.policy_run("slow") == PolicyRun("blocking", "windows", 512, 32)
    assert config.policy_run("whole").stream == "buffered"
    plain = {k: v for k, v in doc.items() if k not in ("input_mode", "policies", "limits")}
    assert build(read_file(write(tmp_path, plain))).run == PolicyRun()
    for bad in ({"limits": {"stream_window_chars": 32}}, {"policies": {"p": {"stream_context_chars": 128}}}):
        with pytest.raises(ConfigurationError, match="must be less than stream_window_chars"):
            build(read_file(write(tmp_path, {**doc, **bad})))
    with pytest.raises(ConfigurationError, match="input_mode"):
        build(read_file(write(tmp_path, {**doc, "input_mode": "eager"})))


@pytest.mark.parametrize(
    ("evaluated", "modified", "start", "cut", "sent", "upto"),
    [
        ("hello world", None, 0, 8, "hello wo", 8),  # nothing changed: up to the cut
        ("hello world", "hello world", 3, 8, "lo wo", 8),
        # a redaction before the cut is sent redacted
        ("mail bob@corp.example now, thanks", "mail [EMAIL] now, thanks", 0, 30, "mail [EMAIL] now, tha", 30),
        # one straddling the cut is held back whole
        ("mail bob@corp.example now", "mail [EMAIL] now", 0, 12, "mail ", 5),
        # one straddling the start (a match longer than the context, partly sent) is sent whole after it
        ("mail bob@corp.example now", "mail [EMAIL] now", 8, 25, "[EMAIL] now", 25),
        # nothing to send when a redaction covers the whole range
        ("xx bob@corp.example", "xx [EMAIL]", 5, 10, "", 5),
        # two redactions, the second after the cut
        ("a@b.cc and then c@d.ee and more", "[E] and then [E] and more", 0, 9, "[E] an", 9),
        # closer than MIN_ANCHOR_CHARS they are one region, held back together
        ("a@b.cc and c@d.ee and more", "[E] and [E] and more", 0, 9, "", 0),
    ],
)
def test_a_windows_release_maps_a_redaction(
    evaluated: str, modified: str | None, start: int, cut: int, sent: str, upto: int
) -> None:
    assert release(evaluated, modified, start, cut) == (sent, upto)


def _lines_of(pieces: list[bytes], max_bytes: int = 1 << 20) -> list[str]:
    async def body() -> Any:
        for p in pieces:
            yield p

    async def read() -> list[str]:
        resp = httpx.Response(200, content=body())
        guard = StreamGuard(resp, Windows(8, 2), None, None, deadline=0.0, max_bytes=max_bytes, include_usage=False)  # type: ignore[arg-type]
        return [line async for line in guard._lines()]

    return asyncio.run(read())


def test_stream_lines_split_as_sse_says_whatever_the_pieces() -> None:
    """CR LF, LF and CR end a line; a CR LF or a UTF-8 character split over two reads is one."""
    pieces = [b"data: a\r", b"\n\r\nda", b"ta: \xc3", b"\xa9\rdata: \xe2\x80\xa8x\n\n", b"data: [DONE]"]
    assert _lines_of(pieces) == ["data: a", "", "data: \u00e9", "data: \u2028x", "", "data: [DONE]"]


def test_stream_bytes_are_counted_before_a_line_ends() -> None:
    with pytest.raises(ProxyError) as e:
        _lines_of([b"data: " + b"x" * 64] * 10, max_bytes=300)
    assert e.value.code == "upstream_response_too_large"


def test_a_streamed_answer_stops_before_it_outgrows_its_decision() -> None:
    """Text beyond what the final (audited) decision's request can carry is never taken in, so
    never released: reading stops on it with a typed 502."""
    events = [b'data: {"choices": [{"index": 0, "delta": {"content": "' + b"x" * 40 + b'"}}]}\n\n'] * 4

    async def body() -> Any:
        for e in events:
            yield e

    async def read() -> StreamGuard:
        resp = httpx.Response(200, content=body())
        guard = StreamGuard(
            resp, Windows(8, 2), None, None,  # type: ignore[arg-type]
            deadline=asyncio.get_running_loop().time() + 10, max_bytes=1 << 20, include_usage=False,
            max_text_bytes=100,
        )  # fmt: skip
        await guard._read()
        return guard

    guard = asyncio.run(read())
    assert guard.failure is not None and guard.failure.code == "upstream_response_too_large"
    assert guard.length == 80  # two events taken, the third refused


def test_an_answers_fields_keep_their_strict_form_or_take_the_proxys_own() -> None:
    """docs/proxy.md#what-the-upstream-writes: one replacement per answer, repeated alike in every
    chunk; a chunk whose fields are all well formed is replayed byte for byte."""
    call = {"index": 0, "id": "TOP SECRET", "type": "x", "function": {"name": "f", "arguments": ""}}
    good = {"id": "chatcmpl-ok1", "model": "gpt-4o-2024-08-06", "choices": delta(0, "hi")["choices"]}
    bad = [
        {"id": "chatcmpl-TOP-SECRET", "model": "TOP-SECRET", "system_fingerprint": "TOP", "choices": d["choices"]}
        for d in (delta(0, tool_calls=[call]), delta(0, tool_calls=[call]), delta(0, finish="TOP-SECRET"))
    ]
    chunks = chat.parse_stream(sse(good, *bad))
    events = chunks.replay({}, chat.Fields("gpt-4o"))
    assert events[0] == b"data: " + json.dumps(good).encode() + b"\n\n"  # as received
    sent = [json.loads(e[6:]) for e in events[1:-1]]
    assert "TOP" not in json.dumps(sent)
    assert {e["id"] for e in sent} == {sent[0]["id"]} and sent[0]["id"].startswith("chatcmpl-crossaudit-")
    assert {e["model"] for e in sent} == {"gpt-4o"} and {e["system_fingerprint"] for e in sent} == {None}
    ids = [e["choices"][0]["delta"]["tool_calls"][0]["id"] for e in sent[:2]]
    assert ids[0] == ids[1] and ids[0].startswith("call_")
    assert sent[2]["choices"][0]["finish_reason"] == "stop"
