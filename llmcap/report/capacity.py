"""The capacity table (one row per (candidate, mode) result) and its parquet / Markdown / HTML writers.

Columns (`CAPACITY_SCHEMA`; units in the names: _rps req/s, _ms milliseconds, _mb megabytes):
- workload_id; candidate (unique key within the workload); mode: "aggregated" (one instance searched and
  sized), "prefill" / "decode" (one P/D role's pool of gpus_per_unit / gpus_per_instance instances, searched
  beside an ample other pool; not sized on its own), "disaggregated" (a prefill row + decode row pairing, sized pool by pool);
  gpu, weight_quant, kv_dtype, tp, pp, ep, dp, max_num_seqs, max_num_batched_tokens (the engine config;
  pairings: the decode pool's), gpus_per_instance, pd_ratio ("N_P:N_D" planned, pairings only);
  gpus_per_unit (GPUs of one instance; pairings: one prefill + one decode instance).
- search_status, max_rps (max feasible arrival rate of the unit), attainment (mean over seeds there),
  monotonicity_violations. Pairings: max_rps = what gpus_per_unit GPUs carry in pools balanced to the
  measured role rates, (g_P + g_D) / (g_P/G_P + g_D/G_D); attainment, status: the worse role's; metrics:
  TTFT from the prefill role's search, the rest from the decode role's.
- at max_rps, each the mean over seeds of the evaluate callable's `metrics` of the same name:
  ttft/itl/e2e _p50/_p90/_p99_ms, tokens_per_s (output), mean_active, mean_waiting, preemptions,
  kv_usage_p50 / kv_usage_p99 (fraction of KV capacity), network_payload_mb (mean per request),
  visible_wait_ms_p99 (P/D handoff). Missing metrics are null.
- goodput_rps = max_rps × attainment; goodput_per_gpu = goodput_rps / gpus_per_unit.
- sizing for target_rps: base_instances, headroom_instances, instances, gpus, gpu_hours_per_day,
  usd_per_hour, operational_margin (headroom ÷ base). Null when the row was not sized.
Rows are sorted by (workload_id, mode, goodput_per_gpu descending, candidate), so identical inputs give
identical bytes in every format.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from numpy.typing import ArrayLike

from llmcap.report import capacity_plots as plots
from llmcap.report import replay as replay_section
from llmcap.sizing.headroom import COMBINATION_RULE, CapacityPlan
from llmcap.sizing.ledger import Ledger
from llmcap.sizing.params import SloParams
from llmcap.sizing.scenarios import FitResult
from llmcap.sizing.search import SearchResult

_STR, _I64, _F64 = pa.string(), pa.int64(), pa.float64()

CONFIG_COLUMNS = [
    ("gpu", _STR), ("weight_quant", _STR), ("kv_dtype", _STR),
    ("tp", _I64), ("pp", _I64), ("ep", _I64), ("dp", _I64),
    ("max_num_seqs", _I64), ("max_num_batched_tokens", _I64), ("gpus_per_instance", _I64),
]  # fmt: skip
METRIC_COLUMNS = [
    *(f"{m}_p{q}_ms" for m in ("ttft", "itl", "e2e") for q in (50, 90, 99)),
    "tokens_per_s", "mean_active", "mean_waiting", "preemptions",
    "kv_usage_p50", "kv_usage_p99", "network_payload_mb", "visible_wait_ms_p99",
]  # fmt: skip
SIZING_COLUMNS = [
    ("target_rps", _F64), ("base_instances", _I64), ("headroom_instances", _I64), ("instances", _I64),
    ("gpus", _I64), ("gpu_hours_per_day", _F64), ("usd_per_hour", _F64), ("operational_margin", _F64),
]  # fmt: skip

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
        pa.field("goodput_rps", _F64),
        pa.field("goodput_per_gpu", _F64),
        *(pa.field(n, _F64) for n in METRIC_COLUMNS),
        *(pa.field(n, t) for n, t in SIZING_COLUMNS),
    ]
)


def capacity_row(
    workload_id: str,
    candidate: str,
    mode: str,
    config: Mapping[str, Any],
    result: SearchResult,
    gpus_per_unit: int,
    plan: CapacityPlan | None = None,
    pd_ratio: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """One table row from a candidate's search result (and its headroom plan, when sized)."""
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
        goodput_rps=goodput,
        goodput_per_gpu=None if goodput is None else goodput / gpus_per_unit,
    )
    for m in METRIC_COLUMNS:
        vals = [] if best is None else [r.metrics[m] for r in best.results if m in r.metrics]
        row[m] = float(np.mean(vals)) if vals else None
    row.update({n: None for n, _ in SIZING_COLUMNS})
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
        )
    return row


_STATUS_RANK = {"infeasible": 0, "max_evaluations": 1, "at_max_rate": 2, "converged": 3}


def pairing_row(
    workload_id: str,
    candidate: str,
    config: Mapping[str, Any],
    prefill: tuple[SearchResult, float, int],
    decode: tuple[SearchResult, float, int],
    plan: CapacityPlan | None,
) -> dict[str, Any]:
    """One P/D pairing's row from its two role searches — each (search, per-instance rate G, GPUs per
    instance) — and its per-pool plan (module docstring)."""
    (pre_res, g_p, prefill_gpus), (dec_res, g_d, decode_gpus) = prefill, decode
    gpus = prefill_gpus + decode_gpus
    rate = gpus / (prefill_gpus / g_p + decode_gpus / g_d) if g_p > 0 and g_d > 0 else 0.0
    row = capacity_row(workload_id, candidate, "disaggregated", config, dec_res, gpus, plan)
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
        goodput_rps=goodput,
        goodput_per_gpu=None if goodput is None else goodput / gpus,
        **{k: v for k, v in pre.items() if k.startswith("ttft_")},
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


# ---------------------------------------------------------------- Markdown / HTML


@dataclass(frozen=True)
class CapacityReport:
    """Everything the report shows. `chosen` is a candidate key of `table`; `records` are the per-request
    records (REQUEST_SCHEMA) at the chosen point; `kv_usage` maps replica name -> (times s, usage fraction)."""

    table: pa.Table
    slo: SloParams
    curves: Mapping[str, SearchResult]
    chosen: str
    plan: CapacityPlan
    records: pa.Table | None = None
    kv_usage: Mapping[str, tuple[ArrayLike, ArrayLike]] | None = None
    title: str = "Capacity plan"
    notes: tuple[str, ...] = field(default_factory=tuple)
    analytic: CapacityPlan | None = None  # the per-pool plan before the scenario simulations (default: `plan`)
    fit: FitResult | None = None  # the scenario simulations and minimality check of the chosen plan
    ledger: Ledger | None = None  # the four-ledger floor beside the simulated count


_SHOWN = [
    ("candidate", "candidate"), ("mode", "mode"), ("pd_ratio", "P:D"), ("gpus_per_unit", "GPUs/unit"),
    ("max_rps", "max RPS"), ("attainment", "attain."), ("goodput_per_gpu", "goodput/GPU"),
    ("ttft_p50_ms", "TTFT p50"), ("ttft_p99_ms", "TTFT p99"), ("itl_p50_ms", "ITL p50"), ("itl_p99_ms", "ITL p99"),
    ("e2e_p99_ms", "E2E p99"), ("tokens_per_s", "tok/s"), ("kv_usage_p99", "KV p99"), ("preemptions", "preempt."),
    ("instances", "instances"), ("gpus", "GPUs"), ("usd_per_hour", "$/h"), ("operational_margin", "margin"),
    ("search_status", "search"),
]  # fmt: skip


def _fmt(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1e4 else f"{v:,.0f}"
    return str(v)


def _table_cells(table: pa.Table) -> tuple[list[str], list[list[str]]]:
    cols = [c for c, _ in _SHOWN]
    data = table.select(cols).to_pylist()
    return [h for _, h in _SHOWN], [[_fmt(r[c]) for c in cols] for r in data]


def _chosen_row(report: CapacityReport) -> dict[str, Any]:
    rows = [r for r in report.table.to_pylist() if r["candidate"] == report.chosen]
    if not rows:
        raise ValueError(f"chosen candidate {report.chosen!r} is not in the capacity table")
    return rows[0]


def _slo_line(slo: SloParams) -> str:
    parts = []
    if slo.ttft_ms is not None:
        per_1k = f" + {slo.ttft_ms_per_1k_isl:g} ms per 1k prompt tokens" if slo.ttft_ms_per_1k_isl else ""
        parts.append(f"TTFT ≤ {slo.ttft_ms:g} ms{per_1k}")
    if slo.itl_ms is not None:
        parts.append(f"ITL ({slo.itl_stat} per request) ≤ {slo.itl_ms:g} ms")
    for name, label in (("tpot_ms", "TPOT"), ("e2e_ms", "E2E"), ("max_queue_ms", "queue")):
        if getattr(slo, name) is not None:
            parts.append(f"{label} ≤ {getattr(slo, name):g} ms")
    return f"every request must meet {', '.join(parts) or 'no per-request target'}; attainment ≥ {slo.attainment_target:g}"


def _summary_lines(report: CapacityReport) -> list[str]:
    r, p = _chosen_row(report), report.plan
    pools = " + ".join(f"{q.name} {q.instances} × {q.pool.gpus_per_instance} GPU (base {q.base_instances})" for q in p.pools)
    lines = [
        f"SLO: {_slo_line(report.slo)}.",
        f"Chosen: **{report.chosen}** ({r['mode']}) — goodput/GPU {_fmt(r['goodput_per_gpu'])}.",
        f"For {p.target_rps:g} req/s (planning rate {p.planning_rps:.4g}): {pools} = "
        f"**{p.total_instances} instances, {p.total_gpus} GPUs** (base {p.base_gpus}), {p.gpu_hours_per_day:,.0f} GPU-h/day, "
        f"${p.usd_per_hour:,.2f}/h.",
    ]
    if report.fit is not None:
        a = report.analytic or p
        verdict = "every scenario passes" if report.fit.ok else "NOT every scenario passes"
        lines.append(f"Scenarios simulated on the whole trace: {verdict}; analytic count {a.total_gpus} GPUs → simulated {p.total_gpus} GPUs.")
    if report.ledger is not None:
        lines.append(report.ledger.line() + ".")
    return lines + list(report.notes)


def _headroom_rows(plan: CapacityPlan) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for q in plan.pools:
        g = q.pool.per_instance_rps
        rows.append((q.name, "base", f"{q.target_rps:.4g}", str(q.base_instances), f"ceil({q.target_rps:.4g} / {g:.4g}) at G = {g:.4g} req/s per instance"))
        rows += [(q.name, i.risk, f"+{i.rps:.4g}", f"+{i.instances}", i.reasoning) for i in q.items]
        fit = q.instances - q.base_instances - sum(i.instances for i in q.items)
        if fit:
            rows.append((q.name, "simulation", "", f"{fit:+d}", "scenario fit and minimality check (below) changed the analytic count"))
        rows.append((q.name, "total", f"{q.instances * g:.4g}", str(q.instances), f"{q.combination()}; {q.gpus} GPUs, ${q.usd_per_hour:,.2f}/h"))
    rows.append(("all", "total", "", str(plan.total_instances), f"{plan.total_gpus} GPUs, ${plan.usd_per_hour:,.2f}/h; combination: {COMBINATION_RULE}"))
    return rows


_HEADROOM_HEAD = ["pool", "risk", "req/s", "instances", "reasoning"]
_SCENARIO_HEAD = ["scenario", "serving", "attainment", "KV p99", "verdict", "why"]


def _scenario_rows(fit: FitResult | None) -> list[tuple[str, ...]]:
    if fit is None:
        return []
    out: list[tuple[str, ...]] = []
    for r in fit.results:
        sc = r.scenario
        kv = "–" if r.kv_p99_share is None else f"{r.kv_p99_share:.0%}"
        out.append((sc.name, ", ".join(f"{k} {v}" for k, v in sc.serving), f"{r.attainment:.4f}", kv, "pass" if r.passed else "FAIL", sc.reasoning))
    return out


def _minimality_lines(fit: FitResult | None) -> list[str]:
    if fit is None:
        return ["Scenarios were not simulated."]
    lines = [f"one instance fewer — {m.note}" for m in fit.minimality]
    return lines + [f"fit: {h}" for h in fit.history]


def _md_row(cells: list[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def render_markdown(report: CapacityReport) -> str:
    head, rows = _table_cells(report.table)
    lines = [f"# {report.title}", "", *_summary_lines(report), "", "## Capacity table", "", _md_row(head), _md_row(["---"] * len(head))]
    lines += [_md_row(r) for r in rows]
    lines += ["", "## Headroom per pool", "", _md_row(_HEADROOM_HEAD), _md_row(["---"] * len(_HEADROOM_HEAD))]
    lines += [_md_row(list(r)) for r in _headroom_rows(report.plan)]
    lines += ["", "## Scenarios", "", _md_row(_SCENARIO_HEAD), _md_row(["---"] * len(_SCENARIO_HEAD))]
    lines += [_md_row(list(r)) for r in _scenario_rows(report.fit)]
    lines += ["", "## Minimality", "", *(f"- {m}" for m in _minimality_lines(report.fit))]
    lines += ["", f"## {replay_section.CAPACITY_SECTION_TITLE}", "", replay_section.CAPACITY_SECTION_TEXT]
    return "\n".join(lines) + "\n"


def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">'


def _html_table(head: list[str], rows: list[list[str]] | list[tuple[str, ...]]) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


SECTIONS = ("summary", "capacity-table", "attainment", "goodput", "latency-cdfs", "kv-usage", "headroom", "scenarios", "replay")

_CSS = (
    "body{font-family:sans-serif;margin:2em;max-width:1200px}table{border-collapse:collapse;font-size:12px}"
    "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}td:first-child,th:first-child{text-align:left}"
    "img{max-width:100%}"
)


def render_html(report: CapacityReport) -> str:
    """One self-contained HTML page (plots inline as base64 PNG), one <section id=...> per `SECTIONS` entry."""
    head, rows = _table_cells(report.table)
    summary = "".join(f"<p>{html.escape(s).replace('**', '')}</p>" for s in _summary_lines(report))
    parts = {
        "summary": ("Summary", summary),
        "capacity-table": ("Capacity table", _html_table(head, rows)),
        "attainment": ("Attainment vs arrival rate", _img(plots.plot_attainment(report.curves, report.slo.attainment_target), "attainment vs rate")),
        "goodput": ("Goodput per GPU", _img(plots.plot_goodput_per_gpu(report.table), "goodput per GPU")),
        "latency-cdfs": (f"TTFT / ITL at the chosen point ({report.chosen})", _img(plots.plot_latency_cdfs(report.records, report.slo), "latency CDFs")),
        "kv-usage": ("KV usage over time", _img(plots.plot_kv_usage(report.kv_usage), "KV usage")),
        "headroom": ("Headroom per pool", _img(plots.plot_headroom(report.plan), "headroom") + _html_table(_HEADROOM_HEAD, _headroom_rows(report.plan))),
        "scenarios": (
            "Scenarios and minimality",
            _html_table(_SCENARIO_HEAD, _scenario_rows(report.fit)) + "".join(f"<p>{html.escape(m)}</p>" for m in _minimality_lines(report.fit)),
        ),
        "replay": (replay_section.CAPACITY_SECTION_TITLE, f"<p>{html.escape(replay_section.CAPACITY_SECTION_TEXT)}</p>"),
    }
    body = "".join(f'<section id="{sid}"><h2>{html.escape(parts[sid][0])}</h2>{parts[sid][1]}</section>\n' for sid in SECTIONS)
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(report.title)}</title>'
        f"<style>{_CSS}</style></head>\n<body><h1>{html.escape(report.title)}</h1>\n{body}</body></html>\n"
    )


def write_report(report: CapacityReport, out_dir: str | Path, stem: str = "capacity") -> dict[str, Path]:
    """capacity.parquet, capacity.md and capacity.html into `out_dir`; returns the paths by format."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"parquet": write_parquet(report.table, out / f"{stem}.parquet")}
    for fmt, text in (("md", render_markdown(report)), ("html", render_html(report))):
        p = out / f"{stem}.{fmt}"
        p.write_text(text, encoding="utf-8")
        paths[fmt] = p
    return paths
