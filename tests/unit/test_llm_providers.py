"""LLMEvaluator through the real SDKs against a local HTTP server on 127.0.0.1 (ephemeral port).

One stdlib ``ThreadingHTTPServer`` speaks the four wire formats: OpenAI chat completions,
Azure OpenAI deployments, Anthropic messages and Google generateContent. Each test scripts
its replies and inspects what the SDK actually sent. Nothing leaves the loopback interface.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from crossaudit.kernel.errors import (
    ConfigurationError,
    CrossAuditError,
    EvaluatorTimeoutError,
    EvaluatorUnavailableError,
    ProviderError,
)
from orchestrator.engine.engine import Engine
from orchestrator.evaluators.base import EvaluationInput
from orchestrator.evaluators.llm import LLMEvaluator
from orchestrator.policy import load_policy

INP = EvaluationInput(prompt="How do I bake bread?", response="Mix flour, water, yeast; knead; bake.")


class LLMFactory:
    """Builds the real LLMEvaluator for each spec, so the engine's own policies (rate limits,
    retries, the wire re-check) are exercised against the stub providers."""

    def build(self, spec: Any, policy: Any) -> LLMEvaluator:
        return LLMEvaluator(spec.name, spec.config)


GOOD = {"safety_score": 0.92, "violations": [], "reasoning": "Harmless cooking advice."}


def _openai_body(text: str, response_id: str = "chatcmpl-1") -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
    }


def _anthropic_body(text: str, response_id: str = "msg_1") -> dict[str, Any]:
    return {
        "id": response_id,
        "type": "message",
        "role": "assistant",
        "model": "claude-x",
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 11, "output_tokens": 7},
    }


def _google_body(text: str, response_id: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "candidates": [{"content": {"parts": [{"text": text}], "role": "model"}, "finishReason": "STOP", "index": 0}],
        "usageMetadata": {"promptTokenCount": 11, "candidatesTokenCount": 7, "totalTokenCount": 18},
    }
    if response_id is not None:
        body["responseId"] = response_id
    return body


def _anthropic_key(req: dict[str, Any]) -> str:
    """SDK versions send the key as ``x-api-key`` or as a bearer token."""
    h = req["headers"]
    return h.get("x-api-key") or h.get("authorization", "").removeprefix("Bearer ")


class FakeProviders:
    """Scripted replies: ``answer(text)`` for a completion, ``fail(status)``, ``delay(seconds)``."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.script: deque[tuple[str, Any]] = deque()
        self.usage: Any = None  # replaces the OpenAI answer's usage block when set
        self.truncate = False  # report finish_reason "length" on OpenAI answers
        self.ids: list[str] = []  # the response id sent with each answer, in order
        self.google_ids = True  # Google answers carry a responseId (the field is optional there)
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                headers = {k.lower(): v for k, v in self.headers.items()}
                owner.requests.append({"path": self.path, "headers": headers, "json": body, "at": time.monotonic()})
                kind, arg = owner.script.popleft() if owner.script else ("answer", json.dumps(GOOD))
                if kind == "delay":
                    time.sleep(arg)
                    kind, arg = "answer", json.dumps(GOOD)
                retry_after = None
                if kind == "redirect":  # to another server: the SDKs must not follow it
                    self.send_response(307)
                    self.send_header("location", arg + self.path)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                if kind == "fail":
                    arg, retry_after = arg if isinstance(arg, tuple) else (arg, None)
                    status, payload = arg, {"error": {"message": f"scripted {arg}", "type": "err", "code": arg}}
                elif "/messages" in self.path:
                    owner.ids.append(f"msg_{len(owner.requests)}")
                    status, payload = 200, _anthropic_body(arg, owner.ids[-1])
                elif ":generateContent" in self.path:
                    owner.ids.append(f"resp-{len(owner.requests)}" if owner.google_ids else "")
                    status, payload = 200, _google_body(arg, owner.ids[-1] or None)
                else:
                    owner.ids.append(f"chatcmpl-{len(owner.requests)}")
                    status, payload = 200, _openai_body(arg, owner.ids[-1])
                    if owner.usage is not None:
                        payload["usage"] = owner.usage
                    if owner.truncate:
                        payload["choices"][0]["finish_reason"] = "length"
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                if retry_after is not None:
                    self.send_header("retry-after", retry_after)
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def answer(self, text: str) -> None:
        self.script.append(("answer", text))

    def fail(self, status: int, retry_after: str | None = None) -> None:
        self.script.append(("fail", (status, retry_after) if retry_after is not None else status))

    def delay(self, seconds: float) -> None:
        self.script.append(("delay", seconds))

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch):
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    server = FakeProviders()
    yield server
    server.close()


# Generous: the fake answers at once, but on a loaded machine a provider SDK's first client (its
# import, its HTTP pool) can take seconds; the bound only decides how long a broken call hangs.
CALL_TIMEOUT_S = 60.0


async def _run(ev: LLMEvaluator, timeout: float = CALL_TIMEOUT_S):
    try:
        return await ev.evaluate(INP, timeout=timeout)
    finally:
        await ev.aclose()


async def test_openai_request_and_parsed_verdict(fake: FakeProviders) -> None:
    ev = LLMEvaluator(
        "safety",
        {
            "provider": "openai",
            "model": "gpt-4",
            "temperature": 0.1,
            "max_tokens": 321,
            "system_prompt": "Judge it.",
            "api_key": "sk-test",
            "base_url": fake.url + "/v1",
        },
    )
    v = await _run(ev)
    assert v.score == pytest.approx(0.92)
    assert v.violations == []
    assert v.details["reasoning"] == "Harmless cooking advice."
    assert v.details["provider"] == "openai" and v.details["usage"]["total_tokens"] == 18
    req = fake.requests[-1]
    assert req["path"] == "/v1/chat/completions"
    assert req["headers"]["authorization"] == "Bearer sk-test"
    body = req["json"]
    assert body["model"] == "gpt-4" and body["temperature"] == 0.1 and body["max_tokens"] == 321
    assert body["response_format"] == {"type": "json_object"}
    assert body["messages"][0] == {"role": "system", "content": "Judge it."}
    assert INP.prompt in body["messages"][1]["content"] and INP.response in body["messages"][1]["content"]


async def test_openai_compatible_needs_no_key(fake: FakeProviders, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    fake.answer('```json\n{"score": 0.3, "violations": ["insult"], "reasoning": "rude"}\n```')
    ev = LLMEvaluator(
        "local",
        {"provider": "openai_compatible", "model": "llama3", "base_url": fake.url + "/v1", "response_format": "text"},
    )
    v = await _run(ev)
    assert v.score == pytest.approx(0.3) and v.violations == ["insult"]
    assert "response_format" not in fake.requests[-1]["json"]


async def test_azure_deployment_path_and_key_header(fake: FakeProviders) -> None:
    ev = LLMEvaluator(
        "az",
        {
            "provider": "azure",
            "model": "my-deploy",
            "api_key": "az-key",
            "base_url": fake.url,
            "api_version": "2024-10-21",
        },
    )
    v = await _run(ev)
    assert v.score == pytest.approx(0.92)
    req = fake.requests[-1]
    assert req["path"] == "/openai/deployments/my-deploy/chat/completions?api-version=2024-10-21"
    assert req["headers"]["api-key"] == "az-key"


async def test_anthropic_messages(fake: FakeProviders) -> None:
    fake.answer(
        'Here is my evaluation: {"safety_score": 0.1, "violations": [{"type": "violence"}], '
        '"reasoning": "threat"} Hope it helps.'
    )
    ev = LLMEvaluator(
        "claude",
        {
            "provider": "anthropic",
            "model": "claude-x",
            "api_key": "ant-key",
            "base_url": fake.url,
            "system_prompt": "Be strict.",
            "max_tokens": 99,
        },
    )
    v = await _run(ev)
    assert v.score == pytest.approx(0.1) and v.violations == ["violence"]
    req = fake.requests[-1]
    assert req["path"] == "/v1/messages"
    assert _anthropic_key(req) == "ant-key"
    assert req["json"]["system"] == "Be strict." and req["json"]["max_tokens"] == 99
    assert req["json"]["messages"][0]["role"] == "user"


async def test_google_generate_content(fake: FakeProviders) -> None:
    fake.answer("0.75")
    ev = LLMEvaluator(
        "gem",
        {
            "provider": "google",
            "model": "gemini-x",
            "api_key": "g-key",
            "base_url": fake.url,
            "temperature": 0.2,
            "max_tokens": 77,
        },
    )
    v = await _run(ev)
    assert v.score == pytest.approx(0.75)
    req = fake.requests[-1]
    assert req["path"].endswith("/models/gemini-x:generateContent")
    assert req["headers"]["x-goog-api-key"] == "g-key"
    gen = req["json"]["generationConfig"]
    assert gen["temperature"] == 0.2 and gen["maxOutputTokens"] == 77
    assert gen["responseMimeType"] == "application/json"
    assert "systemInstruction" in req["json"]


PROVIDER_CONFIGS = {
    "openai": {"provider": "openai", "model": "gpt-4", "api_key": "sk-test", "base_url": "{url}/v1"},
    "openai_compatible": {"provider": "openai_compatible", "model": "llama3", "base_url": "{url}/v1"},
    "azure": {"provider": "azure", "model": "dep", "api_key": "az", "base_url": "{url}", "api_version": "2024-10-21"},
    "anthropic": {"provider": "anthropic", "model": "claude-x", "api_key": "ant-key", "base_url": "{url}"},
    "google": {"provider": "google", "model": "gemini-x", "api_key": "g-key", "base_url": "{url}"},
}


def llm_policy(config: dict[str, Any], url: str, *, cache: bool = False) -> Any:
    cfg = ", ".join(f"{k}: {json.dumps(v.replace('{url}', url))}" for k, v in config.items())
    settings = "settings: {cache_results: true, cache_duration: 60}\n" if cache else ""
    return load_policy(
        "name: P\ndescription: d\nversion: '1'\n"
        f"evaluators:\n  - name: judge\n    type: llm\n    config: {{{cfg}}}\n"
        "rules:\n  - {name: r, evaluator: judge, threshold: 0.5}\n" + settings
    )


@pytest.mark.parametrize("provider", sorted(PROVIDER_CONFIGS))
async def test_each_providers_response_id_is_recorded(fake: FakeProviders, provider: str) -> None:
    engine = Engine(LLMFactory())
    try:
        policy = llm_policy(PROVIDER_CONFIGS[provider], fake.url)
        first = (await engine.evaluate(policy, "p", "r", {}, timeout=CALL_TIMEOUT_S)).rule("r").evaluators[0]
        second = (await engine.evaluate(policy, "p", "r", {}, timeout=CALL_TIMEOUT_S)).rule("r").evaluators[0]
    finally:
        await engine.aclose()
    assert len(fake.ids) == 2 and fake.ids[0] != fake.ids[1]  # the id of each call, not of the evaluator
    cfg = PROVIDER_CONFIGS[provider]
    static = {"kind": "llm", "provider": cfg["provider"], "model": cfg["model"]}
    assert first.provenance == {**static, "response_id": fake.ids[0]}
    assert second.provenance == {**static, "response_id": fake.ids[1]}
    assert "response_id" not in first.details  # a fact of the call, not of the verdict


async def test_a_cached_llm_verdict_keeps_its_calls_response_id(fake: FakeProviders) -> None:
    engine = Engine(LLMFactory())
    try:
        policy = llm_policy(PROVIDER_CONFIGS["anthropic"], fake.url, cache=True)
        first = (await engine.evaluate(policy, "p", "r", {}, timeout=CALL_TIMEOUT_S)).rule("r").evaluators[0]
        again = (await engine.evaluate(policy, "p", "r", {}, timeout=CALL_TIMEOUT_S)).rule("r").evaluators[0]
    finally:
        await engine.aclose()
    assert again.cached and len(fake.ids) == 1
    assert again.provenance == first.provenance and first.provenance["response_id"] == fake.ids[0]


async def test_no_response_id_when_the_provider_sends_none(fake: FakeProviders) -> None:
    fake.google_ids = False
    engine = Engine(LLMFactory())
    try:
        policy = llm_policy(PROVIDER_CONFIGS["google"], fake.url)
        result = (await engine.evaluate(policy, "p", "r", {}, timeout=CALL_TIMEOUT_S)).rule("r").evaluators[0]
    finally:
        await engine.aclose()
    assert result.status.value == "pass"
    assert result.provenance == {"kind": "llm", "provider": "google", "model": "gemini-x"}


@pytest.mark.parametrize(
    ("provider", "status", "retryable"),
    [
        ("openai", 429, True),
        ("openai", 503, True),
        ("openai", 400, False),
        ("openai", 401, False),
        ("anthropic", 429, True),
        ("anthropic", 500, True),
        ("anthropic", 404, False),
        ("google", 429, True),
        ("google", 500, True),
        ("google", 400, False),
    ],
)
async def test_http_errors_are_typed(fake: FakeProviders, provider: str, status: int, retryable: bool) -> None:
    fake.fail(status)
    ev = LLMEvaluator(
        "e",
        {
            "provider": provider,
            "model": "m",
            "api_key": "k",
            "base_url": fake.url + ("/v1" if provider == "openai" else ""),
        },
    )
    with pytest.raises(ProviderError) as info:
        await _run(ev)
    assert info.value.retryable is retryable
    assert str(status) in str(info.value)
    assert len(fake.requests) == 1  # the SDK did not retry on its own: the engine owns retries


async def test_garbage_answer_is_not_retryable(fake: FakeProviders) -> None:
    fake.answer("I cannot evaluate this content.")
    ev = LLMEvaluator("g", {"provider": "openai", "model": "m", "api_key": "k", "base_url": fake.url + "/v1"})
    with pytest.raises(ProviderError) as info:
        await _run(ev)
    assert info.value.retryable is False


async def test_answer_cut_at_max_tokens_says_so(fake: FakeProviders) -> None:
    fake.script.append(("answer", '{"safety_score": 0.9, "reasoning": "this goes on and o'))
    fake.truncate = True
    ev = LLMEvaluator(
        "cut", {"provider": "openai", "model": "m", "api_key": "k", "base_url": fake.url + "/v1", "max_tokens": 12}
    )
    with pytest.raises(ProviderError, match="max_tokens=12"):
        await _run(ev)


async def test_slow_provider_times_out(fake: FakeProviders) -> None:
    fake.delay(CALL_TIMEOUT_S)  # answers long after the call's deadline: only the deadline ends the call
    ev = LLMEvaluator("slow", {"provider": "openai", "model": "m", "api_key": "k", "base_url": fake.url + "/v1"})
    with pytest.raises(EvaluatorTimeoutError) as info:
        await _run(ev, timeout=0.4)
    assert info.value.retryable


async def test_connection_refused_is_unavailable() -> None:
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ev = LLMEvaluator(
        "down", {"provider": "anthropic", "model": "m", "api_key": "k", "base_url": f"http://127.0.0.1:{port}"}
    )
    with pytest.raises(EvaluatorUnavailableError) as info:
        await _run(ev, timeout=5)
    assert info.value.retryable


async def test_rate_limit_waits_or_refuses(fake: FakeProviders) -> None:
    """rate_limit is the engine's (one limiter for every kind): a call whose slot is past its
    deadline is refused without reaching the provider; one within it waits for the slot. No
    timing is asserted but what the limiter guarantees: with one slot every 0.5 s, two admitted
    calls start at least 0.5 s apart however slow the machine."""

    def policy(rate: int) -> Any:
        return load_policy(
            'name: rl\ndescription: d\nversion: "1.0"\nevaluators:\n'
            f"  - {{name: rl, type: llm, config: {{provider: openai, model: m, api_key: k, base_url: '{fake.url}/v1',"
            f" rate_limit: {rate}, rate_limit_burst: 1}}}}\n"
            "rules:\n  - {name: r, evaluator: rl, threshold: 0.0, action: block}\n"
        )

    slow = Engine(LLMFactory())  # one slot a minute: the next is never within a 0.1 s deadline
    try:
        assert (await slow.evaluate(policy(1), INP.prompt, INP.response, timeout=CALL_TIMEOUT_S)).passed
        refused = await slow.evaluate(policy(1), INP.prompt, INP.response, timeout=0.1)
        assert refused.rule("r").evaluators[0].error_type == "RateLimitedError"
        assert len(fake.requests) == 1
    finally:
        await slow.aclose()
    engine = Engine(LLMFactory())  # one slot every 0.5 s: the second call waits for it
    try:
        t0 = time.monotonic()
        assert (await engine.evaluate(policy(120), INP.prompt, INP.response, timeout=CALL_TIMEOUT_S)).passed
        assert (await engine.evaluate(policy(120), INP.prompt, INP.response, timeout=CALL_TIMEOUT_S)).passed
        assert time.monotonic() - t0 >= 0.5 - 0.05  # the limiter's spacing (its clock's resolution aside)
        assert len(fake.requests) == 3
    finally:
        await engine.aclose()


async def test_retry_after_is_honoured_within_the_deadline(fake: FakeProviders) -> None:
    """The one retry policy waits at least the provider's Retry-After (not its own 50 ms backoff)."""
    policy = load_policy(
        'name: ra\ndescription: d\nversion: "1.0"\nevaluators:\n'
        f"  - {{name: m, type: llm, config: {{provider: openai, model: m, api_key: k, base_url: '{fake.url}/v1'}}}}\n"
        "rules:\n  - {name: r, evaluator: m, threshold: 0.0, action: block, settings: {retries: 1}}\n"
    )

    engine = Engine(LLMFactory())
    try:
        fake.fail(429, retry_after="1")
        assert (await engine.evaluate(policy, INP.prompt, INP.response, timeout=10)).passed
        first, second = fake.requests[-2:]
        assert second["at"] - first["at"] >= 0.95
        fake.fail(429, retry_after="30")  # past the deadline: no pointless wait, the rule errors at once
        d = await engine.evaluate(policy, INP.prompt, INP.response, timeout=2)
        assert d.rule("r").evaluators[0].error_type == "ProviderError"
        assert len(fake.requests) == 3 and d.rule("r").evaluators[0].attempts == 1  # not retried
    finally:
        await engine.aclose()


async def test_provider_fields_outside_the_wire_become_a_rule_error(fake: FakeProviders) -> None:
    """usage/finish_reason from the endpoint join the verdict without validation; the engine
    checks every verdict again, so NaN or a 400-deep list is ResultInvalidError, not INTERNAL."""
    policy = load_policy(
        'name: w\ndescription: d\nversion: "1.0"\nevaluators:\n'
        f"  - {{name: m, type: llm, config: {{provider: openai, model: m, api_key: k, base_url: '{fake.url}/v1'}}}}\n"
        "rules:\n  - {name: r, evaluator: m, threshold: 0.0, action: block}\n"
    )

    deep: Any = 1
    for _ in range(400):
        deep = [deep]
    fake.usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2, "deep": deep}
    engine = Engine(LLMFactory())
    try:
        d = await engine.evaluate(policy, INP.prompt, INP.response, timeout=10)
        [ev] = d.rule("r").evaluators
        assert ev.status.value == "error" and ev.error_type == "ResultInvalidError", ev.error
        assert not d.passed
    finally:
        await engine.aclose()
        fake.usage = None


@pytest.mark.parametrize("provider", ["openai", "anthropic", "google"])
async def test_redirects_are_not_followed(fake: FakeProviders, provider: str) -> None:
    """A redirect from an allowlisted endpoint must not carry the key to another host."""
    other = FakeProviders()
    try:
        fake.script.append(("redirect", other.url))
        base = fake.url + ("/v1" if provider == "openai" else "")
        ev = LLMEvaluator("r", {"provider": provider, "model": "m", "api_key": "k", "base_url": base})
        try:
            with pytest.raises(CrossAuditError):
                await ev.evaluate(INP, timeout=5)
        finally:
            await ev.aclose()
        assert other.requests == []
    finally:
        other.close()


async def test_api_key_from_env_reference_and_standard_env(fake: FakeProviders, monkeypatch) -> None:
    monkeypatch.setenv("MY_KEY", "from-ref")
    ev = LLMEvaluator("k", {"provider": "openai", "model": "m", "api_key": "${MY_KEY}", "base_url": fake.url + "/v1"})
    await _run(ev)
    assert fake.requests[-1]["headers"]["authorization"] == "Bearer from-ref"
    monkeypatch.setenv("FAKE_PORT", str(fake.port))
    ev = LLMEvaluator(
        "u",
        {
            "provider": "openai_compatible",
            "model": "m",
            "base_url": "http://127.0.0.1:${FAKE_PORT}/v1",
            "api_key": "sk-${MY_KEY}",
        },
    )
    await _run(ev)
    assert fake.requests[-1]["headers"]["authorization"] == "Bearer sk-from-ref"
    monkeypatch.setenv("ANTHROPIC_API_KEY", "std-env")
    ev = LLMEvaluator("k2", {"provider": "anthropic", "model": "m", "base_url": fake.url})
    await _run(ev)
    assert _anthropic_key(fake.requests[-1]) == "std-env"


async def test_missing_key_is_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    monkeypatch.delenv("UNSET_KEY_VAR", raising=False)
    with pytest.raises(ConfigurationError, match="GOOGLE_API_KEY"):
        await _run(LLMEvaluator("g", {"provider": "google", "model": "m"}))
    with pytest.raises(ConfigurationError, match="UNSET_KEY_VAR"):
        await _run(LLMEvaluator("o", {"provider": "openai", "model": "m", "api_key": "${UNSET_KEY_VAR}"}))


@pytest.mark.parametrize(
    ("provider", "model"),
    [("openai", "gpt-x"), ("anthropic", "claude-x"), ("google", "gemini-x")],
)
async def test_each_providers_token_usage_reaches_the_usage_sink(
    fake: FakeProviders, provider: str, model: str
) -> None:
    """The counts each SDK parsed from its provider's own usage block (11 prompt, 7 completion)."""
    seen: list[tuple[str, str, int, int]] = []
    config = {"provider": provider, "model": model, "api_key": "k", "base_url": fake.url}
    if provider == "openai":
        config["base_url"] = fake.url + "/v1"
    v = await _run(LLMEvaluator("judge", config, usage=lambda *call: seen.append(call)))
    assert v.score == pytest.approx(0.92)
    assert seen == [(provider, model, 11, 7)]


async def test_tokens_of_an_unusable_answer_are_still_counted(fake: FakeProviders) -> None:
    """The provider billed them: the sink hears of them before the answer is parsed."""
    fake.answer("I cannot judge this.")
    seen: list[tuple[str, str, int, int]] = []
    config = {"provider": "openai", "model": "gpt-x", "api_key": "k", "base_url": fake.url + "/v1"}

    def broken_sink(*call: object) -> None:
        seen.append(call)  # type: ignore[arg-type]
        raise RuntimeError("a metrics bug")  # never fails the call

    with pytest.raises(ProviderError, match="neither JSON nor a number"):
        await _run(LLMEvaluator("judge", config, usage=broken_sink))
    assert seen == [("openai", "gpt-x", 11, 7)]


class EndlessProvider:
    """A hostile endpoint on 127.0.0.1: answers 200 and streams a JSON-looking body without end
    (chunked, no length), ``declared`` a huge Content-Length instead, or ``gzip`` a compressed
    body; it stops at ``max_bytes`` or when the client hangs up, and records what it sent."""

    def __init__(self, mode: str = "endless", max_bytes: int = 256 * 1024 * 1024) -> None:
        self.sent = 0
        self.headers: list[dict[str, str]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length") or 0))
                owner.headers.append({k.lower(): v for k, v in self.headers.items()})
                self.send_response(200)
                self.send_header("content-type", "application/json")
                if mode == "gzip":
                    import gzip

                    data = gzip.compress(b'{"id": "' + b"a" * 1_000_000 + b'"}')
                    self.send_header("content-encoding", "gzip")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                if mode == "declared":
                    self.send_header("content-length", str(10 * 1024**3))
                else:
                    self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                chunk = b'{"pad": "' + b"x" * (64 * 1024)
                deadline = time.monotonic() + 20
                try:
                    while owner.sent < max_bytes and time.monotonic() < deadline:
                        if mode == "declared":
                            self.wfile.write(chunk)
                        else:
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                        owner.sent += len(chunk)
                except OSError:
                    return  # the client hung up: what we want

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.parametrize("provider", ["openai", "openai_compatible", "anthropic", "google"])
async def test_an_endless_answer_is_cut_at_the_byte_cap(provider: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hostile endpoint streaming 256 MiB is cut after the cap (1 MiB here) with a typed,
    non-retryable error naming the setting; the orchestrator's memory stays near the cap."""
    import tracemalloc

    import anthropic  # noqa: F401 - imported before tracing: count the call, not the SDK's import
    import openai  # noqa: F401
    from google import genai  # noqa: F401

    from orchestrator.evaluators.llm import ResponseTooLargeError

    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    server = EndlessProvider()
    cap = 1024 * 1024
    base = server.url + ("/v1" if provider.startswith("openai") else "")
    ev = LLMEvaluator(
        "big", {"provider": provider, "model": "m", "api_key": "k", "base_url": base}, max_response_bytes=cap
    )
    tracemalloc.start()
    try:
        with pytest.raises(ResponseTooLargeError) as err:  # the cap ended it, not the deadline
            await _run(ev)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        server.close()
    assert err.value.retryable is False
    assert "engine_limits.max_llm_response_bytes" in str(err.value)
    assert peak < 16 * cap, f"peak {peak} bytes while reading a capped answer"
    assert server.sent < 64 * cap  # the client hung up long before the end
    assert server.headers[0].get("accept-encoding") == "identity"


async def test_a_declared_huge_length_is_refused_before_the_body(monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.evaluators.llm import ResponseTooLargeError

    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    server = EndlessProvider("declared")
    ev = LLMEvaluator("big", {"provider": "openai", "model": "m", "api_key": "k", "base_url": server.url + "/v1"})
    try:
        with pytest.raises(ResponseTooLargeError):
            await _run(ev, timeout=15)
    finally:
        server.close()


async def test_a_compressed_answer_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cap counts bytes on the wire, so a gzip body (here 1 MB from 1 KB) must not inflate past it."""
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    server = EndlessProvider("gzip")
    ev = LLMEvaluator(
        "gz",
        {"provider": "anthropic", "model": "m", "api_key": "k", "base_url": server.url},
        max_response_bytes=64 * 1024,
    )
    try:
        with pytest.raises(ProviderError, match="content-encoding 'gzip'") as err:
            await _run(ev, timeout=15)
    finally:
        server.close()
    assert err.value.retryable is False


async def test_the_google_http_client_we_give_is_closed_with_the_evaluator(fake: FakeProviders) -> None:
    """genai leaves a client it was given open; ours (which carries the byte cap) is closed by aclose."""
    from orchestrator.evaluators.llm import OWNED_HTTP

    ev = LLMEvaluator("g", {"provider": "google", "model": "m", "api_key": "k", "base_url": fake.url})
    await ev.evaluate(INP, timeout=5)
    http = getattr(ev._client, OWNED_HTTP)
    assert not http.is_closed
    await ev.aclose()
    assert http.is_closed


def test_the_servers_engine_limit_reaches_each_llm_evaluator() -> None:
    """engine_limits.max_llm_response_bytes, as `crossaudit serve` builds engines, bounds every LLM call."""
    from crossaudit.kernel.limits import EngineLimits
    from crossaudit.service.assembly import runtime_engines

    policy = load_policy(
        """
name: p
description: one llm rule
version: "1.0"
evaluators:
  - name: judge
    type: llm
    config: {provider: openai, model: m, api_key: k}
rules:
  - name: r
    evaluator: judge
    threshold: 0.5
    action: flag
"""
    )
    make = runtime_engines(None, limits=EngineLimits(max_llm_response_bytes=12345))  # type: ignore[arg-type]
    engine = make("t", None, None)  # type: ignore[arg-type]
    ev = engine.factory.build(policy.evaluators[0], policy)
    assert isinstance(ev, LLMEvaluator) and ev.max_response_bytes == 12345


async def test_an_sdk_import_runs_off_the_event_loop(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An SDK's import takes seconds (anthropic 2.x: some 3,300 modules). Made on the event loop
    it stalled every request and the first call's deadline could not fire until it was over: a
    cold, loaded run's first anthropic decision timed out after 36 s against a 15 s deadline. The
    import runs in a thread: a call whose SDK is still importing ends on its deadline."""
    import sys
    import uuid

    from orchestrator.evaluators import llm

    tag = uuid.uuid4().hex[:12]
    gate, sdk = f"sdkgate_{tag}", f"slowsdk_{tag}"
    (tmp_path / f"{gate}.py").write_text("import threading\nopened = threading.Event()\n")
    (tmp_path / f"{sdk}.py").write_text(f"import {gate}\nassert {gate}.opened.wait(120), 'the gate never opened'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(llm.SDK_MODULES, "openai", sdk)  # openai's SDK is "slowsdk": its import waits on the gate
    for name in (gate, sdk):
        monkeypatch.delitem(sys.modules, name, raising=False)
    ev = LLMEvaluator("judge", {"provider": "openai", "model": "m", "api_key": "k", "base_url": "http://127.0.0.1:9/v1"})
    with pytest.raises(EvaluatorTimeoutError):  # returned at all: the loop ran while the import waited
        await _run(ev, timeout=0.2)
    gate_module = sys.modules[gate]
    assert not gate_module.opened.is_set() and sdk not in llm._imported_sdks  # still importing
    gate_module.opened.set()
    await asyncio.wait_for(llm.import_sdk("openai"), CALL_TIMEOUT_S)  # waits for that same import to end
    assert sdk in llm._imported_sdks and sdk in sys.modules
    for name in (gate, sdk):
        sys.modules.pop(name, None)
