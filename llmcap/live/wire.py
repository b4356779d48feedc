"""A lean HTTP/1.1 streaming POST for the load generator: one asyncio Protocol per request.

Why not httpx here: a replay at 500 req/s spent its time in httpcore's pool (every request scans every
pooled connection) and anyio's cancel scopes, and sent up to 2 s late (benchmarks/loadgen.py). A
Protocol receives each read as a callback — no task switch per chunk, no per-read timeout object: one
timer per request checks the time of the last read (the per-read timeout httpx had).

Each request opens a fresh connection (`Connection: close`), as `llmcap.live.client.async_client`
does and for the same measured reason: on a reused connection vLLM's small SSE writes were held back
(Nagle meeting delayed ACK). The server closes first, so TIME_WAIT stays on its side.

The response is HTTP/1.1 with a chunked, sized or close-delimited body; a 200 body goes to
`SSEEvents` as it arrives. Outcomes follow `stream_completion`: non-200 → rejected (body kept as the
error), transport errors, timeouts, events that are not JSON and streams without `[DONE]` → unfinished.
"""

from __future__ import annotations

import asyncio
import base64
import socket
import ssl
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from llmcap.credentials import redact_text, split_userinfo
from llmcap.errors import LlmcapError
from llmcap.live.client import SSEEvents, StreamResult

ERROR_BODY_BYTES = 4096  # a rejection's body is kept for its error message, up to this much


@dataclass(frozen=True)
class Endpoint:
    """Where and how to POST: the address to connect to, TLS, and the fixed request-head lines."""

    host: str  # as in the URL (Host header, TLS server name)
    port: int
    tls: bool
    path_prefix: str  # the base URL's path, e.g. "" or "/proxy"
    fixed_headers: bytes  # Host, auth, content type, ... each line ending CRLF

    @classmethod
    def from_url(cls, base_url: str, api_key: str | None = None) -> Endpoint:
        url, userinfo = split_userinfo(base_url.rstrip("/"))
        if userinfo is not None and api_key is not None:
            raise LlmcapError("the endpoint URL carries user:password and an API key is set: use one of them")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise LlmcapError(f"{redact_text(base_url)}: not an http(s) URL")
        tls = parts.scheme == "https"
        port = parts.port or (443 if tls else 80)
        host = parts.hostname
        lines = [
            f"Host: {host}:{port}" if ":" not in host else f"Host: [{host}]:{port}",
            "User-Agent: llmcap",
            "Accept: text/event-stream",
            "Content-Type: application/json",
            "Connection: close",
        ]
        if api_key is not None:
            lines.append(f"Authorization: Bearer {api_key}")
        elif userinfo is not None:
            lines.append("Authorization: Basic " + base64.b64encode(f"{userinfo[0]}:{userinfo[1]}".encode()).decode())
        return cls(host, port, tls, parts.path.rstrip("/"), "".join(f"{x}\r\n" for x in lines).encode())

    def request(self, path: str, body: bytes, request_id: int | None = None) -> bytes:
        """The whole request (head and JSON body) as it goes on the wire; `request_id` goes in X-Request-Id
        (vLLM's request-id header), so a gateway or engine log can be joined with the replay's rows."""
        rid = b"" if request_id is None else b"X-Request-Id: %d\r\n" % request_id
        head = b"POST %s HTTP/1.1\r\n%s%sContent-Length: %d\r\n\r\n" % (
            (self.path_prefix + path).encode(),
            self.fixed_headers,
            rid,
            len(body),
        )
        return head + body


class Connector:
    """Opens connections to one endpoint; the name is resolved once, before the run (a lookup per
    request would go through the loop's thread pool)."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self._address: str | None = None
        self._tls = ssl.create_default_context() if endpoint.tls else None

    async def resolve(self) -> None:
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(self.endpoint.host, self.endpoint.port, type=socket.SOCK_STREAM)
        self._address = str(infos[0][4][0])

    async def exchange(self, request: bytes, result: StreamResult, timeout_s: float) -> StreamResult:
        """Send `request` on a fresh connection and fold the response into `result`; never raises for
        server or transport errors (its status says). `timeout_s` bounds the connect and every wait
        for the next read."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        proto = _Exchange(request, result, done, timeout_s)
        try:
            async with asyncio.timeout(timeout_s):
                await loop.create_connection(
                    lambda: proto,
                    self._address or self.endpoint.host,
                    self.endpoint.port,
                    ssl=self._tls,
                    server_hostname=self.endpoint.host if self._tls else None,
                )
        except (OSError, TimeoutError) as exc:
            kind = "ConnectTimeout" if isinstance(exc, TimeoutError) else type(exc).__name__
            result.status, result.error = "unfinished", redact_text(f"{kind}: {exc}")[:500]
            return result
        try:
            await done
        except asyncio.CancelledError:
            proto.abort()
            raise
        return result


class _Exchange(asyncio.Protocol):
    """One request and its streamed response on one connection."""

    def __init__(self, request: bytes, result: StreamResult, done: asyncio.Future[None], timeout_s: float) -> None:
        self.request, self.result, self.done, self.timeout_s = request, result, done, timeout_s
        self.events = SSEEvents(result)
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.head_done = False
        self.mode = "eof"  # how the body ends: "chunked", "length" or "eof" (the server closes)
        self.left = 0  # length mode: body bytes still due; chunked: bytes left in the current chunk
        self.error_body = b""
        self.last_read = 0.0
        self.timer: asyncio.TimerHandle | None = None

    # ---------------------------------------------------------------- transport callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.transport.write(self.request)  # type: ignore[union-attr]
        self.last_read = time.perf_counter()
        self.timer = asyncio.get_running_loop().call_later(self.timeout_s, self._check_idle)

    def data_received(self, data: bytes) -> None:
        now = self.last_read = time.perf_counter()
        if self.done.done():
            return
        try:
            self._parse(data, now)
        except ValueError as exc:  # an event that is not JSON, or HTTP we cannot read
            self._finish("unfinished", f"{type(exc).__name__}: {exc}")

    def eof_received(self) -> bool | None:
        return None  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        if self.done.done():
            return
        if not self.head_done:
            self._finish("unfinished", f"RemoteProtocolError: connection closed before a response ({exc or 'EOF'})")
        elif self.mode == "eof" or self.result.status == "rejected":
            self._body_end()
        else:
            self._finish("unfinished", f"RemoteProtocolError: connection closed mid-body ({exc or 'EOF'})")

    def _check_idle(self) -> None:
        if self.done.done():
            return
        idle = time.perf_counter() - self.last_read
        if idle >= self.timeout_s:
            self._finish("unfinished", f"ReadTimeout: no data for {self.timeout_s:g} s")
        else:
            self.timer = asyncio.get_running_loop().call_later(self.timeout_s - idle, self._check_idle)

    # ---------------------------------------------------------------- HTTP/1.1 framing
    def _parse(self, data: bytes, now: float) -> None:
        if not self.head_done:
            self.buf += data
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            self._head(self.buf[:end])
            data, self.buf = self.buf[end + 4 :], b""
            if self.mode == "length" and self.left == 0:
                self._body_end()
                return
        if self.mode == "chunked":
            self._dechunk(data, now)
        elif self.mode == "length":
            piece = data[: self.left]
            self.left -= len(piece)
            self._body(piece, now)
            if self.left == 0 and not self.done.done():
                self._body_end()
        else:
            self._body(data, now)

    def _head(self, head: bytes) -> None:
        status_line, *lines = head.split(b"\r\n")
        parts = status_line.split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
            raise ValueError(f"not an HTTP response: {status_line[:80]!r}")
        self.head_done = True
        self.result.http_status = int(parts[1])
        if self.result.http_status != 200:
            self.result.status = "rejected"
        for line in lines:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"transfer-encoding" and b"chunked" in value.lower():
                self.mode = "chunked"
            elif name == b"content-length" and self.mode != "chunked":
                self.mode, self.left = "length", int(value)

    def _dechunk(self, data: bytes, now: float) -> None:
        buf = self.buf + data if self.buf else data
        self.buf = b""
        pos = 0
        while pos < len(buf) and not self.done.done():
            if self.left > 0:  # inside a chunk: hand over what arrived, even if the chunk is not complete
                piece = buf[pos : pos + self.left]
                self.left -= len(piece)
                pos += len(piece)
                self._body(piece, now)
                if self.left == 0:
                    self.left = -2  # its CRLF follows
                continue
            if self.left < 0:  # the CRLF after a chunk's data
                skip = min(-self.left, len(buf) - pos)
                pos, self.left = pos + skip, self.left + skip
                continue
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                self.buf = buf[pos:]
                return
            size = int(buf[pos:eol].split(b";", 1)[0].strip(), 16)
            pos = eol + 2
            if size == 0:  # the last chunk (trailers, if any, are not read)
                self._body_end()
                return
            self.left = size

    def _body(self, piece: bytes, now: float) -> None:
        if self.result.status == "rejected":
            self.error_body = (self.error_body + piece)[:ERROR_BODY_BYTES]
        elif piece and self.events.feed(piece, now):
            self._finish("ok", None)

    def _body_end(self) -> None:
        if self.result.status == "rejected":
            self._finish("rejected", self.error_body.decode(errors="replace")[:500])
        else:
            self._finish("unfinished", "stream ended without data: [DONE]")

    def _finish(self, status: str, error: str | None) -> None:
        if self.done.done():
            return
        self.result.status = status
        self.result.error = None if error is None else redact_text(error)[:500]
        if self.timer is not None:
            self.timer.cancel()
        if self.transport is not None:
            if status == "ok":
                self.transport.close()  # [DONE] came: what may follow is the body's end, not needed
            else:
                self.transport.abort()
        self.done.set_result(None)

    def abort(self) -> None:
        """The replay was cancelled: drop the connection, the result stays as it was."""
        if self.timer is not None:
            self.timer.cancel()
        if self.transport is not None:
            self.transport.abort()
