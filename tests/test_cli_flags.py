"""Flags shared with vLLM's conventions: `--request-rate`, `--weight-quant` everywhere, comma lists on `size`."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from llmcap.cli import app
from llmcap.commands._size_inputs import listed, tp_degrees
from llmcap.errors import LlmcapError
from tests.conftest import TRACES

runner = CliRunner()


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("flags") / "head.csv"
    path.write_text("\n".join(TRACES["azure_conv"].read_text().splitlines()[:121]) + "\n")
    return path


def test_simulate_at_a_request_rate(trace, tmp_path):
    out = tmp_path / "records.parquet"
    base = ["simulate", "--trace", str(trace), "--model", "Llama-3.1-8B", "--gpu", "h100"]
    r = runner.invoke(app, [*base, "--request-rate", "2.5", "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    arrival = pq.read_table(out).column("arrival_s").to_numpy()
    assert arrival.size / (arrival.max() - arrival.min()) == pytest.approx(2.5, rel=1e-9)
    both = runner.invoke(app, [*base, "--request-rate", "2.5", "--rate-scale", "2"])
    assert both.exit_code == 2 and "--request-rate and --rate-scale both set the rate" in both.stderr


def test_weight_quant_is_the_same_flag_on_every_command(trace):
    sim = ["simulate", "--trace", str(trace), "--model", "Llama-3.1-8B", "--gpu", "h100", "--json"]
    long, short = (json.loads(runner.invoke(app, [*sim, flag, "fp8"]).stdout) for flag in ("--weight-quant", "--quant"))
    assert long["ttft_ms"] == short["ttft_ms"] and long["kv_blocks_per_replica"] == short["kv_blocks_per_replica"]
    bf16 = json.loads(runner.invoke(app, sim).stdout)
    assert long["kv_blocks_per_replica"] > bf16["kv_blocks_per_replica"]  # fp8 weights leave more memory for KV
    mem = ["memory", "--model", "Llama-3.1-8B", "--gpu", "h100", "--json"]
    assert json.loads(runner.invoke(app, [*mem, "--weight-quant", "fp8"]).stdout) == json.loads(
        runner.invoke(app, [*mem, "--quant", "fp8"]).stdout
    )


def test_size_takes_comma_lists_or_repeats():
    assert listed(["h100,h200", "b200", "h100"], "--gpu") == ["h100", "h200", "b200"]
    assert tp_degrees(["1,2", "8"]) == [1, 2, 8]
    with pytest.raises(LlmcapError, match="an empty item"):
        listed(["bf16,"], "--weight-quant")
    with pytest.raises(LlmcapError, match="positive integers"):
        tp_degrees(["1,two"])
    r = runner.invoke(
        app, ["size", "--trace", "never-read.csv", "--model", "Llama-3.1-8B", "--tp", "0,2", "--goodput", "ttft:500"]
    )
    assert r.exit_code == 2 and "--tp '0,2': TP degrees are positive integers" in r.stderr
