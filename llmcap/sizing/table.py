"""The capacity table: one row per (candidate, mode) result, its schema, its order and its parquet writer.

Columns (`CAPACITY_SCHEMA`; units in the names: _rps req/s, _ms milliseconds, _mb megabytes):
- workload_id; candidate (unique key within the workload); mode: "aggregated" (one instance searched and
  sized), "prefill" / "decode" (one P/D role's pool of gpus_per_unit / gpus_per_instance instances, searched
  beside an ample other pool; not sized on its own), "disaggregated" (a prefill row + decode row pairing, sized pool by pool);
  gpu, weight_quant, kv_dtype, tp, pp, ep, dp, max_num_seqs, max_num_batched_tokens, admission_policy (the
  engine config; pairings: the decode pool's), step_model (what timed its steps: the measured profile, or
  the roofline with its GPU's calibration file and sha256 or the default efficiencies), gpus_per_instance, pd_ratio ("N_P:N_D" planned, pairings only);
  gpus_per_unit (GPUs of one instance; pairings: one prefill + one decode instance).
- search_status, max_rps (max feasible arrival rate of the unit), attainment (mean over seeds there),
  monotonicity_violations, binding_slo (`binding_slo`: what stopped the rate from rising; pairings: per role).
  Pairings: max_rps = what gpus_per_unit GPUs carry in pools balanced to the
  measured role rates, (g_P + g_D) / (g_P/G_P + g_D/G_D); attainment, status: the worse role's; metrics:
  TTFT and the handoff from the prefill role's search (its instance's link carries G_P; TTFT includes the
  handoff), the rest from the decode role's.
- at max_rps, each the mean over seeds of the evaluate callable's `metrics` of the same name:
  ttft/itl/e2e _p50/_p90/_p99_ms, tokens_per_s (output), mean_active, mean_waiting, preemptions,
  kv_usage_p50 / kv_usage_p99 (fraction of KV capacity), network_payload_mb (mean per request),
  P/D handoff, p50 and p99: handoff_post_ms (prefill done → its KV starts on the prefill instance's link: the
  queue behind earlier handoffs), handoff_transfer_ms (on the link + its latency), visible_wait_ms (prefill done →
  decode admission: what the request waited). Missing metrics are null.
- kv_tokens_planned / kv_tokens_measured / kv_tokens_used: KV tokens per instance by the memory plan, as the engine
  stated them (a matching profile or engine log; null: none), and the one sizing used (`size.kv_budget`).
- pd_link_required_gbps, pd_link_gbps, pd_link_verdict (sized P/D pairings): what one prefill instance's handoffs need,
  max(burst, concurrent flows) × overhead, against its NICs, and "fits (N% of the link)" / "over by N%" (`llmcap.sizing.network`).
- goodput_rps = max_rps × attainment; goodput_per_gpu = goodput_rps / gpus_per_unit.
- sizing for target_rps: base_instances, headroom_instances, instances, gpus, gpu_hours_per_day,
  usd_per_hour, operational_margin (headroom ÷ base). Null when the row was not sized. scenarios: "pass" /
  "fail" where the counts were settled by simulating the whole trace in every scenario (`size.final_shortlist`;
  a failing row's counts are where its cost limit stopped the growth), null where they are the analytic plan.
Rows are sorted by (workload_id, mode, goodput_per_gpu descending, candidate), so identical inputs give
identical bytes in every format.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from llmcap.sizing.headroom import CapacityPlan
from llmcap.sizing.search import SearchResult

_STR, _I64, _F64 = pa.string(), pa.int64(), pa.float64()

CONFIG_COLUMNS = [
    ("gpu", _STR),
    ("weight_quant", _STR),
    ("kv_dtype", _STR),
    ("tp", _I64),
    ("pp", _I64),
    ("ep", _I64),
    ("dp", _I64),
    ("max_num_seqs", _I64),
    ("max_num_batched_tokens", _I64),
    ("gpus_per_instance", _I64),
    ("admission_policy", _STR),
    ("step_model", _STR),
    ("kv_tokens_planned", _I64),
    ("kv_tokens_measured", _I64),
    ("kv_tokens_used", _I64),
]
METRIC_COLUMNS = [
    *(f"{m}_p{q}_ms" for m in ("ttft", "itl", "e2e") for q in (50, 90, 99)),
    "tokens_per_s",
    "mean_active",
    "mean_waiting",
    "preemptions",
    "kv_usage_p50",
    "kv_usage_p99",
    "network_payload_mb",
    "visible_wait_ms_p99",
    "visible_wait_ms_p50",
    "handoff_post_ms_p50",
    "handoff_post_ms_p99",
    "handoff_transfer_ms_p50",
    "handoff_transfer_ms_p99",
]
HANDOFF_COLUMNS = tuple(m for m in METRIC_COLUMNS if m.startswith(("visible_wait_", "handoff_")))
NETWORK_COLUMNS = [
    ("pd_link_required_gbps", _F64),
    ("pd_link_gbps", _F64),
    ("pd_link_verdict", _STR),
]  # P/D pairings (llmcap.sizing.network)
SIZING_COLUMNS = [
    ("target_rps", _F64),
    ("base_instances", _I64),
    ("headroom_instances", _I64),
    ("instances", _I64),
    ("gpus", _I64),
    ("gpu_hours_per_day", _F64),
    ("usd_per_hour", _F64),
    ("operational_margin", _F64),
    ("scenarios", _STR),
]

CAPACITY_SCHEMA = pa.schema(
    [
        pa.field("workload_id", _STR, nullable=False),
        pa.field("candidate", _STR, nullable=False),
        pa.field("mode", _STR, nullable=False),
        *(pa.field(n, t) for n, t in CONFIG_COLUMNS),
        pa.field("pd_ratio", _STR),
        pa.field("gpus_per_unit", _I64, nullable=False),
        pa.field("search_status", _STR, nullable=False),
        pa.field("max_rps", _F64, nullable=False),
        pa.field("attainment", _F64),
        pa.field("monotonicity_violations", _I64, nullable=False),
        pa.field("binding_slo", _STR),
        pa.field("goodput_rps", _F64),
        pa.field("goodput_per_gpu", _F64),
        *(pa.field(n, _F64) for n in METRIC_COLUMNS),
        *(pa.field(n, t) for n, t in SIZING_COLUMNS),
        *(pa.field(n, t) for n, t in NETWORK_COLUMNS),
    ]
)


def binding_slo(result: SearchResult) -> str:
    """The SLO that binds: the one most requests missed at the lowest infeasible rate the search tried
    (summed over its seeds), with "overloaded" when that run's queue kept growing."""
    above = None
    if result.upper_rate is not None:
        confirmed = () if result.confirmation is None else result.confirmation.points
        above = next((p for p in (*confirmed, *result.points) if p.rate == result.upper_rate and not p.feasible), None)
    if above is None:
        return "none reached"
    ttft = sum(r.metrics.get("ttft_misses", 0.0) for r in above.results)
    itl = sum(r.metrics.get("itl_misses", 0.0) for r in above.results)
    name = "TTFT" if ttft > 0 and ttft >= itl else "ITL/TPOT" if itl > 0 else ""
    overloaded = any(not r.stable for r in above.results)
    if overloaded:
        return f"{name}, overloaded" if name else "overloaded"
    return name or "other (E2E, queue or unfinished)"


def capacity_row(
    workload_id: str,
    candidate: str,
    mode: str,
    config: Mapping[str, Any],
    result: SearchResult,
    gpus_per_unit: int,
    plan: CapacityPlan | None = None,
    pd_ratio: tuple[int, int] | None = None,
    scenarios: bool | None = None,
) -> dict[str, Any]:
    """One table row from a candidate's search result (and its headroom plan, when sized; `scenarios`: whether
    that plan passed its whole-trace scenarios, None where it is the analytic plan)."""
    best = result.best
    att = best.mean_attainment if best is not None else None
    row: dict[str, Any] = {"workload_id": workload_id, "candidate": candidate, "mode": mode}
    row.update({n: config.get(n) for n, _ in CONFIG_COLUMNS})
    goodput = None if att is None else result.max_rate * att
    row.update(
        pd_ratio=None if pd_ratio is None else f"{pd_ratio[0]}:{pd_ratio[1]}",
        gpus_per_unit=gpus_per_unit,
        search_status=result.status,
        max_rps=result.max_rate,
        attainment=att,
        monotonicity_violations=len(result.violations),
        binding_slo=binding_slo(result),
        goodput_rps=goodput,
        goodput_per_gpu=None if goodput is None else goodput / gpus_per_unit,
    )
    for m in METRIC_COLUMNS:
        vals = [] if best is None else [r.metrics[m] for r in best.results if m in r.metrics]
        row[m] = float(np.mean(vals)) if vals else None
    row.update({n: None for n, _ in (*SIZING_COLUMNS, *NETWORK_COLUMNS)})
    if plan is not None:
        row.update(
            target_rps=plan.rate_rps,
            base_instances=plan.base_instances,
            headroom_instances=plan.total_instances - plan.base_instances,
            instances=plan.total_instances,
            gpus=plan.total_gpus,
            gpu_hours_per_day=plan.gpu_hours_per_day,
            usd_per_hour=plan.usd_per_hour,
            operational_margin=plan.operational_margin,
            scenarios=None if scenarios is None else ("pass" if scenarios else "fail"),
        )
    return row


_STATUS_RANK = {"below_floor": 0, "infeasible": 0, "max_evaluations": 1, "at_max_rate": 2, "converged": 3}


def pairing_row(
    workload_id: str,
    candidate: str,
    config: Mapping[str, Any],
    prefill: tuple[SearchResult, float, int],
    decode: tuple[SearchResult, float, int],
    plan: CapacityPlan | None,
    scenarios: bool | None = None,
) -> dict[str, Any]:
    """One P/D pairing's row from its two role searches — each (search, per-instance rate G, GPUs per
    instance) — and its per-pool plan (module docstring)."""
    (pre_res, g_p, prefill_gpus), (dec_res, g_d, decode_gpus) = prefill, decode
    gpus = prefill_gpus + decode_gpus
    rate = gpus / (prefill_gpus / g_p + decode_gpus / g_d) if g_p > 0 and g_d > 0 else 0.0
    row = capacity_row(workload_id, candidate, "disaggregated", config, dec_res, gpus, plan, scenarios=scenarios)
    pre = capacity_row(workload_id, candidate, "disaggregated", config, pre_res, gpus)
    atts = [a for a in (pre["attainment"], row["attainment"]) if a is not None]
    att = min(atts) if len(atts) == 2 else None
    goodput = None if att is None else rate * att
    row.update(
        pd_ratio=None if plan is None else f"{plan.pool('prefill').instances}:{plan.pool('decode').instances}",
        search_status=min((pre_res.status, dec_res.status), key=lambda st: _STATUS_RANK[st]),
        max_rps=rate,
        attainment=att,
        monotonicity_violations=len(pre_res.violations) + len(dec_res.violations),
        binding_slo=f"prefill: {binding_slo(pre_res)}; decode: {binding_slo(dec_res)}",
        goodput_rps=goodput,
        goodput_per_gpu=None if goodput is None else goodput / gpus,
        **{k: v for k, v in pre.items() if k.startswith("ttft_") or k in HANDOFF_COLUMNS},
    )
    return row


def _sort_key(r: Mapping[str, Any]) -> tuple[Any, ...]:
    g = r["goodput_per_gpu"]
    return (r["workload_id"], r["mode"], -(g if g is not None else -math.inf), r["candidate"])


def capacity_table(rows: list[dict[str, Any]]) -> pa.Table:
    """Rows → a CAPACITY_SCHEMA table in the documented order; duplicate (workload, candidate, mode) is an error."""
    keys = [(r["workload_id"], r["candidate"], r["mode"]) for r in rows]
    if len(set(keys)) != len(keys):
        raise ValueError("capacity rows must be unique per (workload_id, candidate, mode)")
    return pa.Table.from_pylist(sorted(rows, key=_sort_key), schema=CAPACITY_SCHEMA)


def write_parquet(table: pa.Table, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table.cast(CAPACITY_SCHEMA), path, compression="zstd")
    return path


def pool_configurations(chosen: str) -> dict[str, str]:
    """Pool name -> configuration key: "P[a]+D[b]" gives prefill a and decode b; anything else one pool."""
    m = re.fullmatch(r"P\[(.+)\]\+D\[(.+)\]", chosen)
    return {"prefill": m.group(1), "decode": m.group(2)} if m else {"instances": chosen}
