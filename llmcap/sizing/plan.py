"""Step 4 end to end: feasible candidates + trace + SLOs → searched max rates → sized, costed deployments.

1. Bound: every feasible candidate gets analytic upper bounds on one instance's rate (prefill compute,
   decode bandwidth, KV by Little's law) from its step-time model, and its attainment when idle (an
   upper bound at any rate). The best `pd_shortlist` prefill/decode pairings are searched first; then
   aggregated candidates in order of bound per GPU, in batches of `shortlist`, while a bound can still
   beat the best goodput per GPU found (branch and bound, at most `max_simulated`). Every pruned
   candidate is listed in the notes with its reason.
2. Search: each simulated unit's max feasible rate by bracket + bisection on the rate-scaled trace
   (`llmcap.sizing.search`; seeds replay different excerpts, long enough at each rate for a queue to show,
   and an overloaded run fails whatever its attainment); evaluations go through the executor. Each answer
   is confirmed on the whole trace at that rate, stepping down until it holds (`confirm_whole_trace`: the
   chosen candidate's, re-choosing until the cheapest plan is a confirmed one; or every candidate's); the
   notes say what each confirmation did and which rates stay unconfirmed.
3. Size: each searched unit is scaled to the target rate, plus headroom by risk, with cost. The
   cheapest plan is checked end to end: its whole deployment simulated on the full trace at the
   target rate, adding instances until it meets the attainment target.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
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
from llmcap.report.capacity import CapacityReport, capacity_row, capacity_table
from llmcap.sim import EngineConfig, LinkConfig, PDConfig
from llmcap.sizing.analytic import RateBounds, rate_bounds
from llmcap.sizing.executor import Executor
from llmcap.sizing.headroom import CapacityPlan, plan_headroom
from llmcap.sizing.params import SizeParams, SloParams
from llmcap.sizing.pools import Pool, PoolComparison, compare_pools
from llmcap.sizing.search import SearchResult, SearchTask, confirm_max_rate, pd_ratio_candidates, search_candidates, search_pd_ratios
from llmcap.sizing.simeval import SimEvaluate
from llmcap.trace.prefix import hit_tokens, leading_reuse_unbounded
from llmcap.trace.schema import block_size_of
from llmcap.trace.synth import mean_rate, scale_rate

CONFIG_KEYS = ("gpu", "weight_quant", "kv_dtype", "tp", "pp", "ep", "dp", "max_num_seqs", "max_num_batched_tokens", "gpus_per_instance")


def candidate_key(row: Mapping[str, Any]) -> str:
    return (
        f"{row['gpu']}/{row['weight_quant']}/kv-{row['kv_dtype']}/tp{row['tp']}pp{row['pp']}ep{row['ep']}"
        f"/seqs{row['max_num_seqs']}/mbt{row['max_num_batched_tokens']}/blk{row['block_size']}"
    )


@dataclass(frozen=True)
class Lengths:
    """The trace's per-request lengths the bounds need; `cached` = ideal (unbounded-cache) prefix hits."""

    isl: np.ndarray
    osl: np.ndarray
    cached: np.ndarray

    @classmethod
    def of(cls, trace: pa.Table) -> Lengths:
        isl = trace.column("isl").to_numpy().astype(np.float64)
        osl = trace.column("osl").to_numpy().astype(np.float64)
        block = block_size_of(trace)
        if block is None or "hash_ids" not in trace.column_names:
            return cls(isl, osl, np.zeros_like(isl))
        reuse = leading_reuse_unbounded(trace.column("hash_ids"))
        return cls(isl, osl, hit_tokens(reuse, isl, block).astype(np.float64))


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

    @property
    def gpus(self) -> int:
        return int(self.row["gpus_per_instance"])

    @property
    def bound_per_gpu(self) -> float:
        return self.bounds.rate / self.gpus

    @property
    def config(self) -> dict[str, Any]:
        return {k: (v.item() if hasattr(v, "item") else v) for k, v in self.row.items() if k in CONFIG_KEYS}


def unloaded_attainment(step: StepTimeModel, engine: EngineConfig, lengths: Lengths, slo: SloParams) -> float:
    """Attainment on an idle instance (every request alone): an upper bound on attainment at any rate.

    TTFT ≥ the request's own (chunked) prefill; ITL ≥ a batch-1 decode step at its final context.
    """
    ok = np.ones(lengths.isl.size, dtype=bool)
    if slo.ttft_ms is not None:
        ttft = prefill_time(step, lengths.isl, lengths.cached, chunk=engine.max_num_batched_tokens)
        ok &= ttft <= (slo.ttft_ms + slo.ttft_ms_per_1k_isl * lengths.isl / 1000.0) * 1e-3
    if slo.itl_ms is not None:
        itl = decode_step_time(step, np.ones_like(lengths.isl), lengths.isl + lengths.osl)
        ok &= (itl <= slo.itl_ms * 1e-3) | (lengths.osl <= 1)
    return float(ok.mean())


MeasuredModels = Mapping[tuple[str, int, int, int, str, str], StepTimeModel]
"""Calibrated step models by (GPU name, tp, pp, ep, weight quant, KV dtype): a measured profile whose
fingerprint matches a candidate replaces the roofline for that candidate."""


def config_key(row: Mapping[str, Any]) -> tuple[str, int, int, int, str, str]:
    return (str(row["gpu"]), int(row["tp"]), int(row["pp"]), int(row["ep"]), str(row["weight_quant"]), str(row["kv_dtype"]))


def make_unit(model: ModelSpec, row: Mapping[str, Any], lengths: Lengths, slo: SloParams, measured: MeasuredModels | None = None) -> Unit:
    """Step model (measured when one matches, else roofline), engine config (KV blocks from the memory plan)
    and rate bounds of one candidate row."""
    gpu = get_gpu(str(row["gpu"]))
    step = (measured or {}).get(config_key(row)) or build_step_model(
        model.source, gpu.name, tp=int(row["tp"]), pp=int(row["pp"]), ep=int(row["ep"]),
        weight_quant=str(row["weight_quant"]), kv_dtype=str(row["kv_dtype"]),
    )  # fmt: skip
    block, kv_tokens = int(row["block_size"]), int(row["kv_tokens_per_instance"])
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
    t_prefill = float(prefill_time(step, [uncached], chunk=engine.max_num_batched_tokens)[0])
    # the largest decode batch the scheduler and the KV allow at the mean request length
    batch = max(1, min(engine.max_num_seqs, kv_tokens // max(1, math.ceil(mean_isl + mean_osl))))
    t_batch, t_one = decode_step_time(step, [batch, 1], mean_isl + mean_osl / 2)
    bounds = rate_bounds(lengths.isl, lengths.osl, uncached / t_prefill, batch / float(t_batch), kv_tokens, float(t_one), lengths.cached)
    return Unit(candidate_key(row), row, gpu, step, engine, bounds, unloaded_attainment(step, engine, lengths, slo))


@dataclass(frozen=True)
class SizedRow:
    key: str
    mode: str
    unit_gpus: int
    result: SearchResult
    plan: CapacityPlan | None
    config: Mapping[str, Any]
    gpu: GpuSpec
    pd_ratio: tuple[int, int] | None = None
    unit: Unit | None = None  # aggregated only
    whole_trace: SimEvaluate | None = None  # the unit's evaluate on the whole trace (confirmation)


@dataclass(frozen=True)
class SizingOutcome:
    table: pa.Table
    report: CapacityReport
    summary: dict[str, Any]


def _metric(result: SearchResult, name: str) -> float | None:
    best = result.best
    vals = [] if best is None else [r.metrics[name] for r in best.results if name in r.metrics]
    return float(np.mean(vals)) if vals else None


def validate_instances(
    make_eval: Callable[[int], SimEvaluate], start: int, target_rps: float, attainment_target: float, seeds: Sequence[int], max_extra: int
) -> tuple[int | None, list[tuple[int, float]]]:
    """Smallest instance count ≥ start whose whole deployment meets the target at `target_rps` on every seed."""
    tried: list[tuple[int, float]] = []
    for n in range(max(1, start), max(1, start) + max_extra + 1):
        ev = make_eval(n)
        worst = min(ev(target_rps, s).attainment for s in seeds)
        tried.append((n, worst))
        if worst >= attainment_target:
            return n, tried
    return None, tried


def unit_evaluate(
    trace: pa.Table, params: SizeParams, unit: Unit, replicas: int = 1, pd: PDConfig | None = None,
    decode: Unit | None = None, excerpt: int | None = None,
) -> SimEvaluate:  # fmt: skip
    """The simulator-backed evaluate(rate, seed) of `replicas` instances of `unit` (or a P/D unit with `pd`,
    `unit` as the prefill pool and `decode` as the decode pool)."""
    return SimEvaluate(
        trace, unit.step_model, unit.engine, params.slo, excerpt or params.excerpt_requests, replicas, params.router, pd,
        None if decode is None else decode.step_model, params.steady,
    )  # fmt: skip


class _Sizer:
    """State shared by the steps of one sizing run (the trace, targets, params, executor)."""

    def __init__(self, trace: pa.Table, model: ModelSpec, params: SizeParams, executor: Executor | None, say: Callable[[str], None],
                 measured: MeasuredModels | None):  # fmt: skip
        self.trace, self.model, self.params, self.executor, self.say = trace, model, params, executor, say
        self.measured = measured
        self.lengths = Lengths.of(trace)
        self.target = params.target_rps if params.target_rps is not None else mean_rate(trace)
        self.arrivals_at_target = scale_rate(trace, self.target).column("arrival_s").to_numpy()
        self.notes: list[str] = []

    def evaluate(self, unit: Unit, replicas: int = 1, excerpt: int | None = None) -> SimEvaluate:
        return unit_evaluate(self.trace, self.params, unit, replicas=replicas, excerpt=excerpt)

    def search_task(self, unit: Unit) -> SearchTask:
        """One instance's search from half its analytic bound (confirmed on the whole trace in mode "all")."""
        p, ev = self.params, self.evaluate(unit)
        confirm = ev.whole_trace() if p.confirm_whole_trace == "all" else None
        return SearchTask(unit.key, ev, p.slo.attainment_target, p.search, 0.5 * unit.bounds.rate, confirm)

    def sized(self, row: SizedRow, result: SearchResult) -> SizedRow:
        """`row` with `result` and the plan for its max rate (none at rate 0); a confirmation is noted."""
        if result.confirmation is not None:
            self.notes.append(f"whole-trace confirmation of {row.key}: {result.confirmation.describe()}")
        plan = None
        if result.max_rate > 0:
            kv = None if row.unit is None else float(row.unit.row["kv_tokens_per_instance"])
            p99 = None if row.unit is None else _metric(result, "kv_tokens_p99")
            plan = self.plan(result.max_rate, row.unit_gpus, row.gpu, p99, kv)
        return replace(row, result=result, plan=plan)

    def confirm(self, row: SizedRow) -> SizedRow:
        """`row` with its max rate confirmed on the whole trace (`confirm_max_rate`) and its plan redone."""
        assert row.whole_trace is not None
        self.say(f"confirming {row.key} on the whole trace")
        return self.sized(row, confirm_max_rate(row.whole_trace, row.result, self.params.search, self.executor))

    def plan(self, unit_rps: float, unit_gpus: int, gpu: GpuSpec, p99_tokens: float | None, kv_tokens: float | None) -> CapacityPlan:
        return plan_headroom(
            self.target, unit_rps, unit_gpus, gpu.gpus_per_node, gpu.usd_per_gpu_hour, self.params.headroom,
            arrival_s=self.arrivals_at_target, p99_active_tokens_per_instance=p99_tokens, kv_tokens_per_instance=kv_tokens,
        )  # fmt: skip

    def aggregated(self, rows: pd.DataFrame, incumbent: float) -> list[SizedRow]:
        """Branch and bound in rounds of `shortlist`: simulate candidates by analytic bound per GPU (the best
        of each parallel layout first) while their bound can still beat the best goodput per GPU found so
        far (`incumbent` seeds it, e.g. from the P/D search), up to `max_simulated`."""
        p = self.params
        units = [make_unit(self.model, r, self.lengths, p.slo, self.measured) for _, r in rows.iterrows()]
        for u in units:
            if u.unloaded_attainment < p.slo.attainment_target:
                self.notes.append(f"pruned {u.key}: even idle only {u.unloaded_attainment:.1%} of requests meet the SLOs")
        viable = sorted((u for u in units if u.unloaded_attainment >= p.slo.attainment_target), key=lambda u: (-u.bound_per_gpu, u.key))
        # Rounds take the best of each parallel layout first (GPU, TP, PP, EP), so variants of one layout
        # (KV dtype, chunk size) do not use up the budget before other layouts are tried.
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
            tasks = [self.search_task(u) for u in batch]
            results = search_candidates(tasks, self.executor)
            for u in batch:
                res = results[u.key]
                row = SizedRow(u.key, "aggregated", u.gpus, res, None, u.config, u.gpu, unit=u, whole_trace=self.evaluate(u).whole_trace())
                out.append(self.sized(row, res))
                if res.best is not None and res.max_rate > 0:
                    best = max(best, res.max_rate * res.best.mean_attainment / u.gpus)
        for u in bounded:
            self.notes.append(f"pruned {u.key}: analytic bound {u.bound_per_gpu:.3g} req/s per GPU ({u.bounds.binding}) cannot beat the best goodput found")
        for u in queue:
            self.notes.append(f"not simulated {u.key} (bound {u.bound_per_gpu:.3g} req/s per GPU): max_simulated {p.max_simulated} reached")
        return out

    def disaggregated(self, rows: pd.DataFrame) -> list[SizedRow]:
        """Per GPU type: the best prefill row (prefill bound/GPU) with the best decode row (decode bound/GPU)."""
        p = self.params
        pairs = []
        for gpu_name, group in rows.groupby("gpu", sort=True):
            units = [make_unit(self.model, r, self.lengths, p.slo, self.measured) for _, r in group.iterrows()]
            good = [u for u in units if u.unloaded_attainment >= p.slo.attainment_target]
            pre = [u for u in good if u.row["role"] == "prefill"]
            dec = [u for u in good if u.row["role"] == "decode"]
            if not pre or not dec:
                continue
            pu = max(pre, key=lambda u: (u.bounds.prefill_compute / u.gpus, u.key))
            du = max(dec, key=lambda u: (min(u.bounds.decode_bandwidth, u.bounds.kv) / u.gpus, u.key))
            g_p, g_d = pu.bounds.prefill_compute, min(du.bounds.decode_bandwidth, du.bounds.kv)
            per_gpu = 1.0 / (pu.gpus / g_p + du.gpus / g_d)  # req/s per GPU of a balanced pool
            pairs.append((-per_gpu, str(gpu_name), pu, du, g_p, g_d))
        out = []
        for _, _, pu, du, g_p, g_d in sorted(pairs, key=lambda x: (x[0], x[1]))[: p.pd_shortlist]:
            key = f"P[{pu.key}]+D[{du.key}]"
            self.say(f"disaggregated: searching P:D ratios of {key}")
            link = LinkConfig(bandwidth_bytes_s=pu.gpu.nic_bytes_s * pu.gpus, latency_s=p.pd_link_latency_s)
            factory = _PdFactory(self.trace, pu, du, link, p)
            confirm = replace(factory, whole_trace=True) if p.confirm_whole_trace == "all" else None
            ratios = pd_ratio_candidates(g_p, g_d, p.pd_max_decode)[: p.pd_ratios]
            best = search_pd_ratios(
                factory, ratios, pu.gpus, du.gpus, p.slo.attainment_target, p.search, (0.5 * g_p, 0.5 * g_d), self.executor, confirm
            )[0]
            ratio = (best.n_prefill, best.n_decode)
            whole = factory(*ratio).whole_trace()
            row = SizedRow(key, "disaggregated", best.gpus, best.result, None, du.config, pu.gpu, ratio, whole_trace=whole)
            out.append(self.sized(row, best.result))
        return out

    def choose(self, rows: list[SizedRow]) -> tuple[SizedRow, list[SizedRow]]:
        """The cheapest sized row; in mode "chosen" confirmed on the whole trace first, re-choosing while a
        confirmation steps the cheapest down (each row is confirmed at most once)."""

        def cost(r: SizedRow) -> tuple[float, float, str]:
            assert r.plan is not None
            return (r.plan.usd_per_hour, -r.result.max_rate / r.unit_gpus, r.key)

        while True:
            sized = [r for r in rows if r.plan is not None]
            if not sized:
                raise LlmcapError("no candidate meets the SLOs at any rate the search tried; relax the SLOs or add candidates")
            chosen = min(sized, key=cost)
            if self.params.confirm_whole_trace == "off" or chosen.result.confirmation is not None or chosen.whole_trace is None:
                break
            rows = [self.confirm(r) if r is chosen else r for r in rows]
        unconfirmed = [r.key for r in rows if r.result.confirmation is None and r.result.max_rate > 0]
        if unconfirmed:
            self.notes.append(f"max rates from excerpts only (not confirmed on the whole trace): {', '.join(unconfirmed)}")
        return chosen, rows

    def validate(self, row: SizedRow) -> SizedRow:
        """End-to-end check of an aggregated plan on the whole trace at the target rate; fix its base count."""
        assert row.unit is not None and row.plan is not None
        unit, p = row.unit, self.params
        n_ok, tried = validate_instances(
            lambda n: self.evaluate(unit, replicas=n, excerpt=self.trace.num_rows),
            row.plan.base_instances, self.target, p.slo.attainment_target, p.search.seeds[:1], p.validate_max_extra,
        )  # fmt: skip
        tried_txt = ", ".join(f"{n} → {a:.3f}" for n, a in tried)
        if n_ok is None:
            self.notes.append(
                f"end-to-end check of {row.key} at {self.target:.3g} req/s failed up to {tried[-1][0]} instances "
                f"(instances → attainment: {tried_txt}); the count shown is the linear estimate"
            )
            return row
        self.notes.append(f"end-to-end check of {row.key} on the whole trace at {self.target:.3g} req/s (instances → attainment): {tried_txt}")
        if n_ok == row.plan.base_instances:
            return row
        return replace(row, plan=replace(row.plan, base_instances=n_ok))


@dataclass(frozen=True)
class _PdFactory:
    """(n_P, n_D) → evaluate of that P/D unit (a class, not a closure, so it pickles to workers)."""

    trace: pa.Table
    prefill: Unit
    decode: Unit
    link: LinkConfig
    params: SizeParams
    whole_trace: bool = False  # evaluates that replay the whole trace (confirmation)

    def __call__(self, n_p: int, n_d: int) -> SimEvaluate:
        pd_cfg = PDConfig(prefill_replicas=n_p, decode_replicas=n_d, link=self.link, decode_engine=self.decode.engine)
        ev = unit_evaluate(self.trace, self.params, self.prefill, pd=pd_cfg, decode=self.decode)
        return ev.whole_trace() if self.whole_trace else ev


def _kv_usage(records_ts: pa.Table) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    out = {}
    for r in sorted(set(records_ts.column("replica").to_pylist())):
        part = records_ts.filter(pc.equal(records_ts["replica"], r))
        out[f"replica {r}"] = (part["t_s"].to_numpy(), part["kv_usage"].to_numpy())
    return out


def size_deployments(
    trace: pa.Table,
    candidates: pd.DataFrame,
    model: ModelSpec,
    params: SizeParams,
    executor: Executor | None = None,
    workload_id: str = "workload",
    progress: Callable[[str], None] | None = None,
    measured: MeasuredModels | None = None,
) -> SizingOutcome:
    """The capacity table, report and summary for `trace` over the feasible rows of `candidates`
    (`measured`: calibrated step models that replace the roofline for matching candidates)."""
    feasible = candidates[candidates["feasible"]]
    if feasible.empty:
        raise LlmcapError("no feasible candidate to size: every candidate was ruled out in step 2 (see its reasons)")
    sizer = _Sizer(trace, model, params, executor, progress or (lambda _msg: None), measured)
    rows: list[SizedRow] = []
    dis = feasible[feasible["mode"] == "disaggregated"]
    if params.pd_shortlist > 0 and not dis.empty:
        rows += sizer.disaggregated(dis)
    incumbent = max((r.result.max_rate * r.result.best.mean_attainment / r.unit_gpus for r in rows if r.result.best and r.result.max_rate > 0), default=0.0)
    if (feasible["mode"] == "aggregated").any():
        rows = sizer.aggregated(feasible[feasible["mode"] == "aggregated"], incumbent) + rows

    chosen, rows = sizer.choose(rows)
    if chosen.mode == "aggregated":
        checked = sizer.validate(chosen)
        rows = [checked if r is chosen else r for r in rows]
        chosen = checked
    assert chosen.plan is not None
    table = capacity_table([capacity_row(workload_id, r.key, r.mode, r.config, r.result, r.unit_gpus, r.plan, r.pd_ratio) for r in rows])

    records = kv_usage = None
    if chosen.unit is not None:  # the chosen point re-simulated for the report's CDFs and KV plot
        sim = sizer.evaluate(chosen.unit).simulate(chosen.result.max_rate, params.search.seeds[0])
        records, kv_usage = sim.records, _kv_usage(sim.timeseries)
    curves = {r.key: r.result for r in rows}
    report = CapacityReport(table, params.slo, curves, chosen.key, chosen.plan, records, kv_usage, notes=tuple(sizer.notes))
    plan = chosen.plan
    summary = {
        "target_rps": sizer.target,
        "chosen": chosen.key,
        "mode": chosen.mode,
        "pd_ratio": None if chosen.pd_ratio is None else f"{chosen.pd_ratio[0]}:{chosen.pd_ratio[1]}",
        "max_rps_per_unit": chosen.result.max_rate,
        "gpus_per_unit": chosen.unit_gpus,
        "base_instances": plan.base_instances,
        "instances": plan.total_instances,
        "gpus": plan.total_gpus,
        "usd_per_hour": plan.usd_per_hour,
        "headroom": {i.risk: {"instances": i.instances, "reasoning": i.reasoning} for i in plan.items},
        "candidates_feasible": len(feasible),
        "candidates_simulated": len(rows),
        "notes": list(sizer.notes),
    }
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
    """One shared pool (the plan already sized) against a pool per request class: prompts of at most
    `split_isl` tokens vs longer ones, each class sized on its own sub-trace at its share of the target
    rate with its own best configuration. Compared on base instances (headroom applies to either)."""
    isl = trace.column("isl").to_numpy()
    s = shared.summary
    usd_per_gpu = s["usd_per_hour"] / s["gpus"]
    pools_shared = [Pool("shared", s["target_rps"], s["max_rps_per_unit"], s["gpus_per_unit"], usd_per_gpu)]
    split = []
    for name, mask in ((f"ISL ≤ {split_isl:,}", isl <= split_isl), (f"ISL > {split_isl:,}", isl > split_isl)):
        n = int(mask.sum())
        if n < 2:
            raise LlmcapError(f"request-class split at ISL {split_isl:,} leaves {n} request(s) in class '{name}'")
        sub = trace.filter(pa.array(mask))
        rate = s["target_rps"] * n / trace.num_rows
        try:
            out = size_deployments(sub, candidates, model, params.model_copy(update={"target_rps": rate, "pools_split_isl": None}), executor, name, measured=measured)
        except LlmcapError as exc:
            raise LlmcapError(f"class '{name}' ({n:,} requests) alone: {exc}") from None
        o = out.summary
        split.append(Pool(f"{name}: {o['chosen']}", rate, o["max_rps_per_unit"], o["gpus_per_unit"], o["usd_per_hour"] / o["gpus"]))
    return compare_pools(pools_shared, split)
