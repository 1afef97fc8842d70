"""``Client.evaluate_tool_call`` / ``evaluate_tool_result`` (and the async client's) refuse what
the wire cannot carry as ``InvalidInputError`` before anything is sent, as the SDK documents for
arguments JSON cannot encode: a lone surrogate in the arguments (a value's string, or the text
given as is), the tool's name, its call id or a tool result's text is not UTF-8, and a caller must
not get a bare ``UnicodeEncodeError`` out of protobuf for what a model wrote."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from crossaudit import AsyncClient, Client
from crossaudit.kernel.errors import InvalidInputError

ADDRESS = "127.0.0.1:9"  # nothing is sent: the refusal comes first
KEY = "k" * 32
LONE = "\ud800"

CALLS: list[dict[str, Any]] = [
    {"name": "send", "arguments": {"to": LONE}},
    {"name": "send", "arguments": {LONE: 1}},
    {"name": "send", "arguments": '{"to": "' + LONE + '"}'},
    {"name": "send" + LONE, "arguments": {}},
    {"name": "send", "arguments": {}, "call_id": LONE},
]


@pytest.mark.parametrize("call", CALLS)
def test_a_tool_call_the_wire_cannot_carry_is_a_typed_refusal(call: dict[str, Any]) -> None:
    with Client(ADDRESS, api_key=KEY) as c, pytest.raises(InvalidInputError, match="UTF-8"):
        c.evaluate_tool_call("agents", call["name"], call["arguments"], call_id=call.get("call_id", ""), timeout=1)


@pytest.mark.parametrize("call", CALLS)
def test_the_async_client_refuses_alike(call: dict[str, Any]) -> None:
    async def run() -> None:
        async with AsyncClient(ADDRESS, api_key=KEY) as c:
            await c.evaluate_tool_call(
                "agents", call["name"], call["arguments"], call_id=call.get("call_id", ""), timeout=1
            )

    with pytest.raises(InvalidInputError, match="UTF-8"):
        asyncio.run(run())


@pytest.mark.parametrize(("name", "output"), [("fetch", "page " + LONE), ("fetch" + LONE, "page")])
def test_a_tool_result_the_wire_cannot_carry_is_a_typed_refusal(name: str, output: str) -> None:
    with Client(ADDRESS, api_key=KEY) as c, pytest.raises(InvalidInputError, match="UTF-8"):
        c.evaluate_tool_result("agents", name, output, timeout=1)


@pytest.mark.parametrize("prompt, response", [(LONE, "ok"), ("ok", "a" + LONE)])
def test_a_plain_evaluate_the_wire_cannot_carry_is_a_typed_refusal(prompt: str, response: str) -> None:
    with Client(ADDRESS, api_key=KEY) as c, pytest.raises(InvalidInputError, match="UTF-8"):
        c.evaluate("agents", prompt, response, timeout=1)
