"""`llmcap profile --endpoint URL` against the real vLLM CPU engine (a small grid)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from llmcap import exit_codes
from llmcap.cli import app
from llmcap.perf import read_profile
from tests.conftest import TRACES

pytestmark = pytest.mark.live


def test_profile_command_writes_a_profile_and_prints_json(vllm_engine, tmp_path):
    out = tmp_path / "prof"
    result = CliRunner().invoke(
        app,
        [
            "profile",
            "--endpoint",
            vllm_engine.base_url,
            "--isl",
            "64,512",
            "--concurrency",
            "1,4",
            "--osl",
            "32",
            "--repeats",
            "3",
            "--max-num-batched-tokens",
            str(vllm_engine.max_num_batched_tokens),
            "--device",
            "cpu",
            "--weight-quant",
            "bf16",
            "--out",
            str(out),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout.strip().splitlines()[-1])
    assert doc["model"] == vllm_engine.model  # the server's first (only) model
    assert doc["engine_version"] == vllm_engine.version
    assert sorted((p["isl"], p["concurrency"]) for p in doc["points"]) == [(64, 1), (64, 4), (512, 1), (512, 4)]
    prof = read_profile(out)
    assert prof.fingerprint_hash == doc["fingerprint_hash"]
    assert prof.fingerprint.engine_version == vllm_engine.version and prof.fingerprint.device_sku == "cpu"
    assert prof.fingerprint.quantization == "bf16"
    assert prof.fit is not None and prof.fit.to_dict() == doc["fit"]
    ttft_512 = next(p["ttft_s"] for p in doc["points"] if (p["isl"], p["concurrency"]) == (512, 1))
    ttft_64 = next(p["ttft_s"] for p in doc["points"] if (p["isl"], p["concurrency"]) == (64, 1))
    assert 0 < ttft_64 < ttft_512  # a longer prompt takes longer to prefill

    # the measured profile times a simulation from the command line (a CPU engine: --gpu only sets the KV memory)
    trace = tmp_path / "head.csv"
    trace.write_text("\n".join(TRACES["azure_conv"].read_text().splitlines()[:51]) + "\n")
    sim = CliRunner().invoke(
        app,
        [
            "simulate",
            "--trace",
            str(trace),
            "--model",
            "Llama-3.1-8B",
            "--gpu",
            "h100",
            "--profile",
            str(out),
            "--json",
        ],
    )
    assert sim.exit_code == 0, sim.output
    summary = json.loads(sim.stdout)
    assert (
        summary["step_model"] == "LinearStepModel" and summary["profile"]["fingerprint_hash"] == prof.fingerprint_hash
    )
    assert summary["completed"] == 50


def test_profile_command_reports_an_unreachable_endpoint_in_one_line():
    result = CliRunner().invoke(app, ["profile", "--endpoint", "http://127.0.0.1:9", "--osl", "4"])
    assert result.exit_code == exit_codes.UNREACHABLE
    assert (
        result.output.startswith("error: http://127.0.0.1:9: no answer (ConnectError")
        and len(result.output.strip().splitlines()) == 1
    )
