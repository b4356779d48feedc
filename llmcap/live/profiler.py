"""The endpoint profiler: controlled experiments against any OpenAI-compatible streaming server.

One *cell* is (ISL, concurrency): `concurrency` requests with unique token-id prompts of exactly ISL
tokens and exactly `osl` output tokens, started together. Cells run `repeats` times, repeats in the
outer loop so that slow drift (other load on the machine) spreads over all cells, and in a fresh
seeded order within each repeat (`run_order`) so that a disturbance tied to a slot cannot bias one
set of cells (on a shared CI box the cells listed last, run last in every repeat, once came out
~30% slower than their neighbours). Each run is preceded by a tiny ping so that no measurement
pays the engine's wake-up from idle.

From each run:
- TTFT: at concurrency 1 from `ttft_probes` extra requests alone with max_tokens 1 per repeat
  (client overhead + the prefill of ISL tokens; nothing after the first token can hold it back);
  at higher concurrency the median TTFT of the burst (queueing included, not used in the fit);
- the *steady window*: from the last first token to the first finish, when all `concurrency`
  sequences decode together; every step inside it is one decode step of that batch at the
  sequences' current contexts (ISL + tokens so far). Measured on vLLM CPU: the server now and
  then holds a stream back and releases it in a burst; `Run.steady` is robust to that.
Cells aggregate runs by median (the machine is shared: medians, not means, across runs).
`fit_observations` turns cells into `StepObservations` for `llmcap.perf.calibrate.fit_step_model`.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import cast

import httpx
import numpy as np

from llmcap.credentials import redact_url
from llmcap.live.client import (
    StreamResult,
    endpoint_client,
    served_models,
    server_version,
    stream_completion,
    token_prompt,
)
from llmcap.live.metrics import MetricsSnapshot, delta, scrape
from llmcap.perf.calibrate import StepObservations, decode_observations, fit_step_model, prefill_observations
from llmcap.perf.fingerprint import EnvironmentFingerprint
from llmcap.perf.profile import Profile, points_table, steps_table


@dataclass(frozen=True)
class ProfileSpec:
    """What to measure. `cells` lists (isl, concurrency) pairs; `grid` builds the full product."""

    cells: tuple[tuple[int, int], ...]
    osl: int = 64
    repeats: int = 3
    vocab_size: int = 1000  # token ids are drawn from [4, vocab_size): safe for any real model
    max_num_batched_tokens: int | None = None  # the engine's chunk size, if known (TTFT of long prompts)
    seed: int | None = None  # prompt seed; None: fresh each session (a re-run must not hit the prefix cache)
    ttft_probes: int = 2  # per repeat and concurrency-1 cell: requests alone with max_tokens 1 (TTFT)
    cache_hits: tuple[float, ...] = ()  # ... and as many at each of these prefix-cache hit shares (0 < h < 1)
    block_tokens: int = 16  # the engine's KV block: a cached prefix is whole blocks (vLLM's default size)
    warmup: bool = True
    timeout_s: float = 600.0

    @classmethod
    def grid(cls, isl: Iterable[int], concurrency: Iterable[int], **kw) -> ProfileSpec:
        return cls(cells=tuple(itertools.product(sorted(set(isl)), sorted(set(concurrency)))), **kw)

    def __post_init__(self) -> None:
        if not self.cells or any(i < 1 or c < 1 for i, c in self.cells):
            raise ValueError("cells must be non-empty (isl, concurrency) pairs of positive integers")
        if self.osl < 2 or self.repeats < 1:
            raise ValueError("osl must be >= 2 (gaps need two tokens) and repeats >= 1")
        if any(not 0 < h < 1 for h in self.cache_hits) or self.block_tokens < 1:
            raise ValueError("cache_hits are shares strictly between 0 and 1, block_tokens >= 1")

    def cached_tokens(self, isl: int, hit: float) -> int:
        """The prefix a probe at `hit` finds cached: whole blocks, at least one, and its last token computed."""
        return max(
            self.block_tokens,
            min(int(hit * isl) // self.block_tokens, (isl - 1) // self.block_tokens) * self.block_tokens,
        )


@dataclass
class Run:
    isl: int
    concurrency: int
    repeat: int
    results: list[StreamResult]
    preemptions: float | None = None
    server_itl_s: float | None = None  # mean gap by the engine's own timestamps (/metrics), all gaps of the run

    @property
    def ok(self) -> bool:
        return all(r.status == "ok" and r.tokens > 0 for r in self.results)

    def window(self) -> tuple[float, float] | None:
        """(start, end) of the steady window: the last first token to the first finish. A stream whose
        first tokens came in a burst was held back by the server: its first token was made earlier
        than it arrived, so it does not push the start later (unless every stream was held)."""
        if any(r.first_token_s is None for r in self.results):
            return None
        # every result has a chunk now, so its first_token_s and finish_s are floats
        prompt = [cast(float, r.first_token_s) for r in self.results if not _held_start(r)]
        start = max(prompt or [cast(float, r.first_token_s) for r in self.results])
        end = min(cast(float, r.finish_s) for r in self.results)
        return (start, end) if end > start else None

    def steady(self) -> list[tuple[float, float, float]]:
        """Per request, (step time, mean context, steps) over the steady window: from the last
        first token to the first finish, when all sequences decode together.

        A request's step time there is the median over blocks of 8 steps of (time span) / (steps),
        not a mean of client gaps: a server that briefly holds its stream (measured on vLLM CPU:
        ~100 ms now and then) delivers the held tokens in a burst, which would fake near-zero gaps,
        and other load on the machine stalls single steps. A burst at the window's start is
        skipped (those tokens were made before it); later ones stay inside their block.
        """
        window = self.window()
        if window is None:
            return []
        start, end = window
        out = []
        for r in self.results:
            t = _spread(r)
            j = np.flatnonzero((t >= start) & (t <= end))
            if j.size < 3:
                continue
            gaps = np.diff(t[j])
            typical = np.median(gaps)
            if typical < 0.1 * (cast(float, r.finish_s) - r.sent_s) / r.tokens:  # a window: every result has a chunk
                continue  # held and released at once: the client saw no steps at all
            lead = int(np.argmax(gaps >= 0.1 * typical)) if typical > 0 else 0  # leading burst
            j = j[lead + 1 if lead else 0 :]  # the gap closing a burst is partial too: start after it
            if j.size < 3 or t[j[-1]] <= t[j[0]]:
                continue
            steps = float(j[-1] - j[0])
            # gap k (token k -> k+1, 0-based k) is a decode step over isl + k + 1 tokens
            out.append((_block_median_step(t[j]), r.isl + float(np.mean(j[:-1])) + 1.0, steps))
        return out

    def gaps(self) -> np.ndarray:
        """Every client-seen gap inside the steady window (for the ITL percentiles)."""
        window = self.window()
        if window is None:
            return np.empty(0)
        start, end = window
        out = []
        for r in self.results:
            t = _spread(r)
            keep = (t[:-1] >= start) & (t[1:] <= end)
            out.append(np.diff(t)[keep])
        return np.concatenate(out) if out else np.empty(0)


def _block_median_step(t: np.ndarray, block: int = 8) -> float:
    """Seconds per step of consecutive token times `t`: the median over blocks of `block` steps of
    each block's span / steps. A stall (the machine is shared) or a held-then-released burst
    stays inside one block, whose rate the median ignores; within a block they cancel out."""
    n = t.size - 1
    if n < 2 * block:
        return float((t[-1] - t[0]) / n)
    edges = np.arange(0, n - block // 2, block)  # drop a last block shorter than half a block
    ends = np.minimum(edges + block, n)
    return float(np.median((t[ends] - t[edges]) / (ends - edges)))


def _held_start(r: StreamResult) -> bool:
    """The stream's first tokens arrived together (gaps under a tenth of its typical gap)."""
    t = _spread(r)
    if t.size < 4:
        return False
    g = np.diff(t)
    typical = np.median(g)
    return bool(typical > 0 and g[0] < 0.1 * typical and g[1] < 0.1 * typical)


def _spread(r: StreamResult) -> np.ndarray:
    """Per-token times; tokens that came in one chunk are spread evenly over the gap before it
    (the chunk means the client lagged; the engine made them one step apart)."""
    t = np.asarray(r.chunk_s, dtype=np.float64)
    k = np.asarray(r.chunk_tokens, dtype=np.int64)
    out: list[float] = []
    for i in range(t.size):
        prev = t[i - 1] if i else t[i]
        out.extend(prev + (t[i] - prev) * (np.arange(1, k[i] + 1) / k[i]) if i else [t[i]] * int(k[i]))
    return np.asarray(out, dtype=np.float64)


@dataclass(frozen=True)
class Cell:
    """A cell's runs, aggregated (seconds)."""

    isl: int
    osl: int
    concurrency: int
    repeats: int
    requests: int
    ttft_s: float | None  # median over runs of the run's median TTFT
    ttft_p90_s: float | None
    itl_mean_s: float | None  # median over runs of the run's steady decode step (see itl_source)
    itl_source: str | None  # "client": the SSE stream's steady window; "server": /metrics (stream held back)
    itl_server_mean_s: float | None  # median over runs of the engine's own mean gap (/metrics), all gaps
    itl_p50_s: float | None
    itl_p90_s: float | None
    itl_p99_s: float | None
    itl_max_s: float | None
    steady_gaps: int
    decode_context_mean: float | None
    tpot_mean_s: float | None
    preemptions: int | None


def _q(a: np.ndarray, p: float) -> float | None:
    return float(np.percentile(a, p)) if a.size else None


def aggregate(runs: list[Run], osl: int, ttft_probes: list[float]) -> Cell:
    ok = [r for r in runs if r.ok]
    steady = [r.steady() for r in ok]
    # a run's step time: median over its requests; the cell's: median over runs
    run_steps = [float(np.median([s for s, _, _ in st])) for st in steady if st]
    run_ctx = [float(np.median([c for _, c, _ in st])) for st in steady if st]
    pooled = np.concatenate([r.gaps() for r in ok]) if ok else np.empty(0)
    ttft = np.array(ttft_probes if ttft_probes else [x.ttft_s for r in ok for x in r.results], dtype=np.float64)
    tpots = [
        (cast(float, x.finish_s) - cast(float, x.first_token_s)) / (x.tokens - 1)
        for r in ok
        for x in r.results
        if x.tokens > 1
    ]  # ok results streamed their tokens: chunk_s is non-empty
    pre = [r.preemptions for r in runs if r.preemptions is not None]
    server = [r.server_itl_s for r in ok if r.server_itl_s]
    server_itl = float(np.median(server)) if server else None
    first = runs[0]
    # The client's view is primary; when the server held every stream back (vLLM CPU did so for its
    # fastest steps: ISL 64 x 4, ~2.5 ms) the engine's own timestamps are the only view of its steps.
    itl, source = (
        (float(np.median(run_steps)), "client") if run_steps else (server_itl, "server" if server_itl else None)
    )
    ctx_mean = float(np.median(run_ctx)) if run_ctx else (first.isl + osl / 2.0 if server_itl else None)
    return Cell(
        isl=first.isl,
        osl=osl,
        concurrency=first.concurrency,
        repeats=len(ok),
        requests=sum(len(r.results) for r in ok),
        ttft_s=float(np.median(ttft)) if ttft.size else None,
        ttft_p90_s=_q(ttft, 90),
        itl_mean_s=itl,
        itl_source=source,
        itl_server_mean_s=server_itl,
        itl_p50_s=_q(pooled, 50),
        itl_p90_s=_q(pooled, 90),
        itl_p99_s=_q(pooled, 99),
        itl_max_s=float(pooled.max()) if pooled.size else None,
        steady_gaps=int(pooled.size),
        decode_context_mean=ctx_mean,
        tpot_mean_s=float(np.mean(tpots)) if tpots else None,
        preemptions=int(sum(pre)) if pre else None,
    )


@dataclass
class EndpointMeasurement:
    """Everything one profiling session measured, plus what the server said about itself."""

    base_url: str
    model: str
    spec: ProfileSpec
    runs: list[Run]
    ttft_probes: dict[int, list[float]]  # ISL -> TTFTs of requests alone with max_tokens 1
    version: str | None
    model_info: dict
    metrics_before: MetricsSnapshot | None
    metrics_after: MetricsSnapshot | None
    wall_s: float
    cells: dict[tuple[int, int], Cell] = field(default_factory=dict)
    ttft_probe_repeats: dict[int, list[int]] = field(default_factory=dict)  # ISL -> the repeat of each TTFT probe
    hit_probes: dict[tuple[int, int], list[float]] = field(
        default_factory=dict
    )  # (ISL, cached tokens) -> TTFTs of requests alone

    def ttft_by_repeat(self, isl: int) -> dict[int, float]:
        """Repeat -> median TTFT of that repeat's probes at `isl` (requests alone): the cell's run-to-run spread."""
        probes = np.asarray(self.ttft_probes.get(isl, []), dtype=np.float64)
        reps = np.asarray(self.ttft_probe_repeats.get(isl, []), dtype=np.int64)
        if probes.size != reps.size:
            raise ValueError(f"ISL {isl}: {probes.size} TTFT probes but {reps.size} repeat labels")
        return {int(r): float(np.median(probes[reps == r])) for r in np.unique(reps)}

    def __post_init__(self) -> None:
        by_cell: dict[tuple[int, int], list[Run]] = {}
        for r in self.runs:
            by_cell.setdefault((r.isl, r.concurrency), []).append(r)
        self.cells = {
            k: aggregate(v, self.spec.osl, self.ttft_probes.get(k[0], []) if k[1] == 1 else [])
            for k, v in sorted(by_cell.items())
        }

    @property
    def failed_runs(self) -> list[Run]:
        return [r for r in self.runs if not r.ok]

    def fit_observations(
        self, cells: Iterable[tuple[int, int]] | None = None
    ) -> tuple[StepObservations, list[str], list[tuple[int, int]]]:
        """Step observations from `cells` (default all): a prefill row per concurrency-1 cell (its
        median TTFT), a decode row per cell with a steady window. Returns (obs, kinds, cell keys)."""
        chosen = self.cells if cells is None else {k: self.cells[k] for k in cells}
        parts, kinds, keys = [], [], []
        for key, cell in chosen.items():
            if cell.concurrency == 1 and cell.ttft_s:
                parts.append(prefill_observations(cell.isl, cell.ttft_s, chunk=self.spec.max_num_batched_tokens))
                kinds.append("prefill")
                keys.append(key)
            if cell.itl_mean_s and cell.decode_context_mean:
                parts.append(decode_observations(cell.concurrency, cell.decode_context_mean, cell.itl_mean_s))
                kinds.append("decode")
                keys.append(key)
        for (isl, cached), ttfts in sorted(self.hit_probes.items()):  # the prefill rows of a prompt partly cached
            if ttfts and (isl, 1) in chosen:
                parts.append(
                    prefill_observations(
                        isl, float(np.median(ttfts)), chunk=self.spec.max_num_batched_tokens, cached=cached
                    )
                )
                kinds.append("prefill")
                keys.append((isl, 1))
        if not parts:
            raise ValueError("no cell gave a usable TTFT or steady decode window")
        return StepObservations.concat(parts), kinds, keys


def run_order(cells: tuple[tuple[int, int], ...], repeats: int, seed: int) -> list[tuple[int, int, int]]:
    """(repeat, isl, concurrency) in the order to run: repeat by repeat, each a seeded permutation of `cells`."""
    rng = np.random.default_rng(seed)
    return [(rep, *cells[j]) for rep in range(repeats) for j in rng.permutation(len(cells))]


async def _ping(
    client: httpx.AsyncClient, base_url: str, model: str, spec: ProfileSpec, seeds: itertools.count
) -> None:
    # the engine may sleep when idle, and waking it would land in the next measurement
    await stream_completion(client, base_url, model, token_prompt(4, spec.vocab_size, next(seeds)), 2, spec.timeout_s)


async def _ttft_probe(
    client: httpx.AsyncClient, base_url: str, model: str, spec: ProfileSpec, isl: int, seeds: itertools.count
) -> float | None:
    """TTFT of one request alone that stops at its first token (nothing after it to hold it back)."""
    await _ping(client, base_url, model, spec, seeds)
    r = await stream_completion(
        client, base_url, model, token_prompt(isl, spec.vocab_size, next(seeds)), 1, spec.timeout_s
    )
    return r.ttft_s if r.status == "ok" else None


async def _hit_probe(
    client: httpx.AsyncClient,
    base_url: str,
    model: str,
    spec: ProfileSpec,
    isl: int,
    cached: int,
    seeds: itertools.count,
) -> float | None:
    """TTFT of one request alone whose first `cached` tokens a request just before it left in the prefix cache."""
    prefix = token_prompt(cached, spec.vocab_size, next(seeds))
    primed = await stream_completion(client, base_url, model, prefix, 1, spec.timeout_s)
    if primed.status != "ok":
        return None
    r = await stream_completion(
        client, base_url, model, prefix + token_prompt(isl - cached, spec.vocab_size, next(seeds)), 1, spec.timeout_s
    )
    return r.ttft_s if r.status == "ok" else None


async def _one_run(
    client: httpx.AsyncClient,
    base_url: str,
    model: str,
    spec: ProfileSpec,
    isl: int,
    c: int,
    repeat: int,
    seeds: itertools.count,
    scrape_metrics: bool,
) -> Run:
    await _ping(client, base_url, model, spec, seeds)
    before = await scrape(client, base_url) if scrape_metrics else None
    prompts = [token_prompt(isl, spec.vocab_size, next(seeds)) for _ in range(c)]
    results = await asyncio.gather(
        *(stream_completion(client, base_url, model, p, spec.osl, spec.timeout_s) for p in prompts)
    )
    after = await scrape(client, base_url) if scrape_metrics else None
    n = delta(before, after, "vllm:inter_token_latency_seconds_count")
    total = delta(before, after, "vllm:inter_token_latency_seconds_sum")
    return Run(
        isl,
        c,
        repeat,
        list(results),
        preemptions=delta(before, after, "vllm:num_preemptions_total"),
        server_itl_s=total / n if n and total is not None else None,
    )


async def measure_endpoint_async(
    base_url: str, model: str, spec: ProfileSpec, progress: bool = False, api_key: str | None = None
) -> EndpointMeasurement:
    shown_url = redact_url(base_url.rstrip("/"))  # what the measurement keeps (reports, manifests)
    seed = spec.seed if spec.seed is not None else int.from_bytes(os.urandom(6), "little")
    seeds = itertools.count(seed * 1_000_003 + 1)
    t0 = time.perf_counter()
    base_url, client = endpoint_client(base_url, api_key)
    async with client:
        version = await server_version(client, base_url)
        models = await served_models(client, base_url)
        info = next((m for m in models if m.get("id") == model), {})
        before = await scrape(client, base_url)
        scrape_metrics = before is not None
        if spec.warmup:  # first shapes may compile: every ISL once alone, the largest burst once
            for isl in sorted({i for i, _ in spec.cells}):
                await stream_completion(
                    client, base_url, model, token_prompt(isl, spec.vocab_size, next(seeds)), 4, spec.timeout_s
                )
            big_c = max(c for _, c in spec.cells)
            await _one_run(client, base_url, model, spec, min(i for i, _ in spec.cells), big_c, -1, seeds, False)
        todo = run_order(spec.cells, spec.repeats, seed)
        runs: list[Run] = []
        probes: dict[int, list[float]] = {}
        probe_repeats: dict[int, list[int]] = {}
        hit_probes: dict[tuple[int, int], list[float]] = {}
        with _progress(progress, len(todo)) as advance:
            for rep, isl, c in todo:
                if c == 1:
                    for _ in range(spec.ttft_probes):
                        t = await _ttft_probe(client, base_url, model, spec, isl, seeds)
                        if t is not None:
                            probes.setdefault(isl, []).append(t)
                            probe_repeats.setdefault(isl, []).append(rep)
                        for hit in spec.cache_hits:
                            cached = spec.cached_tokens(isl, hit)
                            t = await _hit_probe(client, base_url, model, spec, isl, cached, seeds)
                            if t is not None:
                                hit_probes.setdefault((isl, cached), []).append(t)
                runs.append(await _one_run(client, base_url, model, spec, isl, c, rep, seeds, scrape_metrics))
                advance(f"ISL {isl} x {c}")
        after = await scrape(client, base_url)
    return EndpointMeasurement(
        shown_url,
        model,
        spec,
        runs,
        probes,
        version,
        info,
        before,
        after,
        time.perf_counter() - t0,
        ttft_probe_repeats=probe_repeats,
        hit_probes=hit_probes,
    )


def measure_endpoint(
    base_url: str, model: str, spec: ProfileSpec, progress: bool = False, api_key: str | None = None
) -> EndpointMeasurement:
    """Run the experiments of `spec` against `base_url` (blocking; see the module docstring).

    Credentials in `base_url` (user:password) are sent as basic auth, `api_key` as a Bearer token;
    the measurement keeps the URL with its password masked."""
    return asyncio.run(measure_endpoint_async(base_url, model, spec, progress, api_key))


class _progress:
    """A rich progress bar on stderr, or nothing."""

    def __init__(self, enabled: bool, total: int) -> None:
        self.enabled, self.total = enabled, total

    def __enter__(self):
        if not self.enabled:
            return lambda label: None
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.bar = Progress(
            TextColumn("profiling {task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=False,
        )
        self.bar.__enter__()
        task = self.bar.add_task("", total=self.total)
        return lambda label: self.bar.update(task, advance=1, description=label)

    def __exit__(self, *exc) -> None:
        if self.enabled:
            self.bar.__exit__(*exc)


def endpoint_fingerprint(m: EndpointMeasurement, **overrides) -> EnvironmentFingerprint:
    """The fingerprint the server itself tells (version, model, KV block size, prefix caching);
    what it cannot tell (device, driver, runtime, parallelism) comes in `overrides`."""
    cc = m.metrics_after.cache_config if m.metrics_after else None
    is_vllm = m.metrics_after is not None and any(k.startswith("vllm:") for k in m.metrics_after.samples)
    kv_dtype = cc.labels.get("cache_dtype") if cc else None
    fields = {
        "engine": "vllm" if is_vllm else "openai-compatible",
        "engine_version": m.version,
        "model_id": str(m.model_info.get("root") or m.model),
        "kv_dtype": None if kv_dtype in (None, "auto") else kv_dtype,
        "block_size": cc.block_size if cc else None,
        "enable_prefix_caching": cc.prefix_caching if cc else None,
        "max_num_batched_tokens": m.spec.max_num_batched_tokens,
    }
    return EnvironmentFingerprint(**{**fields, **overrides})


def to_profile(
    m: EndpointMeasurement,
    fingerprint: EnvironmentFingerprint,
    fit_cells: Iterable[tuple[int, int]] | None = None,
    kv_capacity_tokens: int | None = None,
    ready: dict | None = None,
) -> Profile:
    """The profile table, step observations and NNLS fit of a measurement (fit on `fit_cells`, default all). `ready`: what
    was measured of the engine's start-up (`llmcap.live.readiness`), kept in the manifest."""
    cap = kv_capacity_tokens or (
        m.metrics_after.cache_config.capacity_tokens if m.metrics_after and m.metrics_after.cache_config else None
    )
    rows = []
    for cell in m.cells.values():
        row = {k: getattr(cell, k) for k in cell.__dataclass_fields__}
        ctx = cell.decode_context_mean or (cell.isl + cell.osl / 2)
        rows.append(
            {
                **row,
                "source": "endpoint",
                "batch_size": cell.concurrency,
                "cache_hit": 0.0,
                "kv_load": cell.concurrency * ctx / cap if cap else None,
                "tp": fingerprint.tp,
                "pp": fingerprint.pp,
                "ep": fingerprint.ep,
                "dp": fingerprint.dp,
            }
        )
    for (isl, cached), ttfts in sorted(m.hit_probes.items()):
        rows.append(
            {
                "source": "endpoint",
                "isl": isl,
                "osl": 1,
                "concurrency": 1,
                "batch_size": 1,
                "cache_hit": cached / isl,
                "tp": fingerprint.tp,
                "pp": fingerprint.pp,
                "ep": fingerprint.ep,
                "dp": fingerprint.dp,
                "repeats": m.spec.repeats,
                "requests": len(ttfts),
                "ttft_s": float(np.median(ttfts)),
                "ttft_p90_s": float(np.quantile(ttfts, 0.9)),
                "steady_gaps": 0,
            }
        )
    obs, kinds, keys = m.fit_observations(fit_cells)
    fit = fit_step_model(obs)
    steps = steps_table(obs, kinds, [k[0] for k in keys], [k[1] for k in keys], [m.cells[k].repeats for k in keys])
    manifest = {
        "source": "endpoint",
        "base_url": redact_url(m.base_url),  # already masked by measure_endpoint; a hand-made measurement may not be
        "served_model": m.model,
        "spec": {
            **{k: v for k, v in m.spec.__dict__.items() if k != "cells"},
            "cells": [list(c) for c in m.spec.cells],
        },
        "fit_cells": [list(k) for k in dict.fromkeys(keys)],
        "failed_runs": len(m.failed_runs),
        "wall_s": round(m.wall_s, 3),
        "kv_capacity_tokens": cap,
    } | ({"ready": ready} if ready is not None else {})
    return Profile(fingerprint, points_table(rows), steps, fit, manifest)
