"""`llmcap simulate --plan summary.json` judges the plan's availability target (`llmcap.sizing.availability`) as the
sizer did: each recorded state (every instance serving, each pool with its fullest node down) replayed on the whole
trace, weighted by the share of time it lasts; an overloaded state serves nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmcap.cli import app
from llmcap.exit_codes import SLO_MISSED
from llmcap.sizing.params import HeadroomParams
from tests._size_cli import size_args

DOWN = HeadroomParams().node_repair_h / (
    HeadroomParams().node_mtbf_h + HeadroomParams().node_repair_h
)  # 4 / 6,339 h: one node down


@pytest.fixture(scope="module")
def plan(tmp_path_factory) -> tuple[Path, Path, dict]:
    """2,000 short requests at 100 req/s: one H100 carries about 70 (the search's G), so the plan has instances to lose."""
    root = tmp_path_factory.mktemp("plan")
    trace = root / "t.csv"
    trace.write_text(
        "arrival_s,isl,osl\n"
        + "".join(f"{i * 0.05:.2f},{200 + (i * 37) % 800},{20 + (i * 13) % 150}\n" for i in range(2000))
    )
    r = CliRunner().invoke(
        app,
        size_args("--slo-availability", "0.99", "--target-rps", "100", "--out", str(root / "plan"), trace=trace),
    )
    assert r.exit_code == 0, r.output
    return trace, root / "plan" / "summary.json", json.loads(r.stdout)


def _simulate(summary: Path, trace: Path, *extra: str) -> tuple[int, dict]:
    r = CliRunner().invoke(app, ["simulate", "--plan", str(summary), "--trace", str(trace), *extra, "--json"])
    assert r.exit_code in (0, 2, SLO_MISSED), r.output
    return r.exit_code, (json.loads(r.stdout) if r.exit_code != 2 else {"error": r.output})


def _edited(summary: Path, name: str, edit) -> Path:
    record = json.loads(summary.read_text())
    edit(record["deployment"])
    out = summary.with_name(name)
    out.write_text(json.dumps(record))
    return out


def test_the_plan_records_its_states_and_simulate_judges_them_as_the_sizer(plan) -> None:
    trace, summary, sized = plan
    states = sized["deployment"]["availability"]
    (all_up, node_down) = states
    nodes = round(node_down["share"] / DOWN)  # a pool of n nodes has one down n × d of the time
    assert (
        nodes >= 1
        and node_down["share"] == pytest.approx(nodes * DOWN)
        and all_up["share"] == pytest.approx(1 - nodes * DOWN)
    )
    assert all_up["serving"] == sized["deployment"]["counts"] and node_down["down"] == "instances"
    code, s = _simulate(summary, trace)
    assert code == 0 and s["plan_check"]["passes"]
    # A = share(all up) × attainment(all up) + share(node down) × attainment(node down), each run its own scenario's replay
    _, lost = _simulate(summary, trace, "--scenario", "node loss: instances")
    assert lost["counts"] == node_down["serving"]
    expected = all_up["share"] * s["plan_check"]["attainment"] + node_down["share"] * lost["plan_check"]["attainment"]
    check = s["availability_check"]
    assert check["availability"] == pytest.approx(expected) and check["target"] == 0.99 and check["passes"]
    (sizer,) = [line for line in sized["scenarios"] if line.startswith("availability")]
    assert f"attainment {check['availability']:.4f} → pass" in sizer  # the sizer's own verdict on the same runs


def test_the_availability_target_changes_the_verdict(plan) -> None:
    """The same plan, its node-down state left with one instance (as a packed placement would) 2% of the time: one H100
    cannot carry 100 req/s, its run is overloaded and serves nothing, so A = 0.98 × 1 + 0.02 × 0 < 0.99, while the
    plan's own replay still passes: exit 6 for the availability alone."""
    trace, summary, _ = plan

    def packed(d: dict) -> None:
        d["availability"] = [
            {"serving": d["counts"], "share": 0.98, "down": ""},
            {"serving": {"instances": 1}, "share": 0.02, "down": "instances"},
        ]

    code, s = _simulate(_edited(summary, "packed.json", packed), trace)
    assert code == SLO_MISSED and s["plan_check"]["passes"]
    assert s["availability_check"]["availability"] == pytest.approx(0.98 * s["plan_check"]["attainment"])
    assert (
        not s["availability_check"]["passes"]
        and "instances node down 2.000% × 0.0000" in s["availability_check"]["states"]
    )
    code, alone = _simulate(_edited(summary, "packed.json", packed), trace, "--scenario", "availability")
    assert code == SLO_MISSED and alone["availability_check"] == s["availability_check"] and "plan_check" not in alone


def test_a_plan_without_a_target_has_nothing_to_judge(plan) -> None:
    trace, summary, _ = plan

    def untargeted(d: dict) -> None:
        del d["availability"]
        d["slo"]["availability"] = None

    plain = _edited(summary, "plain.json", untargeted)
    code, s = _simulate(plain, trace)
    assert code == 0 and "availability_check" not in s
    code, s = _simulate(plain, trace, "--scenario", "availability")
    assert code == 2 and "the plan has no availability target" in s["error"]
