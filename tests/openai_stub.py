"""A stub LLM provider on 127.0.0.1 speaking the OpenAI chat-completions API, for tests that
drive LLM evaluators through a real server. It records each Authorization header and echoes
the key back in its answer (a hostile or careless provider), so masking is put to the test,
and reports ``usage`` tokens as configured, so token metering is too."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class OpenAIStub:
    def __init__(self, *, prompt_tokens: int = 1, completion_tokens: int = 1, score: float = 0.2) -> None:
        self.authorizations: list[str] = []
        self.calls = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                self.rfile.read(length)
                auth = self.headers.get("authorization", "")
                owner.authorizations.append(auth)
                owner.calls += 1
                seen = auth.removeprefix("Bearer ")
                content = json.dumps(
                    {"safety_score": score, "violations": [f"saw {seen}"], "reasoning": f"the key was {seen}"}
                )
                usage = {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                }
                body = json.dumps(
                    {
                        "id": "chatcmpl-1",
                        "object": "chat.completion",
                        "created": 0,
                        "model": "m",
                        "choices": [
                            {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
                        ],
                        "usage": usage,
                    }
                ).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
