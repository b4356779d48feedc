"""The client's SSE line splitting (no engine needed; the live tests stream the real engine through the
same code). A random-weight model generates arbitrary text, and a line break inside an event's JSON
string (U+2028, U+0085, \\x1c ...) once cut an event in two under httpx's `aiter_lines`."""

from __future__ import annotations

import asyncio
import json

import httpx

from llmcap.live.client import SSELines, stream_completion

ODD_TEXT = "a\u2028b\x85c\x1cd\u2029e\x0bf\x0cg\x1dh\x1ei é€𝄞"  # every str.splitlines boundary that is not CR/LF


def event(text: str, token_ids: list[int], finish: str | None = None) -> dict:
    return {"choices": [{"index": 0, "text": text, "token_ids": token_ids, "finish_reason": finish}]}


def sse_body(events: list[dict], newline: bytes = b"\n") -> bytes:
    # ensure_ascii=False: like vLLM's pydantic JSON, the odd characters go over the wire raw
    parts = [b"data: " + json.dumps(e, ensure_ascii=False).encode() + newline + newline for e in events]
    return b"".join(parts) + b"data: [DONE]" + newline + newline


EVENTS = [
    event(ODD_TEXT, [5]),
    event("\u2028", [6, 7]),
    event("", [8], "length"),
    {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}},
]


def test_lines_end_only_at_cr_and_lf_wherever_the_chunks_split():
    for newline in (b"\n", b"\r\n", b"\r"):
        body = sse_body(EVENTS, newline)
        expected = [f"data: {json.dumps(e, ensure_ascii=False)}" for e in EVENTS] + ["data: [DONE]"]
        for cut in range(1, len(body)):  # every two-chunk split: inside a UTF-8 sequence, between CR and LF
            lines = SSELines()
            got = lines.feed(body[:cut]) + lines.feed(body[cut:])
            assert [x for x in got if x] == expected, (newline, cut)
        one_byte = SSELines()
        assert [x for b in body for x in one_byte.feed(bytes([b])) if x] == expected, newline


def _client(body: bytes, chunk: int) -> httpx.AsyncClient:
    async def chunks():
        for i in range(0, len(body), chunk):
            yield body[i : i + chunk]

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=chunks(), headers={"content-type": "text/event-stream"})

    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


def _stream(body: bytes, chunk: int):
    async def go():
        async with _client(body, chunk) as client:
            return await stream_completion(client, "http://sse.test", "m", [4, 5, 6], 4)

    return asyncio.run(go())


def test_a_stream_with_odd_line_breaks_in_its_text_counts_every_token():
    for chunk in (7, 64, 10_000):
        r = _stream(sse_body(EVENTS), chunk)
        assert r.status == "ok", r.error
        assert r.chunk_tokens == [1, 2, 1] and r.tokens == 4 and r.finish_reason == "length"
        assert (r.prompt_tokens, r.completion_tokens) == (3, 4)


def test_an_event_that_is_not_json_ends_the_stream_as_unfinished_without_raising():
    body = b"data: " + json.dumps(event("x", [5])).encode() + b'\n\ndata: {"choices": [\n\ndata: [DONE]\n\n'
    r = _stream(body, 16)
    assert r.status == "unfinished" and r.error.startswith("JSONDecodeError")
    assert r.chunk_tokens == [1]  # what came before the bad event is kept
