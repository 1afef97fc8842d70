"""parse_result / error_from_frame / AgentChannel: the orchestrator trusts nothing the sandbox says."""

from __future__ import annotations

import asyncio
import json

import pytest

from crossaudit.kernel.errors import (
    EvaluatorCodeError,
    EvaluatorTimeoutError,
    ResultInvalidError,
    SandboxCodeError,
    SandboxCrashedError,
    SandboxError,
    SandboxLimitError,
    SandboxSecurityError,
)
from crossaudit.kernel.limits import SandboxLimits
from sandbox.protocol import AgentChannel, ProtocolError, error_from_frame, parse_result

LIMITS = SandboxLimits(result_max_depth=5, result_max_violations=3, result_bytes=10_000)


def test_guide_shape() -> None:
    v = parse_result(
        {"safety_score": 0.6, "violations": ["a", "b"], "passed": False, "details": {"checked_words": 2}}, LIMITS
    )
    assert (v.score, v.passed, v.violations, v.details) == (0.6, False, ["a", "b"], {"checked_words": 2})


def test_score_key_and_defaults() -> None:
    v = parse_result({"score": 1}, LIMITS)
    assert v.score == 1.0 and v.passed is None and v.violations == [] and v.details == {}


def test_unknown_keys_move_into_details() -> None:
    v = parse_result({"score": 0.5, "detected_language": "en", "details": {"x": 1}}, LIMITS)
    assert v.details == {"x": 1, "detected_language": "en"}


def test_both_score_keys_score_wins_other_kept() -> None:
    v = parse_result({"score": 0.2, "safety_score": 0.9}, LIMITS)
    assert v.score == 0.2 and v.details["safety_score"] == 0.9


def test_non_string_violations_become_compact_json() -> None:
    v = parse_result({"score": 0.5, "violations": [{"word": "x", "n": 1}, 3, "s"]}, LIMITS)
    assert v.violations == ['{"n":1,"word":"x"}', "3", "s"]


def test_spans() -> None:
    v = parse_result({"score": 0.5, "spans": [{"start": 1, "end": 4, "label": "PII", "score": 0.9}]}, LIMITS)
    assert v.spans[0].start == 1 and v.spans[0].label == "PII"


@pytest.mark.parametrize(
    "doc",
    [
        [1, 2],
        "score",
        None,
        {},
        {"violations": []},
        {"score": 1.5},
        {"score": -0.1},
        {"score": "0.5"},
        {"score": True},
        {"score": float("nan")},
        {"score": float("inf")},
        {"score": 0.5, "details": {"x": float("nan")}},
        {"score": 0.5, "details": {"x": [float("-inf")]}},
        {"score": 0.5, "passed": "yes"},
        {"score": 0.5, "violations": "a"},
        {"score": 0.5, "violations": ["a", "b", "c", "d"]},
        {"score": 0.5, "details": [1]},
        {"score": 0.5, "details": {"a": {"b": {"c": {"d": {"e": {}}}}}}},
        {"score": 0.5, "spans": [{"start": 5, "end": 1}]},
        {"score": 0.5, "spans": [{"start": 0, "end": 1, "score": 2}]},
        {"score": 0.5, "spans": "x"},
        {"score": 0.5, "details": {"blob": "x" * 20_000}},
        {"score": 0.5, "details": {"obj": object()}},
        {"score": 0.5, "details": {1: "int key"}},
        {"score": 10**400},
        {"score": 0.5, "spans": [{"start": 0, "end": 1, "score": 10**400}]},
    ],
)
def test_rejects(doc) -> None:
    with pytest.raises(ResultInvalidError):
        parse_result(doc, LIMITS)


def test_very_deep_document_rejected_without_recursion_error() -> None:
    doc: dict = {"score": 0.5}
    cur = doc
    for _ in range(100_000):
        cur["d"] = {}
        cur = cur["d"]
    with pytest.raises(ResultInvalidError):
        parse_result(doc, LIMITS)


@pytest.mark.parametrize(
    ("error", "cls"),
    [
        ({"type": "code_error", "message": "ValueError: x"}, SandboxCodeError),
        ({"type": "crashed", "message": "killed"}, SandboxCrashedError),
        ({"type": "limit", "message": "m", "limit": "memory"}, SandboxLimitError),
        ({"type": "limit", "message": "t", "limit": "timeout"}, EvaluatorTimeoutError),
        ({"type": "security", "message": "no"}, SandboxSecurityError),
        ({"type": "invalid_result", "message": "nan"}, ResultInvalidError),
        ({"type": "load_error", "message": "no evaluate"}, EvaluatorCodeError),
        ({"type": "something_new", "message": "?"}, SandboxError),
    ],
)
def test_error_from_frame(error, cls) -> None:
    err = error_from_frame({"op": "result", "id": "x", "ok": False, "error": error})
    assert type(err) is cls
    assert error_from_frame(error).__class__ is cls  # the bare error object works too


def test_limit_error_carries_limit_name_and_clipped_message() -> None:
    err = error_from_frame({"error": {"type": "limit", "limit": "result_bytes", "message": "x" * 10_000}})
    assert isinstance(err, SandboxLimitError) and err.limit == "result_bytes" and len(err.message) <= 2000


def test_channel_roundtrip_and_feed() -> None:
    ch = AgentChannel(1000)
    call_id, frame = AgentChannel.call_frame("p", "r", {"k": 1})
    data = AgentChannel.encode(frame)
    assert data.endswith(b"\n") and ch.decode(data[:-1])["id"] == call_id
    frames = ch.feed(data[:5]) + ch.feed(data[5:] + b'{"op":"loaded","ok":true}\n')
    assert [f["op"] for f in frames] == ["call", "loaded"]
    _, other = AgentChannel.call_frame("p", "r", {})
    assert other["id"] != call_id  # a fresh nonce per call


def test_channel_caps_and_rejects() -> None:
    ch = AgentChannel(100)
    with pytest.raises(ProtocolError):
        ch.feed(b"x" * 200)
    with pytest.raises(ProtocolError):
        ch.decode(b"[1]")
    with pytest.raises(ProtocolError):
        ch.decode(b'{"op":"result","x":NaN}')
    with pytest.raises(ProtocolError):
        ch.decode(b"not json")
    with pytest.raises(ValueError):
        AgentChannel.encode({"op": "call", "context": {"x": float("nan")}})


def test_load_frame_carries_limits() -> None:
    f = AgentChannel.load_frame("code", preload=["nltk"], restricted=True, limits=SandboxLimits(cpu_s=3))
    assert f["op"] == "load" and f["limits"]["cpu_s"] == 3 and f["preload"] == ["nltk"] and f["restricted"] is True
    json.dumps(f)


async def test_read_answer_drops_frames_with_other_ids() -> None:
    ch = AgentChannel(1000)
    reader = asyncio.StreamReader(limit=2000)
    reader.feed_data(b'{"op":"result","id":"old"}\n{"op":"result","id":"new","ok":true}\n')
    frame = await ch.read_answer(reader, "result", "new")
    assert frame["id"] == "new"


async def test_read_frame_oversized_and_eof() -> None:
    ch = AgentChannel(50)
    reader = asyncio.StreamReader(limit=51)
    reader.feed_data(b"y" * 200)
    with pytest.raises(ProtocolError):
        await ch.read_frame(reader)
    reader2 = asyncio.StreamReader(limit=51)
    reader2.feed_eof()
    with pytest.raises(ProtocolError):
        await ch.read_frame(reader2)
