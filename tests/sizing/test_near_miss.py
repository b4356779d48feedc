"""When nothing meets the SLOs: the near misses, closest first, with the target that binds each."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from llmcap.cli import app
from llmcap.sizing.nearmiss import NoFeasiblePlan, idle_miss, near_miss, near_misses
from llmcap.sizing.params import SloParams
from llmcap.sizing.search import EvalResult, RatePoint, SearchResult
from tests.conftest import TRACES

SLO = SloParams(ttft_ms=500, itl_ms=50, attainment_target=0.99)


def _point(rate: float, attainments: list[float], **metrics_and_flags) -> RatePoint:
    overload = metrics_and_flags.pop("overload", "")
    results = tuple(EvalResult(a, dict(metrics_and_flags), overload=overload) for a in attainments)
    return RatePoint(rate, False, tuple(range(len(attainments))), results, "shrink")


def _result(*points: RatePoint) -> SearchResult:
    return SearchResult(0.0, points[0].rate, "infeasible", points, (), SLO.attainment_target)


def test_the_closest_rate_and_the_target_with_more_misses():
    res = _result(
        _point(
            4.0,
            [0.50, 0.60],
            ttft_p99_ms=4000.0,
            itl_p99_ms=30.0,
            ttft_misses=90.0,
            itl_misses=2.0,
            overload="TTFT trend 3.1",
        ),
        _point(1.0, [0.90, 0.94], ttft_p99_ms=900.0, itl_p99_ms=70.0, ttft_misses=3.0, itl_misses=40.0),
        _point(0.5, [0.92, 0.92], ttft_p99_ms=600.0, itl_p99_ms=65.0, ttft_misses=1.0, itl_misses=30.0),
    )
    m = near_miss("H100/fp8/tp1", res, SLO)
    assert m is not None
    # 0.92 mean attainment at both 1.0 and 0.5 req/s: the lower rate is not closer, the tie goes to the lower rate
    assert (m.rate_rps, m.attainment, m.binding) == (0.5, pytest.approx(0.92), "itl")
    assert (m.ttft_p99_ms, m.itl_p99_ms) == (600.0, 65.0)
    assert (
        "ITL binds (1 TTFT vs 30 ITL/TPOT misses" in m.reason
        and "ITL (token-level p99 of all gaps) 65.0 ms (target 50 ms for ITL (per-request p99 gap))" in m.reason
    )
    overloaded = near_miss("x", _result(_point(2.0, [0.8], ttft_p99_ms=1.0, overload="served/offered 0.7")), SLO)
    assert overloaded is not None and overloaded.binding == "overload" and "served/offered 0.7" in overloaded.reason
    assert near_miss("nothing", _result(RatePoint(1.0, False, (), (), "initial")), SLO) is None


def test_near_misses_sort_closest_first_and_carry_the_idle_ones():
    far = _result(_point(1.0, [0.5], ttft_misses=10.0))
    close = _result(_point(2.0, [0.97], itl_misses=10.0))
    idle = idle_miss("B200/tp8", 0.7, SLO)
    found = near_misses([("far", far), ("close", close)], SLO, [idle])
    assert [m.candidate for m in found] == ["close", "B200/tp8", "far"]
    assert found[1].binding == "idle" and found[1].line().startswith("B200/tp8: idle 70.0% of requests met every SLO")
    err = NoFeasiblePlan(found)
    assert str(err).startswith(NoFeasiblePlan.headline) and "nearest: close: at 2 req/s 97.0%" in str(err)


def test_size_with_unreachable_slos_reports_the_near_misses_and_exits_1(tmp_path, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)  # piped: the table's full width, headers unwrapped
    trace = tmp_path / "azure_head.csv"
    trace.write_text("\n".join(TRACES["azure_conv"].read_text().splitlines()[:301]) + "\n")
    args = [
        "size",
        "--trace",
        str(trace),
        "--model",
        "Llama-3.1-8B",
        "--gpu",
        "h100",
        "--tp",
        "1",
        "--tp",
        "2",
        "--weight-quant",
        "fp8",
        "--no-pd",
        "--goodput",
        "ttft:5",
        "--shortlist",
        "1",
        "--excerpt",
        "100",
        "--out",
        str(tmp_path / "out"),
    ]
    r = CliRunner().invoke(app, [*args, "--json"])
    assert r.exit_code == 1, r.output
    report = json.loads(r.stdout)
    assert report["feasible"] is False and report["error"] == NoFeasiblePlan.headline
    misses = report["near_misses"]
    # a 5 ms TTFT is out of reach of every H100 row even idle: all are ruled out unsimulated, each named
    assert misses and {m["binding"] for m in misses} == {"idle"} and all(m["attainment"] < 0.99 for m in misses)
    assert {m["candidate"].split("/")[0] for m in misses} == {"H100-SXM-80GB"}
    assert {"tp1pp1ep1", "tp2pp1ep1"} <= {m["candidate"].split("/")[3] for m in misses}
    assert [m["attainment"] for m in misses] == sorted((m["attainment"] for m in misses), reverse=True)
    assert json.loads((tmp_path / "out" / "near_misses.json").read_text()) == report
    table = CliRunner().invoke(app, args)
    assert (
        table.exit_code == 1
        and "the nearest misses" in table.stdout
        and "\nerror: no candidate meets the SLOs" in table.stderr
    )
    assert "ITL ms (token-level p99 of all gaps)" in table.stdout, (
        "the ITL column names its statistic, as the report does"
    )
