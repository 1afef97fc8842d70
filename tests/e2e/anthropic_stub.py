"""A model on 127.0.0.1 speaking Anthropic's Messages API (``POST /v1/messages``, JSON and its
server-sent events), for the guard proxy's tests: it records every request it gets (path,
headers, body) and answers with the content blocks the test sets; streamed, a text is sent in
pieces of ``PIECE_CHARS`` characters and a tool_use's input in fragments of ``JSON_PIECE_CHARS``,
so a word or an address spans several events."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PIECE_CHARS = 4
JSON_PIECE_CHARS = 7


class AnthropicStub:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.blocks: list[dict[str, Any]] = [{"type": "text", "text": "Hello from the stub."}]
        self.stop_reason = "end_turn"
        self.status = 200  # another status: answered with an Anthropic-style error body
        self.raw: tuple[str, bytes] | None = None  # (content type, body): a 200 answered exactly so
        self.lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, kind: str, data: bytes) -> None:
                self.send_response(status)
                self.send_header("content-type", kind)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                headers = {k.lower(): v for k, v in self.headers.items()}
                with owner.lock:
                    owner.requests.append({"path": self.path, "headers": headers, "body": body})
                if owner.status != 200:
                    seen = self.headers.get("x-api-key", "")  # a careless upstream quotes the key it got
                    error = {"type": "error", "error": {"type": "api_error", "message": f"stub failure for {seen}"}}
                    self._send(owner.status, "application/json", json.dumps(error).encode())
                    return
                if owner.raw is not None:
                    self._send(200, *owner.raw)
                    return
                message = {
                    "id": "msg_01stub",
                    "type": "message",
                    "role": "assistant",
                    "model": body.get("model", "m"),
                    "content": owner.blocks,
                    "stop_reason": owner.stop_reason,
                    "stop_sequence": None,
                    "usage": {"input_tokens": 11, "output_tokens": 7},
                }
                if not body.get("stream"):
                    self._send(200, "application/json", json.dumps(message).encode())
                    return
                self._send(200, "text/event-stream", b"".join(events(message)))

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def reset(self, blocks: list[dict[str, Any]] | None = None, stop_reason: str = "end_turn") -> None:
        with self.lock:
            self.requests.clear()
        self.blocks = blocks if blocks is not None else [{"type": "text", "text": "Hello from the stub."}]
        self.stop_reason = stop_reason
        self.status = 200
        self.raw = None

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def event(kind: str, obj: dict[str, Any]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **obj})}\n\n".encode()


def events(message: dict[str, Any]) -> list[bytes]:
    """The message as Anthropic streams it."""
    start = {**message, "content": [], "stop_reason": None, "usage": {**message["usage"], "output_tokens": 1}}
    out = [event("message_start", {"message": start}), event("ping", {})]
    for i, block in enumerate(message["content"]):
        if block["type"] == "text":
            out.append(event("content_block_start", {"index": i, "content_block": {"type": "text", "text": ""}}))
            text = block["text"]
            for k in range(0, len(text), PIECE_CHARS):
                delta = {"type": "text_delta", "text": text[k : k + PIECE_CHARS]}
                out.append(event("content_block_delta", {"index": i, "delta": delta}))
        else:
            out.append(event("content_block_start", {"index": i, "content_block": {**block, "input": {}}}))
            text = block["input"] if isinstance(block["input"], str) else json.dumps(block["input"])
            for k in range(0, len(text), JSON_PIECE_CHARS):
                delta = {"type": "input_json_delta", "partial_json": text[k : k + JSON_PIECE_CHARS]}
                out.append(event("content_block_delta", {"index": i, "delta": delta}))
        out.append(event("content_block_stop", {"index": i}))
    ending = {"delta": {"stop_reason": message["stop_reason"], "stop_sequence": None}, "usage": {"output_tokens": 7}}
    out += [event("message_delta", ending), event("message_stop", {})]
    return out
