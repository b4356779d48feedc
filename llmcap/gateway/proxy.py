"""The gateway: an OpenAI-compatible pass-through (streaming) in front of a baseline and a candidate.

- Routing: each completion request goes to the candidate or the baseline by `TrafficSplit` (sticky by
  session or prompt prefix). The weight changes at run time (`set_weight`, or POST /admin/weights from
  loopback) without touching requests in flight.
- Failures: a request that fails on the candidate before the gateway has sent its client a byte
  (connection refused or reset, HTTP 5xx or 429, a stream that ends before its first chunk) is retried
  on the baseline and counted (`retried`). One that breaks mid-stream cannot be retried without
  repeating tokens: the client's stream is cut too, and the row says `failed_midstream`.
- Shadows: a share of requests is copied to each shadow target, answers read and discarded. Copies run
  on their own connection pool and are bounded per target (`max_in_flight`: past it a copy is dropped
  and counted), so a slow or stalled shadow never holds up or fails production.
- Records: one row per request the gateway saw (`GATEWAY_SCHEMA`: the shared request schema as the
  gateway measured it, plus which side the split chose, which served it, and what went wrong), and
  one per shadow copy. A recording file gets each row as a JSON line the moment the request ends, so
  a killed gateway loses none that finished.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx
import pyarrow as pa

from llmcap.gateway.metrics import GatewayMetrics
from llmcap.gateway.split import PREFIX_TOKENS, TrafficSplit, sticky_key
from llmcap.live.client import SSEEvents, StreamResult
from llmcap.live.trace_replay import request_row
from llmcap.sim.records import REQUEST_SCHEMA
from llmcap.twin.http import HttpServer, Request, Responder

LOOPBACK = ("127.0.0.1", "::1", "localhost")
COMPLETION_PATHS = ("/v1/completions", "/v1/chat/completions")
PROXIED_GETS = ("/v1/models", "/version")  # answered by the baseline
FORWARDED_HEADERS = ("authorization", "content-type", "accept", "x-request-id", "x-session-id", "x-llmcap-session")
RETRYABLE = {429} | set(range(500, 600))

GATEWAY_SCHEMA = pa.schema(
    [
        *REQUEST_SCHEMA,
        pa.field("seq", pa.int64(), nullable=False),  # the gateway's arrival number
        pa.field(
            "routed", pa.string(), nullable=False
        ),  # the side the split chose, shadow:NAME, or none (refused unread)
        pa.field("side", pa.string()),  # the side that served it (null: none did)
        pa.field("retried", pa.bool_(), nullable=False),
        pa.field("outcome", pa.string(), nullable=False),  # llmcap.gateway.metrics.OUTCOMES
        pa.field("http_status", pa.int32()),
        pa.field("error", pa.string()),
    ]
)


@dataclass(frozen=True)
class ShadowTarget:
    name: str
    url: str
    share: float = 1.0  # of the requests, copied here
    max_in_flight: int = 16  # copies in flight at once; past it a copy is dropped (counted)
    timeout_s: float = 120.0


@dataclass(frozen=True)
class GatewayConfig:
    baseline: str
    candidate: str | None = None
    candidate_weight: float = 0.0
    shadows: tuple[ShadowTarget, ...] = ()
    prefix_tokens: int = PREFIX_TOKENS  # sticky prefix key length (0: no prefix stickiness)
    timeout_s: float = 600.0  # per upstream read

    def __post_init__(self) -> None:
        if self.candidate is None and self.candidate_weight > 0:
            raise ValueError("a candidate weight above 0 needs a candidate URL")
        names = [s.name for s in self.shadows]
        if len(set(names)) != len(names):
            raise ValueError(f"shadow target names must be unique: {names}")


class _UpstreamFailed(Exception):
    """The side failed before the gateway sent its client anything (so the request can go elsewhere)."""

    def __init__(self, message: str, status: int | None = None, body: bytes = b"") -> None:
        super().__init__(message)
        self.status, self.body = status, body


@dataclass
class _Flight:
    seq: int
    request_id: int
    routed: str
    result: StreamResult
    retried: bool = False
    side: str | None = None
    outcome: str = "ok"
    error: str | None = None


@dataclass
class Gateway:
    config: GatewayConfig
    record: Path | None = None  # JSON lines, one per finished request (and shadow copy)
    rows: list[dict] = field(default_factory=list)
    shadow_rows: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.split = TrafficSplit(self.config.candidate_weight)
        self.metrics = GatewayMetrics()
        self.metrics.weight.set(self.split.candidate_weight)
        self.http = HttpServer(self._handle, {"server": "llmcap-gateway"})
        self.url = ""
        self.t0 = time.perf_counter()
        self._seq = 0
        self._clients: dict[str, httpx.AsyncClient] = {}
        self._mirrors: set[asyncio.Task] = set()
        self._mirror_in_flight = {s.name: 0 for s in self.config.shadows}
        self.mirror_counts = {s.name: {"mirrored": 0, "dropped": 0, "failed": 0} for s in self.config.shadows}
        self.in_flight = {"baseline": 0, "candidate": 0}
        self._open: set[asyncio.Task] = (
            set()
        )  # completion handlers not yet recorded (a client may hold its last byte first)
        self._recorded = asyncio.Event()
        self._record: IO[str] | None = None
        self.weight_log: list[tuple[float, float]] = [(0.0, self.split.candidate_weight)]  # (gateway s, weight)

    # ------------------------------------------------------------ life cycle

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        upstreams = {"baseline": self.config.baseline, "candidate": self.config.candidate}
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
        for side, url in upstreams.items():
            if url is not None:
                self._clients[side] = httpx.AsyncClient(
                    base_url=url.rstrip("/"), limits=limits, timeout=self._timeout(self.config.timeout_s)
                )
        for s in self.config.shadows:  # a pool of its own each: a stalled shadow holds only its own connections
            self._clients[f"shadow:{s.name}"] = httpx.AsyncClient(
                base_url=s.url.rstrip("/"), timeout=self._timeout(s.timeout_s)
            )
        if self.record is not None:
            self.record.parent.mkdir(parents=True, exist_ok=True)
            self._record = self.record.open("a", encoding="utf-8")
        bound = await self.http.start(host, port)
        self.t0 = time.perf_counter()
        self.url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{bound}"
        return self.url

    async def cut_mirrors(self) -> None:
        """Stop every shadow copy still streaming (each ends as a failed row)."""
        tasks = list(self._mirrors)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def settle(self) -> None:
        """Wait until every request that reached the gateway has its row (read `table()` after this)."""
        while self._open:
            self._recorded.clear()
            await self._recorded.wait()

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop serving; a request still waiting on its upstream after `grace_s` is cut, and recorded as cut."""
        await self.http.stop()  # closes the connections: a stream still open ends as client_gone, and is recorded
        try:
            await asyncio.wait_for(self.settle(), grace_s)
        except TimeoutError:
            for task in list(self._open):
                task.cancel()
            await self.settle()
        await self.cut_mirrors()
        for client in self._clients.values():
            await client.aclose()
        if self._record is not None:
            self._record.close()
            self._record = None

    @staticmethod
    def _timeout(read_s: float) -> httpx.Timeout:
        return httpx.Timeout(connect=10.0, read=read_s, write=30.0, pool=None)

    def set_weight(self, weight: float) -> None:
        self.split.set(weight)
        self.metrics.weight.set(weight)
        self.weight_log.append((self.now(), weight))

    @property
    def mirrors_in_flight(self) -> int:
        """Shadow copies still streaming."""
        return len(self._mirrors)

    @property
    def requests_open(self) -> int:
        """Requests the gateway has taken and not yet recorded."""
        return len(self._open)

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def table(self) -> pa.Table:
        """Every request the gateway finished, in arrival order (complete after `settle()` or `stop()`)."""
        return pa.Table.from_pylist(sorted(self.rows, key=lambda r: r["seq"]), schema=GATEWAY_SCHEMA)

    def shadow_table(self) -> pa.Table:
        return pa.Table.from_pylist(sorted(self.shadow_rows, key=lambda r: r["seq"]), schema=GATEWAY_SCHEMA)

    # ------------------------------------------------------------ HTTP

    async def _handle(self, req: Request, res: Responder) -> None:
        if req.method == "POST" and req.path in COMPLETION_PATHS:
            await self._completion(req, res)
        elif req.method == "GET" and req.path == "/health":
            await res.send(200, b"")
        elif req.method == "GET" and req.path == "/metrics":
            await res.send(200, self.metrics.render(), "text/plain; version=0.0.4; charset=utf-8")
        elif req.path == "/admin/weights" and req.method in ("GET", "POST"):
            await self._admin_weights(req, res)
        elif req.method == "GET" and req.path in PROXIED_GETS:
            try:
                r = await self._clients["baseline"].get(req.path)
                await res.send(r.status_code, r.content, r.headers.get("content-type", "application/json"))
            except httpx.HTTPError as exc:
                await _error(res, 502, f"the baseline did not answer: {type(exc).__name__}")
        else:
            await _error(res, 404, f"no route {req.method} {req.path}")

    async def _admin_weights(self, req: Request, res: Responder) -> None:
        if req.peer not in LOOPBACK:
            await _error(res, 403, "the weights answer loopback clients only")
            return
        if req.method == "POST":
            try:
                doc = req.json()
                weight = float(doc["candidate"])  # type: ignore[index]
                if self.config.candidate is None and weight > 0:
                    raise ValueError("this gateway has no candidate")
                self.set_weight(weight)
            except (ValueError, TypeError, KeyError) as exc:
                await _error(res, 400, f'POST {{"candidate": W}} with W in [0, 1]: {exc}')
                return
        await res.send_json(
            200,
            {
                "candidate": self.split.candidate_weight,
                "baseline": 1.0 - self.split.candidate_weight,
                "requests": self._seq,
                "in_flight": dict(self.in_flight),
            },
        )

    async def _completion(self, req: Request, res: Responder) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._open.add(task)
        try:
            await self._complete(req, res)
        finally:
            self._open.discard(task)
            self._recorded.set()

    async def _complete(self, req: Request, res: Responder) -> None:
        arrived = time.perf_counter()
        self._seq += 1
        seq = self._seq
        try:
            body = req.json()
            if not isinstance(body, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:  # answered here, and still a row: every request is accounted for
            flight = _Flight(
                seq, _request_id(req, seq), "none", _result({}, arrived), outcome="rejected", error=f"gateway: {exc}"
            )
            flight.result.status, flight.result.http_status = "rejected", 400
            self._finish(flight, self.rows, arrived)
            await _error(res, 400, f"the body is not a JSON object: {exc}")
            return
        key = sticky_key(req.headers, body, seq, self.config.prefix_tokens)
        routed = self.split.side(key)
        for shadow in self.config.shadows:
            if TrafficSplit.mirrored(key, shadow.share, shadow.name):
                self._mirror(shadow, req, seq, arrived)
        flight = _Flight(seq, _request_id(req, seq), routed, _result(body, arrived))
        try:
            await self._serve(flight, req, res, body.get("stream") is True)
        except asyncio.CancelledError:  # the gateway stopped with this request still open
            flight.result.status, flight.outcome, flight.error = "unfinished", "failed_midstream", "gateway: stopped"
            raise
        finally:
            self._finish(flight, self.rows, arrived)

    async def _serve(self, flight: _Flight, req: Request, res: Responder, streaming: bool) -> None:
        sides = ["candidate", "baseline"] if flight.routed == "candidate" else ["baseline"]
        for side in sides:
            self.in_flight[side] += 1
            self.metrics.in_flight.labels(side).inc()
            try:
                flight.side = side
                await self._forward(side, flight, req, res, streaming)
                return
            except _UpstreamFailed as exc:
                flight.error = f"{side}: {exc}"
                if side == "candidate":
                    flight.retried = True
                    self.metrics.retries.inc()
                    continue
                flight.side, flight.outcome = None, "rejected"
                flight.result.status, flight.result.http_status = "rejected", exc.status or 502
                if exc.body:
                    await res.send(exc.status or 502, exc.body)
                else:
                    await _error(res, exc.status or 502, flight.error)
            finally:
                self.in_flight[side] -= 1
                self.metrics.in_flight.labels(side).dec()

    async def _forward(self, side: str, flight: _Flight, req: Request, res: Responder, streaming: bool) -> None:
        """Pass the request through to `side`; raises _UpstreamFailed while nothing has reached the client."""
        client = self._clients[side]
        headers = {h: req.headers[h] for h in FORWARDED_HEADERS if h in req.headers}
        r = flight.result
        try:
            up = await client.send(
                client.build_request("POST", req.path, content=req.body, headers=headers), stream=True
            )
        except httpx.HTTPError as exc:
            raise _UpstreamFailed(f"{type(exc).__name__}: {exc}") from None
        try:
            r.http_status = up.status_code
            chunks = up.aiter_bytes()
            try:
                first = await anext(chunks) if up.status_code == 200 else await up.aread()
            except StopAsyncIteration:
                raise _UpstreamFailed("the stream ended before its first byte") from None
            except httpx.HTTPError as exc:
                raise _UpstreamFailed(f"{type(exc).__name__} before the first byte") from None
            if up.status_code != 200:
                if up.status_code in RETRYABLE:
                    raise _UpstreamFailed(f"HTTP {up.status_code}", up.status_code, first)
                r.status, flight.outcome = "rejected", "rejected"  # the client's own error: passed on, not retried
                await res.send(
                    up.status_code, first, up.headers.get("content-type", "application/json"), {"x-llmcap-side": side}
                )
                return
            extra = {"x-llmcap-side": side}
            content_type = up.headers.get("content-type", "application/json")
            if not streaming:
                body = first + await up.aread()
                r.chunk_s.append(time.perf_counter())
                _usage(r, body)
                r.chunk_tokens.append(r.completion_tokens or 0)
                await res.send(200, body, content_type, extra)
                return
            events = SSEEvents(r)
            await res.start_stream(content_type, extra)
            done = events.feed(first, time.perf_counter())
            await res.chunk(first)
            try:
                async for chunk in chunks:
                    done = events.feed(chunk, time.perf_counter()) or done
                    await res.chunk(chunk)
            except (httpx.HTTPError, ValueError) as exc:
                r.status, flight.outcome, flight.error = (
                    "unfinished",
                    "failed_midstream",
                    f"{side}: {type(exc).__name__} mid-stream",
                )
                res.abort()
                return
            await res.end_stream()
            if not done:
                r.status, flight.outcome, flight.error = (
                    "unfinished",
                    "failed_midstream",
                    f"{side}: stream ended without [DONE]",
                )
            elif r.finish_reason is not None:
                r.max_tokens = min(r.max_tokens, r.tokens)  # stopped by the model: finished, not cut short
        except (
            ConnectionError,
            RuntimeError,
        ) as exc:  # the client went away (RuntimeError: writing to a closed transport)
            r.status, flight.outcome, flight.error = "unfinished", "client_gone", f"client: {type(exc).__name__}"
            res.keep_alive = False
        finally:
            await up.aclose()

    def _finish(self, flight: _Flight, rows: list[dict], arrived: float) -> None:
        row, gaps = request_row(flight.request_id, arrived - self.t0, arrived, flight.result, self.t0)
        if flight.outcome == "ok" and row["status"] != "ok":
            flight.outcome = "failed_midstream"
        row.update(
            seq=flight.seq,
            routed=flight.routed,
            side=flight.side,
            retried=flight.retried,
            outcome=flight.outcome,
            http_status=flight.result.http_status,
            error=flight.error,
        )
        rows.append(row)
        label = flight.side or "none"
        self.metrics.requests.labels(label, flight.outcome).inc()
        if flight.side is not None:  # shadows too, under side="shadow:NAME": the shadow check reads them
            if row["ttft_s"] is not None:
                self.metrics.ttft.labels(flight.side).observe(row["ttft_s"])
            if row["e2e_s"] is not None:
                self.metrics.e2e.labels(flight.side).observe(row["e2e_s"])
            hist = self.metrics.itl.labels(flight.side)
            for g in gaps[gaps > 0]:
                hist.observe(float(g))
        if self._record is not None:
            self._record.write(json.dumps(row) + "\n")
            self._record.flush()

    # ------------------------------------------------------------ shadows

    def _mirror(self, shadow: ShadowTarget, req: Request, seq: int, arrived: float) -> None:
        if self._mirror_in_flight[shadow.name] >= shadow.max_in_flight:
            self.mirror_counts[shadow.name]["dropped"] += 1
            self.metrics.mirror_dropped.labels(shadow.name).inc()
            return
        self._mirror_in_flight[shadow.name] += 1
        self.mirror_counts[shadow.name]["mirrored"] += 1
        self.metrics.mirrored.labels(shadow.name).inc()
        task = asyncio.create_task(
            self._shadow_copy(shadow, req, seq, arrived), name=f"llmcap-mirror-{shadow.name}-{seq}"
        )
        self._mirrors.add(task)
        task.add_done_callback(self._mirrors.discard)

    async def _shadow_copy(self, shadow: ShadowTarget, req: Request, seq: int, arrived: float) -> None:
        side = f"shadow:{shadow.name}"
        body = json.loads(req.body)
        flight = _Flight(seq, _request_id(req, seq), side, _result(body, arrived), side=side)
        r = flight.result
        try:
            headers = {h: req.headers[h] for h in FORWARDED_HEADERS if h in req.headers}
            async with self._clients[side].stream("POST", req.path, content=req.body, headers=headers) as up:
                r.http_status = up.status_code
                if up.status_code != 200:
                    r.status, flight.outcome = "rejected", "rejected"
                    await up.aread()
                    return
                events, done = SSEEvents(r), False
                async for chunk in up.aiter_bytes():
                    done = events.feed(chunk, time.perf_counter()) or done
                if not done and body.get("stream") is True:
                    r.status, flight.outcome = "unfinished", "failed_midstream"
        except (httpx.HTTPError, ValueError) as exc:
            r.status, flight.outcome, flight.error = "unfinished", "failed_midstream", f"{side}: {type(exc).__name__}"
        except asyncio.CancelledError:
            r.status, flight.outcome, flight.error = "unfinished", "failed_midstream", f"{side}: cut (copies stopped)"
            raise
        finally:
            self._mirror_in_flight[shadow.name] -= 1
            self._finish(flight, self.shadow_rows, arrived)  # may find the copy unfinished: outcome failed_midstream
            if flight.outcome != "ok":
                self.mirror_counts[shadow.name]["failed"] += 1
                self.metrics.mirror_failed.labels(shadow.name).inc()


def _request_id(req: Request, seq: int) -> int:
    """The client's X-Request-Id when it is an integer (llmcap replay sends the trace's request id), else `seq`."""
    try:
        return int(req.headers.get("x-request-id", ""))
    except ValueError:
        return seq


def _result(body: dict, arrived: float) -> StreamResult:
    prompt = body.get("prompt")
    isl = len(prompt) if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt) else 0
    max_tokens = body.get("max_tokens") or body.get("max_completion_tokens") or 16
    return StreamResult(sent_s=arrived, isl=isl, max_tokens=int(max_tokens))


def _usage(r: StreamResult, body: bytes) -> None:
    try:
        usage = json.loads(body).get("usage") or {}
    except (ValueError, AttributeError):
        return
    r.prompt_tokens, r.completion_tokens = usage.get("prompt_tokens"), usage.get("completion_tokens")


async def _error(res: Responder, status: int, message: str) -> None:
    await res.send_json(status, {"error": {"message": message, "type": "GatewayError", "code": status}})
