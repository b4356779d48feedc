"""The digital twin: an OpenAI-compatible endpoint whose tokens come from the simulator, in real time.

One driver task owns the simulated deployment (`OnlineCluster`) and keeps its engine clock in step
with the wall clock (`TwinClock`): it sleeps until the wall time of the next engine decision, runs
every decision due by then, and hands each request the tokens that decision produced; the request's
handler writes them to its SSE stream at once. An arriving request first brings the simulation up to
its arrival instant, then joins it. Tokens therefore leave at the wall times that correspond to the
simulated token times, plus the event loop's wake-up delay (about a millisecond).

Everything the twin says about itself says "twin": the `server` and `x-llmcap-twin` headers,
/version, /v1/models' `owned_by`, a `twin` label on every metric and `llmcap_twin_info`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass, field

import numpy as np
from pydantic import ValidationError

from llmcap.live.client import FIRST_ORDINARY_ID
from llmcap.perf.model import StepTimeModel
from llmcap.perf.scaled import ScaledStepModel
from llmcap.sim.config import SimConfig
from llmcap.sim.engine import INF
from llmcap.sim.steptime import StepTimer
from llmcap.twin.clock import TwinClock
from llmcap.twin.faults import Faults, FaultUpdate
from llmcap.twin.http import HttpServer, Request, Responder
from llmcap.twin.metrics import TwinMetrics
from llmcap.twin.online import DEFAULT_SLOTS, Flight, OnlineCluster
from llmcap.twin.prefix import block_keys, text_token_ids

log = logging.getLogger(__name__)

TWIN_VERSION = "llmcap-twin-0.1.0"
LOOPBACK = ("127.0.0.1", "::1", "localhost")
DEFAULT_MAX_TOKENS = 16  # vLLM's default for /v1/completions
SIGMA_SLACK = 1e-9  # engine seconds: a wake-up a rounding error early still runs its decision


@dataclass(frozen=True)
class TwinSpec:
    """What the twin simulates and how it behaves."""

    config: SimConfig
    step_model: StepTimeModel
    served_model_name: str
    info: dict[str, str]  # what it stands for (model, gpu, tp, deployment): labels of llmcap_twin_info
    vocab_size: int = 32000
    max_model_len: int | None = None
    decode_step_model: StepTimeModel | None = None
    dilation: float = 1.0  # wall seconds per twin second
    slowdown: float = 1.0
    error_rate: float = 0.0
    crash_after: int | None = None
    stall_s: float = 0.0
    stall_at: float = 0.0  # twin seconds after start
    long_prompt_slowdown: float = 1.0  # steps whose prefill reaches past long_prompt_tokens take this many times longer
    long_prompt_tokens: int = 8192
    seed: int = 0  # error draws and the power-of-two router
    slots: int = DEFAULT_SLOTS  # requests in flight at once; more are answered 503
    engine_version: str = TWIN_VERSION  # what GET /version answers: another value stands for an engine upgrade


@dataclass(eq=False)
class _Stream:
    """A request's side of the twin: what its handler waits on."""

    number: int
    arrival_tau: float
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)  # (new tokens, finished) or None: crash/stop
    sent: int = 0
    last_tau: float = 0.0


class Twin:
    def __init__(self, spec: TwinSpec) -> None:
        self.spec = spec
        self.clock = TwinClock(spec.dilation, spec.slowdown)
        rng = np.random.default_rng(spec.seed)
        decode_timer = None if spec.decode_step_model is None else StepTimer(spec.decode_step_model)
        step: StepTimeModel = spec.step_model
        if spec.long_prompt_slowdown != 1.0:
            step = ScaledStepModel(step, spec.long_prompt_slowdown, spec.long_prompt_tokens)
        self.cluster = OnlineCluster(
            StepTimer(step), spec.config, rng, self._emit, slots=spec.slots, decode_timer=decode_timer
        )
        self.faults = Faults(error_rate=spec.error_rate, crash_after=spec.crash_after, seed=spec.seed)
        self.metrics = TwinMetrics(self.cluster, spec.served_model_name, {**spec.info, "version": spec.engine_version})
        self.metrics.slowdown = spec.slowdown
        headers = {"server": TWIN_VERSION, "x-llmcap-twin": "simulated; not a measurement"}
        self.http = HttpServer(self._handle, headers)
        self._wake = asyncio.Event()
        self._driver: asyncio.Task | None = None
        self._streams: set[_Stream] = set()
        self._numbers = 0
        self.ended = asyncio.Event()  # set on a crash or stop
        self.crashed = False
        self.url = ""

    # ------------------------------------------------------------ life cycle

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Listen and start the clock; the twin's time 0 is now."""
        bound = await self.http.start(host, port)
        self.clock = TwinClock(self.spec.dilation, self.spec.slowdown)
        if self.spec.stall_s > 0:
            self.clock.stall(self.spec.stall_s, at=self.spec.stall_at)
        self._driver = asyncio.create_task(self._drive(), name="llmcap-twin-driver")
        self.url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{bound}"
        return self.url

    async def stop(self) -> None:
        self._end()
        await self.http.stop()
        if self._driver is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._driver

    def crash(self) -> None:
        """Die as an engine process dies: connections cut mid-stream, nothing listening any more."""
        self.crashed = True
        self.http.close_listener()
        self.http.abort_all()
        self._end()

    def _end(self) -> None:
        if self._driver is not None:
            self._driver.cancel()
        for stream in self._streams:
            stream.queue.put_nowait(None)
        self.ended.set()

    # ------------------------------------------------------------ the simulation in real time

    async def _drive(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            nxt = self.cluster.next_time()
            timer = None
            if nxt < INF:
                timer = loop.call_later(max(0.0, self.clock.wall_of(nxt) - time.perf_counter()), self._wake.set)
            await self._wake.wait()
            self._wake.clear()
            if timer is not None:
                timer.cancel()
                # how late this wake-up is for the decision it was for: a twin that cannot keep up
                # (too many tokens a second for one process) shows it here; --dilation is the remedy
                self.metrics.max_lag_s = max(self.metrics.max_lag_s, time.perf_counter() - self.clock.wall_of(nxt))
            self.cluster.run_until(self.clock.sigma() + SIGMA_SLACK)

    def _emit(self, flight: Flight, new: int, sigma: float, done: bool) -> None:
        stream: _Stream = flight.tag  # type: ignore[assignment]
        tau = self.clock.tau_of(sigma)
        if new > 0:
            if stream.sent == 0:
                front_gid = self.cluster.front[flight.front].gid
                self.metrics.first_token(front_gid, flight.isl, flight.cached, tau - stream.arrival_tau)
                gaps = [0.0] * (new - 1)
            else:
                gaps = [tau - stream.last_tau] + [0.0] * (new - 1)
            self.metrics.tokens(flight.on, new, gaps)
            stream.sent += new
            stream.last_tau = tau
        if done:
            self.metrics.finished(flight.on, tau - stream.arrival_tau)
        stream.queue.put_nowait((new, done))

    def _submit(self, prompt: list[int], max_tokens: int) -> tuple[Flight, _Stream]:
        sigma = self.clock.sigma()
        self.cluster.run_until(sigma, inclusive=False)  # an arrival comes before the decisions at its instant
        self._numbers += 1
        stream = _Stream(self._numbers, self.clock.tau())
        flight = Flight(len(prompt), max_tokens, block_keys(prompt, self.spec.config.engine.block_size), tag=stream)
        self.cluster.submit(flight, max(sigma, self.cluster.now))
        self._streams.add(stream)
        self._wake.set()
        return flight, stream

    # ------------------------------------------------------------ HTTP

    async def _handle(self, req: Request, res: Responder) -> None:
        try:
            route = (req.method, req.path)
            if route == ("GET", "/health"):
                await res.send(200, b"")
            elif route == ("GET", "/version"):
                await res.send_json(
                    200,
                    {
                        "version": self.spec.engine_version,
                        "twin": True,
                        "note": "llmcap digital twin: token timing is simulated, not measured",
                    },
                )
            elif route == ("GET", "/v1/models"):
                await res.send_json(200, {"object": "list", "data": [self._model_card()]})
            elif route == ("GET", "/metrics"):
                self.metrics.slowdown = self.clock.slowdown
                self.metrics.injected_errors = self.faults.errors
                await res.send(200, self.metrics.render(), "text/plain; version=0.0.4; charset=utf-8")
            elif route == ("POST", "/v1/completions"):
                await self._completions(req, res)
            elif req.path == "/admin/faults" and req.method in ("GET", "POST"):
                await self._admin_faults(req, res)
            else:
                await _error(res, 404, f"no route {req.method} {req.path}", "NotFoundError")
        except (ConnectionError, asyncio.CancelledError):
            raise
        except Exception as exc:  # a bug must answer 500 (or cut its stream), not hang the client
            log.exception("llmcap twin: %s %s failed", req.method, req.path)
            if not res.started:
                await _error(res, 500, f"{type(exc).__name__}: {exc}", "InternalServerError")
            res.keep_alive = False

    def _model_card(self) -> dict:
        return {
            "id": self.spec.served_model_name,
            "object": "model",
            "created": 0,
            "owned_by": "llmcap-twin",
            "root": self.spec.info.get("model", self.spec.served_model_name),
            "max_model_len": self.spec.max_model_len,
            "twin": True,
        }

    async def _admin_faults(self, req: Request, res: Responder) -> None:
        if req.peer not in LOOPBACK:
            await _error(res, 403, "fault knobs answer loopback clients only", "PermissionError")
            return
        if req.method == "POST":
            try:
                update = FaultUpdate.model_validate(req.json())
            except (ValidationError, ValueError) as exc:
                await _error(res, 400, f"bad fault update: {exc}", "BadRequestError")
                return
            self._apply(update)
        await res.send_json(
            200,
            {
                **self.faults.state(),
                "slowdown": self.clock.slowdown,
                "stalled": self.clock.stalled(),
                "twin_time_s": self.clock.tau(),
            },
        )

    def _apply(self, u: FaultUpdate) -> None:
        if u.slowdown is not None:
            self.clock.set_slowdown(u.slowdown)
        if u.error_rate is not None:
            self.faults.error_rate = u.error_rate
        if u.crash_after is not None:
            self.faults.crash_after = self.faults.requests + u.crash_after
        if u.stall_s is not None:
            self.clock.stall(u.stall_s, at=u.stall_at)
        self._wake.set()  # the next decision's wall time moved

    async def _completions(self, req: Request, res: Responder) -> None:
        try:
            body = req.json()
        except ValueError:
            await _error(res, 400, "the body is not JSON", "BadRequestError")
            return
        parsed = _parse_completion(body, self.spec.served_model_name)
        if isinstance(parsed, str):
            await _error(res, 404 if parsed.startswith("The model") else 400, parsed, "BadRequestError")
            return
        prompt, max_tokens, stream_on, usage_on, ids_on = parsed
        fate = self.faults.on_request()
        if fate == "crash":
            self.crash()
            return
        if fate == "error":
            await _error(res, 500, "llmcap twin: injected error (--error-rate)", "InternalServerError")
            return
        if not self.cluster.fits(len(prompt), max_tokens):
            self.cluster.reject()  # as the simulator's rejected rows, it takes its place in the routers' arrival order
            await _error(
                res,
                400,
                f"This model's maximum context length or KV cache cannot hold {len(prompt)} prompt + "
                f"{max_tokens} output tokens",
                "BadRequestError",
            )
            return
        if not self.cluster.free_slots:
            await _error(res, 503, "llmcap twin: too many requests in flight", "ServiceUnavailableError")
            return
        flight, stream = self._submit(prompt, max_tokens)
        try:
            await self._respond(res, flight, stream, prompt, stream_on, usage_on, ids_on)
        finally:
            self._streams.discard(stream)

    async def _respond(
        self,
        res: Responder,
        flight: Flight,
        stream: _Stream,
        prompt: list[int],
        stream_on: bool,
        usage_on: bool,
        ids_on: bool,
    ) -> None:
        """Answer a completion from its tokens as the simulation makes them: an SSE event per token, or one
        response once all are made; nothing more when the twin crashed or stopped first."""
        head = {
            "id": f"cmpl-twin-{stream.number}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.spec.served_model_name,
        }
        usage = {
            "prompt_tokens": len(prompt),
            "total_tokens": len(prompt) + flight.osl,
            "completion_tokens": flight.osl,
        }
        if not stream_on:
            made = await _tokens_made(stream)
            if made is not None:
                choice = {
                    "index": 0,
                    "text": " tok" * made,
                    "logprobs": None,
                    "finish_reason": "length",
                    "stop_reason": None,
                }
                await res.send_json(200, {**head, "usage": usage, "choices": [choice]})
            return
        await res.start_stream()
        if not await self._stream_tokens(res, flight, stream, prompt, head, ids_on):
            return
        if usage_on:
            await res.chunk(_sse({**head, "choices": [], "usage": usage}))
        await res.chunk(b"data: [DONE]\n\n")
        await res.end_stream()

    async def _stream_tokens(
        self, res: Responder, flight: Flight, stream: _Stream, prompt: list[int], head: dict, ids_on: bool
    ) -> bool:
        """One SSE event per token, as they are made, to the last; False when the twin crashed or stopped first."""
        made = 0
        while True:
            item = await stream.queue.get()
            if item is None:  # crashed or stopped: the connection is gone or going
                return False
            new, done = item
            for _ in range(new):
                made += 1
                choice = {
                    "index": 0,
                    "text": " tok",
                    "logprobs": None,
                    "finish_reason": "length" if made == flight.osl else None,
                    "stop_reason": None,
                }
                if ids_on:
                    choice["token_ids"] = [self._token_id(stream.number, made)]
                    if made == 1:
                        choice["prompt_token_ids"] = prompt
                await res.chunk(_sse({**head, "choices": [choice], "usage": None}))
            if done:
                return True

    def _token_id(self, number: int, k: int) -> int:
        span = max(1, self.spec.vocab_size - FIRST_ORDINARY_ID)
        return FIRST_ORDINARY_ID + (number * 1_000_003 + k * 7919) % span


async def _tokens_made(stream: _Stream) -> int | None:
    """How many tokens the request got, once it finished; None when the twin crashed or stopped first."""
    made = 0
    while True:
        item = await stream.queue.get()
        if item is None:  # crashed or stopped: the connection is gone or going
            return None
        new, done = item
        made += new
        if done:
            return made


def _sse(event: dict) -> bytes:
    return b"data: " + json.dumps(event).encode() + b"\n\n"


async def _error(res: Responder, status: int, message: str, kind: str) -> None:
    await res.send_json(status, {"object": "error", "message": message, "type": kind, "param": None, "code": status})


def _parse_completion(body: object, served: str) -> tuple[list[int], int, bool, bool, bool] | str:
    """(prompt token ids, max_tokens, stream, include usage, return token ids), or what is wrong."""
    if not isinstance(body, dict):
        return "the body must be a JSON object"
    model = body.get("model")
    if model is not None and model != served:
        return f"The model `{model}` does not exist."
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        ids = text_token_ids(prompt)
    elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        ids = list(prompt)
    else:
        return "prompt must be a string or a list of token ids (one prompt per request)"
    if not ids:
        return "the prompt is empty"
    max_tokens = body.get("max_tokens", DEFAULT_MAX_TOKENS)
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        return "max_tokens must be an integer >= 1"
    opts = body.get("stream_options") or {}
    stream_on = bool(body.get("stream", False))
    return (
        ids,
        max_tokens,
        stream_on,
        stream_on and bool(opts.get("include_usage", False)),
        bool(body.get("return_token_ids", False)),
    )
