"""A webhook receiver for alert tests: an HTTP server on 127.0.0.1 that keeps every JSON
body POSTed to it (the ``receiver`` fixture, tests/conftest.py); apprise's ``json://``
notifier posts there."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Receiver:
    """Where to post (``url``: ``json://127.0.0.1:PORT/hook``) and what came, in order."""

    url: str
    bodies: list[dict[str, Any]] = field(default_factory=list)


@contextmanager
def serve() -> Iterator[Receiver]:
    got: list[dict[str, Any]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            got.append({"path": self.path, **json.loads(body)})
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Receiver(f"json://127.0.0.1:{server.server_address[1]}/hook", got)
    finally:
        server.shutdown()
        server.server_close()
