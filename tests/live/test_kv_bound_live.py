"""The preemption regime on the real engine: a vLLM CPU engine of the test's own with 40 KV blocks
(`--num-gpu-blocks-override`: 5,120 tokens, five whole lives of the workload's requests) and 16 requests
of 512 prompt / 512 output tokens sent at once. vLLM admits them by their prompts' blocks, ten at a time,
and preempts (and later recomputes) the newest as decodes outgrow the cache.

The simulator, with vLLM's admission policy, the engine's own settings and the session's calibrated step
model, predicts the preemptions (`vllm:num_preemptions_total` over the replay) and the output throughput
(output tokens / (last finish − first arrival)). Judged by the repeat-envelope rule
(llmcap.reconcile.repeatability) over 3 repeats; the throughput prediction is a band per repeat, the step
model scaled by the fastest and the slowest speed probes around it (as tests/live/test_sim_fidelity.py).
The guaranteed-no-evict policy's prediction for the same engine is printed beside: no preemption."""

from __future__ import annotations

from functools import partial

import numpy as np
import pyarrow as pa
import pytest

from llmcap.live.metrics import parse_metrics
from llmcap.reconcile.repeatability import judge, judge_band
from llmcap.sim import SimConfig, simulate
from tests.live._calibration import engine_config, measure_replay, probe_speed, profile_probe, speed_band
from tests.live.conftest import engine_server

pytestmark = [pytest.mark.live, pytest.mark.timeout(1200)]
BLOCKS, N, ISL, OSL, REPEATS = 40, 16, 512, 512, 3
PROMPT_SEED0 = 70_000  # every replay its own prompts (no prefix-cache hits across repeats)


def workload() -> pa.Table:
    return pa.table(
        {"request_id": np.arange(N), "arrival_s": np.arange(N) * 1e-3, "isl": np.full(N, ISL), "osl": np.full(N, OSL)}
    )


def throughput(records: pa.Table) -> float:
    fin = records.column("finish_s").to_numpy(zero_copy_only=False).astype(np.float64)
    return float(
        records.column("osl").to_numpy().sum() / (np.nanmax(fin) - records.column("arrival_s").to_numpy().min())
    )


def preemptions(base_url: str) -> float:
    import httpx

    return parse_metrics(httpx.get(f"{base_url}/metrics", timeout=30.0).text).preemptions or 0.0


def test_preemptions_and_throughput_of_a_kv_bound_engine_within_its_repeat_envelope(calibration, tmp_path) -> None:
    trace = workload()
    with engine_server(tmp_path / "engine", extra_args=("--num-gpu-blocks-override", str(BLOCKS))) as engine:
        assert engine.kv.num_blocks == BLOCKS, engine.kv
        config = SimConfig(engine=engine_config(engine))
        ref = profile_probe(calibration)
        probe = partial(probe_speed, engine.base_url, engine.model, engine.max_num_batched_tokens)
        measured_pre, measured_tput, bands = [], [], []
        before = probe()
        for rep in range(REPEATS):
            p0 = preemptions(engine.base_url)
            m = measure_replay(engine.base_url, engine.model, trace, seed=PROMPT_SEED0 + rep)
            measured_pre.append(preemptions(engine.base_url) - p0)
            assert m.replay.requests.column("status").to_pylist() == ["ok"] * N
            measured_tput.append(throughput(m.replay.requests))
            after = probe()
            bands.append(speed_band(ref, before, after))
            before = after

    def run(policy: str, fit):
        return simulate(
            trace,
            fit,
            config.model_copy(update={"engine": config.engine.model_copy(update={"admission_policy": policy})}),
        )

    predicted = run("vllm", calibration.fit)
    fast = [throughput(run("vllm", calibration.fit.scaled_by_phase(*lo)).records) for lo, _ in bands]
    slow = [throughput(run("vllm", calibration.fit.scaled_by_phase(*hi)).records) for _, hi in bands]
    no_evict = run("trtllm-guaranteed-no-evict", calibration.fit)
    pre_verdict = judge(max(predicted.summary["preemptions"], 1e-9), np.maximum(measured_pre, 1e-9))
    tput_verdict = judge_band(np.minimum(fast, slow), np.maximum(fast, slow), measured_tput)
    print(
        f"\n[kv-bound] engine {BLOCKS} blocks x {engine.kv.block_size}; {N} x {ISL}/{OSL}: preemptions measured {measured_pre}, "
        f"predicted {predicted.summary['preemptions']} ({pre_verdict.reason}); output tok/s measured "
        + ", ".join(f"{x:.0f}" for x in measured_tput)
        + f", predicted {throughput(predicted.records):.0f} unscaled ({tput_verdict.reason}); "
        f"guaranteed-no-evict would preempt {no_evict.summary['preemptions']} times at {throughput(no_evict.records):.0f} tok/s"
    )
    assert (
        min(measured_pre) > 0 and predicted.summary["preemptions"] > 0
    )  # the regime is the preemption one, on both sides
    assert no_evict.summary["preemptions"] == 0
    assert pre_verdict.passed, pre_verdict.reason
    assert tput_verdict.passed, tput_verdict.reason
