"""The replay check's report (step 5): the unit, the rate, attainment per run, the verdict and the per-bucket
table, as markdown and as one HTML page. Twin figures carry the twin warning at the top, never as a
measurement of a real engine."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from llmcap.sizing.slo import itl_name

# The capacity report is written by the size stage, before the replay runs: it points here.
CAPACITY_SECTION_TITLE = "Replay check (step 5)"
CAPACITY_SECTION_TEXT = (
    "The chosen unit is replayed at 0.8x / 1.0x / 1.2x (params replay.rate_scales) of its predicted max "
    "feasible rate by the replay stage, after this report: see ../replay/replay.html "
    "(data/reports/replay/: measured vs predicted per ISL x OSL bucket, attainment per run, verdict). "
    "Without replay.endpoint its figures come from the digital twin, not from a real engine."
)


def _f(v: Any, digits: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return str(v)


def _run_rows(s: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    head = [
        "run",
        "seed",
        "rate req/s",
        "requests",
        "drawn as",
        "measured ok/unfinished/rejected",
        "measured attainment",
        "predicted attainment",
        "send lateness p99 / max ms (wall)",
        "valid",
    ]
    rows = []
    for r in s["runs"]:
        m, p, st = r["measured"], r["predicted"], r["measured"]["status"]
        rows.append(
            [
                r["run"],
                str(r["excerpt_seed"]),
                _f(r["rate_rps"], 4),
                str(m["requests"]),
                str(r.get("traffic", "an excerpt stretched to the rate")),
                f"{st['ok']}/{st['unfinished']}/{st['rejected']}",
                _f(m["attainment"], 3),
                _f(p["attainment"], 3),
                f"{_f(m['send_lateness_ms']['p99'])} / {_f(m['send_lateness_ms']['max'])}",
                _f(m["valid"]),
            ]
        )
    return head, rows


# The bucket table's "itl" figures are each request's mean gap (llmcap.replaycheck.compare): TPOT, named as
# every report names it (llmcap.sizing.slo.itl_name), not the capacity report's ITL statistic.
TPOT = itl_name("mean")


def _bucket_rows(s: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    head = ["run", "ISL", "OSL", "n meas/pred"]
    for metric in ("TTFT", "TPOT"):
        head += [f"{metric} p{q} meas/pred ms" for q in (50, 90, 99)]
    rows = []
    for b in s["buckets"]:
        row = [b["run"], b["isl_bucket"], b["osl_bucket"], f"{b['n_measured']}/{b['n_predicted']}"]
        for metric in ("ttft", "itl"):
            row += [
                f"{_f(b[f'{metric}_p{q}_measured_ms'])} / {_f(b[f'{metric}_p{q}_predicted_ms'])}" for q in (50, 90, 99)
            ]
        rows.append(row)
    return head, rows


def _lines(s: dict[str, Any]) -> list[str]:
    u, v = s["unit"], s["verdict"]
    source = (
        "the DIGITAL TWIN (simulated, not a measurement)"
        if s["source"] == "digital-twin"
        else "the configured endpoint"
    )
    lines = [
        f"Unit: {u['description']} ({u['mode']}); the size stage's per-instance rate {u['rate_rps']:.4g} req/s ({u['rate_basis']}).",
        *(
            [
                f"Runs at {', '.join(f'{x:g}' for x in s['rate_scales'])} x {s['knee']['load']:.3g}x the planning rate "
                f"({s['rate_rps']:.4g} req/s to the unit at 1x): {s['knee']['basis']}."
            ]
            if "knee" in s
            else []
        ),
        f"Measured against {source}; {s['requests_sent']:,} requests sent in {len(s['runs'])} runs "
        f"({s['excerpt_requests']} at the lowest scale; seeds {s['excerpt_seeds']}), SLO attainment target "
        f"{s['attainment_target']:.0%}"
        + (", the runs replayed all at once, one twin each." if s.get("concurrent_runs") else "."),
        *([f"Traffic: {s['traffic']}."] if "traffic" in s else []),
        f"Verdict (measured): {v['measured']['text']}.",
        f"Verdict (predicted, same requests): {v['predicted']['text']}.",
    ]
    if s["dilation"] != 1.0:
        lines.append(
            f"The twin ran time-dilated ({s['dilation']:g} wall s per simulated s); measured times are in simulated seconds."
        )
    if not s["valid"]:
        lines.append(
            "INVALID: some sends ran later than replay.max_lateness_ms; those latencies measure the client, not the server."
        )
    lines.append(f"{TPOT} in the per-bucket table, across requests: {s['itl_definition']}.")
    return lines


def _md_row(cells: list[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def render_markdown(s: dict[str, Any]) -> str:
    out = ["# Replay check (step 5)", ""]
    if s["warning"]:
        out += [f"> **{s['warning']}**", ""]
    out += [*_lines(s), ""]
    for title, (head, rows) in (("Runs", _run_rows(s)), ("Per bucket: measured / predicted", _bucket_rows(s))):
        out += [f"## {title}", "", _md_row(head), _md_row(["---"] * len(head)), *(_md_row(r) for r in rows), ""]
    return "\n".join(out)


def _html_table(head: list[str], rows: list[list[str]]) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def render_html(s: dict[str, Any]) -> str:
    warn = (
        f'<p style="color:#b00;font-weight:bold;font-size:1.2em">{html.escape(s["warning"])}</p>'
        if s["warning"]
        else ""
    )
    body = warn + "".join(f"<p>{html.escape(line)}</p>" for line in _lines(s))
    body += (
        "<h2>Runs</h2>"
        + _html_table(*_run_rows(s))
        + "<h2>Per bucket: measured / predicted</h2>"
        + _html_table(*_bucket_rows(s))
    )
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>Replay check</title>'
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:12px}"
        "td,th{border:1px solid #ccc;padding:2px 6px}</style></head>\n"
        f"<body><h1>Replay check (step 5)</h1>\n{body}</body></html>\n"
    )


def write_replay_report(summary: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"md": out_dir / "replay.md", "html": out_dir / "replay.html"}
    paths["md"].write_text(render_markdown(summary), encoding="utf-8")
    paths["html"].write_text(render_html(summary), encoding="utf-8")
    return paths
