"""What `llmcap size` prints: the plan with its evidence, the closest miss, the candidates ruled out."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
from rich.table import Table

from llmcap.commands._common import dumps, out_console, print_csv, print_json
from llmcap.commands._size_sources import budget_lines
from llmcap.sizing.nearmiss import NoFeasiblePlan
from llmcap.sizing.plan import no_feasible_candidate
from llmcap.sizing.search import SearchResult
from llmcap.sizing.slo import itl_name
from llmcap.sizing.units import candidate_key


def print_near_miss(none: NoFeasiblePlan, output: str, out: Path | None) -> None:
    """Nothing met the SLOs: how close each candidate came, on stdout (and near_misses.json under --out)."""
    rows = [m.to_dict() for m in none.near_misses]
    report = {"feasible": False, "error": none.headline, "near_misses": rows}
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "near_misses.json").write_text(dumps(report, indent=2) + "\n", encoding="utf-8")
    if output == "json":
        print_json(report)
    elif output == "csv":
        print_csv(rows)
    else:
        t = Table(title="no candidate meets the SLOs: the nearest misses (closest first)")
        itl = itl_name("token_p99").replace("ITL (", "ITL ms (")  # the statistic the report's near-miss table names
        for col in ("candidate", "rate req/s", "met every SLO", "binds", "TTFT p99 ms", itl):
            t.add_column(col, overflow="fold")
        for m in none.near_misses:
            ms = lambda v: "–" if v is None else f"{v:,.1f}"  # noqa: E731
            t.add_row(
                m.candidate,
                "idle (unsimulated)" if m.binding == "idle" else f"{m.rate_rps:.4g}",
                f"{m.attainment:.1%} (target {m.attainment_target:.1%})",
                m.binding,
                ms(m.ttft_p99_ms),
                ms(m.itl_p99_ms),
            )
        out_console().print(t)
        for m in none.near_misses[:3]:
            print(f"  {m.line()}")
    print(f"error: {report['error']}", file=sys.stderr)


def print_ruled_out(candidates: pd.DataFrame, output: str) -> None:
    """Step 2 ruled out every candidate: each one with its reasons, on stdout (the error line follows on stderr)."""
    rows = [
        {
            "candidate": candidate_key(r),
            "mode": r["mode"],
            "role": r["role"],
            "reason_codes": r["reason_codes"],
            "reasons": r["reasons"],
        }
        for _, r in candidates.iterrows()
    ]
    if output == "json":
        print_json({"feasible": False, "error": no_feasible_candidate(candidates), "ruled_out": rows})
    elif output == "csv":
        print_csv(rows)
    else:
        t = Table(title=f"every candidate was ruled out before simulation ({len(rows)}): why")
        for col in ("candidate", "mode", "role", "reasons"):
            t.add_column(col, overflow="fold")
        for r in rows:
            t.add_row(r["candidate"], r["mode"], r["role"], r["reasons"])
        out_console().print(t)


def chosen_rows(rows: list[dict[str, Any]], chosen: str, mode: str) -> list[dict[str, Any]]:
    """The capacity table's rows with `chosen` first: true on the plan's row alone (a role row may share its key)."""
    return [{"chosen": r["candidate"] == chosen and r["mode"] == mode} | r for r in rows]


#: Why a row carries no rate, by search status (`llmcap.sizing.search`).
_NO_RATE = {
    "below_floor": "stopped",
    "infeasible": "no rate meets the SLOs",
    "max_evaluations": "no feasible rate found",
}


def max_rps_cell(row: Mapping[str, Any], curves: Mapping[str, SearchResult]) -> str:
    """The max RPS/unit cell: the rate, or `—` and why there is none (a 0 would read as a measured rate)."""
    if row["max_rps"] > 0:
        return f"{row['max_rps']:.3g}"
    status = row["search_status"]
    why = _NO_RATE.get(status, f"no rate ({status.replace('_', ' ')})")
    curve = curves.get(row["candidate"] if row["mode"] == "aggregated" else f"{row['mode']}: {row['candidate']}")
    if status == "below_floor" and curve is not None and curve.upper_rate is not None:
        why += f": fails at {curve.upper_rate:.3g} req/s, needed to beat the best"
    elif status == "below_floor":
        why += ": cannot beat the best"
    return f"— {why}"


NO_PLAN_PASSES = (
    "no plan passes every scenario within its cost limit (size.max_cost_factor / max_usd_per_hour): "
    "the counts shown are the closest miss, not an answer"
)


def print_plan(outcome, model_name: str, step_line: dict, serve, model: str, over: int, context: int) -> None:
    """The console answer: the table, the chosen plan (or the closest miss) with its evidence, the serve lines."""
    s = outcome.summary
    t = Table(title=f"{model_name}: capacity for {s['target_rps']:.3g} req/s")
    t.add_column("candidate", overflow="fold")  # a narrow terminal folds the name; it never cuts it to `…`
    for col in ("mode", "P:D", "max RPS/unit", "goodput/GPU", "GPUs", "$/h", "search", "scenarios"):
        t.add_column(col)
    for r in outcome.table.to_pylist():
        t.add_row(
            r["candidate"],
            r["mode"],
            r["pd_ratio"] or "–",
            max_rps_cell(r, outcome.report.curves),
            "–" if r["goodput_per_gpu"] is None else f"{r['goodput_per_gpu']:.3g}",
            "–" if r["gpus"] is None else str(r["gpus"]),
            "–" if r["usd_per_hour"] is None else f"{r['usd_per_hour']:,.0f}",
            r["search_status"],
            r["scenarios"] or "–",
        )
    out_console().print(t)
    if s["verdict"] == "fails":
        out_console().print(
            f"[bold red]NO PLAN PASSES[/]: closest miss {s['chosen']} ({s['mode']}): {s['gpus']} GPUs, ${s['usd_per_hour']:,.0f}/h "
            "still fails a scenario — not an answer",
            highlight=False,
        )
    else:
        print(f"chosen: {s['chosen']} ({s['mode']}): {s['gpus']} GPUs, ${s['usd_per_hour']:,.0f}/h")
    for name, definition in s["slo_definitions"].items():
        print(f"  SLO {name}: {definition}")
    if over:
        print(
            f"  {over:,} requests are longer than max_model_len {context:,}: rejected as the engine would, counted as SLO misses"
        )
    for pool, q in s["pool_plans"].items():
        print(
            f"  {pool}: {q['instances']} × {q['gpus_per_instance']} GPU (base {q['base_instances']}, G = {q['per_instance_rps']:.3g} req/s per instance "
            f"from excerpts; the router's split of the whole-trace replay: mean {q['routed_rps']['mean']:.3g}, busiest {q['routed_rps']['busiest']:.3g} req/s)"
        )
        for risk, h in q["headroom"].items():
            print(f"    +{h['instances']} {risk} (+{h['rps']:.3g} req/s): {h['reasoning']}")
    for f in s["finalists"] or []:
        print(f"  settled on the whole trace: {f['line']}")
    for line in s["scenarios"] or []:
        print(f"  scenario {line}")
    for line in s["minimality"] or []:
        print(f"  one fewer: {line}")
    for line in (s["count_range"] or {}).get("lines", []):
        print(f"  range: {line}")
    print(f"  {s['ledger']['line']}")
    for line in budget_lines(s):
        print(f"  {line}")
    print(f"  step times: {step_line['line']}")
    if serve and not Path(model).exists():
        print(f"  serve: {model} is llmcap's catalog name; give vllm serve your checkpoint's path or Hugging Face id")
    for c in serve:
        print(f"  serve ({c.pool}: {c.instances} × {c.gpus_per_instance} GPU): {c.shell}")
        for note in c.notes:
            print(f"    note: {note}")
