"""Autoscaling what-if on a synthesized diurnal day: the autoscaled plan against the static one."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sim"))
from _workloads import MODEL, canonical, table  # noqa: E402

from llmcap.errors import LlmcapError  # noqa: E402
from llmcap.sim import AutoscaleConfig, EngineConfig  # noqa: E402
from llmcap.sizing.autoscale_whatif import DiurnalDay, PoolRate, autoscale_whatif, forecast_floor  # noqa: E402
from llmcap.sizing.params import SearchParams, SloParams  # noqa: E402
from llmcap.sizing.search import search_max_rate  # noqa: E402
from llmcap.sizing.simeval import SimEvaluate  # noqa: E402

ENGINE = EngineConfig(num_blocks=400, max_num_seqs=32, max_num_batched_tokens=512)
SLO = SloParams(ttft_ms=500, itl_ms=100, itl_stat="p99", attainment_target=0.99)
# a day compressed 24x into an hour, the autoscaler's clock with it (T_ready 12 min, windows 4–6 min a real day)
SCALER = AutoscaleConfig(
    t_ready_s=30.0, interval_s=5.0, min_residency_s=30.0, scale_down_window_s=15.0, metric_window_s=10.0, kv_usage=None
)


def source_trace(n: int = 3000, seed: int = 0):
    """Requests whose prompts share two leading blocks (32 tokens each), the rest unique."""
    rng = np.random.default_rng(seed)
    isl = rng.integers(50, 400, n)
    hashes, next_id = [], 1000
    for i in range(n):
        blocks = -(-int(isl[i]) // 32)
        shared = min(blocks, 2)
        hashes.append([7, 8][:shared] + list(range(next_id, next_id + blocks - shared)))
        next_id += blocks
    rows = {
        "arrival_s": np.cumsum(rng.exponential(0.1, n)),
        "isl": isl,
        "osl": rng.integers(10, 100, n),
        "hash_ids": hashes,
    }
    return canonical(table(rows, 32))


def test_forecast_floor_orders_t_ready_ahead():
    day = DiurnalDay(mean_rps=10.0, amplitude=0.5, period_s=1000.0, duration_s=1000.0)
    times, counts = forecast_floor(
        day, instance_rps=2.0, fraction=1.0, t_ready_s=100.0, interval_s=10.0, forecast_error=0.0
    )
    assert times[0] == 0.0 and list(times) == sorted(times)
    need = dict(zip(times, counts, strict=True))
    at = lambda t: counts[np.searchsorted(times, t, side="right") - 1]  # noqa: E731
    # at the peak (t = 250) the floor already holds what the peak needs: ⌈15 / 2⌉ = 8 ...
    assert at(250.0) == 8
    # ... asked for T_ready + one interval ahead: the rate passes 14 (8 replicas) at t* = 1000·asin(0.8)/2π = 147.6,
    # so the first tick whose look-ahead [t, t + 110] reaches it is t = 40
    assert at(40.0) == 8 and at(30.0) == 7
    assert max(need.values()) == 8 and min(counts) == np.ceil(5.0 / 2.0)  # trough ⌈5 / 2⌉
    half = forecast_floor(day, 2.0, 0.5, 100.0, 10.0, 0.0)[1]
    assert max(half) == 4


def test_autoscaling_uses_fewer_gpu_hours_than_static_at_the_same_attainment():
    trace = source_trace()
    g = search_max_rate(
        SimEvaluate(trace, MODEL, ENGINE, SLO, excerpt_requests=1000),
        SLO.attainment_target,
        SearchParams(seeds=(0,), rel_tol=0.05),
    ).max_rate
    assert g > 0
    day = DiurnalDay(mean_rps=3.0 * g, amplitude=0.7, period_s=3600.0, duration_s=3600.0)
    cfg = SCALER
    w = autoscale_whatif(trace, MODEL, ENGINE, SLO, [PoolRate("both", g, 2)], day, scaler=cfg, fractions=(0.0, 1.0))
    assert w.static_counts == {"both": int(np.ceil(day.peak_rps / g))}
    assert w.static.keeps(SLO.attainment_target)  # the static plan sized to the peak holds the day
    assert w.static.gpu_hours == pytest.approx(2 * w.static.replica_hours)
    full = next(p for p in w.autoscaled if p.floor_fraction == 1.0)
    assert full.keeps(SLO.attainment_target)
    assert full.gpu_hours < w.static.gpu_hours  # the acceptance: fewer GPU-hours at the same attainment
    assert w.floor is not None and w.floor.gpu_hours < w.static.gpu_hours
    assert w.saving is not None and 0.0 < w.saving < 1.0
    assert full.scale_ups > 0 and full.peak_replicas >= w.static_counts["both"] - 1  # it did follow the day
    # T_ready is paid for: a replica asked after the start and made routable is held at least T_ready; one
    # cancelled while starting is held until it was cancelled
    life = full.log.replicas.to_pandas()
    grown = life[life.asked_s > 0]
    assert (grown.dropna(subset=["ready_s"]).held_s >= cfg.t_ready_s).all()
    cancelled = grown[grown.ready_s.isna()]
    assert (cancelled.held_s == cancelled.stopped_s - cancelled.asked_s).all()


def test_a_plan_needs_a_positive_instance_rate():
    with pytest.raises(LlmcapError, match="max feasible rate"):
        autoscale_whatif(
            source_trace(20), MODEL, ENGINE, SLO, [PoolRate("both", 0.0)], DiurnalDay(1.0, 0.5, 100.0, 100.0)
        )
    with pytest.raises(LlmcapError, match="prefill and a decode pool"):
        autoscale_whatif(
            source_trace(20), MODEL, ENGINE, SLO, [PoolRate("prefill", 1.0)], DiurnalDay(1.0, 0.5, 100.0, 100.0)
        )


def test_autoscale_command_reports_every_plan_as_simulated(tmp_path):
    import json

    from typer.testing import CliRunner

    from llmcap.cli import app
    from tests.conftest import TRACES

    args = [
        "autoscale",
        "--trace",
        str(TRACES["azure_conv"]),
        "--model",
        "Llama-3.1-8B",
        "--gpu",
        "H100",
        "--weight-quant",
        "fp8",
        "--slo-ttft-p99",
        "2000",
        "--max-num-batched-tokens",
        "2048",
        "--instance-rps",
        "30",
        "--mean-rps",
        "40",
        "--duration",
        "900",
        "--period",
        "900",
        "--min-residency",
        "120",
        "--floor-fractions",
        "0,1",
        "--ready-phases",
        "schedule_s=5,image_pull_s=0,weight_load_s=25,engine_init_s=10,compile_s=10,admission_s=10",
        "--output-format",
        "json",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    s = json.loads(result.stdout)
    assert s["simulated"] is True and s["static_replicas"] == int(np.ceil(s["day"]["peak_rps"] / 30.0))
    assert [p["plan"] for p in s["plans"]] == ["static", "auto f=0", "auto f=1"]
    # T_ready = 5 + 0 + 25 + 10 + 10 + 10 = 60: pod running at 5 (schedule + image), model ready at 50, admitted at 60
    assert s["t_ready_s"] == 60 and s["scale_up"]["after_ask_s"] == {
        "pod_running": 5,
        "model_ready": 50,
        "router_admitted": 60,
    }
    for up in s["scale_up"]["first_scale_up"].values():
        assert (
            up["running_s"] - up["target_s"],
            up["model_ready_s"] - up["target_s"],
            up["admitted_s"] - up["target_s"],
        ) == (5, 50, 60)
    assert s["forecast"]["note"].startswith(
        "forecast NOT fitted: the trace spans"
    )  # a short trace: the synthesized day, said
    for p in s["plans"]:
        assert p["gpu_hours"] > 0 and 0.0 <= p["attainment"] <= 1.0
    bad = CliRunner().invoke(app, [*args[:-2], "--floor-fractions", "0,x"])
    assert bad.exit_code == 2 and "--floor-fractions" in bad.output


def test_a_pd_deployment_scales_each_pool_and_saves_against_static():
    from llmcap.sim import LinkConfig, PDConfig

    trace = source_trace()
    engine = ENGINE.model_copy(update={"kv_bytes_per_token": 1000.0})
    link = LinkConfig(bandwidth_bytes_s=1e9, latency_s=0.001)
    params = SearchParams(seeds=(0,), rel_tol=0.05)

    def pool_rate(n_p: int, n_d: int, per: int) -> float:  # one instance's share of what the pair holds
        pd = PDConfig(prefill_replicas=n_p, decode_replicas=n_d, link=link, first_token_from="decode")
        return (
            search_max_rate(
                SimEvaluate(trace, MODEL, engine, SLO, excerpt_requests=1000, pd=pd), SLO.attainment_target, params
            ).max_rate
            / per
        )

    g_p, g_d = pool_rate(1, 4, 1), pool_rate(4, 1, 1)  # each pool alone as the bottleneck
    assert g_p > 0 and g_d > 0
    day = DiurnalDay(mean_rps=2.0 * min(g_p, g_d), amplitude=0.7, period_s=3600.0, duration_s=3600.0)
    cfg = SCALER
    pd = PDConfig(prefill_replicas=1, decode_replicas=1, link=link, first_token_from="decode")
    pools = [PoolRate("prefill", g_p, 1), PoolRate("decode", g_d, 2)]
    w = autoscale_whatif(trace, MODEL, engine, SLO, pools, day, scaler=cfg, fractions=(1.0,), pd=pd)
    assert w.static_counts == {"prefill": int(np.ceil(day.peak_rps / g_p)), "decode": int(np.ceil(day.peak_rps / g_d))}
    assert set(w.reactive_targets["prefill"]) == {"running_per_replica"} and set(w.reactive_targets["decode"]) == {
        "kv_usage"
    }
    assert w.static.keeps(SLO.attainment_target)
    full = w.autoscaled[0]
    life = full.log.replicas.to_pandas()
    assert set(life.pool) == {"prefill", "decode"}
    # GPU-hours count each pool's instances at their own GPUs
    per_pool = {r: full.log.replica_seconds(r) / 3600.0 for r in ("prefill", "decode")}
    assert full.gpu_hours == pytest.approx(per_pool["prefill"] * 1 + per_pool["decode"] * 2)
    assert full.keeps(SLO.attainment_target) and full.gpu_hours < w.static.gpu_hours
