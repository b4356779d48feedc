"""The capacity report's sections, each built by one function, rendered as Markdown and as one
self-contained HTML page (plots inline as base64 PNG, no script, nothing fetched).

Order: the header (model, trace, SLOs, code, step-time and price sources — loud when assumed), the answer
(GPUs per pool and configuration, cost, base vs headroom, how sure), then the evidence (ledger beside the
simulated count, scenarios, headroom per pool, the chosen deployment's latency and KV, the capacity table
with the binding SLO of each candidate, the search curves), notes, and the pruned / not-simulated
candidates collapsed at the end. Another section is one more entry in `BUILDERS` (its id -> its builder).
The header is built in `llmcap.report.capacity_header`; tables and figures are marked up by
`llmcap.report.capacity_markup`.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import TYPE_CHECKING

from llmcap.report import capacity_network as kv_network
from llmcap.report import capacity_plots as plots
from llmcap.report import replay_check
from llmcap.report.capacity_header import header
from llmcap.report.capacity_markup import Section, esc, figure, fmt, html_table, md_table, paragraphs
from llmcap.sizing.headroom import COMBINATION_RULE
from llmcap.sizing.outcome import routed_rates
from llmcap.sizing.slo import itl_name
from llmcap.sizing.table import pool_configurations

if TYPE_CHECKING:
    from llmcap.report.capacity import CapacityReport
    from llmcap.sizing.scenarios import FitResult


# ---------------------------------------------------------------- sections


# base: the bare count at the planning rate; the answer is the total (base + headroom), in instances, GPUs and $/h
_ANSWER_HEAD = [
    "pool",
    "configuration",
    "instances (total)",
    "base instances",
    "headroom instances",
    "GPUs (total)",
    "$/h (total)",
]


def _answer_rows(report: CapacityReport) -> list[list[str]]:
    configs, p = pool_configurations(report.chosen), report.plan
    rows = [
        [
            q.name,
            configs.get(q.name, report.chosen),
            str(q.instances),
            str(q.base_instances),
            f"+{q.instances - q.base_instances}",
            str(q.gpus),
            f"{q.usd_per_hour:,.2f}",
        ]
        for q in p.pools
    ]
    rows.append(
        [
            "total",
            "",
            str(p.total_instances),
            str(p.base_instances),
            f"+{p.total_instances - p.base_instances}",
            str(p.total_gpus),
            f"{p.usd_per_hour:,.2f}",
        ]
    )
    return rows


def _how_sure(report: CapacityReport) -> list[str]:
    lines = []
    if report.fit is not None:
        verdict = _scenarios_verdict(report.fit)
        failing = sum(m.failed is not None for m in report.fit.minimality)
        lines.append(
            f"Simulated on the whole trace: {verdict} ({len(report.fit.results)} scenarios); one instance fewer fails in "
            f"{failing} of {len(report.fit.minimality)} pools (minimality)."
        )
    else:
        lines.append("Scenarios were not simulated: the count is analytic.")
    if report.count_range:
        lines.append(f"Count range: {report.count_range[0]}.")
    if report.ledger is not None:
        lg = report.ledger
        lines.append(
            f"Analytic floor (100% busy, no SLO, no headroom) {lg.gpus} GPUs: the plan is {lg.ratio:.2f}× that ({'within' if lg.within else 'OUTSIDE'} the expected range)."
        )
    if report.sources is not None and report.sources.roofline:
        lines.append(
            "Step times are the roofline, not a measured profile of this engine: treat the count as an estimate until profiled."
        )
    return lines


def _scenarios_verdict(fit: FitResult) -> str:
    """Whether the plan's scenarios pass: a plan stopped by the cost limit may pass every one, only too dear."""
    if fit.ok:
        return "every scenario passes"
    if fit.failed is None:
        return f"every scenario passes, but only over the cost limit ${fit.limit_usd_per_hour:,.2f}/h"
    return "NOT every scenario passes"


def answer(report: CapacityReport) -> Section:
    p = report.plan
    failing = report.fit is not None and not report.fit.ok
    if failing:
        assert report.fit is not None
        failed = report.fit.failed
        why = (
            f"over the cost limit ${report.fit.limit_usd_per_hour:,.2f}/h"
            if failed is None
            else f"still fails {failed.describe()}"
        )
        head = (
            f"NO PLAN PASSES: no shape passed every scenario within its cost limit. The closest, {p.total_gpus} GPUs "
            f"(${p.usd_per_hour:,.2f}/h), {why}. Not an answer."
        )
    else:
        head = (
            f"{p.total_gpus} GPUs, ${p.usd_per_hour:,.2f}/h ({p.gpu_hours_per_day:,.0f} GPU-h/day) serve {p.target_rps:.4g} req/s "
            f"within the SLOs: {p.base_gpus} GPUs base + {p.total_gpus - p.base_gpus} GPUs headroom."
        )
    sure = _how_sure(report)
    md = f"**{head}**\n\n{md_table(_ANSWER_HEAD, _answer_rows(report))}\n\n" + "\n".join(f"- {s}" for s in sure)
    body = (
        f'<p class="answer{" loud" if failing else ""}">{html.escape(head)}</p>{html_table(_ANSWER_HEAD, _answer_rows(report))}<ul>'
        + "".join(f"<li>{html.escape(s)}</li>" for s in sure)
        + "</ul>"
    )
    return Section("The answer", md, body)


_LEDGER_HEAD = ["pool", "demand (busy GPUs)", "floor (whole instances)", "simulated plan", "plan ÷ floor"]


def ledger(report: CapacityReport) -> Section:
    lg = report.ledger
    if lg is None:
        return Section("Ledger beside the simulation", "Not computed.", "<p>Not computed.</p>")
    if lg.disaggregated:
        demand = {
            "prefill": f"prefill {lg.prefill_gpus:.3g}, transfer {lg.transfer_gpus:.3g}",
            "decode": f"decode {lg.decode_gpus:.3g}, KV {lg.kv_gpus:.3g}",
        }
    else:
        demand = {"instances": f"prefill {lg.prefill_gpus:.3g} + decode {lg.decode_gpus:.3g}, KV {lg.kv_gpus:.3g}"}
    rows = []
    for name, floor in lg.pool_floors().items():
        planned = next((q.gpus for q in report.plan.pools if q.name == name), None)
        rows.append(
            [name, demand[name], str(floor), fmt(planned), "–" if planned is None else f"{planned / floor:.2f}×"]
        )
    rows.append(["total", "", str(lg.gpus), str(lg.final_gpus), f"{lg.ratio:.2f}×"])
    note = lg.line() + "."
    return Section(
        "Ledger beside the simulation",
        f"{md_table(_LEDGER_HEAD, rows)}\n\n{note}",
        html_table(_LEDGER_HEAD, rows) + paragraphs([note]),
    )


_SCENARIO_HEAD = ["scenario", "serving", "attainment", "KV p99", "verdict", "why"]


def scenarios(report: CapacityReport) -> Section:
    fit = report.fit
    if fit is None:
        return Section(
            "Scenarios and minimality", "Scenarios were not simulated.", "<p>Scenarios were not simulated.</p>"
        )
    rows = []
    for r in fit.results:
        sc = r.scenario
        kv = "–" if r.kv_p99_share is None else f"{r.kv_p99_share:.0%}"
        rows.append(
            [
                sc.name,
                ", ".join(f"{k} {v}" for k, v in sc.serving),
                f"{r.attainment:.4f}",
                kv,
                "pass" if r.passed else "FAIL",
                sc.reasoning,
            ]
        )
    lines = [f"settled on the whole trace, {_finalist_role(report, f)}: {f}" for f in report.finalists]
    lines += [f"one instance fewer — {m.note}" for m in fit.minimality] + [f"fit: {h}" for h in fit.history]
    a = report.analytic or report.plan
    lines.append(
        f"analytic count {a.total_gpus} GPUs → simulated {report.plan.total_gpus} GPUs ({_answer_role(report)})"
    )
    md = md_table(_SCENARIO_HEAD, rows) + "\n\n" + "\n".join(f"- {s}" for s in lines)
    return Section("Scenarios and minimality", md, html_table(_SCENARIO_HEAD, rows) + paragraphs(lines))


def _finalist_role(report: CapacityReport, line: str) -> str:
    """Whether a settled shape's counts are the answer's (its line starts with its key) or another shape's."""
    return _answer_role(report) if line.startswith(f"{report.chosen}: ") else "not chosen"


def _answer_role(report: CapacityReport) -> str:
    return "the closest miss, not an answer" if report.fit is not None and not report.fit.ok else "the answer"


_HEADROOM_HEAD = ["pool", "risk", "req/s", "instances", "reasoning"]


def count_range(report: CapacityReport) -> Section:
    lines = list(report.count_range) or ["Not computed."]
    return Section("Count range", "\n".join(f"- {m}" for m in lines), paragraphs(lines))


def _headroom_rows(report: CapacityReport) -> list[list[str]]:
    rows: list[list[str]] = []
    for q in report.plan.pools:
        g = q.pool.per_instance_rps
        routed = ""
        if report.records is not None:  # what G estimates, as the plan's router split the replay
            r = routed_rates(report.records, q.name, q.instances)
            routed = f"; the router's split of the replay: mean {r['mean']:.4g}, busiest {r['busiest']:.4g} req/s"
        rows.append(
            [
                q.name,
                "base",
                f"{q.target_rps:.4g}",
                str(q.base_instances),
                f"ceil({q.target_rps:.4g} / {g:.4g}) at G = {g:.4g} req/s per instance (excerpt search){routed}",
            ]
        )
        rows += [[q.name, i.risk, f"+{i.rps:.4g}", f"+{i.instances}", i.reasoning] for i in q.items]
        extra = q.instances - q.base_instances - sum(i.instances for i in q.items)
        if extra:
            rows.append(
                [
                    q.name,
                    "simulation",
                    "",
                    f"{extra:+d}",
                    "the scenario fit and minimality check changed the analytic count",
                ]
            )
        rows.append(
            [
                q.name,
                "total",
                f"{q.instances * g:.4g}",
                str(q.instances),
                f"{q.combination()}; {q.gpus} GPUs, ${q.usd_per_hour:,.2f}/h",
            ]
        )
    return rows


def headroom(report: CapacityReport) -> Section:
    rows = _headroom_rows(report)
    rule = f"Combination: {COMBINATION_RULE}."
    body = (
        figure(plots.plot_headroom(report.plan), "GPUs per pool: base and headroom by risk")
        + html_table(_HEADROOM_HEAD, rows)
        + paragraphs([rule])
    )
    return Section("Headroom per pool", f"{md_table(_HEADROOM_HEAD, rows)}\n\n{rule}", body)


def latency(report: CapacityReport) -> Section:
    title = "Latency of the chosen deployment"
    if report.records is None or report.records.num_rows == 0:
        return Section(title, "Not simulated.", "<p>Not simulated.</p>")
    what = (
        f"CDFs of each request's TTFT and {plots.itl_shown(report.slo)[1]} replaying {report.replay}, each divided by the request's own target "
        "(TTFT's grows with the prompt when the SLO says so), so 1 (dashed) is every request's target; a statistic "
        "no per-request target bounds is in ms, unmarked."
    )
    return Section(
        title,
        what,
        paragraphs([what]) + figure(plots.plot_latency_cdfs(report.records, report.slo), "latency CDFs", panels=2),
    )


def kv_usage(report: CapacityReport) -> Section:
    title = "KV-cache usage over time"
    if not report.kv_usage:
        return Section(title, "Not simulated.", "<p>Not simulated.</p>")
    what = f"KV-cache usage (fraction of capacity) replaying {report.replay}."
    return Section(title, what, paragraphs([what]) + figure(plots.plot_kv_usage(report.kv_usage), "KV usage over time"))


_SHOWN = [
    ("candidate", "candidate (mode)"),
    ("pd_ratio", "P:D"),
    ("gpus_per_unit", "GPUs/unit"),
    ("max_rps", "max RPS"),
    ("attainment", "attain."),
    ("goodput_per_gpu", "goodput/GPU"),
    ("binding_slo", "binding SLO"),
    ("ttft_p90_ms", "TTFT p90"),
    ("ttft_p99_ms", "TTFT p99"),
    ("itl_p90_ms", itl_name("token_p90")),
    ("itl_p99_ms", itl_name("token_p99")),
    ("e2e_p99_ms", "E2E p99"),
    ("tokens_per_s", "tok/s"),
    ("mean_waiting", "waiting"),
    ("kv_usage_p99", "KV p99"),
    ("preemptions", "preempt."),
    ("network_payload_mb", "KV MB/req"),
    ("visible_wait_ms_p99", "handoff p99 ms"),
    ("instances", "instances"),
    ("gpus", "GPUs"),
    ("usd_per_hour", "$/h"),
    ("search_status", "search"),
]


def capacity_table(report: CapacityReport) -> Section:
    """Every simulated row, the chosen one first (highlighted); latencies in ms."""
    data = report.table.to_pylist()
    data.sort(key=lambda r: r["candidate"] != report.chosen)  # stable: the table's own order otherwise
    head = [h for _, h in _SHOWN]
    rows = [[f"{r['candidate']} ({r['mode']})", *(fmt(r[c]) for c, _ in _SHOWN[1:])] for r in data]
    chosen = 0 if data and data[0]["candidate"] == report.chosen else None
    what = "Each candidate at its max feasible rate (latencies in ms); the chosen configuration first. Binding SLO: the target most requests missed just above that rate."
    return Section(
        "Capacity table", f"{what}\n\n{md_table(head, rows)}", paragraphs([what]) + html_table(head, rows, chosen)
    )


def attainment(report: CapacityReport) -> Section:
    png = plots.plot_attainment(report.curves, report.slo.attainment_target)
    return Section("Attainment vs arrival rate", "", figure(png, "attainment vs arrival rate"))


def goodput(report: CapacityReport) -> Section:
    return Section("Goodput per GPU", "", figure(plots.plot_goodput_per_gpu(report.table), "goodput per GPU"))


_COLLAPSED = ("pruned ", "not simulated ")


def notes(report: CapacityReport) -> Section:
    kept = [n for n in report.notes if not n.startswith(_COLLAPSED)]
    return Section("Notes", "\n".join(f"- {n}" for n in kept) or "None.", paragraphs(kept) or "<p>None.</p>")


def replay(report: CapacityReport) -> Section:
    text = replay_check.CAPACITY_SECTION_TEXT  # the replay stage runs after this report: a pointer to its own
    return Section(replay_check.CAPACITY_SECTION_TITLE, text, paragraphs([text]))


def pruned(report: CapacityReport) -> Section:
    items = [n for n in report.notes if n.startswith(_COLLAPSED)]
    summary = f"{len(items)} candidates pruned or not simulated"
    lis = "".join(f"<li>{esc(n)}</li>" for n in items)
    md = f"<details><summary>{summary}</summary>\n\n" + "\n".join(f"- {n}" for n in items) + "\n\n</details>"
    return Section(
        "Pruned and not simulated", md, f"<details><summary>{html.escape(summary)}</summary><ul>{lis}</ul></details>"
    )


BUILDERS: dict[str, Callable[[CapacityReport], Section]] = {
    "provenance": header,
    "answer": answer,
    "ledger": ledger,
    "scenarios": scenarios,
    "count-range": count_range,
    "headroom": headroom,
    "latency-cdfs": latency,
    "kv-usage": kv_usage,
    "kv-network": kv_network.section,
    "capacity-table": capacity_table,
    "attainment": attainment,
    "goodput": goodput,
    "replay": replay,
    "notes": notes,
    "pruned": pruned,
}
SECTIONS = tuple(BUILDERS)  # the <section id=...> of each, in page order


def _title(report: CapacityReport) -> str:
    p = report.provenance
    return report.title if p is None else f"{report.title}: {p.model} on {p.trace}"


def render_markdown(report: CapacityReport) -> str:
    parts = [f"# {_title(report)}"]
    for s in (b(report) for b in BUILDERS.values()):
        parts += ["", f"## {s.title}", "", s.markdown] if s.markdown else []
    return "\n".join(parts) + "\n"


_CSS = (
    "body{font-family:sans-serif;margin:1.5em auto;max-width:1280px;padding:0 1em;line-height:1.35}"
    "table{border-collapse:collapse;font-size:11px;margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 5px;text-align:right;vertical-align:top}"
    "td:first-child,th:first-child,td:nth-child(2){text-align:left}tr.chosen td{background:#fff3bf;font-weight:bold}"
    "#headroom td:last-child,#scenarios td:last-child{text-align:left}#capacity-table table{font-size:10px}"
    "dl{display:grid;grid-template-columns:max-content auto;gap:.2em 1em;margin:0}dt{font-weight:bold}dd{margin:0}"
    ".loud{color:#a00;font-weight:bold}p.answer{font-size:1.4em;font-weight:bold;margin:.3em 0}"
    "figure{margin:.5em 0}img{max-width:100%;height:auto}h2{margin:1.2em 0 .3em;border-bottom:1px solid #ddd}"
)


def render_html(report: CapacityReport) -> str:
    """One self-contained page, one <section id=...> per `SECTIONS` entry, in that order."""
    body = "".join(
        f'<section id="{sid}"><h2>{html.escape(s.title)}</h2>{s.html}</section>\n'
        for sid, s in ((i, b(report)) for i, b in BUILDERS.items())
    )
    title = html.escape(_title(report))
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
        f"<style>{_CSS}</style></head>\n<body><h1>{title}</h1>\n{body}</body></html>\n"
    )
