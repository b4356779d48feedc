"""`llmcap perf` and `llmcap simulate` agree: for each cell (dense and MoE models, TP 1–8 on H100, fp8,
ISL/OSL from 128/128 to 20000/2000) perf's steady-state estimate and the simulator's throughput on
4 × B requests of that shape queued at once (B: perf's batch) agree within 10%, under vLLM's admission
and TensorRT-LLM's guaranteed-no-evict. Where the KV binds both say so — perf's `limited_by`, the vLLM
simulation's preemptions — and where it does not, neither preempts; guaranteed-no-evict never does.
Where vLLM preempts, perf's figure is a ceiling without the recompute (`estimate`): the simulation may
fall below it by the recompute's cost (at most to `CEILING_FLOOR`), never above it by more than the tolerance."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from llmcap.cli import app

MODELS = {
    "Llama-3.1-8B": (1, 2, 4, 8),
    "Llama-3.1-70B": (2, 4, 8),
    "Mixtral-8x7B": (2, 4, 8),
    "Qwen3-30B-A3B": (1, 2, 4, 8),
}
SHAPES = ((128, 128), (2048, 128), (128, 2048), (1024, 1024), (20000, 2000))
POLICIES = ("vllm", "trtllm-guaranteed-no-evict")
TOLERANCE = 0.10
CEILING_FLOOR = 0.80  # under a ceiling: the recompute costs 0-11% over this grid; thrashing would cost far more
runner = CliRunner()


def _json(args: list[str]) -> dict:
    r = runner.invoke(app, [*args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


@pytest.mark.parametrize("model", MODELS)
def test_perf_and_simulate_agree_over_the_grid(model: str, tmp_path: Path) -> None:
    misses, seen = [], 0
    for tp in MODELS[model]:
        cell = ["--model", model, "--gpu", "h100", "--tp", str(tp), "--weight-quant", "fp8", "--kv-dtype", "fp8"]
        for isl, osl in SHAPES:
            for policy in POLICIES:
                perf = _json(["perf", *cell, "--isl", str(isl), "--osl", str(osl), "--admission-policy", policy])[
                    "throughput"
                ]
                n = 4 * perf["batch"]
                trace = tmp_path / f"{isl}-{osl}-{n}.parquet"
                pq.write_table(
                    pa.table(
                        {
                            "request_id": np.arange(n),
                            "arrival_s": np.zeros(n),
                            "isl": np.full(n, isl),
                            "osl": np.full(n, osl),
                        }
                    ),
                    trace,
                )
                sim = _json(["simulate", "--trace", str(trace), *cell, "--admission-policy", policy])
                where = f"{model} TP{tp} {isl}/{osl} {policy}"
                assert sim["completed"] == n, where
                kv_binds = perf["limited_by"] == "kv"
                if policy == "vllm":
                    assert (sim["preemptions"] > 0) == kv_binds, (
                        f"{where}: {sim['preemptions']} preemptions, perf limited by {perf['limited_by']}"
                    )
                else:
                    assert sim["preemptions"] == 0, where
                ceiling = perf["estimate"] == "ceiling"
                assert ceiling == (policy == "vllm" and kv_binds), where
                ratio = sim["throughput"]["output_tok_s"] / perf["output_tokens_per_s"]
                seen += 1
                if ratio > 1 + TOLERANCE or ratio < (CEILING_FLOOR if ceiling else 1 - TOLERANCE):
                    misses.append(f"{where}: simulate / perf = {ratio:.3f}")
    assert seen == len(MODELS[model]) * len(SHAPES) * len(POLICIES) and misses == []
