"""The capacity report's header (`llmcap.report.capacity_sections`): what was planned — model, trace, SLOs with
their definitions, target, code — and the step-time and price sources, loud where the plan rests on a model or an
assumption."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

from llmcap.report.capacity_markup import Section, esc
from llmcap.sizing.slo import definitions, itl_name

if TYPE_CHECKING:
    from llmcap.report.capacity import CapacityReport, Sources


def slo_line(report: CapacityReport) -> str:
    """Each target with the definition it was judged by (`llmcap.sizing.slo.definitions`)."""
    disaggregated = any(q.name == "prefill" for q in report.plan.pools)
    names = {
        "ttft": "TTFT",
        "itl": itl_name(report.slo.itl_stat),
        "tpot": "TPOT",
        "e2el": "E2E",
        "queue": "queue",
        "attainment": "attainment",
    }
    return "; ".join(
        f"{names.get(k, k)} {v}" for k, v in definitions(report.slo, disaggregated).items()
    )  # a distribution target by its key


SLO_DEFINITION = (
    "a request qualifies only if it finishes and meets every target; attainment = qualified ÷ requests arriving "
    "in the steady window (after warm-up, before drain); rejected and unfinished requests count as misses"
)


def _header_items(report: CapacityReport) -> list[tuple[str, str, bool]]:
    """(label, text, loud) rows of the header."""
    p = report.provenance
    items = []
    if p is not None:
        items.append(("Model", p.model, False))
        items.append(("Trace", f"{p.trace} (canonical trace sha256 {p.trace_sha256[:16]}…)", False))
    items.append(("SLOs", f"{slo_line(report)} — {SLO_DEFINITION}", False))
    items.append(
        ("Target", f"{report.plan.target_rps:.4g} req/s (planning rate {report.plan.planning_rps:.4g} req/s)", False)
    )
    if p is not None:
        code = (
            "not a git checkout"
            if p.commit is None
            else f"commit {p.commit[:12]} of {p.commit_date} (the last change to the sizing code)"
        )
        items.append(("Code", code, False))
    if report.sources is not None:
        items += source_items(report.sources)
    return items


def _efficiencies(s: Sources) -> str:
    """The roofline's efficiencies per plan GPU: the shipped calibration's (named) or the documented defaults."""
    fitted = [
        f"{gpu} ({file}, sha256 {sha[:12]}{f'; defaults kept for {kept}' if kept else ''})"
        for gpu, file, sha, kept in s.calibrations
    ]
    parts = [f"efficiencies fitted to timed operations for {', '.join(fitted)}"] if fitted else []
    if s.uncalibrated:
        parts.append(f"documented default efficiencies, uncalibrated, for {', '.join(s.uncalibrated)}")
    return "; ".join(parts) or "documented default efficiencies"


def source_items(s: Sources) -> list[tuple[str, str, bool]]:
    """The header's step-time and price rows, loud where the plan rests on a model or an assumption: the one
    place these warnings are worded, whichever command wrote the report."""
    if s.roofline:
        step = f"ROOFLINE, NOT MEASURED on this engine ({s.step_model}): a datasheet model with {_efficiencies(s)} — the GPU counts carry that model's error"
    else:
        step = f"measured engine profile ({s.step_model})"
    prices = ", ".join(f"{gpu} ${usd:g}/GPU-h ({src})" for gpu, usd, src in s.prices) or "none"
    return [
        ("Step times", step + (f"; {s.step_model_detail}" if s.step_model_detail else ""), s.roofline),
        ("Prices", ("ASSUMED list prices, not your contract: " if s.assumed_prices else "") + prices, s.assumed_prices),
        *((f"Pool {pool}", text, False) for pool, text in s.pools),
    ]


def header(report: CapacityReport) -> Section:
    items = _header_items(report)
    md = "\n".join(f"- **{label}:** {'⚠ ' if loud else ''}{text}" for label, text, loud in items)
    rows = "".join(
        f"<dt>{html.escape(label)}</dt><dd{' class=loud' if loud else ''}>{esc(text)}</dd>"
        for label, text, loud in items
    )
    return Section("What was planned", md, f"<dl>{rows}</dl>")
