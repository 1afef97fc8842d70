"""A real HTTP receiver on loopback for webhook and decision-log tests.

Records every request (method, path, headers, body; gzip bodies decoded) and answers from a
script of responses: each a status, extra headers and an optional delay; when the script is
empty, 200. Bound to 127.0.0.1 only.
"""

from __future__ import annotations

import gzip
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAX_WAIT_S = 60.0


def loopback_grant(*origins: str, signing_env: str) -> str:
    """A tenant's ``webhooks`` grant in an API-keys file (flow YAML): ``origins`` on loopback,
    signed with the secret in the server's environment variable ``signing_env``."""
    grant = {"allow": list(origins), "allow_networks": ["127.0.0.1/32"], "signing_secret": {"env": signing_env}}
    return json.dumps(grant)


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


class HangingReceiver:
    """A loopback port that accepts connections and never answers: every attempt to it lasts
    until the sender's own deadline. Holds at most ``max_held`` connections (older ones
    are closed beyond, so a runaway sender cannot exhaust the test's file descriptors)."""

    def __init__(self, max_held: int = 256) -> None:
        import socket

        self.max_held = max_held
        self.accepted = 0
        self.held: list[socket.socket] = []
        self._lock = threading.Lock()
        self._sock = socket.create_server(("127.0.0.1", 0), backlog=128)
        self._sock.settimeout(0.2)
        self.port = int(self._sock.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self.accepted += 1
                self.held.append(conn)
                if len(self.held) > self.max_held:
                    self.held.pop(0).close()

    def open_connections(self) -> int:
        """Connections the sender still holds open (what they sent is read and dropped)."""
        with self._lock:
            alive = []
            for c in self.held:
                c.setblocking(False)
                closed = False
                try:
                    for _ in range(64):  # bounded: drain what arrived, until EOF or nothing more
                        if c.recv(65536) == b"":
                            closed = True
                            break
                except BlockingIOError:
                    pass
                except OSError:
                    closed = True
                if closed:
                    c.close()
                else:
                    alive.append(c)
            self.held = alive
            return len(alive)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()
        with self._lock:
            for c in self.held:
                c.close()
            self.held = []
