"""A real HTTP receiver on loopback for webhook and decision-log tests.

Records every request (method, path, headers, body; gzip bodies decoded) and answers from a
script of responses: each a status, extra headers and an optional delay; when the script is
empty, 200. Bound to 127.0.0.1 only.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAX_WAIT_S = 60.0


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    answered: int = 0


@dataclass
class Reply:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


class Receiver:
    def __init__(self, port: int = 0) -> None:
        self.requests: list[Received] = []
        self.script: list[Reply] = []
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self.release = threading.Event()  # set to end every pending delay at once
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _handle(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                rec = Received(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                with outer._lock:
                    reply = outer.script.pop(0) if outer.script else Reply()
                outer.release.wait(reply.delay_s) if reply.delay_s else None
                try:
                    self.send_response(reply.status)
                    for k, v in reply.headers.items():
                        self.send_header(k, v)
                    self.send_header("content-length", "2")
                    self.end_headers()
                    self.wfile.write(b"ok")
                    rec.answered = reply.status
                except OSError:  # the caller went away
                    pass
                with outer._changed:
                    outer.requests.append(rec)
                    outer._changed.notify_all()

            do_POST = do_PUT = do_PATCH = do_GET = _handle

            def log_message(self, *args: object) -> None:
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def wait_for(self, count: int, timeout: float = MAX_WAIT_S, *, answered: int | None = None) -> list[Received]:
        """Block until ``count`` requests (answered with ``answered``, when given) arrived."""
        deadline = time.monotonic() + min(timeout, MAX_WAIT_S)
        with self._changed:
            while True:
                got = [r for r in self.requests if answered is None or r.answered == answered]
                if len(got) >= count:
                    return got
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{len(got)} of {count} requests after {timeout:g}s: {self.requests}")
                self._changed.wait(left)

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def receiving(port: int = 0) -> Iterator[Receiver]:
    r = Receiver(port)
    try:
        yield r
    finally:
        r.close()
