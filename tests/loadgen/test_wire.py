"""The load generator's HTTP/1.1 client (`llmcap.live.wire`) against a raw server on 127.0.0.1 that
answers canned bytes cut into pieces: every body framing, every outcome a row can have, the request
it sends. Each exchange is bounded by asyncio.wait_for."""

from __future__ import annotations

import asyncio
import json

import pytest

from llmcap.live.client import StreamResult
from llmcap.live.wire import Connector, Endpoint
from tests.live.test_sse_lines import EVENTS, sse_body

pytestmark = pytest.mark.timeout(60)


def chunked(body: bytes, size: int) -> bytes:
    parts = [b"%x\r\n%s\r\n" % (len(body[i : i + size]), body[i : i + size]) for i in range(0, len(body), size)]
    return b"".join(parts) + b"0\r\n\r\n"


def response(body: bytes, framing: str, status: str = "200 OK") -> bytes:
    head = f"HTTP/1.1 {status}\r\ncontent-type: text/event-stream\r\n".encode()
    if framing == "chunked":
        return head + b"transfer-encoding: chunked\r\n\r\n" + chunked(body, 10)
    if framing == "length":
        return head + b"content-length: %d\r\n\r\n" % len(body) + body
    return head + b"connection: close\r\n\r\n" + body  # ends when the server closes


async def exchange(
    wire: bytes,
    piece: int,
    *,
    url_auth: str = "",
    api_key: str | None = None,
    timeout_s: float = 5.0,
    hold_open_s: float = 0.0,
) -> tuple[StreamResult, bytes]:
    """Serve `wire` in `piece`-byte writes to one request; (the client's result, the request it sent)."""
    got = bytearray()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(
                next(x for x in head.split(b"\r\n") if x.lower().startswith(b"content-length:")).split(b":")[1]
            )
            got.extend(head + await reader.readexactly(length))
            for i in range(0, len(wire), piece):
                writer.write(wire[i : i + piece])
                await writer.drain()
            await asyncio.sleep(hold_open_s)
        except (ConnectionError, asyncio.CancelledError):
            pass  # the client hung up first (it aborts on a timeout or a bad event), or the test ended
        finally:
            writer.transport.abort()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        connector = Connector(Endpoint.from_url(f"http://{url_auth}127.0.0.1:{port}/base", api_key))
        await connector.resolve()
        result = StreamResult(sent_s=0.0, isl=3, max_tokens=4)
        endpoint = connector.endpoint
        await asyncio.wait_for(
            connector.exchange(endpoint.request("/v1/completions", b'{"x":1}'), result, timeout_s), 20
        )
    return result, bytes(got)


def run(*args, **kw) -> tuple[StreamResult, bytes]:
    return asyncio.run(exchange(*args, **kw))


def test_every_framing_and_split_counts_every_token_and_the_usage():
    for framing in ("chunked", "length", "eof"):
        for newline in (b"\n", b"\r\n"):
            for piece in (1, 7, 100_000):
                r, _ = run(response(sse_body(EVENTS, newline), framing), piece)
                assert r.status == "ok", (framing, newline, piece, r.error)
                assert r.chunk_tokens == [1, 2, 1] and r.tokens == 4 and r.finish_reason == "length"
                assert (r.prompt_tokens, r.completion_tokens, r.http_status) == (3, 4, 200)


def test_the_request_carries_the_path_body_and_credentials():
    _, sent = run(response(sse_body(EVENTS), "chunked"), 64, api_key="sk-test")
    head, body = sent.split(b"\r\n\r\n", 1)
    assert head.startswith(b"POST /base/v1/completions HTTP/1.1\r\n") and body == b'{"x":1}'
    assert b"\r\nAuthorization: Bearer sk-test" in head and b"\r\nConnection: close" in head
    _, sent = run(response(sse_body(EVENTS), "chunked"), 64, url_auth="user:pw@")
    assert b"\r\nAuthorization: Basic dXNlcjpwdw==" in sent  # base64("user:pw")


def test_an_http_error_is_rejected_with_its_body_as_the_error():
    for framing in ("chunked", "length", "eof"):
        r, _ = run(response(b'{"error": "too long"}', framing, "400 Bad Request"), 5)
        assert (r.status, r.http_status, r.error) == ("rejected", 400, '{"error": "too long"}'), framing
        assert r.chunk_s == []


def test_a_stream_that_ends_without_done_or_is_cut_is_unfinished_and_keeps_its_tokens():
    no_done = sse_body(EVENTS).rsplit(b"data: [DONE]", 1)[0]
    r, _ = run(response(no_done, "chunked"), 9)
    assert r.status == "unfinished" and r.error == "stream ended without data: [DONE]" and r.tokens == 4
    cut = response(sse_body(EVENTS), "chunked")[:-60]  # the server closes mid-body
    r, _ = run(cut, 9)
    assert r.status == "unfinished" and r.error.startswith("RemoteProtocolError") and sum(r.chunk_tokens) >= 1


def test_an_event_that_is_not_json_ends_the_stream_as_unfinished():
    body = b"data: " + json.dumps(EVENTS[0]).encode() + b'\n\ndata: {"choices": [\n\ndata: [DONE]\n\n'
    r, _ = run(response(body, "chunked"), 16)
    assert r.status == "unfinished" and r.error.startswith("JSONDecodeError") and r.chunk_tokens == [1]


def test_a_silent_server_times_the_read_out():
    head_only = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    r, _ = run(head_only, 100, timeout_s=0.3, hold_open_s=3.0)
    assert r.status == "unfinished" and r.error == "ReadTimeout: no data for 0.3 s"


def test_a_refused_connection_is_unfinished_not_raised():
    async def refused() -> StreamResult:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()  # the port is free again: nothing listens
        result = StreamResult(sent_s=0.0, isl=1, max_tokens=1)
        connector = Connector(Endpoint.from_url(f"http://127.0.0.1:{port}"))
        await connector.resolve()
        return await asyncio.wait_for(connector.exchange(b"POST / HTTP/1.1\r\n\r\n", result, 5.0), 20)

    r = asyncio.run(refused())
    assert r.status == "unfinished" and r.error.startswith("ConnectionRefusedError")
