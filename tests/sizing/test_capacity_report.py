"""Capacity table schema and order; parquet / Markdown / HTML writers are deterministic and complete."""

from __future__ import annotations

import re

import pyarrow.parquet as pq
import pytest
from capacity_fixture import CANDIDATES, SLO, report, searches, table_from

from llmcap.report.capacity import Provenance, Sources, render_html, render_markdown, write_report
from llmcap.report.capacity_sections import SECTIONS
from llmcap.sizing.placement import place
from llmcap.sizing.search import EvalResult, RatePoint, SearchResult
from llmcap.sizing.table import CAPACITY_SCHEMA, binding_slo, capacity_row, capacity_table


@pytest.fixture
def chosen_records(records):
    rows = [
        {"arrival_s": i * 0.1, "ttft_ms": 50 + 10 * i, "itl_ms": 10 + i, "itl_p99_ms": 20 + 2 * i} for i in range(40)
    ]
    rows[5]["status"] = "unfinished"
    return records(rows)


def test_table_schema_order_and_values():
    results = searches()
    t = table_from(results)
    assert t.schema == CAPACITY_SCHEMA
    # sorted by goodput per GPU, best first: thresholds per GPU 7/2 = 3.5, 3/1 = 3, 9/4 = 2.25
    assert t.column("candidate").to_pylist() == ["H100 TP2", "H100 TP1", "H100 TP4"]
    row = t.to_pylist()[0]
    res = results["H100 TP2"]
    assert row["max_rps"] == res.max_rate and row["gpus_per_unit"] == 2
    assert row["goodput_rps"] == pytest.approx(res.max_rate * res.best.mean_attainment)
    assert row["goodput_per_gpu"] == pytest.approx(row["goodput_rps"] / 2)
    # target 20 req/s: S = ceil(20 / λ*) must survive the larger of a node loss (TP2, 8-GPU nodes: placement rule)
    # and one surge step; nothing else is added
    base = int(-(-20 // res.max_rate))
    n = base + 1
    while n - max(place(n, 2, 8).lost(1), 1) < base:
        n += 1
    assert row["base_instances"] == base and row["instances"] == n and row["headroom_instances"] == n - base
    assert n - base == place(n, 2, 8).lost(1) > 1  # a node loss, not a surge step, binds here
    assert row["gpus"] == 2 * row["instances"] and row["usd_per_hour"] == pytest.approx(2.5 * row["gpus"])
    assert row["ttft_p50_ms"] is None  # the synthetic evaluate reports no latency metrics
    with pytest.raises(ValueError):
        capacity_table([row, row])


def test_metrics_are_means_over_seeds_at_the_knee():
    pts = (
        RatePoint(
            5.0,
            True,
            (0, 1),
            (
                EvalResult(1.0, {"ttft_p99_ms": 100.0, "kv_usage_p99": 0.5}),
                EvalResult(0.98, {"ttft_p99_ms": 140.0, "kv_usage_p99": 0.7}),
            ),
            "initial",
        ),
    )
    res = SearchResult(5.0, None, "at_max_rate", pts, (), 0.95)
    row = capacity_row("wl", "x", "aggregated", {}, res, gpus_per_unit=2, pd_ratio=(2, 1))
    assert row["ttft_p99_ms"] == pytest.approx(120.0) and row["kv_usage_p99"] == pytest.approx(0.6)
    assert row["attainment"] == pytest.approx(0.99) and row["goodput_per_gpu"] == pytest.approx(5 * 0.99 / 2)
    assert row["pd_ratio"] == "2:1" and row["instances"] is None


def test_outputs_are_byte_identical_for_identical_inputs(tmp_path, chosen_records):
    a = write_report(report(chosen_records), tmp_path / "a")
    b = write_report(report(chosen_records), tmp_path / "b")
    for fmt in ("parquet", "md", "html"):
        assert a[fmt].read_bytes() == b[fmt].read_bytes(), fmt
    assert pq.read_table(a["parquet"]).schema.remove_metadata() == CAPACITY_SCHEMA


def test_html_is_self_contained_with_every_section(chosen_records):
    rep = report(chosen_records)
    page = render_html(rep)
    for sid in SECTIONS:
        assert f'<section id="{sid}">' in page, sid
    assert len(re.findall(r'<img alt="[^"]+" src="data:image/png;base64,[A-Za-z0-9+/=]+">', page)) == 5
    assert "http" not in page and "<script" not in page  # nothing fetched from anywhere
    for key in CANDIDATES:
        assert key in page
    text = page.replace("<wbr>", "")  # break opportunities in long names
    for item in rep.plan.pools[0].items:
        assert item.reasoning.split(";")[0].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") in text
    # a different input changes the page (the plots really depend on the data)
    other = report(chosen_records.slice(0, 20))
    assert render_html(other) != page


def test_markdown_lists_rows_and_headroom(chosen_records):
    rep = report(chosen_records)
    md = render_markdown(rep)
    assert md.startswith("# Test plan\n")
    assert all(f"| {k} (aggregated) |" in md for k in CANDIDATES)
    p = rep.plan
    assert (
        f"**{p.total_gpus} GPUs, ${p.usd_per_hour:,.2f}/h" in md
        and f"{p.base_gpus} GPUs base + {p.total_gpus - p.base_gpus} GPUs headroom" in md
    )
    for risk in ("base", "traffic", "failure", "deployment", "memory", "control", "total"):
        assert f"| instances | {risk} |" in md
    assert "## Scenarios" in md and "Scenarios were not simulated." in md  # the fixture simulates none
    assert f"TTFT ≤ {SLO.ttft_ms:g} ms" in md


PROVENANCE = Provenance(
    model="Llama-3.1-70B",
    trace="data/raw/trace.jsonl",
    trace_sha256="ab" * 32,
    commit="0123456789abcdef" * 2 + "01234567",
    commit_date="2026-01-02T03:04:05+00:00",
)
SOURCES = Sources(
    step_model="roofline-fallback",
    prices=(("H100-SXM-80GB", 2.5, "assumption"),),
    calibrations=(("H100-SXM-80GB", "H100-SXM-80GB/roofline.yaml", "cd" * 32, ""),),
)


def test_header_names_the_inputs_and_is_loud_about_assumptions(chosen_records):
    from dataclasses import replace

    rep = replace(report(chosen_records), provenance=PROVENANCE, sources=SOURCES)
    page, md = render_html(rep).replace("<wbr>", ""), render_markdown(rep)
    assert md.startswith("# Test plan: Llama-3.1-70B on data/raw/trace.jsonl\n")
    for text in (
        "Llama-3.1-70B",
        "abababababababab",
        "0123456789ab",
        "2026-01-02T03:04:05+00:00",
        "attainment = qualified",
    ):
        assert text in page and text in md, text
    assert (
        page.count("<dd class=loud>") == 2
        and "ROOFLINE, NOT MEASURED on this engine" in page
        and "ASSUMED list prices" in page
    )
    # the roofline names the calibration it used, and is called uncalibrated only where it is
    assert (
        "efficiencies fitted to timed operations for H100-SXM-80GB (H100-SXM-80GB/roofline.yaml, sha256 cdcdcdcdcdcd)"
        in md
    )
    assert "uncalibrated" not in md
    bare = render_markdown(replace(rep, sources=replace(SOURCES, calibrations=(), uncalibrated=("H100-SXM-80GB",))))
    assert "documented default efficiencies, uncalibrated, for H100-SXM-80GB" in bare
    # the answer comes before any evidence
    assert (
        page.index('id="provenance"')
        < page.index('id="answer"')
        < page.index('id="ledger"')
        < page.index('id="capacity-table"')
    )
    measured = replace(SOURCES, step_model="profile", prices=(("H100-SXM-80GB", 2.0, "our contract"),))
    assert "<dd class=loud>" not in render_html(replace(rep, sources=measured))
    # the warnings come from the sources alone: a report without a provenance header still gives them
    alone = render_markdown(replace(rep, provenance=None))
    assert "- **Step times:** ⚠ ROOFLINE, NOT MEASURED" in alone and "- **Prices:** ⚠ ASSUMED list prices" in alone


def test_pruned_candidates_are_collapsed_at_the_end_and_the_chosen_row_leads(chosen_records):
    from dataclasses import replace

    notes = (
        "pruned X: even idle only 90.0% of requests meet the SLOs",
        "not simulated Y (bound 1 req/s per GPU): max_simulated 8 reached",
        "step times: roofline",
    )
    rep = replace(report(chosen_records), notes=notes)
    page = render_html(rep)
    details = page[page.index('<section id="pruned">') :]
    assert (
        "<details><summary>2 candidates pruned or not simulated</summary>" in details
        and "pruned X" in details
        and "not simulated Y" in details
    )
    assert "pruned X" not in page[: page.index('<section id="pruned">')]  # listed once, collapsed
    assert "step times: roofline" in page[page.index('<section id="notes">') : page.index('<section id="pruned">')]
    table = page[page.index('<section id="capacity-table">') :]
    assert table.index('<tr class="chosen">') < table.index("<tr><td>")  # the chosen row first, highlighted
    assert f'<tr class="chosen"><td>{rep.chosen} (aggregated)</td>' in table


def test_missing_replay_says_so_instead_of_an_empty_panel(chosen_records):
    from dataclasses import replace

    page = render_html(replace(report(chosen_records), records=None, kv_usage=None))
    for sid in ("latency-cdfs", "kv-usage"):
        sec = page[page.index(f'<section id="{sid}">') :]
        sec = sec[: sec.index("</section>")]
        assert "<p>Not simulated.</p>" in sec and "<img" not in sec


def test_binding_slo_names_the_target_most_missed_just_above_the_max_rate():
    def point(rate, feasible, ttft, itl, overload=""):
        return RatePoint(
            rate, feasible, (0,), (EvalResult(0.9, {"ttft_misses": ttft, "itl_misses": itl}, overload),), "bisect"
        )

    def result(above):
        return SearchResult(
            4.0,
            None if above is None else above.rate,
            "converged",
            (point(4.0, True, 0, 0), *(() if above is None else (above,)), point(9.0, False, 0, 50)),
            (),
            0.99,
        )

    assert binding_slo(result(point(5.0, False, 12, 3))) == "TTFT"
    assert binding_slo(result(point(5.0, False, 2, 30))) == "ITL/TPOT"
    assert binding_slo(result(point(5.0, False, 0, 0, "queue grows"))) == "overloaded"
    assert binding_slo(result(point(5.0, False, 0, 0))) == "other (E2E, queue or unfinished)"
    assert binding_slo(result(None)) == "none reached"
