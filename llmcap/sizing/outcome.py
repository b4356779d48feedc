"""What one sizing run hands back (`llmcap.sizing.plan`): the capacity table, the evidence the report shows beside
it and the summary, assembled from the chosen plan, its count range and its replay on the whole trace."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from llmcap.sim import SimResult
from llmcap.sizing.headroom import COMBINATION_RULE, CapacityPlan
from llmcap.sizing.ledger import Ledger, four_ledgers
from llmcap.sizing.network import Provisioning, provision
from llmcap.sizing.network import table_columns as network_columns
from llmcap.sizing.scenarios import FitResult
from llmcap.sizing.search import SearchResult
from llmcap.sizing.simeval import handoff_metrics, ok_rows
from llmcap.sizing.sizer import Sizer
from llmcap.sizing.slo import attainment, deadlines, definitions, with_deadlines
from llmcap.sizing.summary import FinalistSummary, PoolPlanSummary, SizingSummary
from llmcap.sizing.table import capacity_row, capacity_table, pairing_row, pool_configurations
from llmcap.sizing.uncertainty import CountRange
from llmcap.sizing.units import Lengths, RoleRow, SizedRow


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


def kv_usage(records_ts: pa.Table) -> dict[str, tuple[np.ndarray, np.ndarray]]:
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


def table_rows(
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


def routed_rates(records: pa.Table, pool: str, instances: int) -> dict[str, float]:
    """The share of a replay each of a pool's `instances` got from the router (req/s over the replay's arrival span):
    the mean and the busiest instance's. `pool`: "decode" counts decode instances, any other the prefill/serving ones
    (a request the engine rejected was routed nowhere)."""
    column = "decode_replica" if pool == "decode" else "prefill_replica"
    replica = records.column(column).to_numpy(zero_copy_only=False).astype(np.float64)
    arrival = records.column("arrival_s").to_numpy()
    span = float(arrival.max() - arrival.min()) if arrival.size > 1 else 0.0
    if span <= 0 or instances < 1:
        return {"mean": 0.0, "busiest": 0.0}
    counts = np.bincount(replica[~np.isnan(replica)].astype(np.int64), minlength=instances)
    return {"mean": float(counts.sum() / instances / span), "busiest": float(counts.max() / span)}


def pool_summary(plan: CapacityPlan, chosen: str, replay: pa.Table) -> dict[str, PoolPlanSummary]:
    """Each pool of `plan` as the summary lists it; `replay`: the planned deployment's whole-trace records."""
    configs = pool_configurations(chosen)
    return {
        q.name: {
            "configuration": configs.get(q.name, chosen),
            "per_instance_rps": q.pool.per_instance_rps,
            "routed_rps": routed_rates(replay, q.name, q.instances),
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


@dataclass(frozen=True)
class Choice:
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


def provisioning(sizer: Sizer) -> Callable[[SizedRow], Provisioning | None]:
    """A row's P→D links (`llmcap.sizing.network`): bursts are the planning traffic's windowed peak."""
    params = sizer.params
    peak = sizer.traffic.peak_rps(params.headroom.traffic_window_s)
    mean_isl = float(sizer.lengths.isl.mean())

    def provisioned(row: SizedRow) -> Provisioning | None:
        return provision(row, mean_isl, peak, params.pd_network_overhead)

    return provisioned


def evidence(
    sizer: Sizer, choice: Choice, sim: SimResult, spread: CountRange | None, link: Provisioning | None
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
    if not sizer.checked.whole:  # the checks saw a span: say how the plan fares on all of it
        held = attainment(with_deadlines(sim.records, sizer.trace), sizer.params.slo)
        sizer.notes.append(
            f"the whole-deployment checks replayed {sizer.checked.describe()}; {replay}: attainment {held:.4f} "
            f"(target {sizer.params.slo.attainment_target:g})"
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
        kv_usage(sim.timeseries),
        notes=tuple(sizer.notes),
        analytic=choice.analytic,
        fit=fitted,
        ledger=ledger_check(sizer.lengths, chosen, sizer.target, plan),
        replay=replay,
        count_range=() if spread is None else tuple(spread.lines()),
        finalists=tuple(f["line"] for f in choice.finalists or ()),
        network=network,
    )


def summary(
    sizer: Sizer, choice: Choice, sim: SimResult, spread: CountRange | None, shown: SizingEvidence, feasible: int
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
        "pool_plans": pool_summary(plan, chosen.key, sim.records),
        "analytic_gpus": choice.analytic.total_gpus,
        "combination_rule": COMBINATION_RULE,
        "scenarios": None if fitted is None else [r.describe() for r in fitted.results],
        "scenarios_pass": None if fitted is None else fitted.ok,
        "finalists": choice.finalists,
        "checked_traffic": sizer.checked.describe(),
        "minimality": None if fitted is None else [m.note for m in fitted.minimality],
        "fit_history": None if fitted is None else list(fitted.history),
        "count_range": None if spread is None else spread.as_dict(),
        "ledger": shown.ledger.as_dict(),
        "prefix_tiers": sim.summary.get("prefix_tiers"),
        "network": shown.network,
        "deployment": sizer.planned(chosen, plan).to_dict(),
        "candidates_feasible": feasible,
        "candidates_simulated": len(rows) - sum(r.mode == "disaggregated" for r in rows) + len(sizer.roles),
        "notes": list(sizer.notes),
    }


def sizing_outcome(
    workload_id: str, sizer: Sizer, choice: Choice, sim: SimResult, spread: CountRange | None, feasible: int
) -> SizingOutcome:
    """The table, evidence and summary of `choice` (its count range `spread`, its replay `sim`), `feasible` candidates
    in all."""
    provisioned = provisioning(sizer)
    table = capacity_table(table_rows(workload_id, choice.rows, sizer.roles, choice.settled, provisioned))
    shown = evidence(sizer, choice, sim, spread, provisioned(choice.chosen))
    return SizingOutcome(table, shown, summary(sizer, choice, sim, spread, shown, feasible))
