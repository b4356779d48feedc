"""Reconciliation against a real `llmcap twin serve` process whose speed differs from the step model the
predictions use (the twin's fault knobs), measured by the open-loop replay:

- 20% slower everywhere (--slowdown 1.2): every bucket is biased alike, the decision is one global
  correction, and the simulator with the corrected step model then matches the twin within 5% (TTFT
  and ITL, p50 and p90);
- slower only where a prefill reaches past 8k tokens (--long-prompt-slowdown 1.5): the long-prompt
  bucket is split, the others are within tolerance, and no global factor is written.

The twin plays time dilated (wall seconds per twin second) so that the client's and the event loop's
few milliseconds are small against its step times, and client and twin run at high priority where the
OS allows it (the `high_priority` fixture of tests/twin/test_fidelity.py); measured times are divided by the dilation and
the simulator replays the arrivals the client actually sent (as tests/twin/test_fidelity.py does).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from llmcap.catalog import get_gpu, load_model
from llmcap.deployment import EngineOptions, sim_config
from llmcap.live.trace_replay import replay
from llmcap.perf.corrections import apply_corrections
from llmcap.reconcile.params import ReconcileParams
from llmcap.reconcile.run import reconcile
from llmcap.sim import simulate
from tests.twin._twin import deployment, twin_server
from tests.twin.test_fidelity import high_priority  # noqa: F401 - the fixture: client and twin at high priority

pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("high_priority"), pytest.mark.timing]
TIMES = (
    "arrival_s",
    "first_token_s",
    "finish_s",
    "ttft_s",
    "tpot_s",
    "e2e_s",
    "decode_s",
    "itl_p50_s",
    "itl_p99_s",
    "itl_max_s",
)


@contextmanager
def twin_process(model: str, gpu: str, tp: int, dilation: float, *faults: str) -> Iterator[str]:
    with twin_server(
        "-m", model, "-g", gpu, "--tp", str(tp), "--served-model-name", "twin", "--dilation", str(dilation), *faults
    ) as (_, url):
        yield url


def tagged(records: pa.Table) -> pa.Table:
    n = records.num_rows
    return records.append_column("run", pa.array(["1.0x"] * n)).append_column(
        "excerpt_seed", pa.array([0] * n, pa.int64())
    )


def measure(url: str, trace: pa.Table, dilation: float) -> pa.Table:
    """The replay's records in twin seconds."""
    got = replay(url, "twin", trace, rate_scale=1.0 / dilation, timeout_s=60.0).requests
    for name in TIMES:
        i = got.schema.get_field_index(name)
        got = got.set_column(i, got.schema.field(i), pc.divide(got.column(i), dilation))
    assert got.column("status").to_pylist() == ["ok"] * trace.num_rows
    return tagged(got)


def predict(measured: pa.Table, step, cfg) -> pa.Table:
    sent = measured.select(["request_id", "arrival_s", "isl", "osl"])
    return tagged(simulate(sent, step, cfg).records)


def quantile(t: pa.Table, col: str, q: float) -> float:
    v = t.column(col).to_numpy(zero_copy_only=False).astype(float)
    return float(np.quantile(v[np.isfinite(v)], q))


def test_a_twin_20pct_slower_is_one_global_correction_that_then_matches() -> None:
    model, gpu, tp, dilation = "Llama-3.1-70B", "A100-SXM-80GB", 2, 2.0
    rng = np.random.default_rng(3)
    n, rate = 80, 2.0  # well below the knee even 20% slower (the prefills alone keep the engine ~50% busy); 40 a bucket
    trace = pa.table(
        {
            "request_id": np.arange(n),
            "arrival_s": np.concatenate([[0.0], np.cumsum(rng.exponential(1 / rate, n - 1))]),
            "isl": rng.integers(100, 800, n),
            "osl": rng.integers(5, 20, n),
        }
    )
    with twin_process(model, gpu, tp, dilation, "--slowdown", "1.2") as url:
        measured = measure(url, trace, dilation)
    cfg, step = deployment(model, gpu, tp)
    params = ReconcileParams(isl_edges=(0, 450), bootstrap=500, min_requests=15)
    rec = reconcile(measured, predict(measured, step, cfg), params)
    print("\n" + "\n".join(f"{d.bias.label}: {d.decision}: {d.reasoning}" for d in rec.decisions))
    assert [d.decision for d in rec.decisions] == ["correct", "correct"]
    assert all(set(d.biased) == {"ttft", "itl"} for d in rec.decisions)
    assert len(rec.corrections) == 1 and rec.corrections[0].min_context == 0
    assert rec.corrections[0].factor == pytest.approx(1.2, rel=0.05)

    corrected = predict(measured, apply_corrections(step, rec.corrections), cfg)
    for col in ("ttft_s", "tpot_s"):
        for q in (0.5, 0.9):
            want, got = quantile(measured, col, q), quantile(corrected, col, q)
            assert got == pytest.approx(want, rel=0.05), (col, q, got, want)


def test_a_slowdown_past_8k_tokens_splits_that_bucket() -> None:
    model, gpu, tp, dilation = "Llama-3.1-8B", "H100-SXM-80GB", 1, 2.0
    rng = np.random.default_rng(5)
    n = 44
    long = rng.random(n) < 0.25  # few enough that short prompts seldom queue behind a (slowed) long prefill
    # short prompts of 1-4k tokens: prefills of ~40-150 ms, long against the client's few ms of overhead
    isl = np.where(long, rng.integers(9000, 12000, n), rng.integers(1000, 4000, n))
    trace = pa.table(
        {
            "request_id": np.arange(n),
            "arrival_s": np.concatenate([[0.0], np.cumsum(rng.exponential(1 / 2.0, n - 1))]),
            "isl": isl,
            "osl": rng.integers(5, 20, n),
        }
    )
    # prompts up to 16k tokens prefill in one step, so the whole of a long prefill is slowed
    with twin_process(
        model,
        gpu,
        tp,
        dilation,
        "--max-num-batched-tokens",
        "16384",
        "--long-prompt-slowdown",
        "1.5",
        "--long-prompt-tokens",
        "8192",
    ) as url:
        measured = measure(url, trace, dilation)
    step = deployment(model, gpu, tp)[1]
    cfg = sim_config(load_model(model), get_gpu(gpu), EngineOptions(tp=tp, max_num_batched_tokens=16384))
    # 15%: short prompts also queue behind the slowed long prefills, a real knock-on of ~5-10% on their TTFT here
    params = ReconcileParams(isl_edges=(0, 8192), bootstrap=500, min_requests=10, tolerance=0.15)
    rec = reconcile(measured, predict(measured, step, cfg), params)
    print("\n" + "\n".join(f"{d.bias.label}: {d.decision}: {d.reasoning}" for d in rec.decisions))
    assert {d.bias.key["isl"]: d.decision for d in rec.decisions} == {
        "[0,8192)": "within_tolerance",
        "[8192,inf)": "split",
    }
    assert [c.min_context for c in rec.corrections] == [8192]  # a correction for that class only, none global
    assert 1.3 < rec.corrections[0].factor < 1.6  # the fault: those prefill steps take 1.5x
