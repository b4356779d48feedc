"""The endpoint profiler: controlled experiments against any OpenAI-compatible streaming server.

One *cell* is (ISL, concurrency): `concurrency` requests with unique token-id prompts of exactly ISL
tokens and exactly `osl` output tokens, started together. Cells run `repeats` times, repeats in the
outer loop so that slow drift (other load on the machine) spreads over all cells, and in a fresh
seeded order within each repeat (`run_order`) so that a disturbance tied to a slot cannot bias one
set of cells (on a shared CI box the cells listed last, run last in every repeat, once came out
~30% slower than their neighbours). Each run is preceded by a tiny ping so that no measurement
pays the engine's wake-up from idle.

What a run measures (TTFT, the steady decode window) and how a cell's runs aggregate: llmcap.live.cells.
`fit_observations` turns cells into `StepObservations` for `llmcap.perf.calibrate.fit_step_model`.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import httpx
import numpy as np

from llmcap.credentials import redact_url
from llmcap.live.cells import Cell, Run, aggregate
from llmcap.live.client import (
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
