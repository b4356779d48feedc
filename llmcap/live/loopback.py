"""A minimal OpenAI-compatible streaming server, for measuring the load generator itself.

The replay's own capacity (how fast it can send on schedule) must be measured against a server that
costs next to nothing, or the figure is the server's. This one answers every POST with `max_tokens`
SSE events (one token id each, `token_gap_s` apart, chunked like uvicorn), usage, and `[DONE]`;
anything else gets 404. It runs in its own process (`serving_loopback`) so it does not share the
client's interpreter lock, binds 127.0.0.1 only, and is stopped by PID.

`stall_at_s` / `stall_for_s` make it stall: a request arriving within that window after the first
request (server clock) gets its first token only when the window ends — the coordinated-omission
check: the client must keep sending during the stall and count the wait in those requests' TTFT.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
_NOT_FOUND = b"HTTP/1.1 404 Not Found\r\ncontent-length: 9\r\nconnection: close\r\n\r\nnot found"


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _event(obj: dict) -> bytes:
    return _chunk(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")


_TOKEN = _event(
    {"object": "text_completion", "choices": [{"index": 0, "text": " x", "token_ids": [7], "finish_reason": None}]}
)
_LAST = _event(
    {"object": "text_completion", "choices": [{"index": 0, "text": " x", "token_ids": [7], "finish_reason": "length"}]}
)
_DONE = _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip() == b"content-length":
            return int(value)
    return 0


class _Stall:
    """The stall window, on the server's clock from its first request."""

    def __init__(self, at_s: float | None, for_s: float) -> None:
        self.at_s, self.for_s = at_s, for_s
        self.first: float | None = None

    def delay(self, now: float) -> float:
        """How long a request arriving now waits before its first token."""
        if self.first is None:
            self.first = now
        if self.at_s is None:
            return 0.0
        start = self.first + self.at_s
        return start + self.for_s - now if start <= now < start + self.for_s else 0.0


class _Connection(asyncio.Protocol):
    """One request per connection (the load generator opens a fresh one per request)."""

    def __init__(self, gap_s: float, stall: _Stall) -> None:
        self.gap_s, self.stall, self.buf = gap_s, stall, b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        head_end = self.buf.find(b"\r\n\r\n")
        if head_end < 0:
            return
        head = self.buf[:head_end].lower()
        length = _content_length(head)
        if len(self.buf) < head_end + 4 + length:
            return
        body = self.buf[head_end + 4 : head_end + 4 + length]
        self.buf = b""
        assert self.transport is not None
        if not head.startswith(b"post "):
            self.transport.write(_NOT_FOUND)
            self.transport.close()
            return
        tokens = int(json.loads(body).get("max_tokens") or 1)
        loop = asyncio.get_running_loop()
        loop.call_later(self.stall.delay(time.perf_counter()), self._send, tokens, tokens)

    def _send(self, left: int, total: int) -> None:
        t = self.transport
        if t is None or t.is_closing():
            return
        out = (_HEAD if left == total else b"") + (_TOKEN if left > 1 else _LAST)
        if left == 1:
            usage = {"choices": [], "usage": {"prompt_tokens": 0, "completion_tokens": total, "total_tokens": total}}
            t.write(out + _event(usage) + _DONE)
            t.close()
            return
        t.write(out)
        asyncio.get_running_loop().call_later(self.gap_s, self._send, left - 1, total)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


async def serve(port: int, gap_s: float, stall_at_s: float | None, stall_for_s: float) -> None:
    loop = asyncio.get_running_loop()
    stall = _Stall(stall_at_s, stall_for_s)
    server = await loop.create_server(lambda: _Connection(gap_s, stall), "127.0.0.1", port, backlog=4096)
    print(server.sockets[0].getsockname()[1], flush=True)  # the parent reads the port from here
    await server.serve_forever()


@contextmanager
def serving_loopback(
    token_gap_s: float = 0.001, stall_at_s: float | None = None, stall_for_s: float = 0.0
) -> Iterator[str]:
    """Run the server in a child process for the block; yields its base URL; stops it by PID."""
    cmd = [
        sys.executable,
        "-m",
        "llmcap.live.loopback",
        "--token-gap",
        str(token_gap_s),
        "--stall-for",
        str(stall_for_s),
    ]
    if stall_at_s is not None:
        cmd += ["--stall-at", str(stall_at_s)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the port, or "" if it died
        if not line.strip().isdigit():
            raise RuntimeError(f"the loopback server did not start (exit {proc.poll()})")
        yield f"http://127.0.0.1:{int(line)}"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--token-gap", type=float, default=0.001)
    p.add_argument("--stall-at", type=float, default=None)
    p.add_argument("--stall-for", type=float, default=0.0)
    a = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    asyncio.run(serve(a.port, a.token_gap, a.stall_at, a.stall_for))


if __name__ == "__main__":
    main()
