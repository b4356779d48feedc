"""Units of capacity for the sizing search: one candidate as one instance (`Unit`: step model, engine
configuration from the memory plan, analytic bounds), the trace's length statistics it is judged on
(`Lengths`), and the rows the search produces (`SizedRow`, `RoleRow`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from llmcap.catalog import GpuSpec, ModelSpec, get_gpu
from llmcap.catalog.quant import kv_dtype_bytes
from llmcap.errors import LlmcapError
from llmcap.perf import build_step_model, decode_step_time, prefill_time
from llmcap.perf.model import StepTimeModel
from llmcap.perf.roofline import RooflineModel
from llmcap.perf.scaled import ScaledStepModel
from llmcap.sim import EngineConfig, PDConfig
from llmcap.sim.config import tier_of
from llmcap.sizing.analytic import RateBounds, rate_bounds
from llmcap.sizing.headroom import CapacityPlan
from llmcap.sizing.measured import MeasuredModels, config_key
from llmcap.sizing.params import PrefixTier, SizeParams, SloParams
from llmcap.sizing.search import SearchResult
from llmcap.sizing.simeval import SimEvaluate
from llmcap.sizing.slo import itl_column
from llmcap.trace.prefix import hit_tokens, leading_reuse_unbounded, reuse_at, stack_distances
from llmcap.trace.schema import block_size_of

CONFIG_KEYS = (
    "gpu",
    "weight_quant",
    "kv_dtype",
    "tp",
    "pp",
    "ep",
    "dp",
    "max_num_seqs",
    "max_num_batched_tokens",
    "gpus_per_instance",
    "kv_tokens_planned",
    "kv_tokens_measured",
)


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
    raise LlmcapError(
        f"the chosen plan's candidate {key} ({'/'.join(roles)}) is not a feasible row of the candidates table"
    )


ISL_STEPS = 64  # prompt lengths timed at 64 steps per power of two (rounded down by < 1/64)


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
        """The distinct (ISL, cached) pairs, each prompt rounded down by less than 1/ISL_STEPS of itself (to a
        power-of-two grain: a shorter prompt never takes longer, so times stay lower bounds), and each request's
        pair index. ~3x fewer prompts to time on Mooncake."""
        grain = np.exp2(np.maximum(0.0, np.floor(np.log2(np.maximum(self.isl, 1.0))) - np.log2(ISL_STEPS)))
        isl = np.maximum(np.floor(self.isl / grain) * grain, self.cached)
        # whole token counts below 2^31: one int64 key per pair sorts as the (ISL, cached) pairs do, and a 1-D
        # np.unique is far cheaper than one over stacked columns (axis=1) on long traces
        key = (isl.astype(np.int64) << 32) | self.cached.astype(np.int64)
        keys, inverse = np.unique(key, return_inverse=True)
        pairs = np.stack([(keys >> 32).astype(np.float64), (keys & 0xFFFFFFFF).astype(np.float64)])
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
    step_model_source: str = "roofline, default efficiencies"  # `step_model_source`

    @property
    def gpus(self) -> int:
        return int(self.row["gpus_per_instance"])

    @property
    def bound_per_gpu(self) -> float:
        return self.bounds.rate / self.gpus

    @property
    def config(self) -> dict[str, Any]:
        own = {
            k: (None if v is pd.NA else v.item() if hasattr(v, "item") else v)
            for k, v in self.row.items()
            if k in CONFIG_KEYS
        }
        return own | {
            "admission_policy": self.engine.admission_policy,
            "step_model": self.step_model_source,
            "kv_tokens_used": int(self.row["kv_tokens_per_instance"]),
        }


def prefill_alone(step: StepTimeModel, lengths: Lengths, chunk: int) -> np.ndarray:
    """Each request's prefill alone on the engine, in chunks of `chunk`, with its prefix hits: a lower bound
    on its TTFT (`Lengths.prompt_pairs`: each distinct rounded-down prompt timed once)."""
    pairs, inverse = lengths.prompt_pairs
    return prefill_time(step, pairs[0], pairs[1], chunk=chunk)[inverse]


def unloaded_attainment(
    step: StepTimeModel, engine: EngineConfig, lengths: Lengths, slo: SloParams, prefill_s: np.ndarray | None = None
) -> float:
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


def make_unit(
    model: ModelSpec,
    row: Mapping[str, Any],
    lengths: Lengths,
    slo: SloParams,
    measured: MeasuredModels | None = None,
    admission_policy: str = "vllm",
    tiers: Sequence[PrefixTier] = (),
) -> Unit:
    """Step model (measured when one matches, else roofline), engine config (KV blocks from the memory plan,
    the engine's `admission_policy`, the prefix cache's offload `tiers`) and rate bounds of one candidate row
    (prefix hits: an LRU cache of the instance's KV size and its tiers', `Lengths.at_capacity`)."""
    gpu = get_gpu(str(row["gpu"]))
    step = (measured or {}).get(config_key(row)) or build_step_model(
        model.source,
        gpu.name,
        tp=int(row["tp"]),
        pp=int(row["pp"]),
        ep=int(row["ep"]),
        weight_quant=str(row["weight_quant"]),
        kv_dtype=str(row["kv_dtype"]),
    )
    source = step_model_source(step)
    block, kv_tokens = int(row["block_size"]), int(row["kv_tokens_per_instance"])
    kv_bytes = model.kv_bytes_per_token(kv_dtype_bytes(str(row["kv_dtype"])))
    offload = tuple(tier_of(t.name, t.gb, t.gbps, t.lookup_ms, kv_bytes * block) for t in tiers)
    lengths = lengths.at_capacity(kv_tokens + block * sum(t.blocks for t in offload))  # the tiers hold what HBM evicts
    engine = EngineConfig(
        num_blocks=kv_tokens // block,
        block_size=block,
        max_num_seqs=int(row["max_num_seqs"]),
        max_num_batched_tokens=int(row["max_num_batched_tokens"]),
        kv_bytes_per_token=kv_bytes,
        tiers=offload,
        max_model_len=int(row["max_context_len"]),  # longer requests are rejected, as the engine would: misses
        admission_policy=admission_policy,
        max_loras=int(row.get("max_loras", 0)),  # a candidates table written before the column: no LoRA
    )
    mean_isl, mean_osl = float(lengths.isl.mean()), float(lengths.osl.mean())
    uncached = max(float((lengths.isl - lengths.cached).mean()), 1.0)
    chunk = engine.max_num_batched_tokens
    # Prefill bound from the trace's whole length distribution (each prompt alone, in its chunks, with its
    # own prefix hits), not from the mean prompt: attention grows with context, so E[t(ISL)] > t(E[ISL]).
    # The roofline's compiled tables time them faster (a copy of its own, outside the tables simulations share).
    timing = step.compile() if isinstance(step, RooflineModel) else step
    alone = prefill_alone(timing, lengths, chunk)
    # the largest decode batch the scheduler and the KV allow at the mean request length
    batch = max(1, min(engine.max_num_seqs, kv_tokens // max(1, math.ceil(mean_isl + mean_osl))))
    t_batch, t_one = decode_step_time(timing, [batch, 1], mean_isl + mean_osl / 2)
    prefill_tokens_s = uncached / max(float(alone.mean()), 1e-12)
    bounds = rate_bounds(
        lengths.isl, lengths.osl, prefill_tokens_s, batch / float(t_batch), kv_tokens, float(t_one), lengths.cached
    )
    chunk_step = float(prefill_time(timing, [min(chunk, int(lengths.isl.max()))], chunk=chunk)[0])
    return Unit(
        candidate_key(row),
        row,
        gpu,
        step,
        engine,
        bounds,
        unloaded_attainment(timing, engine, lengths, slo, alone),
        float(t_batch),
        chunk_step,
        source,
    )


def step_model_source(step: StepTimeModel) -> str:
    """What times a unit's steps, for its capacity-table row: the roofline with its GPU's fitted efficiencies
    (file and sha256) or the documented defaults, or the measured profile; "corrected" when reconciliation's
    written-back corrections scale it."""
    if isinstance(step, ScaledStepModel):
        return f"{step_model_source(step.model)}, corrected"
    if not isinstance(step, RooflineModel):
        return "measured profile"
    cal = step.calibration
    if cal is None:
        return "roofline, default efficiencies"
    kept = (
        f"; defaults for {', '.join(cal.not_applied)}" if cal.not_applied else ""
    )  # where independent timings refute the fit
    return f"roofline, calibrated ({cal.describe()['file']}, sha256 {cal.sha256[:12]}{kept})"


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


def search_metric(result: SearchResult, name: str) -> float | None:
    best = result.best
    vals = [] if best is None else [r.metrics[name] for r in best.results if name in r.metrics]
    return float(np.mean(vals)) if vals else None


def unit_evaluate(
    trace: pa.Table,
    params: SizeParams,
    unit: Unit,
    replicas: int = 1,
    pd: PDConfig | None = None,
    decode: Unit | None = None,
    excerpt: int | None = None,
    rate_factor: float = 1.0,
) -> SimEvaluate:
    """The simulator-backed evaluate(rate, seed) of `replicas` instances of `unit` (or a P/D deployment with `pd`,
    `unit` as the prefill pool and `decode` as the decode pool); `rate_factor`: `trace`'s rate relative to the
    planning trace's (`SimEvaluate`)."""
    return SimEvaluate(
        trace,
        unit.step_model,
        unit.engine,
        params.slo,
        excerpt or params.excerpt_requests,
        replicas,
        params.router,
        pd,
        None if decode is None else decode.step_model,
        params.steady,
        rate_factor,
    )


def rate_per_usd(rate: float, unit: Unit) -> float:
    return rate / (unit.gpus * max(unit.gpu.usd_per_gpu_hour, 1e-12))


def best_per_layout(units: Sequence[Unit], score: Callable[[Unit], float]) -> list[Unit]:
    """The best-scoring unit of each (GPU, TP, PP, EP) layout, best first (ties: key)."""
    best: dict[tuple, Unit] = {}
    for u in sorted(units, key=lambda u: (-score(u), u.key)):
        best.setdefault((u.row["gpu"], int(u.row["tp"]), int(u.row["pp"]), int(u.row["ep"])), u)
    return list(best.values())


def unit_numerics(u: Unit) -> tuple[str, str]:
    return str(u.row["weight_quant"]), str(u.row["kv_dtype"])


def decode_bound(u: Unit) -> float:
    return min(u.bounds.decode_bandwidth, u.bounds.kv)
