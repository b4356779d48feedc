"""The unit's traffic and the load the check brackets, without a server: a deployment's share is what its router
sent one instance, arrival gaps kept; the knee is where the prediction of that share stops holding."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from llmcap.config import ReplayParams
from llmcap.perf import build_step_model
from llmcap.replaycheck.knee import REACH, share_knee
from llmcap.replaycheck.runs import plan_runs, predict
from llmcap.replaycheck.share import Share
from llmcap.sim import EngineConfig, SimConfig
from llmcap.sizing.params import SloParams
from llmcap.sizing.planned import PlannedDeployment
from llmcap.sizing.slo import attainment
from llmcap.trace.synth import scale_rate

MODEL, GPU = "Llama-3.1-8B", "H100-SXM-80GB"
ROOFLINE = {"source": "roofline", "gpu": GPU, "tp": 1, "pp": 1, "ep": 1, "weight_quant": "fp8", "kv_dtype": "fp8"}
SLO = SloParams(ttft_ms=500, ttft_ms_per_1k_isl=100, itl_ms=50, warmup_frac=0.1, drain_frac=0.1)
ENGINE = EngineConfig(num_blocks=20_000, max_num_seqs=64)


def _trace(n: int = 2000, seed: int = 1) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table(
        {
            "request_id": np.arange(n, dtype=np.int64),
            "arrival_s": np.cumsum(rng.exponential(0.1, n)),  # 10 req/s
            "isl": rng.integers(100, 3000, n),
            "osl": rng.integers(16, 200, n),
        }
    )


def _deployment(router: str, replicas: int = 4) -> PlannedDeployment:
    config = SimConfig(engine=ENGINE, replicas=replicas, router=router)
    return PlannedDeployment(MODEL, 10.0, 0, config, {"instances": ROOFLINE}, {}, SLO)


@pytest.mark.parametrize("router", ["round_robin", "least_outstanding_tokens"])
def test_a_deployment_share_is_what_its_router_sent_the_busiest_instance_arrivals_kept(router: str) -> None:
    trace = _trace()
    share = Share(10.0, 4.0, _deployment(router), "instances")
    (run,) = plan_runs(trace, share, 1.5, [1.0], [0], 200)
    window = share.window(200)
    assert window == 880 and f"the plan's {router} router's share to its busiest instance" in run.traffic
    ids = run.requests.column("request_id").to_numpy()
    # a quarter of the window, give or take what an uneven router does, and the busiest instance's at that
    assert window / 4 <= ids.size <= window / 2
    if router == "round_robin":
        assert np.diff(ids).tolist() == [4] * (ids.size - 1)
    # the requests keep their gaps on the planning clock, divided by the load: bursts reach the unit as they were
    source = scale_rate(trace, 10.0).column("arrival_s").to_numpy()[ids]
    np.testing.assert_allclose(run.requests.column("arrival_s").to_numpy(), (source - source[0]) / 1.5, rtol=1e-9)


def test_the_knee_is_where_the_prediction_of_the_share_stops_holding() -> None:
    trace = _trace()
    share = Share(10.0, 4.0, _deployment("round_robin"), "instances")
    prediction = (
        SimConfig(engine=ENGINE),
        build_step_model(MODEL, GPU, tp=1, weight_quant="fp8", kv_dtype="fp8"),
        None,
    )
    params = ReplayParams(excerpt_requests=200)
    knee = share_knee(trace, share, prediction, params, SLO)
    assert knee.held and knee.load > 1.0 and "highest load" in knee.basis

    def holds(load: float) -> bool:
        (run,) = plan_runs(trace, share, load, [1.0], [0], 200)
        return attainment(predict(run, *prediction), SLO) >= SLO.attainment_target

    assert holds(knee.load) and not holds(knee.load * 1.05)


def test_a_share_that_holds_at_every_load_brackets_the_search_cap_and_says_so() -> None:
    loose = SloParams(ttft_ms=1e7, itl_ms=1e6, warmup_frac=0.1, drain_frac=0.1)
    share = Share(10.0, 4.0)  # a round robin: no deployment record
    prediction = (
        SimConfig(engine=ENGINE),
        build_step_model(MODEL, GPU, tp=1, weight_quant="fp8", kv_dtype="fp8"),
        None,
    )
    knee = share_knee(_trace(400), share, prediction, ReplayParams(excerpt_requests=50), loose)
    assert knee.held and knee.load == REACH and "cap of 64x" in knee.basis and "round-robin" in knee.basis
