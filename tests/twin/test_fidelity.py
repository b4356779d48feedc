"""Twin fidelity: `llmcap twin serve` (a real process, real HTTP) measured by the open-loop replay
gives the simulator's TTFT and ITL for the same excerpt, within 5% at p50 and p90, and its /metrics
parse with the scraper the profiler uses on vLLM.

Why this deployment and excerpt: Llama-3.1-70B on 2 x A100 has decode steps of ~44 ms and prefills
of 0.1-0.3 s, and the twin plays it at dilation 2 (two wall seconds per simulated second), so a gap
lasts ~90 ms of wall time against the ~1-4 ms the twin and the client add (the event loop's wake-up,
HTTP, scheduling noise). The excerpt (40 requests, 3 req/s simulated, outputs of 5-20 tokens) is below
the knee (TTFT p90 ~1.5 x the bare prefill) and puts each compared percentile inside a dense part of
the ITL distribution: p50 among the pure decode steps (44 ms for the 40th-75th percentiles), p90
among mixed prefill+decode steps (~190 ms). A percentile sitting on the edge between those two
clusters (tried first: outputs of 10-40 tokens put p90 at 44.05 ms with p92 at 80 ms) moves with
the largest few ms of noise, not with the twin's timing. The simulator replays the arrivals the
client actually sent (`arrival_s` of the replay's rows, / dilation), so client-side send lateness is
not counted against the twin; measured times are divided by the dilation.

Neighbours on the machine starve the twin and the client of CPU (a load of 2.5 on 2 cores put ITL p90
at +6% even at dilation 2), so, as the live engine tests do (tests/live/conftest.py), the client and
the twin run at nice TWIN_NICE while they measure, where the OS allows it (root / CAP_SYS_NICE).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

import httpx
import numpy as np
import pyarrow as pa
import pytest

from llmcap.live.metrics import parse_metrics
from llmcap.live.trace_replay import replay
from llmcap.sim import simulate, weighted_quantiles
from tests.twin._twin import deployment, twin_server

pytestmark = [pytest.mark.timeout(120), pytest.mark.timing]
MODEL, GPU, TP = "Llama-3.1-70B", "A100-SXM-80GB", 2
STARTUP_S = 60.0
DILATION = 2.0
N = 40
TWIN_NICE = int(os.environ.get("LLMCAP_TWIN_NICE", "-10"))


@pytest.fixture()
def high_priority():
    """This process (the client) and what it spawns from here on (the twin) at TWIN_NICE; restored after."""
    own = os.getpriority(os.PRIO_PROCESS, 0)
    with contextlib.suppress(OSError):  # not allowed here: normal priority
        os.setpriority(os.PRIO_PROCESS, 0, min(own, TWIN_NICE))
    try:
        yield os.getpriority(os.PRIO_PROCESS, 0)
    finally:
        os.setpriority(os.PRIO_PROCESS, 0, own)


@pytest.fixture()
def twin_process(high_priority):
    with twin_server(
        "-m",
        MODEL,
        "-g",
        GPU,
        "--tp",
        str(TP),
        "--served-model-name",
        "twin-70b",
        "--dilation",
        str(DILATION),
        startup_s=STARTUP_S,
    ) as served:
        yield served


def excerpt(n: int, rate: float, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    arrival = np.concatenate([[0.0], np.cumsum(rng.exponential(1.0 / rate, n - 1))])
    return pa.table(
        {
            "request_id": np.arange(n),
            "arrival_s": arrival,
            "isl": rng.integers(100, 800, n),
            "osl": rng.integers(5, 20, n),
        }
    )


def test_twin_matches_the_simulator_on_the_same_excerpt(twin_process):
    proc, url = twin_process
    trace = excerpt(N, 3.0, seed=7)
    t0 = time.perf_counter()
    res = replay(url, "twin-70b", trace, rate_scale=1.0 / DILATION, timeout_s=30.0)
    wall = time.perf_counter() - t0
    metrics_text = httpx.get(f"{url}/metrics", timeout=10.0).text
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0  # a signal stops it cleanly

    got = res.requests.to_pandas()
    assert (got.status == "ok").all() and (got.osl.to_numpy() == trace.column("osl").to_numpy()).all()
    sent = pa.table(
        {"request_id": got.request_id, "arrival_s": got.arrival_s / DILATION, "isl": got.isl, "osl": got.osl}
    )
    cfg, step = deployment(MODEL, GPU, TP)
    sim = simulate(sent, step, cfg)
    want = sim.records.to_pandas()

    report = {}
    for q in (50, 90):
        ttft_twin, ttft_sim = np.percentile(got.ttft_s, q) / DILATION, np.percentile(want.ttft_s, q)
        itl_twin = np.percentile(res.itls, q) / DILATION
        itl_sim = float(weighted_quantiles(sim.itl_values, sim.itl_weights, [q / 100])[0])
        report[f"ttft_p{q}"] = (ttft_twin, ttft_sim, ttft_twin / ttft_sim - 1)
        report[f"itl_p{q}"] = (itl_twin, itl_sim, itl_twin / itl_sim - 1)
    snap = parse_metrics(metrics_text)
    lag = snap.get("llmcap_twin_max_lag_seconds")
    print(
        f"\n[twin] replay wall {wall:.1f} s, twin's max lag {lag * 1e3:.1f} ms; twin vs simulator (s, s, relative): {report}"
    )
    assert all(abs(rel) < 0.05 for _, _, rel in report.values()), report
    assert snap.get("vllm:request_success_total") == N
    assert snap.get("vllm:generation_tokens_total") == got.osl.sum()
    assert snap.get("vllm:prompt_tokens_total") == got.isl.sum()
    assert snap.get("vllm:time_to_first_token_seconds_count") == N
    assert snap.get("vllm:inter_token_latency_seconds_count") == (got.osl - 1).sum()
    # the twin's own clock: TTFT as simulated from when each request reached it (HTTP excluded)
    assert snap.get("vllm:time_to_first_token_seconds_sum") == pytest.approx(want.ttft_s.sum(), rel=0.02)
    assert snap.get("vllm:num_requests_running") == 0 and snap.get("vllm:num_requests_waiting") == 0
    assert snap.cache_config is not None and snap.cache_config.num_blocks == cfg.engine.num_blocks
    assert snap.iteration_tokens is not None and snap.iteration_tokens[0] == got.isl.sum() + (got.osl - 1).sum()
