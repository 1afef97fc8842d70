"""Streamed answers through the guard proxy, window by window (docs/proxy.md#streaming): a real
``crossaudit proxy`` process, a real CrossAudit server deciding and auditing, and the loopback
upstream stub holding its stream at a gate until the caller has seen its first text, so what the
proxy had received by then is known without any timing."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from crossaudit import Client
from crossaudit.kernel.errors import InvalidInputError, NotFoundError
from tests.e2e.conftest import ServerProcess, key
from tests.e2e.test_proxy import (  # noqa: F401 - deployed and upstream are fixtures, found by name
    APP_KEY,
    PROXY_ENV,
    REFUSAL,
    REFUSER_KEY,
    ProxyProcess,
    deployed,
    proxy_config,
    upstream,
)
from tests.e2e.upstream_stub import STREAM_PIECE_CHARS, UpstreamStub

pytestmark = pytest.mark.e2e

WINDOW, CONTEXT = 64, 20  # small windows, so a short answer spans several
CLEAN = "The weather today is mild and pleasant, with a light breeze. "  # 61 characters
TAIL = "LATE-TEXT that must never be sent."
MAX_ANSWER_BYTES = 64 * 1024
POLL_TRIES, POLL_STEP_S = 100, 0.1  # a record written after the caller went away: looked for this often


@pytest.fixture(scope="module")
def proxy(
    deployed: ServerProcess,  # noqa: F811
    upstream: UpstreamStub,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ProxyProcess]:
    callers = {
        "app": {"keys": [APP_KEY], "policies": ["proxy-guard", "proxy-other"], "default_policy": "proxy-guard"},
        "refuser": {
            "keys": [REFUSER_KEY],
            "policies": ["proxy-guard"],
            "default_policy": "proxy-guard",
            "on_block": "refusal",
        },
    }
    config = proxy_config(
        deployed.address,
        upstream.url,
        callers,
        policies={"proxy-other": {"input_mode": "parallel"}},
        limits={
            "stream_window_chars": WINDOW,
            "stream_context_chars": CONTEXT,
            "max_upstream_response_bytes": MAX_ANSWER_BYTES,
        },
    )
    p = ProxyProcess(tmp_path_factory.mktemp("proxy-stream"), config, PROXY_ENV).start()
    try:
        yield p
    finally:
        p.stop()


@pytest.fixture()
def stub(upstream: UpstreamStub) -> UpstreamStub:  # noqa: F811
    upstream.reset()
    return upstream


def gated(stub: UpstreamStub, reply: str, held_from: int) -> threading.Event:
    """The stub streams ``reply`` and stops before the character ``held_from`` until the event."""
    assert held_from % STREAM_PIECE_CHARS == 0
    stub.reset(reply=reply)
    gate = threading.Event()
    stub.gate = (held_from // STREAM_PIECE_CHARS, gate)
    return gate


def stream(proxy: ProxyProcess, text: str, gate: threading.Event | None, key_: str = APP_KEY, **extra: Any) -> Any:
    """POST a streamed chat call; the events (JSON objects, or "[DONE]") as they came, the status
    and the headers. The gate opens once the first text arrived."""
    body = {"model": "stub-model", "messages": [{"role": "user", "content": text}], "stream": True, **extra}
    events: list[Any] = []
    with httpx.stream(
        "POST", proxy.url + "/chat/completions", json=body, headers={"authorization": f"Bearer {key_}"}, timeout=60
    ) as r:
        if r.status_code != 200:
            r.read()
            if gate is not None:
                gate.set()
            return r.status_code, r.headers, r.json()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line.removeprefix("data: ")
            events.append(data if data == "[DONE]" else json.loads(data))
            if gate is not None and content(events):
                gate.set()
    return r.status_code, r.headers, events


def content(events: list[Any]) -> str:
    return "".join(
        (c.get("delta") or {}).get("content") or "" for e in events if isinstance(e, dict) for c in e.get("choices", [])
    )


def records_of(server: ServerProcess, headers: Any) -> list[Any]:
    """The audit records of one proxied call other than its input stage's."""
    with Client(server.address, api_key=key("acme")) as c:
        mine = [r for r in c.list_decisions("proxy-guard") if r.request_id == headers["x-request-id"]]
    return [r for r in mine if r.decision_id != headers["x-crossaudit-input-decision-id"]]


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_an_answer_turning_harmful_is_cut_at_the_failing_window(
    proxy: ProxyProcess, stub: UpstreamStub, deployed: ServerProcess  # noqa: F811
) -> None:
    clean = CLEAN * 2  # 122 characters reach the proxy before the caller has any text
    gate = gated(stub, clean + "The launch code is TOP-SECRET-42. " + TAIL, held_from=120)
    status, headers, events = stream(proxy, "weather?", gate)
    assert status == 200
    sent = content(events)
    assert sent and clean.startswith(sent)  # released before the secret came, and only clean text
    assert "TOP-SECRET" not in json.dumps(events) and "LATE-TEXT" not in json.dumps(events)
    error = events[-1]["error"]  # an OpenAI-style error event ends it; no [DONE]
    assert error["code"] == "SECRET_LEAK" and error["type"] == "policy_violation"
    assert error["crossaudit"]["window"] >= 2 and error["crossaudit"]["stage"] == "output"
    assert "[DONE]" not in events
    assert "x-crossaudit-output-decision-id" not in headers  # the stream began before the decision
    [record] = records_of(deployed, headers)  # one audited decision: the block that cut it
    assert record.decision_id == error["crossaudit"]["decision_id"]
    assert record.action == "block" and not record.passed


def test_a_cut_stream_ends_in_the_refusal_for_a_refusing_caller(proxy: ProxyProcess, stub: UpstreamStub) -> None:
    clean = CLEAN * 2
    gate = gated(stub, clean + "The launch code is TOP-SECRET-42. " + TAIL, held_from=120)
    status, _, events = stream(proxy, "weather?", gate, REFUSER_KEY)
    assert status == 200 and events[-1] == "[DONE]"
    sent = content(events)
    assert sent.endswith(REFUSAL) and clean.startswith(sent.removesuffix(REFUSAL))
    assert "TOP-SECRET" not in json.dumps(events) and "LATE-TEXT" not in json.dumps(events)
    assert [c["finish_reason"] for e in events[:-1] for c in e["choices"]][-1] == "content_filter"


def test_a_redacted_window_streams_redacted_even_split_across_windows(
    proxy: ProxyProcess, stub: UpstreamStub, deployed: ServerProcess  # noqa: F811
) -> None:
    """The address is 16 characters, within the context (20): the caller's first text is sent
    while the proxy holds only "Write to bob@c" of it, and no piece of it is ever sent."""
    head = CLEAN * 2 + "Write to "  # the address starts at character 131
    reply = head + "bob@corp.example today. " + CLEAN
    gate = gated(stub, reply, held_from=136)
    status, headers, events = stream(proxy, "who?", gate, stream_options={"include_usage": True})
    assert status == 200
    texts = [c["delta"].get("content") or "" for e in events if isinstance(e, dict) for c in e.get("choices", [])]
    assert len([t for t in texts if t]) >= 2  # the text came in more than one release
    expected = head + "[EMAIL_ADDRESS] today. " + CLEAN
    assert content(events) == expected
    assert not any(p in json.dumps(events) for p in ("bob", "corp.ex", "@"))
    assert events[-1] == "[DONE]" and events[-2]["usage"]["total_tokens"] == 8
    finish = events[-3]
    assert finish["choices"][0]["finish_reason"] == "stop"
    [record] = records_of(deployed, headers)  # the final decision on the whole answer, audited once
    assert finish["crossaudit"] == {"output_decision_id": record.decision_id, "output_action": "modify"}
    assert record.action == "modify" and record.response_sha256 == sha(reply)
    assert record.modified_response_sha256 == sha(expected)  # what the caller got, exactly


def test_a_clean_stream_is_audited_once(
    proxy: ProxyProcess, stub: UpstreamStub, deployed: ServerProcess  # noqa: F811
) -> None:
    reply = CLEAN * 5
    gate = gated(stub, reply, held_from=100)
    status, headers, events = stream(proxy, "weather?", gate)
    assert status == 200 and content(events) == reply and events[-1] == "[DONE]"
    [record] = records_of(deployed, headers)
    assert record.action == "allow" and record.response_sha256 == sha(reply)
    assert events[-2]["crossaudit"]["output_decision_id"] == record.decision_id


def test_parallel_input_never_leaks_a_blocked_inputs_answer(proxy: ProxyProcess, stub: UpstreamStub) -> None:
    """proxy-other runs its input stage beside the upstream call (input_mode: parallel)."""
    headers = {"authorization": f"Bearer {APP_KEY}", "x-crossaudit-policy": "proxy-other"}
    for streamed in (False, True):
        stub.reset(reply="UPSTREAM-ANSWER " * 40)
        body = {"model": "m", "messages": [{"role": "user", "content": "a forbidden question"}], "stream": streamed}
        r = httpx.post(proxy.url + "/chat/completions", json=body, headers=headers, timeout=60)
        assert r.status_code == 403, r.text
        assert r.json()["error"]["crossaudit"]["stage"] == "input"
        assert "UPSTREAM-ANSWER" not in r.text
        stub.reset(reply="UPSTREAM-ANSWER")
        body["messages"] = [{"role": "user", "content": "a fine question"}]
        r = httpx.post(proxy.url + "/chat/completions", json=body, headers=headers, timeout=60)
        assert r.status_code == 200 and "UPSTREAM-ANSWER" in r.text
        assert r.headers["x-crossaudit-input-action"] == "allow"


def test_a_provisional_decision_is_audited_only_when_it_blocks(deployed: ServerProcess) -> None:  # noqa: F811
    """What the proxy's windows rely on (EvaluateRequest.provisional)."""
    with Client(deployed.address, api_key=key("acme")) as c:
        passed = c.evaluate("proxy-guard", "q", "fine words", stage="output", provisional=True)
        assert passed.action.value == "allow"
        with pytest.raises(NotFoundError):
            c.get_decision(passed.decision_id)
        blocked = c.evaluate("proxy-guard", "q", "TOP-SECRET-1", stage="output", provisional=True)
        assert blocked.action.value == "block" and c.get_decision(blocked.decision_id).action == "block"
        with pytest.raises(InvalidInputError, match="output stage"):
            c.evaluate("proxy-guard", "q", "fine words", stage="input", provisional=True)


def test_a_streamed_tool_call_is_held_evaluated_and_passed_on(proxy: ProxyProcess, stub: UpstreamStub) -> None:
    """Text outside the content (here a tool call's arguments) is held to the end, evaluated whole
    beside the final decision, then sent after the content."""
    args = json.dumps({"city": "Paris"})
    call = {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": args}}
    gate = gated(stub, CLEAN * 3, held_from=100)  # the first text goes out before the rest arrives
    stub.extra = {"tool_calls": [call]}
    status, _, events = stream(proxy, "weather?", gate)
    assert status == 200 and content(events) == CLEAN * 3 and events[-1] == "[DONE]"
    [calls] = [c["delta"]["tool_calls"] for e in events[:-1] for c in e["choices"] if "tool_calls" in c["delta"]]
    assert calls[0]["function"] == {"name": "weather", "arguments": args}
    finish = next(e for e in events[:-1] if e["choices"] and e["choices"][0].get("finish_reason"))
    assert finish["crossaudit"]["output_action"] == "allow,allow"  # the content's decision, then the tool call's


def test_an_endless_line_is_cut_at_the_byte_limit(proxy: ProxyProcess, stub: UpstreamStub) -> None:
    """A hostile upstream's one SSE line that never ends: the proxy must stop reading it at
    max_upstream_response_bytes, not hold it all until a newline (or the timeout) comes."""
    stub.flood = 1024 * MAX_ANSWER_BYTES
    status, _, body = stream(proxy, "weather?", None)
    assert status == 502 and body["error"]["code"] == "upstream_response_too_large"
    assert stub.flooded < stub.flood  # the proxy hung up long before the upstream was done


def test_text_released_before_an_upstream_failure_is_audited(
    proxy: ProxyProcess, stub: UpstreamStub, deployed: ServerProcess  # noqa: F811
) -> None:
    """The upstream breaks off (an error event) after windows were released: what the caller got
    must still have its audit record (windows alone are provisional, unrecorded)."""
    gate = gated(stub, CLEAN * 3, held_from=120)
    stub.ending = b'data: {"error": {"message": "the model fell over"}}\n\n'
    status, headers, events = stream(proxy, "weather?", gate)
    assert status == 200 and events[-1]["error"]["code"] == "upstream_error"
    sent = content(events)
    assert sent and (CLEAN * 3).startswith(sent)
    [record] = records_of(deployed, headers)
    assert record.response_sha256 == sha(sent) and record.action == "allow"


def test_text_released_to_a_caller_that_hangs_up_is_audited(
    proxy: ProxyProcess, stub: UpstreamStub, deployed: ServerProcess  # noqa: F811
) -> None:
    """A caller that reads the first windows and hangs up mid-stream got text: it is audited."""
    gate = gated(stub, CLEAN * 3, held_from=120)
    body = {"model": "stub-model", "messages": [{"role": "user", "content": "weather?"}], "stream": True}
    events: list[Any] = []
    try:
        with httpx.stream(
            "POST", proxy.url + "/chat/completions", json=body, headers={"authorization": f"Bearer {APP_KEY}"},
            timeout=60,
        ) as r:  # fmt: skip
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line.removeprefix("data: ")))
                    if content(events):
                        break  # hang up while the upstream is held at its gate
        sent = content(events)
        records: list[Any] = []
        for _ in range(POLL_TRIES):
            records = records_of(deployed, r.headers)
            if records:
                break
            time.sleep(POLL_STEP_S)
        [record] = records
        assert record.response_sha256 == sha(sent) and record.action == "allow"
    finally:
        gate.set()


LONG_ANSWER_CHARS = 40_000  # the attack's size: its last release diffed the whole answer (36 s on the event loop)


@pytest.fixture(scope="module")
def wide_proxy(
    deployed: ServerProcess,  # noqa: F811
    upstream: UpstreamStub,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ProxyProcess]:
    """The default windows and limits (the module's proxy holds 64 KiB answers at most)."""
    callers = {"app": {"keys": [APP_KEY], "policies": ["proxy-guard"], "default_policy": "proxy-guard"}}
    config = proxy_config(deployed.address, upstream.url, callers)
    p = ProxyProcess(tmp_path_factory.mktemp("proxy-stream-wide"), config, PROXY_ENV).start()
    try:
        yield p
    finally:
        p.stop()


def test_a_long_redacted_stream_is_released_whole_and_redacted(
    wide_proxy: ProxyProcess,
    stub: UpstreamStub,
    deployed: ServerProcess,  # noqa: F811
) -> None:
    words = "".join(f"{w} " for w in ("sun", "sky", "air", "sea") * (LONG_ANSWER_CHARS // 16))
    half = len(words) // 2
    reply = words[:half] + "write to jane.doe@example.com today " + words[half:]
    stub.reset(reply=reply)
    status, headers, events = stream(wide_proxy, "weather?", None)
    assert status == 200 and events[-1] == "[DONE]"
    expected = reply.replace("jane.doe@example.com", "[EMAIL_ADDRESS]")
    assert content(events) == expected
    assert "jane.doe" not in json.dumps(events)
    [record] = records_of(deployed, headers)
    assert record.action == "modify" and record.modified_response_sha256 == sha(expected)
