"""Step 4 end to end: feasible candidates + trace + SLOs → searched max rates → sized, costed deployments.

1. Bound: every feasible candidate gets analytic upper bounds on one instance's rate (prefill compute,
   decode bandwidth, KV by Little's law) from its step-time model, and its attainment when idle (an
   upper bound at any rate). The disaggregated roles are searched first (below); then
   aggregated candidates in order of bound per GPU, in batches of `shortlist`, while a bound can still
   beat the best goodput per GPU found (branch and bound, at most `max_simulated`); once a best is known, a
   candidate's search starts at the rate it needs to beat it and stops there if that rate fails. Every
   pruned or stopped candidate is listed in the notes with its reason.
2. Search: each simulated unit's max feasible rate by bracket + bisection on the rate-scaled trace
   (`llmcap.sizing.search`; seeds replay different excerpts, long enough at each rate for a queue to show,
   and an overloaded run fails whatever its attainment); evaluations go through the executor. Each answer
   is confirmed on the whole trace at that rate, stepping down until it holds (`confirm_whole_trace`: the
   chosen candidate's, re-choosing until the cheapest plan is a confirmed one; or every candidate's); the
   notes say what each confirmation did and which rates stay unconfirmed.
   Disaggregated rows are searched per role (`_Sizer.disaggregated`): each prefill row's and each decode
   row's own per-instance rate G_P / G_D, beside an ample other pool; every pairing (any GPU types,
   any prefill layout) is then sized pool by pool — no fixed P:D unit.
3. Size: each option's pools are sized from the planning rate with headroom per pool, in req/s, rounded
   once (`llmcap.sizing.headroom`), with cost. The cheapest plan is simulated end to end on the whole
   trace at the planning rate in every scenario (node loss, rolling upgrade; `llmcap.sizing.scenarios`),
   instances are added per pool until all pass, and each pool is shown minimal (one fewer fails one).
   The four-ledger floor (`llmcap.sizing.ledger`) is reported beside it.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from llmcap.catalog import GpuSpec, ModelSpec, get_gpu
from llmcap.catalog.quant import kv_dtype_bytes
from llmcap.errors import LlmcapError
from llmcap.perf import build_step_model, decode_step_time, prefill_time
from llmcap.perf.model import StepTimeModel
from llmcap.perf.roofline import RooflineModel
from llmcap.report.capacity import CapacityReport, capacity_row, capacity_table, pairing_row
from llmcap.report.capacity_sections import pool_configurations
from llmcap.sim import EngineConfig, LinkConfig, PDConfig, SimResult
from llmcap.sizing.analytic import RateBounds, rate_bounds
from llmcap.sizing.executor import Executor
from llmcap.sizing.analytic import ceil_count
from llmcap.sizing.headroom import COMBINATION_RULE, CapacityPlan, PoolInput, plan_headroom, traffic_plan
from llmcap.sizing.ledger import Ledger, four_ledgers
from llmcap.sizing.measured import MeasuredModels, config_key
from llmcap.sizing.nearmiss import NearMiss, NoFeasiblePlan, idle_miss, near_misses
from llmcap.sizing.params import SizeParams, SloParams
from llmcap.sizing.pools import Pool, PoolComparison, compare_pools
from llmcap.sizing.scenarios import FitResult, Judge, Parallel
from llmcap.sizing.scenarios import fit as fit_scenarios
from llmcap.sizing.search import EvalResult, SearchResult, SearchTask, confirm_max_rate, evaluate_at, search_candidates
from llmcap.sizing.simeval import SimEvaluate
from llmcap.sizing.slo import definitions, itl_column
from llmcap.sizing.uncertainty import CountRange, RunSeed, count_range, pool_spread, seed_max_rates
from llmcap.trace.prefix import hit_tokens, leading_reuse_unbounded, reuse_at, stack_distances
from llmcap.trace.schema import block_size_of
from llmcap.trace.synth import mean_rate, scale_rate

log = logging.getLogger(__name__)

CONFIG_KEYS = ("gpu", "weight_quant", "kv_dtype", "tp", "pp", "ep", "dp", "max_num_seqs", "max_num_batched_tokens", "gpus_per_instance")


def candidate_key(row: Mapping[str, Any]) -> str:
    return (
        f"{row['gpu']}/{row['weight_quant']}/kv-{row['kv_dtype']}/tp{row['tp']}pp{row['pp']}ep{row['ep']}"
        f"/seqs{row['max_num_seqs']}/mbt{row['max_num_batched_tokens']}/blk{row['block_size']}"
    )


def candidate_row(candidates: pd.DataFrame, key: str, roles: tuple[str, ...]) -> Mapping[str, Any]:
    """The feasible row of the candidates table whose `candidate_key` is `key`, in one of `roles`."""
    feasible = candidates[candidates["feasible"] & candidates["role"].isin(roles)]
    for _, row in feasible.iterrows():
        if candidate_key(row) == key:
            return row.to_dict()
    raise LlmcapError(f"the chosen plan's candidate {key} ({'/'.join(roles)}) is not a feasible row of the candidates table")


_ISL_STEPS = 64  # prompt lengths timed at 64 steps per power of two (rounded down by < 1/64)


@dataclass(frozen=True)
class Lengths:
    """The trace's per-request lengths the bounds need; `cached` = ideal (unbounded-cache) prefix hits, and
    `at_capacity(kv_tokens)` the same requests with the hits an LRU cache of that size gives."""

    isl: np.ndarray
    osl: np.ndarray
    cached: np.ndarray
    hashes: pa.ChunkedArray | None = None  # the trace's prefix hashes in arrival order (None: no prefix reuse)
    block: int = 0  # tokens per trace hash block
    _lru: dict[int, Lengths] = field(default_factory=dict, compare=False, repr=False)

    @cached_property
    def prompt_pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """The distinct (ISL, cached) pairs, each prompt rounded down by less than 1/_ISL_STEPS of itself (to a
        power-of-two grain: a shorter prompt never takes longer, so times stay lower bounds), and each request's
        pair index. ~3x fewer prompts to time on Mooncake."""
        grain = np.exp2(np.maximum(0.0, np.floor(np.log2(np.maximum(self.isl, 1.0))) - np.log2(_ISL_STEPS)))
        isl = np.maximum(np.floor(self.isl / grain) * grain, self.cached)
        pairs, inverse = np.unique(np.stack([isl, self.cached]), axis=1, return_inverse=True)
        return pairs, inverse.ravel()

    def at_capacity(self, kv_tokens: int) -> Lengths:
        """These requests with the prefix hits of an LRU cache holding `kv_tokens` (one instance's whole KV: the
        engine's cache is never larger, so the hits stay an upper bound), in arrival order. Memoised per size."""
        if self.hashes is None:
            return self
        blocks = max(0, kv_tokens // self.block)
        if blocks not in self._lru:
            hits = hit_tokens(reuse_at(*self._distances, blocks), self.isl, self.block).astype(np.float64)
            self._lru[blocks] = Lengths(self.isl, self.osl, hits)
        return self._lru[blocks]

    @cached_property
    def _distances(self) -> tuple[np.ndarray, np.ndarray]:
        """LRU stack distances of every block (one pass gives every cache size: `llmcap.trace.prefix.reuse_at`)."""
        assert self.hashes is not None
        return stack_distances(self.hashes)

    @classmethod
    def of(cls, trace: pa.Table) -> Lengths:
        isl = trace.column("isl").to_numpy().astype(np.float64)
        osl = trace.column("osl").to_numpy().astype(np.float64)
        block = block_size_of(trace)
        if block is None or "hash_ids" not in trace.column_names:
            return cls(isl, osl, np.zeros_like(isl))
        hashes = trace.column("hash_ids")
        reuse = leading_reuse_unbounded(hashes)
        return cls(isl, osl, hit_tokens(reuse, isl, block).astype(np.float64), hashes, block)


@dataclass(frozen=True)
class Unit:
    """One candidate row made simulable: its step model, engine knobs and analytic bounds."""

    key: str
    row: Mapping[str, Any]
    gpu: GpuSpec
    step_model: StepTimeModel
    engine: EngineConfig
    bounds: RateBounds
    unloaded_attainment: float  # share of requests meeting TTFT and ITL alone on an idle instance
    decode_step_s: float = 0.0  # one decode step at the largest batch the scheduler and KV allow (mean context)
    chunk_step_s: float = 0.0  # one step carrying a full prefill chunk: the gap a decode sharing that step sees

    @property
    def gpus(self) -> int:
        return int(self.row["gpus_per_instance"])

    @property
    def bound_per_gpu(self) -> float:
        return self.bounds.rate / self.gpus

    @property
    def config(self) -> dict[str, Any]:
        return {k: (v.item() if hasattr(v, "item") else v) for k, v in self.row.items() if k in CONFIG_KEYS}


def prefill_alone(step: StepTimeModel, lengths: Lengths, chunk: int) -> np.ndarray:
    """Each request's prefill alone on the engine, in chunks of `chunk`, with its prefix hits: a lower bound
    on its TTFT (`Lengths.prompt_pairs`: each distinct rounded-down prompt timed once)."""
    pairs, inverse = lengths.prompt_pairs
    return prefill_time(step, pairs[0], pairs[1], chunk=chunk)[inverse]


def unloaded_attainment(step: StepTimeModel, engine: EngineConfig, lengths: Lengths, slo: SloParams, prefill_s: np.ndarray | None = None) -> float:
    """Attainment on an idle instance (every request alone): an upper bound on attainment at any rate.

    TTFT ≥ the request's own (chunked) prefill (`prefill_s`, computed here when not given); ITL ≥ a batch-1
    decode step at its final context.
    """
    ok = np.ones(lengths.isl.size, dtype=bool)
    if slo.ttft_ms is not None:
        ttft = prefill_s if prefill_s is not None else prefill_alone(step, lengths, engine.max_num_batched_tokens)
        ok &= ttft <= (slo.ttft_ms + slo.ttft_ms_per_1k_isl * lengths.isl / 1000.0) * 1e-3
    if slo.itl_ms is not None and itl_column(slo.itl_stat) is not None:  # a token-level target binds no one request
        itl = decode_step_time(step, np.ones_like(lengths.isl), lengths.isl + lengths.osl)
        ok &= (itl <= slo.itl_ms * 1e-3) | (lengths.osl <= 1)
    return float(ok.mean())


def make_unit(model: ModelSpec, row: Mapping[str, Any], lengths: Lengths, slo: SloParams, measured: MeasuredModels | None = None) -> Unit:
    """Step model (measured when one matches, else roofline), engine config (KV blocks from the memory plan)
    and rate bounds of one candidate row (prefix hits: an LRU cache of the instance's KV size, `Lengths.at_capacity`)."""
    gpu = get_gpu(str(row["gpu"]))
    step = (measured or {}).get(config_key(row)) or build_step_model(
        model.source, gpu.name, tp=int(row["tp"]), pp=int(row["pp"]), ep=int(row["ep"]),
        weight_quant=str(row["weight_quant"]), kv_dtype=str(row["kv_dtype"]),
    )  # fmt: skip
    block, kv_tokens = int(row["block_size"]), int(row["kv_tokens_per_instance"])
    lengths = lengths.at_capacity(kv_tokens)
    engine = EngineConfig(
        num_blocks=kv_tokens // block,
        block_size=block,
        max_num_seqs=int(row["max_num_seqs"]),
        max_num_batched_tokens=int(row["max_num_batched_tokens"]),
        kv_bytes_per_token=model.kv_bytes_per_token(kv_dtype_bytes(str(row["kv_dtype"]))),
        max_model_len=int(row["max_context_len"]),  # longer requests are rejected, as the engine would: misses
    )
    mean_isl, mean_osl = float(lengths.isl.mean()), float(lengths.osl.mean())
    uncached = max(float((lengths.isl - lengths.cached).mean()), 1.0)
    chunk = engine.max_num_batched_tokens
    # Prefill bound from the trace's whole length distribution (each prompt alone, in its chunks, with its
    # own prefix hits), not from the mean prompt: attention grows with context, so E[t(ISL)] > t(E[ISL]).
    # The roofline's compiled tables time them faster (a copy of its own: the simulator compiles afresh).
    timing = step.compile() if isinstance(step, RooflineModel) else step
    alone = prefill_alone(timing, lengths, chunk)
    # the largest decode batch the scheduler and the KV allow at the mean request length
    batch = max(1, min(engine.max_num_seqs, kv_tokens // max(1, math.ceil(mean_isl + mean_osl))))
    t_batch, t_one = decode_step_time(timing, [batch, 1], mean_isl + mean_osl / 2)
    prefill_tokens_s = uncached / max(float(alone.mean()), 1e-12)
    bounds = rate_bounds(lengths.isl, lengths.osl, prefill_tokens_s, batch / float(t_batch), kv_tokens, float(t_one), lengths.cached)
    chunk_step = float(prefill_time(timing, [min(chunk, int(lengths.isl.max()))], chunk=chunk)[0])
    return Unit(candidate_key(row), row, gpu, step, engine, bounds, unloaded_attainment(timing, engine, lengths, slo, alone), float(t_batch), chunk_step)


@dataclass(frozen=True)
class SizedRow:
    """A sized option: an aggregated candidate (one pool, "instances") or a P/D pairing (pools "prefill", "decode")."""

    key: str
    mode: str  # "aggregated" | "disaggregated"
    result: SearchResult  # aggregated: the instance's search; P/D: the prefill role's
    plan: CapacityPlan | None
    unit: Unit  # aggregated: the instance; P/D: the prefill role's
    whole_trace: SimEvaluate | None = None  # aggregated: the unit's evaluate on the whole trace (confirmation)
    decode: Unit | None = None  # P/D: the decode role's unit
    pd_roles: tuple[RoleRow, RoleRow] | None = None  # P/D: the prefill and decode role searches

    @property
    def config(self) -> dict[str, Any]:
        return (self.decode or self.unit).config  # P/D: the decode pool's, as the table documents

    @property
    def gpus_per_unit(self) -> int:
        return self.unit.gpus + (0 if self.decode is None else self.decode.gpus)

    @property
    def balanced_rps_per_gpu(self) -> float:
        """Req/s per GPU: the instance's max rate ÷ its GPUs, or for P/D pools balanced to the measured role
        rates, 1 / (g_P/G_P + g_D/G_D)."""
        if self.decode is None or self.pd_roles is None:
            return self.result.max_rate / self.unit.gpus
        g_p, g_d = self.pd_roles[0].rate, self.pd_roles[1].rate
        return 0.0 if g_p <= 0 or g_d <= 0 else 1.0 / (self.unit.gpus / g_p + self.decode.gpus / g_d)


@dataclass(frozen=True)
class RoleRow:
    """One searched P/D role: a prefill or decode row's own pool rate, searched beside an ample other pool."""

    role: str  # "prefill" | "decode"
    unit: Unit
    result: SearchResult  # the search of a pool of `instances` of the unit
    partner: str  # how it was searched
    instances: int = 1

    @property
    def rate(self) -> float:
        """G: the pool's max rate per instance."""
        return self.result.max_rate / self.instances


@dataclass(frozen=True)
class SizingOutcome:
    table: pa.Table
    report: CapacityReport
    summary: dict[str, Any]


def _metric(result: SearchResult, name: str) -> float | None:
    best = result.best
    vals = [] if best is None else [r.metrics[name] for r in best.results if name in r.metrics]
    return float(np.mean(vals)) if vals else None


def unit_evaluate(
    trace: pa.Table, params: SizeParams, unit: Unit, replicas: int = 1, pd: PDConfig | None = None,
    decode: Unit | None = None, excerpt: int | None = None,
) -> SimEvaluate:  # fmt: skip
    """The simulator-backed evaluate(rate, seed) of `replicas` instances of `unit` (or a P/D deployment with `pd`,
    `unit` as the prefill pool and `decode` as the decode pool)."""
    return SimEvaluate(
        trace, unit.step_model, unit.engine, params.slo, excerpt or params.excerpt_requests, replicas, params.router, pd,
        None if decode is None else decode.step_model, params.steady,
    )  # fmt: skip


def _per_usd(rate: float, unit: Unit) -> float:
    return rate / (unit.gpus * max(unit.gpu.usd_per_gpu_hour, 1e-12))


def _best_per_layout(units: Sequence[Unit], score: Callable[[Unit], float]) -> list[Unit]:
    """The best-scoring unit of each (GPU, TP, PP, EP) layout, best first (ties: key)."""
    best: dict[tuple, Unit] = {}
    for u in sorted(units, key=lambda u: (-score(u), u.key)):
        best.setdefault((u.row["gpu"], int(u.row["tp"]), int(u.row["pp"]), int(u.row["ep"])), u)
    return list(best.values())


def _numerics(u: Unit) -> tuple[str, str]:
    return str(u.row["weight_quant"]), str(u.row["kv_dtype"])


def _decode_bound(u: Unit) -> float:
    return min(u.bounds.decode_bandwidth, u.bounds.kv)


class _Sizer:
    """State shared by the steps of one sizing run (the trace, targets, params, executor)."""

    def __init__(self, trace: pa.Table, model: ModelSpec, params: SizeParams, executor: Executor | None, say: Callable[[str], None],
                 measured: MeasuredModels | None):  # fmt: skip
        self.trace, self.model, self.params, self.executor, self.say = trace, model, params, executor, say
        self.measured = measured
        self.lengths = Lengths.of(trace)
        self.target = params.target_rps if params.target_rps is not None else mean_rate(trace)
        self.arrivals_at_target = scale_rate(trace, self.target).column("arrival_s").to_numpy()
        self.planning = traffic_plan(self.target, params.headroom).planning_rps
        self.notes: list[str] = []
        self.roles: list[RoleRow] = []
        self.idle_misses: list[NearMiss] = []  # rows ruled out before any simulation: not even idle do they meet the SLOs

    def evaluate(self, unit: Unit, replicas: int = 1, excerpt: int | None = None) -> SimEvaluate:
        return unit_evaluate(self.trace, self.params, unit, replicas=replicas, excerpt=excerpt)

    def search_task(self, unit: Unit, best_per_gpu: float = 0.0) -> SearchTask:
        """One instance's search from half its analytic bound (confirmed on the whole trace in mode "all"), cut
        short when it fails at the rate it needs to beat `best_per_gpu` (branch and bound on measured rates)."""
        p, ev = self.params, self.evaluate(unit)
        confirm = ev.whole_trace() if p.confirm_whole_trace == "all" else None
        floor = best_per_gpu * unit.gpus if best_per_gpu > 0 and p.confirm_whole_trace != "all" else None
        return SearchTask(unit.key, ev, p.slo.attainment_target, p.search, 0.5 * unit.bounds.rate, confirm, floor)

    def pool(self, name: str, unit: Unit, rate: float, kv_from: SearchResult | None) -> PoolInput:
        """A pool of `unit` at `rate` req/s per instance; `kv_from`: the search whose KV P99 applies (KV-holding pools)."""
        p99 = None if kv_from is None else _metric(kv_from, "kv_tokens_p99")
        cap = None if kv_from is None else float(unit.row["kv_tokens_per_instance"])
        return PoolInput(name, rate, unit.gpus, unit.gpu.gpus_per_node, unit.gpu.usd_per_gpu_hour, p99, cap)

    def plan(self, pools: Sequence[PoolInput]) -> CapacityPlan:
        return plan_headroom(self.target, tuple(pools), self.params.headroom, arrival_s=self.arrivals_at_target)

    def sized(self, row: SizedRow, result: SearchResult) -> SizedRow:
        """Aggregated `row` with `result` and the plan for its max rate (none at rate 0); a confirmation is noted."""
        if result.confirmation is not None:
            self.notes.append(f"whole-trace confirmation of {row.key}: {result.confirmation.describe()}")
        plan = self.plan([self.pool("instances", row.unit, result.max_rate, result)]) if result.max_rate > 0 else None
        return replace(row, result=result, plan=plan)

    def confirm(self, row: SizedRow) -> SizedRow:
        """`row` with its max rate confirmed on the whole trace (`confirm_max_rate`) and its plan redone."""
        assert row.whole_trace is not None
        self.say(f"confirming {row.key} on the whole trace")
        return self.sized(row, confirm_max_rate(row.whole_trace, row.result, self.params.search, self.executor))

    def aggregated(self, rows: pd.DataFrame, incumbent: float) -> list[SizedRow]:
        """Branch and bound in rounds of `shortlist`: simulate candidates by analytic bound per GPU (the best
        of each parallel layout first) while their bound can still beat the best goodput per GPU found so
        far (`incumbent` seeds it, e.g. from the P/D search), up to `max_simulated`."""
        p = self.params
        units = [make_unit(self.model, r, self.lengths, p.slo, self.measured) for _, r in rows.iterrows()]
        for u in units:
            if u.unloaded_attainment < p.slo.attainment_target:
                self.notes.append(f"pruned {u.key}: even idle only {u.unloaded_attainment:.1%} of requests meet the SLOs")
                self.idle_misses.append(idle_miss(u.key, u.unloaded_attainment, p.slo))
        itl_s = math.inf if p.slo.itl_ms is None else p.slo.itl_ms * 1e-3

        def stalls(u: Unit) -> bool:  # a full chunk's step alone is longer than the ITL target
            return u.chunk_step_s > itl_s

        viable = sorted((u for u in units if u.unloaded_attainment >= p.slo.attainment_target), key=lambda u: (stalls(u), -u.bound_per_gpu, u.key))
        # Rounds take the best of each parallel layout first (GPU, TP, PP, EP), so variants of one layout
        # (KV dtype, chunk size) do not use up the budget before other layouts are tried. Within a layout a
        # chunk whose step fits the ITL target comes first: a larger chunk has the better prefill bound, but
        # every decode sharing its step waits for it (long prompts then stall decodes past the target).
        rank: dict[tuple, int] = {}
        order = []
        for u in viable:
            layout = (u.row["gpu"], int(u.row["tp"]), int(u.row["pp"]), int(u.row["ep"]))
            order.append((rank.get(layout, 0), -u.bound_per_gpu, u.key, u))
            rank[layout] = rank.get(layout, 0) + 1
        queue = [u for *_, u in sorted(order, key=lambda t: t[:3])]
        self.say(f"aggregated: {len(queue)} candidates can meet the SLOs when idle; simulating by analytic bound per GPU")
        out: list[SizedRow] = []
        best = incumbent
        bounded: list[Unit] = []
        while len(out) < p.max_simulated:
            bounded += [u for u in queue if u.bound_per_gpu <= best]
            queue = [u for u in queue if u.bound_per_gpu > best]
            if not queue:
                break
            n = min(p.shortlist, p.max_simulated - len(out))
            batch, queue = queue[:n], queue[n:]
            tasks = [self.search_task(u, best) for u in batch]
            results = search_candidates(tasks, self.executor)
            for u in batch:
                res = results[u.key]
                if res.status == "below_floor":
                    self.notes.append(f"stopped {u.key}: fails at {res.upper_rate:.4g} req/s, the rate it needs to beat the best goodput per GPU found")
                row = SizedRow(u.key, "aggregated", res, None, u, whole_trace=self.evaluate(u).whole_trace())
                out.append(self.sized(row, res))
                if res.best is not None and res.max_rate > 0:
                    best = max(best, res.max_rate * res.best.mean_attainment / u.gpus)
        for u in bounded:
            self.notes.append(f"pruned {u.key}: analytic bound {u.bound_per_gpu:.3g} req/s per GPU ({u.bounds.binding}) cannot beat the best goodput found")
        for u in queue:
            self.notes.append(f"not simulated {u.key} (bound {u.bound_per_gpu:.3g} req/s per GPU): max_simulated {p.max_simulated} reached")
        return out

    def pd_factory(self, prefill: Unit, decode: Unit) -> _PdFactory:
        link = LinkConfig(bandwidth_bytes_s=prefill.gpu.nic_bytes_s * prefill.gpus, latency_s=self.params.pd_link_latency_s)
        return _PdFactory(self.trace, prefill, decode, link, self.params)

    def disaggregated(self, rows: pd.DataFrame) -> list[SizedRow]:
        """Each pool's per-instance rate searched on its own, then every (prefill row, decode row) pairing sized.

        Numerics (weight quant, KV dtype) are those of the best decode row by analytic bound per dollar: both
        pools must share them. Prefill rows (the best of each GPU/TP layout by prefill bound per dollar,
        `pd_prefill_shortlist`) are searched first, as a pool ahead of ceil(2 × pool bound / decode bound)
        instances of the best decode row (decode never binds: its bound, halved, still covers the pool's
        bound); then decode rows (`pd_decode_shortlist`) as a pool behind ceil(1.5 × pool bound / G_P)
        instances of the prefill row with the best measured G_P per dollar (`role_rates` sets the pool
        sizes). Pairings may mix GPU types and prefill layouts; each is sized pool by pool
        (`llmcap.sizing.headroom`) — no fixed P:D unit.
        """
        p = self.params
        units = [make_unit(self.model, r, self.lengths, p.slo, self.measured) for _, r in rows.iterrows()]
        good = [u for u in units if u.unloaded_attainment >= p.slo.attainment_target]
        self.idle_misses += [idle_miss(f"{u.row['role']}: {u.key}", u.unloaded_attainment, p.slo) for u in units if u not in good]
        dec = _best_per_layout([u for u in good if u.row["role"] == "decode"], lambda u: _per_usd(_decode_bound(u), u))
        if not dec:
            return []
        # Both pools run the same numerics (the handed-off KV must be readable, the tokens the same model's):
        # those of the best decode row by bound per dollar.
        numerics = _numerics(dec[0])
        dec = [u for u in dec if _numerics(u) == numerics]
        pre = [u for u in good if u.row["role"] == "prefill" and _numerics(u) == numerics]
        pre = _best_per_layout(pre, lambda u: _per_usd(u.bounds.prefill_compute, u))
        if not pre:
            return []
        pre, dec = pre[: p.pd_prefill_shortlist], dec[: p.pd_decode_shortlist]
        self.say(f"disaggregated: searching the prefill pool rate of {len(pre)} row(s), then the decode pool rate of {len(dec)}")
        lead_d = dec[0]

        def prefill_eval(u: Unit, n: int) -> tuple[SimEvaluate, str]:
            n_d = max(1, math.ceil(2 * n * u.bounds.prefill_compute / _decode_bound(lead_d)))
            return self.pd_factory(u, lead_d)(n, n_d), f"ahead of {n_d} decode instance(s) of {lead_d.key}"

        pre_rows = self.role_rates("prefill", pre, lambda u: u.bounds.prefill_compute, prefill_eval)
        usable = [r for r in pre_rows if r.rate > 0]
        if not usable:
            self.roles += pre_rows
            self.notes.append("disaggregated: no prefill row carries any rate under the SLOs; no P/D plan")
            return []
        lead_p = max(usable, key=lambda r: (_per_usd(r.rate, r.unit), r.unit.key))

        def decode_eval(u: Unit, n: int) -> tuple[SimEvaluate, str]:
            n_p = max(1, math.ceil(1.5 * n * _decode_bound(u) / lead_p.rate))
            return self.pd_factory(lead_p.unit, u)(n_p, n), f"behind {n_p} prefill instance(s) of {lead_p.unit.key}"

        dec_rows = self.role_rates("decode", dec, _decode_bound, decode_eval)
        self.roles += pre_rows + dec_rows
        for r in pre_rows + dec_rows:
            self.notes.append(f"{r.role} pool rate of {r.unit.key}: G = {r.rate:.4g} req/s per instance ({r.partner})")
        out = []
        for pr in pre_rows:
            for dr in dec_rows:
                key = f"P[{pr.unit.key}]+D[{dr.unit.key}]"
                plan = None
                if pr.rate > 0 and dr.rate > 0:
                    plan = self.plan([self.pool("prefill", pr.unit, pr.rate, None), self.pool("decode", dr.unit, dr.rate, dr.result)])
                out.append(SizedRow(key, "disaggregated", pr.result, plan, pr.unit, decode=dr.unit, pd_roles=(pr, dr)))
        return out

    def role_rates(
        self, role: str, units: Sequence[Unit], bound: Callable[[Unit], float], make_eval: Callable[[Unit, int], tuple[SimEvaluate, str]]
    ) -> list[RoleRow]:
        """Each unit's per-instance rate as one instance of a pool of n (pools multiplex: one instance alone
        queues every short prompt behind a long one, so G depends on n). n = ceil(λ / (¼ × bound)) first (a
        pool under per-request latency targets runs at a quarter to a half of its analytic bound); when the
        measured rate implies a count more than a quarter (and more than one instance) away, searched once
        more at that count. The search starts at λ, the rate the pool is sized to carry."""
        p, lam = self.params, self.planning
        sizes = {u.key: max(1, math.ceil(lam / (0.25 * bound(u)))) for u in units}

        def off(u: Unit) -> bool:
            r = rows[u.key].rate
            return r > 0 and abs(ceil_count(lam / r) - sizes[u.key]) > max(1, 0.25 * sizes[u.key])

        rows: dict[str, RoleRow] = {}
        todo = list(units)
        for _ in range(2):
            evals = {u.key: make_eval(u, sizes[u.key]) for u in todo}
            tasks = [SearchTask(f"{role}[{u.key}]", evals[u.key][0], p.slo.attainment_target, p.search, lam) for u in todo]
            res = search_candidates(tasks, self.executor)
            for u in todo:
                n = sizes[u.key]
                rows[u.key] = RoleRow(role, u, res[f"{role}[{u.key}]"], f"searched as a pool of {n} {evals[u.key][1]}", n)
            todo = [u for u in todo if off(u)]
            for u in todo:
                sizes[u.key] = max(1, ceil_count(lam / rows[u.key].rate))
            if not todo:
                break
        return [rows[u.key] for u in units]

    def choose(self, rows: list[SizedRow]) -> tuple[SizedRow, list[SizedRow]]:
        """The cheapest sized row; in mode "chosen" an aggregated one is confirmed on the whole trace first,
        re-choosing while a confirmation steps the cheapest down (each row is confirmed at most once). A P/D
        pairing needs no confirmation: its whole deployment is simulated in every scenario."""

        def cost(r: SizedRow) -> tuple[float, float, str]:
            assert r.plan is not None
            return (r.plan.usd_per_hour, -r.balanced_rps_per_gpu, r.key)

        while True:
            sized = [r for r in rows if r.plan is not None]
            if not sized:
                searched = [(r.key, r.result) for r in rows if r.mode == "aggregated"] + [(f"{q.role}: {q.unit.key}", q.result) for q in self.roles]
                raise NoFeasiblePlan(near_misses(searched, self.params.slo, self.idle_misses))
            chosen = min(sized, key=cost)
            if self.params.confirm_whole_trace == "off" or chosen.result.confirmation is not None or chosen.whole_trace is None:
                break
            rows = [self.confirm(r) if r is chosen else r for r in rows]
        unconfirmed = [r.key for r in rows if r.mode == "aggregated" and r.result.confirmation is None and r.result.max_rate > 0]
        if unconfirmed:
            self.notes.append(f"max rates from excerpts only (not confirmed on the whole trace): {', '.join(unconfirmed)}")
        return chosen, rows

    def replay(self, row: SizedRow, plan: CapacityPlan) -> SimResult:
        """`row`'s deployment at `plan`'s counts, simulated on the whole trace at the planning rate."""
        return self._whole_trace(row)(plan.counts()).simulate(plan.planning_rps, self.params.search.seeds[0])

    def _whole_trace(self, row: SizedRow) -> Callable[[Mapping[str, int]], SimEvaluate]:
        """Serving instances per pool → `row`'s deployment replaying the whole trace (with the sizer's router now)."""
        if row.decode is None:
            unit = row.unit
            return lambda counts: self.evaluate(unit, replicas=counts["instances"], excerpt=self.trace.num_rows)
        factory = replace(self.pd_factory(row.unit, row.decode), whole_trace=True)
        return lambda counts: factory(counts["prefill"], counts["decode"])

    def deployment(self, row: SizedRow) -> tuple[RunSeed, Judge]:
        """`row`'s deployment simulated on the whole trace at the planning rate, (counts, seed) → evaluation, and
        the judge of its scenarios."""
        assert row.plan is not None
        p, rate, make = self.params, row.plan.planning_rps, self._whole_trace(row)

        def run(counts: Mapping[str, int], seed: int) -> EvalResult:
            return make(counts)(rate, seed)

        kv_pool, prefill_pool = ("instances", None) if row.decode is None else ("decode", "prefill")
        return run, Judge(p.slo.attainment_target, p.headroom.kv_safe_fraction, kv_pool, prefill_pool)

    def parallel(self, row: SizedRow, seed: int) -> Parallel | None:
        """`row`'s scenario deployments on `seed` simulated across the executor's workers (None: one at a time)."""
        executor = self.executor
        width = executor.slots() if executor is not None else 1
        if executor is None or width <= 1:
            return None
        assert row.plan is not None
        make, rate = self._whole_trace(row), row.plan.planning_rps
        return Parallel(lambda many: executor.map(evaluate_at, [(make(c), rate, seed) for c in many]), width)

    def fit(self, row: SizedRow) -> FitResult:
        """The chosen plan simulated end to end in every scenario, grown until all pass, each pool shown minimal."""
        assert row.plan is not None
        run, judge = self.deployment(row)
        seed = self.params.search.seeds[0]
        self.say(f"simulating the scenarios of {row.key} on the whole trace at {row.plan.planning_rps:.4g} req/s")
        return fit_scenarios(row.plan, lambda counts: run(counts, seed), judge, self.params.validate_max_extra, self.parallel(row, seed))

    def routers(self) -> list[str]:
        """The routers the chosen plan is fitted with: `router`, and prefix_aware where the trace has prefix hashes."""
        p = self.params
        if p.prefix_routing == "search" and self.lengths.hashes is not None and p.router != "prefix_aware":
            return [p.router, "prefix_aware"]
        return [p.router]

    def fit_routed(self, row: SizedRow) -> tuple[FitResult, dict[str, dict[str, Any]]]:
        """`fit` under each of `routers()`; the one whose fitted plan passes and costs least is kept (ties: the
        configured router) and from then on is the sizer's router. Also each router's outcome, for the report."""
        base, fits = self.params, {}
        for router in self.routers():
            self.params = base.model_copy(update={"router": router})
            fits[router] = self.fit(row)
        order = list(fits)
        best = min(order, key=lambda r: (not fits[r].ok, fits[r].plan.usd_per_hour, order.index(r)))
        self.params = base.model_copy(update={"router": best})
        compared = {r: {"gpus": f.plan.total_gpus, "usd_per_hour": f.plan.usd_per_hour, "scenarios_pass": f.ok} for r, f in fits.items()}
        if len(fits) > 1:
            tried = "; ".join(f"{r} {c['gpus']} GPUs (${c['usd_per_hour']:,.0f}/h){'' if c['scenarios_pass'] else ', scenarios not all met'}"
                              for r, c in compared.items())  # fmt: skip
            self.notes.append(f"routing searched on the chosen plan: {tried} → {best}")
        return fits[best], compared

    def count_range(self, row: SizedRow) -> CountRange:
        """The fitted plan judged on `count_seeds` too, and each pool's seed spread of G (`llmcap.sizing.uncertainty`)."""
        assert row.plan is not None
        if row.pd_roles is None:
            spreads = [pool_spread("instances", seed_max_rates(row.result), self.target)]
        else:
            spreads = [pool_spread(r.role, {s: g / r.instances for s, g in seed_max_rates(r.result).items()}, self.target) for r in row.pd_roles]
        run, judge = self.deployment(row)
        seeds = [s for s in self.params.count_seeds if s != self.params.search.seeds[0]]
        if seeds:
            self.say(f"simulating the plan's scenarios on seeds {', '.join(map(str, seeds))} for the count's range")
        return count_range(row.plan, run, judge, self.params.search.seeds[0], seeds, spreads, lambda seed: self.parallel(row, seed))


@dataclass(frozen=True)
class _PdFactory:
    """(n_P, n_D) → evaluate of that P/D deployment (a class, not a closure, so it pickles to workers)."""

    trace: pa.Table
    prefill: Unit
    decode: Unit
    link: LinkConfig
    params: SizeParams
    whole_trace: bool = False  # evaluates that replay the whole trace (scenarios)

    def __call__(self, n_p: int, n_d: int) -> SimEvaluate:
        first_token = "decode" if self.params.slo.ttft_includes_handoff else "prefill"
        pd_cfg = PDConfig(prefill_replicas=n_p, decode_replicas=n_d, link=self.link, first_token_from=first_token, decode_engine=self.decode.engine)
        ev = unit_evaluate(self.trace, self.params, self.prefill, pd=pd_cfg, decode=self.decode)
        return ev.whole_trace() if self.whole_trace else ev


def _kv_usage(records_ts: pa.Table) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per pool (role) and time bin: the mean and the max KV usage over its replicas (a few lines, however many replicas)."""
    out = {}
    for role in sorted(set(records_ts.column("role").to_pylist())):
        part = records_ts.filter(pc.equal(records_ts["role"], role))
        n = len(set(part.column("replica").to_pylist()))
        agg = part.group_by("t_s").aggregate([("kv_usage", "mean"), ("kv_usage", "max")]).sort_by("t_s")
        t = agg["t_s"].to_numpy()
        name = "instances" if role == "both" else role
        if n > 1:
            out[f"{name}: max over {n} replicas"] = (t, agg["kv_usage_max"].to_numpy())
        out[f"{name}: mean over {n} replicas" if n > 1 else f"{name}: 1 replica"] = (t, agg["kv_usage_mean"].to_numpy())
    return out


def ledger_check(lengths: Lengths, row: SizedRow, rate_rps: float, plan: CapacityPlan) -> Ledger:
    """The four-ledger floor of `row`'s configuration at `rate_rps` (`llmcap.sizing.ledger`), beside `plan`'s count."""
    pre, dec = row.unit, row.decode or row.unit
    return four_ledgers(
        rate_rps, lengths.isl, lengths.osl, lengths.cached,
        prefill_tokens_s=pre.bounds.prefill_compute * float((lengths.isl - lengths.cached).mean()), prefill_gpus=pre.gpus,
        decode_tokens_s=dec.bounds.decode_bandwidth * float(lengths.osl.mean()), decode_gpus=dec.gpus,
        decode_step_s=dec.decode_step_s, kv_tokens_per_instance=float(dec.row["kv_tokens_per_instance"]),
        kv_bytes_per_token=dec.engine.kv_bytes_per_token, nic_bytes_s_per_gpu=pre.gpu.nic_bytes_s,
        disaggregated=row.decode is not None, final_gpus=plan.total_gpus,
    )  # fmt: skip


def _table_rows(workload_id: str, rows: Sequence[SizedRow], roles: Sequence[RoleRow]) -> list[dict[str, Any]]:
    out = [capacity_row(workload_id, r.key, r.mode, r.config, r.result, r.unit.gpus, r.plan) for r in rows if r.mode == "aggregated"]
    out += [capacity_row(workload_id, r.unit.key, r.role, r.unit.config, r.result, r.unit.gpus * r.instances) for r in roles]
    for r in rows:
        if r.mode == "disaggregated":
            assert r.pd_roles is not None
            pr, dr = r.pd_roles
            out.append(pairing_row(workload_id, r.key, r.config, (pr.result, pr.rate, pr.unit.gpus), (dr.result, dr.rate, dr.unit.gpus), r.plan))
    return out


def _pool_summary(plan: CapacityPlan, chosen: str) -> dict[str, Any]:
    configs = pool_configurations(chosen)
    return {
        q.name: {
            "configuration": configs.get(q.name, chosen),
            "per_instance_rps": q.pool.per_instance_rps, "gpus_per_instance": q.pool.gpus_per_instance,
            "base_instances": q.base_instances, "instances": q.instances, "gpus": q.gpus, "usd_per_hour": q.usd_per_hour,
            "headroom": {i.risk: {"rps": i.rps, "instances": i.instances, "reasoning": i.reasoning} for i in q.items},
            "placement": q.placement.describe(),
        }
        for q in plan.pools
    }  # fmt: skip


PHASES = ("disaggregated pools", "aggregated candidates", "choice (whole-trace confirmation)", "scenarios", "count range", "planned deployment replay")


def size_deployments(
    trace: pa.Table,
    candidates: pd.DataFrame,
    model: ModelSpec,
    params: SizeParams,
    executor: Executor | None = None,
    workload_id: str = "workload",
    progress: Callable[[str], None] | None = None,
    measured: MeasuredModels | None = None,
    simulate_scenarios: bool = True,
    on_phase: Callable[[int, int, str], None] | None = None,
) -> SizingOutcome:
    """The capacity table, report and summary for `trace` over the feasible rows of `candidates`
    (`measured`: calibrated step models that replace the roofline for matching candidates;
    `simulate_scenarios` False: the analytic per-pool plan without the scenario simulations;
    `on_phase(done, total, name)`: before each of `PHASES` and once at the end, for a progress bar)."""
    feasible = candidates[candidates["feasible"]]
    if feasible.empty:
        raise LlmcapError("no feasible candidate to size: every candidate was ruled out in step 2 (see its reasons)")

    began = [time.perf_counter()]

    def phase(done: int) -> None:
        now = time.perf_counter()
        if done > 0:
            log.info("sizing phase %d/%d (%s) took %.1f s", done, len(PHASES), PHASES[done - 1], now - began[0])
        began[0] = now
        if on_phase is not None:
            on_phase(done, len(PHASES), PHASES[done] if done < len(PHASES) else "done")

    sizer = _Sizer(trace, model, params, executor, progress or log.info, measured)
    rows: list[SizedRow] = []
    dis = feasible[feasible["mode"] == "disaggregated"]
    phase(0)
    if params.pd_prefill_shortlist > 0 and not dis.empty:
        rows += sizer.disaggregated(dis)
    incumbent = max((r.balanced_rps_per_gpu for r in rows), default=0.0)
    phase(1)
    if (feasible["mode"] == "aggregated").any():
        rows = sizer.aggregated(feasible[feasible["mode"] == "aggregated"], incumbent) + rows

    phase(2)
    chosen, rows = sizer.choose(rows)
    assert chosen.plan is not None
    analytic = chosen.plan
    phase(3)
    fitted, routers = sizer.fit_routed(chosen) if simulate_scenarios else (None, {})
    if fitted is not None:
        chosen_fit = replace(chosen, plan=fitted.plan)
        rows = [chosen_fit if r is chosen else r for r in rows]
        chosen = chosen_fit
        if not fitted.ok:
            sizer.notes.append(f"scenario fit of {chosen.key} did not pass every scenario within +{params.validate_max_extra} instance(s); the count shown is the last tried")
    plan = chosen.plan
    assert plan is not None
    phase(4)
    spread = sizer.count_range(chosen) if fitted is not None and fitted.ok else None
    table = capacity_table(_table_rows(workload_id, rows, sizer.roles))

    # the planned deployment replayed on the whole trace at the planning rate, for the report's CDFs and KV plot
    phase(5)
    sim = sizer.replay(chosen, plan)
    records, kv_usage = sim.records, _kv_usage(sim.timeseries)
    counts = " + ".join(f"{q.name} {q.instances}" for q in plan.pools)
    replay = f"the planned deployment ({counts} instances) on the whole trace ({sim.records.num_rows:,} requests) at {plan.planning_rps:.4g} req/s"
    curves = {r.key: r.result for r in rows if r.mode == "aggregated"} | {f"{r.role}: {r.unit.key}": r.result for r in sizer.roles}
    ledger = ledger_check(sizer.lengths, chosen, sizer.target, plan)
    report = CapacityReport(table, params.slo, curves, chosen.key, plan, records, kv_usage, notes=tuple(sizer.notes),
                            analytic=analytic, fit=fitted, ledger=ledger, replay=replay,
                            count_range=() if spread is None else tuple(spread.lines()))  # fmt: skip
    summary = {
        "target_rps": sizer.target,
        "slo_definitions": definitions(params.slo, chosen.mode == "disaggregated"),
        "planning_rps": plan.planning_rps,
        "chosen": chosen.key,
        "mode": chosen.mode,
        "router": sizer.params.router,
        "routers_compared": routers or None,
        "pd_ratio": None if chosen.mode == "aggregated" else f"{plan.pool('prefill').instances}:{plan.pool('decode').instances}",
        "max_rps_per_unit": chosen.result.max_rate,
        "gpus_per_unit": chosen.gpus_per_unit,
        "base_instances": plan.base_instances,
        "base_gpus": plan.base_gpus,
        "instances": plan.total_instances,
        "gpus": plan.total_gpus,
        "usd_per_hour": plan.usd_per_hour,
        "pool_plans": _pool_summary(plan, chosen.key),
        "analytic_gpus": analytic.total_gpus,
        "combination_rule": COMBINATION_RULE,
        "scenarios": None if fitted is None else [r.describe() for r in fitted.results],
        "scenarios_pass": None if fitted is None else fitted.ok,
        "minimality": None if fitted is None else [m.note for m in fitted.minimality],
        "fit_history": None if fitted is None else list(fitted.history),
        "count_range": None if spread is None else spread.as_dict(),
        "ledger": ledger.as_dict(),
        "candidates_feasible": len(feasible),
        "candidates_simulated": len(rows) - sum(r.mode == "disaggregated" for r in rows) + len(sizer.roles),
        "notes": list(sizer.notes),
    }
    phase(len(PHASES))
    return SizingOutcome(table, report, summary)


def class_pools(
    trace: pa.Table,
    candidates: pd.DataFrame,
    model: ModelSpec,
    params: SizeParams,
    shared: SizingOutcome,
    split_isl: int,
    executor: Executor | None = None,
    measured: MeasuredModels | None = None,
) -> PoolComparison:
    """One shared deployment (the plan already sized) against one per request class: prompts of at most
    `split_isl` tokens vs longer ones, each class sized on its own sub-trace at its share of the target
    rate with its own best configuration (P/D pools sized separately too). Compared on base GPUs (the
    bare counts at the mean rate; headroom applies to either, and per-class scenarios are not simulated)."""
    isl = trace.column("isl").to_numpy()
    s = shared.summary
    pools_shared = [Pool("shared", s["target_rps"], s["base_gpus"], _base_usd(s))]
    split = []
    for name, mask in ((f"ISL ≤ {split_isl:,}", isl <= split_isl), (f"ISL > {split_isl:,}", isl > split_isl)):
        n = int(mask.sum())
        if n < 2:
            raise LlmcapError(f"request-class split at ISL {split_isl:,} leaves {n} request(s) in class '{name}'")
        sub = trace.filter(pa.array(mask))
        rate = s["target_rps"] * n / trace.num_rows
        update = {"target_rps": rate, "pools_split_isl": None}
        try:
            out = size_deployments(sub, candidates, model, params.model_copy(update=update), executor, name, measured=measured, simulate_scenarios=False)
        except LlmcapError as exc:
            raise LlmcapError(f"class '{name}' ({n:,} requests) alone: {exc}") from None
        o = out.summary
        split.append(Pool(f"{name}: {o['chosen']}", rate, o["base_gpus"], _base_usd(o)))
    return compare_pools(pools_shared, split)


def _base_usd(summary: Mapping[str, Any]) -> float:
    """$/h of the base counts (each pool's base GPUs at its GPU's price)."""
    pools = summary["pool_plans"].values()
    return float(sum(q["usd_per_hour"] * q["base_instances"] / q["instances"] for q in pools))
