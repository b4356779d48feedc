"""Import of `vllm bench serve --save-result --save-detailed` JSON as a profile source (no engine needed).

The fixture is a real result file: `vllm bench serve` (vLLM 0.32.0 CPU) against the tiny Llama,
random dataset, 12 prompts, ISL 128-384, OSL 8-24, 8 req/s, max concurrency 4. vLLM computed its
own summary (mean_ttft_ms, mean_itl_ms, ...) from the same per-request lists; the import must agree.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from llmcap.errors import InputFileError
from llmcap.live import read_vllm_bench
from llmcap.perf import POINTS_SCHEMA
from tests.conftest import FIXTURES

BENCH = FIXTURES / "vllm_bench" / "vllm-0.32.0-cpu-tiny-llama-random.json"


def test_reads_every_request_and_agrees_with_vllms_own_summary() -> None:
    run = read_vllm_bench(BENCH)
    doc = json.loads(BENCH.read_text())
    r = run.requests
    assert len(r) == doc["num_prompts"] == doc["completed"] and r["ok"].all()
    assert int(r["isl"].sum()) == doc["total_input_tokens"]
    assert int(r["osl"].sum()) == doc["total_output_tokens"]
    assert r["ttft_s"].mean() * 1e3 == pytest.approx(doc["mean_ttft_ms"])
    gaps = np.concatenate([np.asarray(x) for x in r["itls"]])
    assert gaps.mean() * 1e3 == pytest.approx(doc["mean_itl_ms"])
    assert np.median(gaps) * 1e3 == pytest.approx(doc["median_itl_ms"])
    assert run.concurrency == doc["max_concurrency"] == 4
    assert run.meta["model_id"] == "tiny-llama" and "itls" not in run.meta
    assert (r["start_s"] >= 0).all() and r["start_s"].min() == 0


def test_points_bucket_requests_by_isl() -> None:
    run = read_vllm_bench(BENCH)
    t = run.points()
    assert t.schema.equals(POINTS_SCHEMA)
    assert sum(t.column("requests").to_pylist()) == len(run.requests)
    assert set(t.column("source").to_pylist()) == {"vllm-bench-serve"}
    for row in t.to_pylist():
        bucket = 2 ** np.ceil(np.log2(run.requests["isl"]))  # power-of-two buckets, by hand
        g = run.requests[bucket == 2 ** np.ceil(np.log2(row["isl"]))]
        assert row["requests"] == len(g)
        assert row["ttft_s"] == pytest.approx(float(np.median(g["ttft_s"])))
        assert row["concurrency"] == 4 and row["itl_p50_s"] <= row["itl_p99_s"] <= row["itl_max_s"]


def test_a_summary_only_file_is_a_clear_error(tmp_path) -> None:
    doc = json.loads(BENCH.read_text())
    for key in ("input_lens", "output_lens", "ttfts", "itls", "start_times", "generated_texts", "errors"):
        doc.pop(key)
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(InputFileError, match="--save-detailed"):
        read_vllm_bench(path)
    path.write_text("{not json")
    with pytest.raises(InputFileError, match="not JSON"):
        read_vllm_bench(path)


def test_a_rate_run_without_max_concurrency_uses_littles_law(tmp_path) -> None:
    doc = json.loads(BENCH.read_text())
    doc["max_concurrency"] = None
    path = tmp_path / "rate.json"
    path.write_text(json.dumps(doc))
    run = read_vllm_bench(path)
    assert run.concurrency == max(1, round(sum(doc["latencies"]) / doc["duration"]))
