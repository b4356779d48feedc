"""Diagnosis against twin runs forced into each pattern: the twin (in this process, real HTTP) serves an
open-loop replay while its /metrics are scraped every 0.5 s; the series is diagnosed in 2 s windows.

Each run is built so that one reading dominates (the finding covering the most time), and that is
the one asserted; a run can show others briefly (e.g. while a KV cache fills). A healthy run (the
same deployment, load well under capacity) yields no finding. The P→D link pattern reads the twin's
own link-occupancy counter: vLLM has no standard metric for it."""

from __future__ import annotations

import asyncio

import numpy as np
import pyarrow as pa
import pytest

from llmcap.catalog import get_gpu, load_model
from llmcap.deployment import EngineOptions, sim_config, step_model
from llmcap.live.trace_replay import replay_async
from llmcap.reconcile.diagnose import Diagnosis, diagnose
from llmcap.reconcile.params import DiagnoseParams
from llmcap.reconcile.series import record
from llmcap.twin import Twin, TwinSpec
from tests.twin.test_fidelity import high_priority  # noqa: F401 - the fixture: this process (client and twin) at high priority

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("high_priority"), pytest.mark.timing]
MODEL, GPU = "Llama-3.1-8B", "H100-SXM-80GB"  # decode steps of ~7 ms
PARAMS = DiagnoseParams(window_s=2.0)


async def _run(
    opts: EngineOptions, n: int, rate: float, isl: int, osl: int, hash_ids: list | None, knobs: dict
) -> pa.Table:
    cfg = sim_config(load_model(MODEL), get_gpu(GPU), opts)
    twin = Twin(
        TwinSpec(
            config=cfg,
            step_model=step_model(MODEL, GPU, 1, "bf16", "bf16"),
            served_model_name="twin",
            info={"model": MODEL},
            max_model_len=cfg.engine.max_model_len,
            **knobs,
        )
    )
    url = await twin.start("127.0.0.1", 0)
    try:
        stop = asyncio.Event()
        recorder = asyncio.create_task(record(url, stop, interval_s=0.5))
        rng = np.random.default_rng(0)
        arrival = np.concatenate([[0.0], np.cumsum(rng.exponential(1.0 / rate, n - 1))])
        res = await replay_async(
            url,
            "twin",
            arrival,
            np.full(n, isl),
            np.full(n, osl),
            hash_ids=hash_ids,
            block_tokens=16 if hash_ids else None,
            timeout_s=60.0,
            processes=1,
        )
        stop.set()
        series = await recorder
    finally:
        await twin.stop()
    assert res.requests.column("status").to_pylist() == ["ok"] * n
    return series


def twin_series(
    opts: EngineOptions,
    n: int = 60,
    rate: float = 10.0,
    isl: int = 500,
    osl: int = 50,
    hash_ids: list | None = None,
    **knobs,
) -> pa.Table:
    return asyncio.run(_run(opts, n, rate, isl, osl, hash_ids, knobs))


def dominant(d: Diagnosis) -> set[str]:
    """The readings of the findings covering the most time."""
    assert d.findings, "no finding"
    print("\n" + "\n".join(str(f) for f in d.findings))
    longest = max(f.windows for f in d.findings)
    return {f.kind for f in d.findings if f.windows == longest}


def test_a_healthy_run_yields_no_finding() -> None:
    d = diagnose(twin_series(EngineOptions(max_num_seqs=16)), PARAMS)
    assert d.windows and d.findings == [], [(str(f), [w.values for w in d.windows]) for f in d.findings]


def test_a_slow_engine_is_compute_bound() -> None:
    # the batch is capped at 16 sequences: a 4x slower engine keeps it full and the rest wait, KV nearly empty
    d = diagnose(twin_series(EngineOptions(max_num_seqs=16), slowdown=4.0), PARAMS)
    assert dominant(d) == {"compute_bound"}
    assert {f.kind for f in d.findings} == {"compute_bound"}


def test_too_little_kv_is_memory_bound() -> None:
    # 280 blocks of 16 tokens hold two 2,000 + 100-token requests: the third waits for KV room
    d = diagnose(twin_series(EngineOptions(num_blocks=280), n=20, rate=5.0, isl=2000, osl=100), PARAMS)
    assert dominant(d) == {"memory_bound"}
    assert "preemptions" not in {f.kind for f in d.findings}  # the cache is too small to admit, not to finish
    f = next(f for f in d.findings if f.kind == "memory_bound")
    assert f.values["kv_usage"] >= PARAMS.kv_high and f.values["waiting"] >= PARAMS.waiting_min


def test_an_aggressive_operating_point_preempts() -> None:
    # 400 blocks admit many short prompts whose 300-token outputs then outgrow the cache
    d = diagnose(twin_series(EngineOptions(num_blocks=400), isl=200, osl=300), PARAMS)
    assert "preemptions" in dominant(d)  # KV fills up too (memory bound) while it preempts


def test_prefix_caching_off_drops_the_hit_rate_against_a_healthy_baseline() -> None:
    n = 40
    shared = [list(range(1, 63)) + [1000 + 10 * k + j for j in range(3)] for k in range(n)]  # a 992-token common prefix
    baseline = twin_series(EngineOptions(), n=n, isl=1040, osl=20, hash_ids=shared)
    d = diagnose(
        twin_series(EngineOptions(prefix_caching=False), n=n, isl=1040, osl=20, hash_ids=shared),
        PARAMS,
        baseline=baseline,
    )
    assert dominant(d) == {"prefix_hit_drop"}
    f = d.findings[0]
    assert f.values["prefix_hit_rate"] == 0.0 and f.baseline["prefix_hit_rate"] > 0.8
    assert diagnose(baseline, PARAMS).findings == []  # the warm cache alone shows nothing


def test_a_throttled_pd_link_is_transfer_contention() -> None:
    # the first token from the prefill instance: the handoff is then each request's first gap, which the ITL histogram
    # (what the reading compares) shows; by default it ends TTFT instead, the first token the user sees
    pd = {"pd": "1:1", "first_token_from": "prefill"}
    baseline = twin_series(EngineOptions(**pd), n=40, isl=2000, osl=30)
    d = diagnose(twin_series(EngineOptions(**pd, link_gbps=2.0), n=40, isl=2000, osl=30), PARAMS, baseline=baseline)
    assert d.schema == "llmcap-twin" and dominant(d) == {"transfer_contention"}
    assert diagnose(baseline, PARAMS).findings == []
