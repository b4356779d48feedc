"""Metric names per engine version, and the step-time scaling corrections and the twin's fault share."""

from __future__ import annotations

import numpy as np
import pytest

from llmcap.errors import LlmcapError
from llmcap.perf.model import LinearStepModel, StepBatch, causal_pairs
from llmcap.perf.scaled import ScaledStepModel, prefill_reach
from llmcap.reconcile.diagnose import diagnose
from llmcap.reconcile.metric_schema import detect_schema, schema_for
from llmcap.reconcile.params import DiagnoseParams
from llmcap.reconcile.series import samples, to_table


def test_versions_read_their_own_names() -> None:
    assert schema_for("vllm", "0.8.5").kv_usage == "vllm:gpu_cache_usage_perc"
    assert schema_for("vllm", "0.10.1").kv_usage == "vllm:kv_cache_usage_perc"
    assert schema_for("vllm", "0.10.1").itl == "vllm:time_per_output_token_seconds"
    assert schema_for("vllm", "v0.11.0").itl == "vllm:inter_token_latency_seconds"
    assert schema_for("vllm").itl == "vllm:inter_token_latency_seconds"
    with pytest.raises(LlmcapError, match="no metric schema for engine 'sglang'"):
        schema_for("sglang")
    with pytest.raises(LlmcapError, match="expected numbers"):
        schema_for("vllm", "latest")


def old_vllm_scrape(t: float, waiting: float, usage: float) -> tuple[float, dict]:
    """A scrape as vLLM 0.8 printed it (synthetic text: the old names, two engines)."""
    text = "".join(
        f'vllm:num_requests_waiting{{engine="{e}",model_name="m"}} {waiting / 2}\n'
        f'vllm:gpu_cache_usage_perc{{engine="{e}",model_name="m"}} {usage}\n'
        f'vllm:num_preemptions_total{{engine="{e}",model_name="m"}} 0\n'
        for e in (0, 1)
    )
    return t, samples(text)


def test_an_old_vllm_series_is_read_through_its_names() -> None:
    """Synthetic series in vLLM 0.8's names: waiting with a full cache reads as memory bound only when
    the schema maps `vllm:gpu_cache_usage_perc` to KV usage."""
    series = to_table([old_vllm_scrape(float(t), 6.0 if t >= 10 else 0.0, 0.95 if t >= 10 else 0.2) for t in range(40)])
    assert detect_schema(set(series.column("name").to_pylist())).name == "vllm<0.9.1"
    d = diagnose(series, DiagnoseParams(window_s=10.0))
    assert [(f.kind, f.start_s, f.end_s) for f in d.findings] == [("memory_bound", 10.0, 39.0)]
    assert d.findings[0].values == pytest.approx({"waiting": 6.0, "kv_usage": 0.95})
    new_names = diagnose(series, DiagnoseParams(window_s=10.0), schema=schema_for("vllm", "0.11.0"))
    assert new_names.findings == [] and "kv_usage" in new_names.missing


def test_scaling_everywhere_or_past_a_context_length() -> None:
    base = LinearStepModel(overhead_s=0.01, per_prefill_token_s=1e-5, per_decode_seq_s=1e-4)
    new = np.array([4000.0, 4000.0, 0.0])
    ctx = np.array([0.0, 6000.0, 0.0])  # one short prefill, a chunk reaching 10,000, a decode-only step
    batch = StepBatch.build(new, causal_pairs(new, ctx), decode_seqs=np.array([0.0, 0.0, 8.0]))
    assert prefill_reach(batch).tolist() == [4000.0, 10000.0, 0.0]
    t = base.step_time(batch)
    assert ScaledStepModel(base, 1.2).step_time(batch) == pytest.approx(t * 1.2)
    assert ScaledStepModel(base, 1.5, min_context=8192).step_time(batch) == pytest.approx(t * [1.0, 1.5, 1.0])
    with pytest.raises(ValueError, match="finite and > 0"):
        ScaledStepModel(base, 0.0)
