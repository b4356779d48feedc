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
   Disaggregated rows are searched per role (`llmcap.sizing.pd_search`): each prefill row's and each decode
   row's own per-instance rate G_P / G_D, beside an ample other pool; every pairing (any GPU types,
   any prefill layout) is then sized pool by pool — no fixed P:D unit.
3. Size: each option's pools are sized from the planning rate with headroom per pool, in req/s, rounded
   once (`llmcap.sizing.headroom`), with cost: the analytic plan, which ranks the shapes.
4. Settle: the `final_shortlist` cheapest shapes by analytic plan are each simulated end to end on the whole
   trace at the planning rate in every scenario (node loss, rolling upgrade; `llmcap.sizing.scenarios`);
   instances are added per pool until all pass (up to the shape's cost limit, `max_cost_factor` ×
   its analytic $/h or `max_usd_per_hour`), and each pool is settled at its minimum (one fewer fails a
   scenario). The cheapest shape that passes is the answer; when none passes, the closest is shown with the
   verdict "fails" (the CLI and the stage exit non-zero). The four-ledger floor (`llmcap.sizing.ledger`) is
   reported beside it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from llmcap.catalog import ModelSpec
from llmcap.errors import LlmcapError
from llmcap.sim import SimResult
from llmcap.sizing.analytic import windowed_peak_rate
from llmcap.sizing.executor import Executor
from llmcap.sizing.headroom import COMBINATION_RULE, CapacityPlan
from llmcap.sizing.ledger import Ledger, four_ledgers
from llmcap.sizing.measured import MeasuredModels
from llmcap.sizing.network import Provisioning, provision
from llmcap.sizing.network import table_columns as network_columns
from llmcap.sizing.params import SizeParams
from llmcap.sizing.pd_search import disaggregated
from llmcap.sizing.pools import Pool, PoolComparison, compare_pools
from llmcap.sizing.scenarios import FitResult
from llmcap.sizing.search import SearchResult
from llmcap.sizing.simeval import handoff_metrics, ok_rows
from llmcap.sizing.sizer import Sizer
from llmcap.sizing.slo import deadlines, definitions
from llmcap.sizing.summary import FinalistSummary, PoolPlanSummary, SizingSummary
from llmcap.sizing.table import capacity_row, capacity_table, pairing_row, pool_configurations
from llmcap.sizing.uncertainty import CountRange
from llmcap.sizing.units import Lengths, RoleRow, SizedRow

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SizingEvidence:
    """What the report shows beside the table: each searched row's curve, the chosen plan before and after
    the scenario simulations, the four-ledger floor, and the planned deployment's replay."""

    curves: Mapping[str, SearchResult]
    chosen: str
    plan: CapacityPlan
    records: pa.Table  # per request (REQUEST_SCHEMA) of the replay described by `replay`
    kv_usage: Mapping[str, tuple[np.ndarray, np.ndarray]]  # series -> (times s, usage fraction)
    notes: tuple[str, ...]
    analytic: CapacityPlan
    fit: FitResult | None
    ledger: Ledger
    replay: str
    count_range: tuple[str, ...]
    finalists: tuple[str, ...] = ()  # each shape settled on the whole trace, a line each
    network: dict[str, Any] | None = (
        None  # P/D: the chosen plan's link provisioning and the replay's handoff percentiles
    )


@dataclass(frozen=True)
class SizingOutcome:
    table: pa.Table
    evidence: SizingEvidence
    summary: SizingSummary


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
        rate_rps,
        lengths.isl,
        lengths.osl,
        lengths.cached,
        prefill_tokens_s=pre.bounds.prefill_compute * float((lengths.isl - lengths.cached).mean()),
        prefill_gpus=pre.gpus,
        decode_tokens_s=dec.bounds.decode_bandwidth * float(lengths.osl.mean()),
        decode_gpus=dec.gpus,
        decode_step_s=dec.decode_step_s,
        kv_tokens_per_instance=float(dec.row["kv_tokens_per_instance"]),
        kv_bytes_per_token=dec.engine.kv_bytes_per_token,
        nic_bytes_s_per_gpu=pre.gpu.nic_bytes_s,
        disaggregated=row.decode is not None,
        final_gpus=plan.total_gpus,
    )


def _table_rows(
    workload_id: str,
    rows: Sequence[SizedRow],
    roles: Sequence[RoleRow],
    settled: Mapping[str, bool],
    provisioned: Callable[[SizedRow], Provisioning | None],
) -> list[dict[str, Any]]:
    out = [
        capacity_row(workload_id, r.key, r.mode, r.config, r.result, r.unit.gpus, r.plan, scenarios=settled.get(r.key))
        for r in rows
        if r.mode == "aggregated"
    ]
    out += [
        capacity_row(workload_id, r.unit.key, r.role, r.unit.config, r.result, r.unit.gpus * r.instances) for r in roles
    ]
    for r in rows:
        if r.mode == "disaggregated":
            assert r.pd_roles is not None
            pr, dr = r.pd_roles
            out.append(
                pairing_row(
                    workload_id,
                    r.key,
                    r.config,
                    (pr.result, pr.rate, pr.unit.gpus),
                    (dr.result, dr.rate, dr.unit.gpus),
                    r.plan,
                    settled.get(r.key),
                )
                | network_columns(provisioned(r))
            )
    return out


def _pool_summary(plan: CapacityPlan, chosen: str) -> dict[str, PoolPlanSummary]:
    configs = pool_configurations(chosen)
    return {
        q.name: {
            "configuration": configs.get(q.name, chosen),
            "per_instance_rps": q.pool.per_instance_rps,
            "gpus_per_instance": q.pool.gpus_per_instance,
            "base_instances": q.base_instances,
            "instances": q.instances,
            "gpus": q.gpus,
            "usd_per_hour": q.usd_per_hour,
            "headroom": {i.risk: {"rps": i.rps, "instances": i.instances, "reasoning": i.reasoning} for i in q.items},
            "placement": q.placement.describe(),
        }
        for q in plan.pools
    }


SHOWN_REASONS = 4  # distinct reasons named in the one-line error; the CLI lists every candidate's beside it


def no_feasible_candidate(candidates: pd.DataFrame) -> str:
    """The one-line error when step 2 ruled out every candidate: each distinct reason (of `reasons`, "; "-joined
    per row) with how many candidates it ruled out, commonest first — never a pointer to reasons not shown."""
    if candidates.empty:
        return "no feasible candidate to size: the candidates table has no rows"
    counts: dict[str, int] = {}
    for text in candidates["reasons"].fillna(""):
        for reason in dict.fromkeys(r.strip() for r in str(text).split("; ") if r.strip()):
            counts[reason] = counts.get(reason, 0) + 1
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    n = len(candidates)
    shown = "; ".join(f"{reason} ({k} of {n})" for reason, k in ranked[:SHOWN_REASONS])
    more = f"; and {len(ranked) - SHOWN_REASONS} more reason(s)" if len(ranked) > SHOWN_REASONS else ""
    return f"no feasible candidate to size: step 2 ruled out all {n} candidates: {shown or 'no reason recorded'}{more}"


PHASES = (
    "disaggregated pools",
    "aggregated candidates",
    "choice (whole-trace confirmation)",
    "scenarios (settling the shortlisted shapes)",
    "count range",
    "planned deployment replay",
)


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
        raise LlmcapError(no_feasible_candidate(candidates))
    phase = _phase_clock(on_phase)
    sizer = Sizer(trace, model, params, executor, progress or log.info, measured)
    choice = _settle(sizer, _searched_rows(sizer, feasible, phase), simulate_scenarios, phase)
    chosen, plan, fitted = choice.chosen, choice.plan, choice.fitted
    phase(4)
    spread = sizer.count_range(chosen, fitted.minimality) if fitted is not None and fitted.ok else None
    provisioned = _provisioning(sizer)
    table = capacity_table(_table_rows(workload_id, choice.rows, sizer.roles, choice.settled, provisioned))
    # the planned deployment replayed on the whole trace at the planning rate, for the report's CDFs and KV plot
    phase(5)
    sim = sizer.replay(chosen, plan)
    evidence = _evidence(sizer, choice, sim, spread, provisioned(chosen))
    summary = _summary(sizer, choice, sim, spread, evidence, len(feasible))
    phase(len(PHASES))
    return SizingOutcome(table, evidence, summary)


def _phase_clock(on_phase: Callable[[int, int, str], None] | None) -> Callable[[int], None]:
    """`phase(done)`: logs how long the phase before `done` took and tells `on_phase` which one starts."""
    began = [time.perf_counter()]

    def phase(done: int) -> None:
        now = time.perf_counter()
        if done > 0:
            log.info("sizing phase %d/%d (%s) took %.1f s", done, len(PHASES), PHASES[done - 1], now - began[0])
        began[0] = now
        if on_phase is not None:
            on_phase(done, len(PHASES), PHASES[done] if done < len(PHASES) else "done")

    return phase


def _searched_rows(sizer: Sizer, feasible: pd.DataFrame, phase: Callable[[int], None]) -> list[SizedRow]:
    """Phases 0 and 1: the disaggregated pairings, then the aggregated candidates (the pairings' best goodput per GPU
    is the incumbent their branch and bound must beat)."""
    rows: list[SizedRow] = []
    dis = feasible[feasible["mode"] == "disaggregated"]
    phase(0)
    if sizer.params.pd_prefill_shortlist > 0 and not dis.empty:
        rows += disaggregated(sizer, dis)
    incumbent = max((r.balanced_rps_per_gpu for r in rows), default=0.0)
    phase(1)
    if (feasible["mode"] == "aggregated").any():
        rows = sizer.aggregated(feasible[feasible["mode"] == "aggregated"], incumbent) + rows
    return rows


@dataclass(frozen=True)
class _Choice:
    """The chosen row among `rows` (their plans the fitted ones where settled) and how it was settled."""

    chosen: SizedRow
    rows: list[SizedRow]
    analytic: CapacityPlan  # the chosen shape's plan before the scenario simulations
    fitted: FitResult | None = None  # None: the scenarios were not simulated
    routers: dict[str, dict[str, Any]] = field(default_factory=dict)
    finalists: list[FinalistSummary] | None = None
    settled: dict[str, bool] = field(default_factory=dict)  # shape -> whether its fit passes

    @property
    def plan(self) -> CapacityPlan:
        assert self.chosen.plan is not None
        return self.chosen.plan


def _settle(sizer: Sizer, rows: list[SizedRow], simulate_scenarios: bool, phase: Callable[[int], None]) -> _Choice:
    """Phases 2 and 3: the cheapest row (confirmed on the whole trace), then the shortlisted shapes settled in every
    scenario (`Sizer.settle`) unless the scenarios are not simulated."""
    phase(2)
    chosen, rows = sizer.choose(rows)
    assert chosen.plan is not None
    phase(3)
    if not simulate_scenarios:
        return _Choice(chosen, rows, chosen.plan)
    outcome = sizer.settle(rows)
    fitted, finalists = outcome.chosen.fit, [f.describe() for f in outcome.finalists]
    fits = {f.row.key: f.fit for f in outcome.finalists}
    rows = [replace(r, plan=fits[r.key].plan) if r.key in fits else r for r in rows]
    chosen = next(r for r in rows if r.key == outcome.chosen.row.key)
    assert outcome.chosen.row.plan is not None
    if not fitted.ok:
        sizer.notes.append(
            f"NO PLAN PASSES: none of the {len(finalists)} shape(s) settled on the whole trace passed every scenario "
            f"within its cost limit; the closest is shown: {outcome.chosen.line()}"
        )
    settled = {key: f.ok for key, f in fits.items()}
    return _Choice(chosen, rows, outcome.chosen.row.plan, fitted, outcome.routers, finalists, settled)


def _provisioning(sizer: Sizer) -> Callable[[SizedRow], Provisioning | None]:
    """A row's P→D links (`llmcap.sizing.network`): bursts are the planning traffic's windowed peak."""
    params = sizer.params
    peak = windowed_peak_rate(sizer.scaled_arrivals, params.headroom.traffic_window_s) * sizer.planning / sizer.target
    mean_isl = float(sizer.lengths.isl.mean())

    def provisioned(row: SizedRow) -> Provisioning | None:
        return provision(row, mean_isl, peak, params.pd_network_overhead)

    return provisioned


def _evidence(
    sizer: Sizer, choice: _Choice, sim: SimResult, spread: CountRange | None, link: Provisioning | None
) -> SizingEvidence:
    """What the report shows beside the table, from the replay `sim` of the chosen plan (its prefix tiers noted)."""
    chosen, plan, fitted = choice.chosen, choice.plan, choice.fitted
    counts = " + ".join(f"{q.name} {q.instances}" for q in plan.pools)
    replay = f"the planned deployment ({counts} instances) on the whole trace ({sim.records.num_rows:,} requests) at {plan.planning_rps:.4g} req/s"
    curves = {r.key: r.result for r in choice.rows if r.mode == "aggregated"} | {
        f"{r.role}: {r.unit.key}": r.result for r in sizer.roles
    }
    network = (
        None
        if link is None
        else {"provisioning": link.as_dict(), "replay_handoff_ms": handoff_metrics(sim, ok_rows(sim.records))}
    )
    for t in sim.summary.get("prefix_tiers") or ():
        sizer.notes.append(
            f"prefix tier {t['tier']} ({replay}): {t['hit_ratio']:.1%} of prompt tokens loaded from it, "
            f"load {t['load_s']:,.1f} s, {t['lookups']:,} lookups {t['lookup_s']:,.1f} s, saved prefill ≈ "
            f"{t['saved_prefill_s']:,.1f} s: net {t['net_gain_s']:+,.1f} s"
        )
    return SizingEvidence(
        curves,
        chosen.key,
        plan,
        sim.records,
        _kv_usage(sim.timeseries),
        notes=tuple(sizer.notes),
        analytic=choice.analytic,
        fit=fitted,
        ledger=ledger_check(sizer.lengths, chosen, sizer.target, plan),
        replay=replay,
        count_range=() if spread is None else tuple(spread.lines()),
        finalists=tuple(f["line"] for f in choice.finalists or ()),
        network=network,
    )


def _summary(
    sizer: Sizer, choice: _Choice, sim: SimResult, spread: CountRange | None, evidence: SizingEvidence, feasible: int
) -> SizingSummary:
    """The sizing summary (`llmcap.sizing.summary`) of `choice`, `feasible` candidates in all."""
    chosen, plan, fitted, params, rows = choice.chosen, choice.plan, choice.fitted, sizer.params, choice.rows
    return {
        "verdict": "analytic" if fitted is None else "passes" if fitted.ok else "fails",
        "target_rps": sizer.target,
        "slo_definitions": definitions(params.slo, chosen.mode == "disaggregated", deadlines(sizer.trace)),
        "planning_rps": plan.planning_rps,
        "chosen": chosen.key,
        "mode": chosen.mode,
        "router": sizer.params.router,
        "admission_policy": params.admission_policy,
        "routers_compared": choice.routers or None,
        "pd_ratio": None
        if chosen.mode == "aggregated"
        else f"{plan.pool('prefill').instances}:{plan.pool('decode').instances}",
        "max_rps_per_unit": chosen.result.max_rate,
        "gpus_per_unit": chosen.gpus_per_unit,
        "base_instances": plan.base_instances,
        "base_gpus": plan.base_gpus,
        "instances": plan.total_instances,
        "gpus": plan.total_gpus,
        "usd_per_hour": plan.usd_per_hour,
        "pool_plans": _pool_summary(plan, chosen.key),
        "analytic_gpus": choice.analytic.total_gpus,
        "combination_rule": COMBINATION_RULE,
        "scenarios": None if fitted is None else [r.describe() for r in fitted.results],
        "scenarios_pass": None if fitted is None else fitted.ok,
        "finalists": choice.finalists,
        "minimality": None if fitted is None else [m.note for m in fitted.minimality],
        "fit_history": None if fitted is None else list(fitted.history),
        "count_range": None if spread is None else spread.as_dict(),
        "ledger": evidence.ledger.as_dict(),
        "prefix_tiers": sim.summary.get("prefix_tiers"),
        "network": evidence.network,
        "deployment": sizer.planned(chosen, plan).to_dict(),
        "candidates_feasible": feasible,
        "candidates_simulated": len(rows) - sum(r.mode == "disaggregated" for r in rows) + len(sizer.roles),
        "notes": list(sizer.notes),
    }


def class_pools(
    trace: pa.Table,
    candidates: pd.DataFrame,
    model: ModelSpec,
    params: SizeParams,
    shared: SizingOutcome,
    split_isl: int | None = None,
    executor: Executor | None = None,
    measured: MeasuredModels | None = None,
    split_cap: float | None = None,
) -> PoolComparison:
    """One shared deployment (the plan already sized) against one per request class (`request_classes`), each class
    sized on its own sub-trace at its share of the target rate with its own best configuration (P/D pools sized
    separately too). Compared on base GPUs (the bare counts at the mean rate; headroom applies to either, and
    per-class scenarios are not simulated)."""
    s = shared.summary
    pools_shared = [Pool("shared", s["target_rps"], s["base_gpus"], _base_usd(s))]
    split = []
    where, classes = request_classes(trace, split_isl, split_cap)
    for name, mask in classes:
        n = int(mask.sum())
        if n < 2:
            raise LlmcapError(f"request-class split at {where} leaves {n} request(s) in class '{name}'")
        sub = trace.filter(pa.array(mask))
        rate = s["target_rps"] * n / trace.num_rows
        update = {"target_rps": rate, "pools_split_isl": None, "pools_split_cap": None}
        try:
            out = size_deployments(
                sub,
                candidates,
                model,
                params.model_copy(update=update),
                executor,
                name,
                measured=measured,
                simulate_scenarios=False,
            )
        except LlmcapError as exc:
            raise LlmcapError(f"class '{name}' ({n:,} requests) alone: {exc}") from None
        o = out.summary
        split.append(Pool(f"{name}: {o['chosen']}", rate, o["base_gpus"], _base_usd(o)))
    return compare_pools(pools_shared, split)


def request_classes(
    trace: pa.Table, split_isl: int | None, split_cap: float | None
) -> tuple[str, list[tuple[str, np.ndarray]]]:
    """(where the split is, [(class name, its requests)]): prompts of at most `split_isl` tokens vs longer ones, or
    requests whose max_tokens exceeds `split_cap` × the median output vs the rest (no cap stated: the rest)."""
    if split_isl is not None:
        isl = trace.column("isl").to_numpy()
        return f"ISL {split_isl:,}", [
            (f"ISL ≤ {split_isl:,}", isl <= split_isl),
            (f"ISL > {split_isl:,}", isl > split_isl),
        ]
    if split_cap is None:
        raise LlmcapError("a request-class split needs pools_split_isl or pools_split_cap")
    bound = split_cap * float(np.median(trace.column("osl").to_numpy()))
    caps = trace.column("max_tokens").to_numpy(zero_copy_only=False).astype(np.float64)  # null: NaN, never above
    long_cap = np.nan_to_num(caps, nan=0.0) > bound
    return (
        f"max_tokens {split_cap:g}× the median OSL ({bound:,.0f})",
        [(f"max_tokens ≤ {bound:,.0f} or none", ~long_cap), (f"max_tokens > {bound:,.0f}", long_cap)],
    )


def _base_usd(summary: SizingSummary) -> float:
    """$/h of the base counts (each pool's base GPUs at its GPU's price)."""
    pools = summary["pool_plans"].values()
    return float(sum(q["usd_per_hour"] * q["base_instances"] / q["instances"] for q in pools))
