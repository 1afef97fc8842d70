"""A model on 127.0.0.1 speaking OpenAI's chat-completions API (JSON and SSE streams), for the
guard proxy's tests: it records every request it gets (path, headers, body), and answers with
the text the test sets, or by echoing the last user message; its errors quote the
Authorization header they got, as a careless provider's might."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

STREAM_PIECE_CHARS = 4  # the stub streams its answer in pieces this small, so a word spans chunks
FLOOD_BLOCK_BYTES = 64 * 1024
GATE_TIMEOUT_S = 30.0  # a stream held at its gate goes on after this long whatever happens


class UpstreamStub:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.reply: str | None = None  # None: echo "You said: <last user message>"
        self.by_model: dict[str, str] = {}  # a request naming one of these models gets its reply instead
        self.status = 200  # another status: answered with an OpenAI-style error body
        self.extra: dict[str, Any] = {}  # more fields of the answer's message (tool_calls, reasoning_content, ...)
        self.escape_slashes = False  # errors written as some JSON encoders do: "/" as "\/"
        self.raw: tuple[str, bytes] | None = None  # (content type, body): a 200 answered exactly so, hostile or not
        # (pieces, event): a stream stops after that many content pieces until the event is set, so
        # a test knows what the proxy had received when the caller saw its first text
        self.gate: tuple[int, threading.Event] | None = None
        self.piece_delay_s = 0.0  # a stream's content pieces come this far apart (a model generating)
        # a hostile stream: one SSE line of this many bytes that never ends (no newline); how many
        # the stub got written before the proxy hung up is in ``flooded``
        self.flood = 0
        self.flooded = 0
        self.ending: bytes | None = None  # a stream's end after its content (finish and [DONE] otherwise)
        # a stream written exactly so: these chunks (JSON objects, or raw bytes sent as they are), then
        # [DONE]; the gate, when set, holds it before the chunk of that position
        self.script: list[Any] | None = None
        self.lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _record(self, body: Any) -> None:
                headers = {k.lower(): v for k, v in self.headers.items()}
                with owner.lock:
                    owner.requests.append({"path": self.path, "headers": headers, "body": body})

            def _json(self, status: int, obj: Any) -> None:
                text = json.dumps(obj)
                data = (text.replace("/", "\\/") if owner.escape_slashes and status != 200 else text).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._record(None)
                self._json(
                    200, {"object": "list", "data": [{"id": "stub-model", "object": "model", "owned_by": "stub"}]}
                )

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                self._record(body)
                if owner.status != 200:
                    # a careless upstream quotes the credentials it was sent
                    seen = self.headers.get("authorization", "")
                    error = {"message": f"stub failure for {seen}", "type": "stub", "code": "stub"}
                    self._json(owner.status, {"error": error})
                    return
                if owner.flood:
                    self.send_response(200)
                    self.send_header("content-type", "text/event-stream")
                    self.send_header("connection", "close")
                    self.end_headers()
                    block = b"x" * FLOOD_BLOCK_BYTES
                    try:
                        self.wfile.write(b"data: ")
                        while owner.flooded < owner.flood:
                            self.wfile.write(block)
                            owner.flooded += len(block)
                    except OSError:  # the proxy hung up
                        pass
                    self.close_connection = True
                    return
                if owner.raw is not None:
                    kind, data = owner.raw
                    self.send_response(200)
                    self.send_header("content-type", kind)
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                text = owner.by_model.get(body.get("model"), owner.reply)
                if text is None:
                    last = next((m for m in reversed(body["messages"]) if m["role"] == "user"), {"content": ""})
                    content = last["content"]
                    if isinstance(content, list):
                        content = "\n".join(p["text"] for p in content)
                    text = f"You said: {content}"
                n = int(body.get("n") or 1)
                pieces = [text[i : i + STREAM_PIECE_CHARS] for i in range(0, len(text), STREAM_PIECE_CHARS)]

                def logprobs(parts: list[str]) -> dict[str, Any] | None:  # the answer's tokens, when asked
                    if not body.get("logprobs"):
                        return None
                    return {"content": [{"token": p, "logprob": -0.5, "top_logprobs": []} for p in parts]}

                base = {"id": "chatcmpl-stub", "created": int(time.time()), "model": body.get("model", "m")}
                usage = {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
                if not body.get("stream"):
                    self._json(
                        200,
                        {
                            **base,
                            "object": "chat.completion",
                            "choices": [
                                {
                                    "index": i,
                                    "message": {"role": "assistant", "content": text, **owner.extra},
                                    "finish_reason": "stop",
                                    "logprobs": logprobs(pieces),
                                }
                                for i in range(n)
                            ],
                            "usage": usage,
                        },
                    )
                    return
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("connection", "close")
                self.end_headers()
                chunk = {**base, "object": "chat.completion.chunk"}

                def send(obj: Any) -> None:
                    self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
                    self.wfile.flush()

                if owner.script is not None:
                    for k, item in enumerate(owner.script):
                        if owner.gate is not None and k == owner.gate[0]:
                            owner.gate[1].wait(GATE_TIMEOUT_S)
                        if isinstance(item, bytes):
                            self.wfile.write(item)
                            self.wfile.flush()
                        else:
                            send({**chunk, **item})
                    self.wfile.write(b"data: [DONE]\n\n")
                    self.wfile.flush()
                    self.close_connection = True
                    return

                for i in range(n):
                    send({**chunk, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""}}]})
                started = time.monotonic()
                for k, piece in enumerate(pieces):
                    if owner.gate is not None and k == owner.gate[0]:
                        owner.gate[1].wait(GATE_TIMEOUT_S)
                    if owner.piece_delay_s:  # on a schedule: piece k at (k + 1) delays, however slow the writes
                        time.sleep(max(0.0, started + (k + 1) * owner.piece_delay_s - time.monotonic()))
                    for i in range(n):
                        delta = {"index": i, "delta": {"content": piece}, "finish_reason": None}
                        send({**chunk, "choices": [{**delta, "logprobs": logprobs([piece])}]})
                if owner.ending is not None:
                    self.wfile.write(owner.ending)
                    self.wfile.flush()
                    self.close_connection = True
                    return
                for i in range(n):
                    for name, value in owner.extra.items():  # one delta per extra field, after the content
                        if name == "tool_calls":
                            value = [{"index": k, **call} for k, call in enumerate(value)]
                        send({**chunk, "choices": [{"index": i, "delta": {name: value}, "finish_reason": None}]})
                for i in range(n):
                    send({**chunk, "choices": [{"index": i, "delta": {}, "finish_reason": "stop"}]})
                if (body.get("stream_options") or {}).get("include_usage"):
                    send({**chunk, "choices": [], "usage": usage})
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def reset(self, reply: str | None = None, status: int = 200, extra: dict[str, Any] | None = None) -> None:
        with self.lock:
            self.requests.clear()
        self.reply = reply
        self.by_model = {}
        self.status = status
        self.extra = dict(extra or {})
        self.escape_slashes = False
        self.raw = None
        self.gate = None
        self.piece_delay_s = 0.0
        self.flood = self.flooded = 0
        self.ending = None
        self.script = None

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
