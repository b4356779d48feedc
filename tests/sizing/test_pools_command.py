"""`llmcap pools`: the P/D starting count as the formula writes it, and beside a plan's simulated counts."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from llmcap.cli import app

WORKED = [
    "pools",
    "--rate",
    "12",
    "--prefill-rps",
    "4",
    "--prefill-gpus",
    "2",
    "--decode-rps",
    "7",
    "--decode-gpus",
    "4",
    "--h-prefill",
    "1.25",
    "--h-decode",
    "1.2",
]


@pytest.fixture(autouse=True)
def _wide(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)


def test_the_worked_example_prints_20_gpus_with_its_arithmetic() -> None:
    r = CliRunner().invoke(app, WORKED)
    assert r.exit_code == 0, r.output
    # 12 × 1.25 / 4 = 3.75 → 4 prefill instances of 2 GPUs; 12 × 1.2 / 7 = 2.057 → 3 decode instances of 4 GPUs
    assert r.stdout.splitlines() == [
        "N_P = ⌈λ·H_P/G_P⌉ = ⌈12 × 1.25 / 4⌉ = ⌈3.75⌉ = 4 instances × 2 GPUs = 8 GPUs",
        "N_D = ⌈λ·H_D/G_D⌉ = ⌈12 × 1.2 / 7⌉ = ⌈2.057⌉ = 3 instances × 4 GPUs = 12 GPUs",
        "GPUs = N_P·g_P + N_D·g_D = 4·2 + 3·4 = 20",
    ]
    data = json.loads(CliRunner().invoke(app, [*WORKED, "--json"]).stdout)
    assert data["gpus"] == 20 and [(p["pool"], p["instances"], p["gpus"]) for p in data["pools"]] == [
        ("prefill", 4, 8),
        ("decode", 3, 12),
    ]


def test_beside_a_plan_the_settled_counts_and_the_headroom_they_amount_to(tmp_path) -> None:
    summary = {
        "planning_rps": 3.0,
        "pool_plans": {
            "prefill": {"per_instance_rps": 0.5, "gpus_per_instance": 2, "instances": 8},
            "decode": {"per_instance_rps": 6.0, "gpus_per_instance": 4, "instances": 2},
        },
    }
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(summary))
    r = CliRunner().invoke(app, ["pools", "--plan", str(path), "--json"])
    assert r.exit_code == 0, r.output
    prefill, decode = json.loads(r.stdout)["pools"]
    # H = 1: ⌈3 / 0.5⌉ = 6 prefill, ⌈3 / 6⌉ = 1 decode; the plan settled 8 and 2: H = 8 × 0.5 / 3 = 1.333, 2 × 6 / 3 = 4
    assert (prefill["instances"], decode["instances"]) == (6, 1)
    assert (prefill["plan_instances"], decode["plan_instances"]) == (8, 2)
    assert prefill["plan_headroom"] == pytest.approx(4 / 3) and decode["plan_headroom"] == pytest.approx(4.0)
    table = CliRunner().invoke(app, ["pools", "--plan", str(path)]).stdout
    assert "prefill 8 (H = 1.33), decode 2 (H = 4) = 24 GPUs" in table


def test_missing_numbers_and_an_aggregated_plan_are_refused(tmp_path) -> None:
    r = CliRunner().invoke(app, ["pools", "--rate", "12"])
    assert r.exit_code == 2 and "--prefill-rps, --prefill-gpus, --decode-rps, --decode-gpus" in r.stderr
    aggregated = tmp_path / "summary.json"
    aggregated.write_text(json.dumps({"planning_rps": 3.0, "pool_plans": {"instances": {"per_instance_rps": 1.0}}}))
    r = CliRunner().invoke(app, ["pools", "--plan", str(aggregated)])
    assert r.exit_code == 2 and "not a disaggregated plan's summary.json" in r.stderr
