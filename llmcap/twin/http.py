"""A small HTTP/1.1 server on asyncio streams: what an OpenAI-compatible twin needs and no more.

Requests with a Content-Length body (no chunked uploads), keep-alive, responses with a length or
chunked (server-sent events). Every accepted connection is tracked, so a simulated crash can cut
them all mid-stream (`abort_all`), as a dying engine process would. TCP_NODELAY on every socket:
SSE events are small writes, and Nagle with delayed ACKs would hold them back (see
`llmcap.live.client.async_client`).
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from urllib.parse import urlsplit

MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 64 * 1024 * 1024  # long token-id prompts are large JSON


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes
    peer: str  # client address

    def json(self) -> object:
        return json.loads(self.body or b"null")


class Responder:
    """Writes one response: `send` (whole body) or `start_stream` / `chunk` / `end_stream`."""

    def __init__(self, writer: asyncio.StreamWriter, headers: dict[str, str], keep_alive: bool) -> None:
        self._writer = writer
        self._headers = headers
        self.keep_alive = keep_alive
        self.started = False

    def _head(self, status: int, content_type: str, extra: dict[str, str]) -> bytes:
        lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}", f"content-type: {content_type}"]
        lines += [f"{k}: {v}" for k, v in {**self._headers, **extra}.items()]
        lines.append(f"connection: {'keep-alive' if self.keep_alive else 'close'}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def send(
        self, status: int, body: bytes, content_type: str = "application/json", extra: dict[str, str] | None = None
    ) -> None:
        self.started = True
        self._writer.write(self._head(status, content_type, {"content-length": str(len(body)), **(extra or {})}) + body)
        await self._writer.drain()

    async def send_json(self, status: int, doc: object) -> None:
        await self.send(status, json.dumps(doc).encode())

    async def start_stream(self, content_type: str = "text/event-stream", extra: dict[str, str] | None = None) -> None:
        self.started = True
        extra = {"transfer-encoding": "chunked", "cache-control": "no-cache", **(extra or {})}
        self._writer.write(self._head(200, content_type, extra))
        await self._writer.drain()

    async def chunk(self, data: bytes) -> None:
        self._writer.write(b"%x\r\n%s\r\n" % (len(data), data))
        await self._writer.drain()

    async def end_stream(self) -> None:
        self._writer.write(b"0\r\n\r\n")
        await self._writer.drain()

    def abort(self) -> None:
        """Cut this connection mid-response (no last chunk): the client sees the stream break, as it
        would if the server behind died."""
        self.keep_alive = False
        self._writer.transport.abort()


Handler = Callable[[Request, Responder], Awaitable[None]]


class HttpServer:
    def __init__(self, handler: Handler, headers: dict[str, str]) -> None:
        self._handler = handler
        self._headers = headers  # sent with every response
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.StreamWriter] = set()
        self.port = 0

    async def start(self, host: str, port: int) -> int:
        self._server = await asyncio.start_server(self._serve, host, port, limit=MAX_HEAD_BYTES)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    def close_listener(self) -> None:
        if self._server is not None:
            self._server.close()

    def abort_all(self) -> None:
        """Cut every open connection now (no FIN handshake, no last chunk): a crash."""
        for writer in list(self._conns):
            writer.transport.abort()
        self._conns.clear()

    async def stop(self) -> None:
        self.close_listener()
        for writer in list(self._conns):
            writer.close()
        self._conns.clear()
        if self._server is not None:
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = writer.get_extra_info("peername")
        self._conns.add(writer)
        try:
            while True:
                request, keep_alive, problem = await self._read(reader, str(peer[0]) if peer else "")
                if request is None and problem is None:
                    break  # the client closed the connection
                responder = Responder(writer, self._headers, keep_alive and problem is None)
                if problem is not None:
                    await responder.send_json(problem[0], {"error": {"message": problem[1], "code": problem[0]}})
                    break
                assert request is not None
                await self._handler(request, responder)
                if not responder.keep_alive:
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away mid-request or mid-stream
        finally:
            self._conns.discard(writer)
            if not writer.transport.is_closing():
                writer.close()

    async def _read(
        self, reader: asyncio.StreamReader, peer: str
    ) -> tuple[Request | None, bool, tuple[int, str] | None]:
        """(request, keep-alive, problem): (None, _, None) at a clean end of the connection."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return None, False, None
        except asyncio.LimitOverrunError:
            return None, False, (431, "request head too large")
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            return None, False, (400, "malformed request line")
        method, target, version = parts
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return None, False, (411, "send the body with a Content-Length")
        try:
            length = int(headers.get("content-length", "0"))
        except ValueError:
            return None, False, (400, "bad Content-Length")
        if not 0 <= length <= MAX_BODY_BYTES:
            return None, False, (413, "body too large")
        body = await reader.readexactly(length) if length else b""
        conn = headers.get("connection", "").lower()
        keep_alive = conn != "close" if version == "HTTP/1.1" else conn == "keep-alive"
        return Request(method.upper(), urlsplit(target).path, headers, body, peer), keep_alive, None
