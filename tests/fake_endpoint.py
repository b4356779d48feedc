"""A small OpenAI-compatible streaming server on loopback that demands credentials and records them.

Enough of /version, /v1/models and streaming /v1/completions (token ids per SSE chunk, a steady few ms
per token) for the profiler to measure and fit; every request's Authorization header is kept, and a
request without the expected one gets 401 like `vllm serve --api-key` answers it.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL = "fake-model"


@dataclass
class FakeEndpoint:
    url: str
    expected_authorization: str | None
    authorizations: list[str | None] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)


@contextmanager
def fake_endpoint(expected_authorization: str | None) -> Iterator[FakeEndpoint]:
    """Serve until the block ends; `expected_authorization` is the exact header value required (None: any)."""
    lock = threading.Lock()
    state: FakeEndpoint

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # keep test output clean
            pass

        def _authorized(self) -> bool:
            got = self.headers.get("Authorization")
            with lock:
                state.authorizations.append(got)
                state.paths.append(self.path)
            if state.expected_authorization is not None and got != state.expected_authorization:
                self._json(401, {"error": "Unauthorized"})
                return False
            return True

        def _json(self, status: int, doc: dict) -> None:
            body = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if not self._authorized():
                return
            if self.path == "/version":
                self._json(200, {"version": "0.0.1-fake"})
            elif self.path == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": MODEL, "max_model_len": 4096}]})
            else:
                self._json(404, {"error": "not found"})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length) or b"{}")
            if not self._authorized():
                return
            if self.path != "/v1/completions":
                self._json(404, {"error": "not found"})
                return
            isl, n = len(body.get("prompt") or []), int(body.get("max_tokens", 1))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            time.sleep(0.002 + isl * 2e-5)  # prefill grows with the prompt
            for k in range(n):
                if k:
                    time.sleep(0.003)
                done = k == n - 1
                event = {
                    "choices": [
                        {"index": 0, "text": "x", "token_ids": [5], "finish_reason": "length" if done else None}
                    ]
                }
                self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
                self.wfile.flush()
            usage = {"choices": [], "usage": {"prompt_tokens": isl, "completion_tokens": n}}
            self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
            self.wfile.flush()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state = FakeEndpoint(f"http://127.0.0.1:{server.server_address[1]}", expected_authorization)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
