"""A streaming client for any OpenAI-compatible completions endpoint (vLLM, SGLang, TRT-LLM serve, ...).

What capacity measurements need from a request, and how we get it exactly:
- exact ISL: the prompt is a list of token ids (no tokenizer round trip);
- exact OSL: `max_tokens` with `ignore_eos` (vLLM's extension; other servers ignore unknown keys);
- token timing: one timestamp per SSE chunk, with the number of tokens the chunk carries counted from
  `token_ids` (vLLM's `return_token_ids`) — never from text, which can hold 0 or several tokens;
  servers without it count one token per chunk and `usage.completion_tokens` is the total.

Timestamps are `time.perf_counter()` seconds; callers subtract their own zero.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

from llmcap.credentials import redact_text, split_userinfo
from llmcap.errors import LlmcapError

_LINE_END = re.compile(rb"\r\n|\r|\n")

FIRST_ORDINARY_ID = 4  # keep clear of the usual special ids (<unk> <s> </s> <pad>) at the start of a vocab


@dataclass
class StreamResult:
    """One streamed completion as the client saw it."""

    sent_s: float  # perf_counter when the request was sent
    isl: int  # prompt tokens we sent
    max_tokens: int
    chunk_s: list[float] = field(default_factory=list)  # arrival time of each chunk carrying tokens
    chunk_tokens: list[int] = field(default_factory=list)  # tokens in that chunk
    prompt_tokens: int | None = None  # usage.prompt_tokens
    completion_tokens: int | None = None  # usage.completion_tokens
    finish_reason: str | None = None
    status: str = "ok"  # ok | unfinished (stream broke / no [DONE]) | rejected (HTTP error)
    error: str | None = None
    http_status: int | None = None

    @property
    def tokens(self) -> int:
        """Generated tokens: usage when the server sent it, else the per-chunk count."""
        return self.completion_tokens if self.completion_tokens is not None else sum(self.chunk_tokens)

    @property
    def first_token_s(self) -> float | None:
        return self.chunk_s[0] if self.chunk_s else None

    @property
    def finish_s(self) -> float | None:
        return self.chunk_s[-1] if self.chunk_s else None

    @property
    def ttft_s(self) -> float | None:
        return None if not self.chunk_s else self.chunk_s[0] - self.sent_s

    def token_times(self) -> np.ndarray:
        """Arrival time of every generated token (tokens sharing a chunk share its time)."""
        return np.repeat(np.asarray(self.chunk_s, dtype=np.float64), np.asarray(self.chunk_tokens, dtype=np.int64))

    def itls(self) -> np.ndarray:
        """Every inter-token gap as the client saw it (0 between tokens of one chunk)."""
        return np.diff(self.token_times())


def token_prompt(n: int, vocab_size: int, seed: int) -> list[int]:
    """n pseudo-random ordinary token ids; a different seed gives a different first block, so
    a prefix cache never serves one profile request from another."""
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(FIRST_ORDINARY_ID, vocab_size, size=n)]


def completion_body(model: str, prompt: list[int], max_tokens: int, ignore_eos: bool = True) -> dict:
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": ignore_eos,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }


async def stream_completion(
    client: httpx.AsyncClient, base_url: str, model: str, prompt: list[int], max_tokens: int, timeout_s: float = 600.0
) -> StreamResult:
    """POST /v1/completions with streaming; never raises for server or transport errors (status says)."""
    result = StreamResult(sent_s=time.perf_counter(), isl=len(prompt), max_tokens=max_tokens)
    body = completion_body(model, prompt, max_tokens)
    done = False
    try:
        async with client.stream("POST", f"{base_url}/v1/completions", json=body, timeout=timeout_s) as r:
            result.http_status = r.status_code
            if r.status_code != 200:
                result.status = "rejected"
                result.error = redact_text((await r.aread()).decode(errors="replace")[:500])
                return result
            events = SSEEvents(result)
            async for chunk in r.aiter_bytes():
                if events.feed(chunk, time.perf_counter()):
                    done = True
                    break
    except (TimeoutError, httpx.HTTPError, ValueError) as exc:  # ValueError: an event that is not JSON
        result.status = "unfinished"
        result.error = redact_text(f"{type(exc).__name__}: {exc}")[:500]  # a transport error may quote the URL
        return result
    if not done:
        result.status = "unfinished"
        result.error = "stream ended without data: [DONE]"
    return result


class SSEEvents:
    """A completion stream's body, fed in arbitrary byte chunks, folded into its StreamResult: only
    what a row needs (tokens per event, arrival times, usage, finish reason) is kept."""

    def __init__(self, result: StreamResult) -> None:
        self.result, self._lines = result, SSELines()

    def feed(self, chunk: bytes, now: float) -> bool:
        """True once `data: [DONE]` arrived; raises ValueError for an event that is not JSON.
        `now` stamps every event the chunk completes (they arrived together)."""
        for line in self._lines.feed(chunk):
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return True
            _add_event(self.result, json.loads(data), now)
        return False


def _add_event(result: StreamResult, event: dict, now: float) -> None:
    if event.get("usage"):
        result.prompt_tokens = event["usage"].get("prompt_tokens")
        result.completion_tokens = event["usage"].get("completion_tokens")
    for choice in event.get("choices") or []:
        ids = choice.get("token_ids")
        # completions carry `text`, chat completions `delta.content`; without token ids, one token per event
        text = choice.get("text") or (choice.get("delta") or {}).get("content")
        n = len(ids) if ids is not None else (1 if text else 0)
        if n:
            result.chunk_s.append(now)
            result.chunk_tokens.append(n)
        if choice.get("finish_reason"):
            result.finish_reason = choice["finish_reason"]


class SSELines:
    """The lines of a text/event-stream body fed in arbitrary byte chunks, ending only where the SSE
    spec says: CRLF, LF or CR. httpx's `iter_lines` also ends lines at U+2028, U+0085, \\x1c and the
    other `str.splitlines` boundaries, which a model's generated text can hold (a random-weight model's
    did): it cut an event's JSON in two. Splitting the bytes is safe: no UTF-8 sequence holds CR or LF."""

    def __init__(self) -> None:
        self._rest = b""

    def feed(self, chunk: bytes) -> list[str]:
        """The lines completed by `chunk` (decoded as UTF-8); a trailing partial line waits for the next."""
        buf = self._rest + chunk
        held = buf.endswith(b"\r")  # maybe the first half of a CRLF split between chunks
        *done, rest = _LINE_END.split(buf[:-1] if held else buf)
        self._rest = rest + b"\r" if held else rest
        return [line.decode("utf-8", errors="replace") for line in done]


async def get_json(client: httpx.AsyncClient, url: str) -> dict | None:
    """GET a JSON document, or None when the server has no such endpoint."""
    try:
        r = await client.get(url, timeout=30.0)
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    try:
        return r.json()
    except ValueError:
        return None


async def server_version(client: httpx.AsyncClient, base_url: str) -> str | None:
    """The engine version from GET /version (vLLM, SGLang answer it); None where absent."""
    doc = await get_json(client, f"{base_url}/version")
    return None if doc is None else str(doc.get("version")) if doc.get("version") is not None else None


async def served_models(client: httpx.AsyncClient, base_url: str) -> list[dict]:
    doc = await get_json(client, f"{base_url}/v1/models")
    return list(doc.get("data") or []) if doc else []


def async_client(
    max_connections: int = 1024,
    keepalive: bool = False,
    *,
    basic_auth: tuple[str, str] | None = None,
    api_key: str | None = None,
) -> httpx.AsyncClient:
    """A client for load generation: generous pool (open loop must never queue in the client).

    `api_key` goes in `Authorization: Bearer` (what `vllm serve --api-key` and OpenAI-style servers
    check); `basic_auth` is the user:password an endpoint URL carried (`endpoint_client` splits it off).

    No keep-alive by default: on a reused connection vLLM's small SSE writes were held back until
    the whole response was done (measured: 64 tokens arriving within 1 ms after 130 ms, while a
    fresh connection streams each token ~2 ms apart) — TCP delayed ACK meeting Nagle on the
    server side. A fresh connection per request costs ~0.1 ms on loopback and is what many
    independent users look like anyway.
    """
    if basic_auth is not None and api_key is not None:
        raise LlmcapError("the endpoint URL carries user:password and an API key is set: use one of them")
    limits = httpx.Limits(
        max_connections=max_connections, max_keepalive_connections=max_connections if keepalive else 0
    )
    headers = {"Authorization": f"Bearer {api_key}"} if api_key is not None else None
    return httpx.AsyncClient(
        limits=limits,
        timeout=httpx.Timeout(600.0, connect=30.0),
        headers=headers,
        auth=httpx.BasicAuth(*basic_auth) if basic_auth is not None else None,
    )


def endpoint_client(base_url: str, api_key: str | None = None, **kwargs: Any) -> tuple[str, httpx.AsyncClient]:
    """(the base URL to request, without `user:password@`; a client that authenticates instead).

    httpx logs every request URL, password included, so credentials never stay in the URL we request.
    """
    url, userinfo = split_userinfo(base_url.rstrip("/"))
    return url, async_client(basic_auth=userinfo, api_key=api_key, **kwargs)
