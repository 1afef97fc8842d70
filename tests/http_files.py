"""A real HTTP server on 127.0.0.1:0 serving files from a dict, for download tests (no hub is needed)."""

from __future__ import annotations

import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler], tls: ssl.SSLContext | None = None) -> Iterator[str]:
    """``handler`` answering on 127.0.0.1 (a free port; HTTPS with ``tls``) in a thread of its
    own until the block ends; yields the server's URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


class FileServer:
    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.headers: dict[str, dict[str, str]] = {}
        self.requests: list[str] = []
        self.url = ""

    def add(self, path: str, data: bytes, **headers: str) -> str:
        """Serve ``data`` at ``path``; returns its URL."""
        self.files[path] = data
        self.headers[path] = headers
        return self.url + path


@contextmanager
def file_server() -> Iterator[FileServer]:
    state = FileServer()

    class Handler(BaseHTTPRequestHandler):
        timeout = 10  # a stuck client never holds a thread for long

        def do_GET(self) -> None:
            state.requests.append(self.path)
            data = state.files.get(self.path)
            if data is None:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            for k, v in state.headers.get(self.path, {}).items():
                self.send_header(k.replace("_", "-"), v)
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    with serving(Handler) as url:
        state.url = url
        yield state
