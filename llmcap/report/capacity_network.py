"""The capacity report's section on the two budgets a plan takes from outside the simulator: the KV tokens
per instance (the memory plan's, or what the engine stated: `llmcap.sizing.kvbudget`) and the P→D link
(provisioning per prefill instance and NIC, and the handoff's post / transfer / visible-wait percentiles:
`llmcap.sizing.network`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from llmcap.report.capacity_markup import Section, fmt, html_table, md_table, paragraphs
from llmcap.sizing.table import pool_configurations

if TYPE_CHECKING:
    from llmcap.report.capacity import CapacityReport

TITLE = "KV budget and P→D network"
_PARTS = (
    ("post (queue on the link)", "handoff_post"),
    ("transfer", "handoff_transfer"),
    ("visible wait", "visible_wait"),
)


def _count(v: Any) -> str:
    return "not stated" if v is None else f"{int(v):,}"


def kv_lines(report: CapacityReport) -> list[str]:
    """Per pool of the chosen plan: its KV tokens per instance by the memory plan, as the engine stated them, and the one used."""
    rows = report.table.to_pylist()
    out = []
    for pool, key in pool_configurations(report.chosen).items():
        mode = pool if pool in ("prefill", "decode") else "aggregated"
        row = next((r for r in rows if r["candidate"] == key and r["mode"] == mode), None)
        if row is None or row["kv_tokens_planned"] is None:
            continue
        planned, measured, used = row["kv_tokens_planned"], row["kv_tokens_measured"], row["kv_tokens_used"]
        source = "the engine's" if measured is not None and used == measured else "the memory plan's"
        out.append(
            f"{pool} ({key}): KV tokens per instance planned {_count(planned)}, measured {_count(measured)} → sized with {source} {_count(used)}"
        )
    return out


def handoff_rows(report: CapacityReport) -> list[list[str]]:
    """The handoff's parts, p50 / p99 ms: in the chosen pairing's prefill-role search (the table row) and in the planned deployment's replay."""
    row = next(
        (r for r in report.table.to_pylist() if r["candidate"] == report.chosen and r["mode"] == "disaggregated"), None
    )
    replay = (report.network or {}).get("replay_handoff_ms") or {}
    out = []
    for label, name in _PARTS:
        searched = "–" if row is None else f"{fmt(row[f'{name}_ms_p50'])} / {fmt(row[f'{name}_ms_p99'])}"
        replayed = f"{fmt(replay.get(f'{name}_ms_p50'))} / {fmt(replay.get(f'{name}_ms_p99'))}"
        out.append([label, searched, replayed])
    return out


def section(report: CapacityReport) -> Section:
    lines = kv_lines(report) or [
        "KV tokens per instance: the memory plan's (no engine stated a capacity for the chosen configuration)."
    ]
    provisioning = (report.network or {}).get("provisioning")
    if provisioning is None:
        lines.append("P→D network: not disaggregated, no KV handoff.")
        return Section(TITLE, "\n\n".join(lines), paragraphs(lines))
    lines.append(provisioning["line"])
    head = [
        "handoff part",
        "at G_P, p50 / p99 ms (prefill-role search)",
        f"planned deployment replay, p50 / p99 ms ({report.replay})",
    ]
    rows = handoff_rows(report)
    return Section(
        TITLE, "\n\n".join(lines) + "\n\n" + md_table(head, rows), paragraphs(lines) + html_table(head, rows)
    )
