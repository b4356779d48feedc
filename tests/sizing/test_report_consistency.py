"""A capacity report tells one story (issue 37, item 5): every GPU count, $/h, chosen configuration and verdict
it states is summary.json's, no section contradicts another, no base count passes for the answer, the
warnings `llmcap size --out` writes are the pipeline's, each request is plotted against its own target, and
"ITL" names one statistic. The checker (`report_consistency`) is shown to catch each planted contradiction."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from report_consistency import contradictions, html_contradictions
from typer.testing import CliRunner

from llmcap.cli import app
from llmcap.report.capacity_plots import latency_panels
from llmcap.report.replay_check import render_markdown as replay_markdown
from llmcap.sizing.params import SloParams
from llmcap.sizing.slo import itl_name
from tests.conftest import TRACES

# A real, small `llmcap size --out` run: H100 TP1 fp8 only, the scenarios and the count range simulated, a
# length-scaled TTFT target and the request-class comparison (the report's base-count figures).
ARGS = [
    "--model",
    "Llama-3.1-8B",
    "--gpu",
    "h100",
    "--tp",
    "1",
    "--weight-quant",
    "fp8",
    "--no-pd",
    "--slo-ttft-p99",
    "500",
    "--slo-ttft-per-1k-isl",
    "100",
    "--slo-itl-p99",
    "60",
    "--itl-stat",
    "p99",
    "--attainment",
    "0.95",
    "--shortlist",
    "1",
    "--excerpt",
    "200",
    "--pools-split-isl",
    "1024",
    "--target-rps",
    "60",
]

Report = tuple[str, str, dict[str, Any]]


def _size(tmp: Path, *extra: str, exit_code: int = 0) -> Report:
    trace = tmp / "azure_head.csv"  # 1,500 Azure conversation requests
    trace.write_text("\n".join(TRACES["azure_conv"].read_text().splitlines()[:1501]) + "\n")
    r = CliRunner().invoke(app, ["size", "--trace", str(trace), *ARGS, *extra, "--out", str(tmp / "out"), "--json"])
    assert r.exit_code == exit_code, r.output
    out = tmp / "out"
    return (
        (out / "capacity.md").read_text(),
        (out / "capacity.html").read_text(),
        json.loads((out / "summary.json").read_text()),
    )


@pytest.fixture(scope="module")
def sized(tmp_path_factory: pytest.TempPathFactory) -> Report:
    return _size(tmp_path_factory.mktemp("one-story"))


def test_every_figure_and_verdict_is_the_summarys(sized: Report) -> None:
    md, page, s = sized
    # the run reaches every kind of figure the checker reads: scenarios, request-class pools, a calibrated roofline
    assert (
        s["verdict"] == "passes"
        and s["scenarios"]
        and s["pools"]["shared"]
        and "H100-SXM-80GB" in s["roofline_calibrations"]
    )
    assert s["base_gpus"] < s["gpus"]  # headroom: a base count is another number than the answer
    assert contradictions(md, s) == []
    assert html_contradictions(page, md) == []


def test_a_plan_over_the_cost_limit_tells_one_story_too(tmp_path: Path) -> None:
    # every scenario passes, but only above the limit: the verdict fails, and no section says the plan passes
    md, page, s = _size(tmp_path, "--max-usd-per-hour", "0.5", exit_code=1)
    assert s["verdict"] == "fails" and s["scenarios"] and all("→ pass" in line for line in s["scenarios"])
    assert "every scenario passes, but only over the cost limit $0.50/h" in md and "NOT every scenario passes" not in md
    assert contradictions(md, s) == []
    assert html_contradictions(page, md) == []


def test_the_command_warns_as_the_pipeline_does(sized: Report) -> None:
    md, page, _ = sized
    step = _step_line(md)
    assert "⚠ ROOFLINE, NOT MEASURED on this engine" in step and "uncalibrated" not in step
    assert "efficiencies fitted to timed operations for H100-SXM-80GB (H100-SXM-80GB/roofline.yaml, sha256 " in step
    assert "- **Prices:** ⚠ ASSUMED list prices, not your contract: H100-SXM-80GB" in md
    assert page.count("<dd class=loud>") == 2


def _step_line(md: str) -> str:
    return next(line for line in md.splitlines() if line.startswith("- **Step times:**"))


def _answer_total(md: str, s: dict[str, Any]) -> str:
    row = "| total |  | {} | {} | +{} | {} |".format(
        s["instances"], s["base_instances"], s["instances"] - s["base_instances"], s["gpus"]
    )
    return md.replace(row, row.removesuffix(f" {s['gpus']} |") + f" {s['gpus'] + 2} |")


def _old_pools_line(md: str, s: dict[str, Any]) -> str:
    p = s["pools"]
    shared, split = sum(x["gpus"] for x in p["shared"]), sum(x["gpus"] for x in p["split"])
    usd = sum(x["usd_per_hour"] for x in p["shared"]), sum(x["usd_per_hour"] for x in p["split"])
    old = (
        f"- request-class pools: {p['cheaper']} pools are cheaper: ${p['saving_usd_per_hour']:,.2f}/h less than the other "
        f"(shared {shared} GPUs ${usd[0]:,.2f}/h, split {split} GPUs ${usd[1]:,.2f}/h)"
    )  # as the report said before: base counts unlabelled
    return re.sub(r"^- request-class pools: .*$", lambda _: old, md, count=1, flags=re.M)


# what is planted -> (the plant, what the checker must say about it)
PLANTED: dict[str, tuple[Callable[[str, dict[str, Any]], str], str]] = {
    "another GPU count in the headline": (
        lambda md, s: md.replace(f"**{s['gpus']} GPUs,", f"**{s['gpus'] + 1} GPUs,", 1),
        "headline",
    ),
    "another total in the answer table": (_answer_total, "answer table total"),
    "another chosen configuration": (
        lambda md, s: md.replace(f"| {s['chosen']} (aggregated) |", "| H100-SXM-80GB/other (aggregated) |", 1),
        "capacity table leads",
    ),
    "a failing verdict in the notes": (
        lambda md, s: md.replace("## Notes\n\n", "## Notes\n\n- NO PLAN PASSES at the planned rate\n", 1),
        "NO PLAN PASSES",
    ),
    "the request-class comparison's old wording": (_old_pools_line, "not stated as base counts"),
    "a base count unlabelled": (
        lambda md, s: md.replace("## Notes\n\n", f"## Notes\n\n- shared {s['base_gpus']} GPUs\n", 1),
        "unlabelled",
    ),
    "the roofline warning dropped": (lambda md, s: md.replace(_step_line(md) + "\n", ""), "lacks the step-time"),
    "'uncalibrated' beside a calibration": (
        lambda md, s: md.replace(_step_line(md), _step_line(md) + " (uncalibrated)"),
        "uncalibrated",
    ),
    "a FAIL scenario in a passing plan": (lambda md, s: re.sub(r"\| pass \|", "| FAIL |", md, count=1), "FAIL"),
}


@pytest.mark.parametrize("what", sorted(PLANTED))
def test_a_planted_contradiction_is_reported(sized: Report, what: str) -> None:
    md, _, s = sized
    plant, said = PLANTED[what]
    planted = plant(md, s)
    assert planted != md, "the plant did not take"
    found = contradictions(planted, s)
    assert any(said in f for f in found), found


def test_a_verdict_the_report_contradicts_is_reported(sized: Report) -> None:
    md, page, s = sized
    found = contradictions(md, s | {"verdict": "fails"})  # the same report read against a failing decision
    assert any("yet the report says 'within the SLOs'" in f for f in found), found
    other = page.replace(f"{s['gpus']} GPUs, $", f"{s['gpus'] + 1} GPUs, $", 1)
    assert other != page and any("HTML headline" in f for f in html_contradictions(other, md))


def test_each_request_is_plotted_against_its_own_ttft_target(records) -> None:
    slo = SloParams(ttft_ms=500, ttft_ms_per_1k_isl=100, itl_ms=50, itl_stat="p99")
    # 600 ms at a 2,000-token prompt meets its own 700 ms target; 520 ms at 100 tokens misses its 510 ms
    recs = records(
        [
            {"arrival_s": 0.0, "ttft_ms": 600, "isl": 2000, "itl_p99_ms": 40},
            {"arrival_s": 1.0, "ttft_ms": 520, "isl": 100, "itl_p99_ms": 60},
        ]
    )
    ttft, itl = latency_panels(recs, slo)
    assert ttft.own_target and ttft.values == pytest.approx(sorted([600 / 700, 520 / 510]))
    assert "TTFT ÷ the request's own target" in ttft.label and "500 ms + 100 ms per 1,000 prompt tokens" in ttft.label
    assert itl.own_target and itl.values == pytest.approx([40 / 50, 60 / 50]) and itl.label.startswith(itl_name("p99"))
    token = latency_panels(recs, slo.model_copy(update={"itl_stat": "token_p99"}))[
        1
    ]  # a token-level target bounds no request
    assert (
        not token.own_target
        and token.label == f"{itl_name('p99')} (ms)"
        and token.values == pytest.approx([40.0, 60.0])
    )
    assert np.all(np.diff(ttft.values) >= 0)


def test_itl_names_one_statistic_in_every_report(sized: Report) -> None:
    md, _, _ = sized
    assert f"{itl_name('p99')} ≤ 60 ms" in md  # the SLO the plan was judged by
    assert (
        f"| {itl_name('token_p90')} | {itl_name('token_p99')} |" in md
    )  # the capacity table's token-level percentiles
    assert not re.search(r"\bITL p\d+\b", md)  # no bare "ITL pNN" that could be either
    replay = replay_markdown(_replay_summary())
    assert f"{itl_name('mean')} in the per-bucket table" in replay and "| TPOT p50 meas/pred ms |" in replay
    assert "ITL" not in replay  # the replay check compares TPOT, and says so


def _replay_summary() -> dict[str, Any]:
    """The fields of a replay summary (llmcap.replaycheck) its report reads, one run and one bucket."""
    run = {
        "run": "1.0x",
        "excerpt_seed": 0,
        "rate_rps": 1.0,
        "predicted": {"attainment": 1.0},
        "measured": {
            "requests": 10,
            "status": {"ok": 10, "unfinished": 0, "rejected": 0},
            "attainment": 1.0,
            "send_lateness_ms": {"p99": 1.0, "max": 2.0},
            "valid": True,
        },
    }
    bucket = {"run": "1.0x", "isl_bucket": "0-1k", "osl_bucket": "0-256", "n_measured": 10, "n_predicted": 10}
    bucket |= {
        f"{m}_p{q}_{side}_ms": 1.0 for m in ("ttft", "itl") for q in (50, 90, 99) for side in ("measured", "predicted")
    }
    return {
        "unit": {"description": "H100 TP1", "mode": "aggregated", "rate_rps": 1.0, "rate_basis": "predicted"},
        "source": "digital-twin",
        "verdict": {"measured": {"text": "passes"}, "predicted": {"text": "passes"}},
        "requests_sent": 10,
        "runs": [run],
        "excerpt_requests": 10,
        "excerpt_seeds": [0],
        "attainment_target": 0.99,
        "dilation": 1.0,
        "valid": True,
        "warning": "",
        "itl_definition": "per-request mean inter-token gap (TPOT), percentiles over the bucket's ok requests",
        "buckets": [bucket],
    }
