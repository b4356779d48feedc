"""The capacity report: what it shows (`CapacityReport`, assembled from a sizing outcome by
`capacity_report`), where the plan comes from (`Provenance`, `Sources`), and its parquet / Markdown / HTML writers.
The table itself is `llmcap.sizing.table`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
from numpy.typing import ArrayLike

from llmcap.report.capacity_sections import render_html, render_markdown
from llmcap.sizing.headroom import CapacityPlan
from llmcap.sizing.ledger import Ledger
from llmcap.sizing.outcome import SizingOutcome
from llmcap.sizing.params import SloParams
from llmcap.sizing.scenarios import FitResult
from llmcap.sizing.search import SearchResult
from llmcap.sizing.table import write_parquet


@dataclass(frozen=True)
class Provenance:
    """Where the plan comes from, for the report's header. `commit` / `commit_date` are the last commit that
    changed the sizing code (not the wall clock: the same commit, params and data give the same bytes).
    What timed the steps and priced the GPUs is `CapacityReport.sources` (the same for `llmcap size` and
    the size stage)."""

    model: str
    trace: str  # the trace as named in params (trace.file)
    trace_sha256: str  # of the canonical trace the sizing read
    commit: str | None = None
    commit_date: str | None = None


@dataclass(frozen=True)
class Sources:
    """What timed the steps and priced the GPUs of the plan: the header's two warnings (roofline step times,
    assumed prices) come from here, built once by `llmcap.planning.report_sources` for every caller."""

    step_model: str = "roofline"  # the step times' source: "profile…" (measured) or "roofline…"
    step_model_detail: str = ""
    prices: tuple[tuple[str, float, str], ...] = ()  # (GPU, $/GPU-h, source) of the GPUs in the plan
    # (GPU, file, sha256, knob groups kept at the defaults or "") of the plan GPUs' shipped roofline calibrations
    calibrations: tuple[tuple[str, str, str, str], ...] = ()
    uncalibrated: tuple[str, ...] = ()  # plan GPUs timed on the documented default efficiencies
    pools: tuple[tuple[str, str], ...] = ()  # (pool, what it is and what sized it: llmcap.planning.describe_provenance)

    @property
    def roofline(self) -> bool:
        return not self.step_model.startswith("profile")

    @property
    def assumed_prices(self) -> bool:
        return any(src.strip().lower() == "assumption" for _, _, src in self.prices)


@dataclass(frozen=True)
class CapacityReport:
    """Everything the report shows. `chosen` is a candidate key of `table`; `records` are the per-request
    records (REQUEST_SCHEMA) of the chosen deployment's replay, described by `replay`; `kv_usage` maps a
    series name -> (times s, usage fraction)."""

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
    replay: str = "the chosen configuration at its max feasible rate"  # what `records` / `kv_usage` replayed
    provenance: Provenance | None = None
    sources: Sources | None = None  # what timed the steps and priced the GPUs (None: not stated, no warnings to give)
    count_range: tuple[str, ...] = ()  # the count's range across seeds, in lines (`llmcap.sizing.uncertainty`)
    finalists: tuple[str, ...] = ()  # each shape settled on the whole trace, a line each (cheapest analytic plan first)
    network: Mapping[str, Any] | None = (
        None  # P/D: link provisioning and the replay's handoff percentiles (`SizingEvidence.network`)
    )


def capacity_report(
    outcome: SizingOutcome,
    slo: SloParams,
    notes: tuple[str, ...] = (),
    provenance: Provenance | None = None,
    sources: Sources | None = None,
) -> CapacityReport:
    """The report of a sizing outcome, `notes` before the sizing's own."""
    e = outcome.evidence
    return CapacityReport(
        outcome.table,
        slo,
        e.curves,
        e.chosen,
        e.plan,
        e.records,
        e.kv_usage,
        notes=notes + e.notes,
        analytic=e.analytic,
        fit=e.fit,
        ledger=e.ledger,
        replay=e.replay,
        provenance=provenance,
        sources=sources,
        count_range=e.count_range,
        finalists=e.finalists,
        network=e.network,
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
