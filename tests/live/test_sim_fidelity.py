"""Issue 5 acceptance on the real vLLM CPU engine: the simulator's predictions against an open-loop
replay of a shared trace at three rates — light, near the knee, overloaded.

Workload: `N` consecutive requests of the Azure 2023 conversation trace from a seeded start
(`_calibration.azure_workload`: OSL / 8, ISL clipped to fit max_model_len; why there), its arrival
clock rate-scaled (`scale_rate`: every gap by one factor, bursts kept).

Step model: the profile's NNLS fit (issue 4), as the simulator checks use it (`Calibration.fit`).
Predicted TTFT is the simulator's plus the API server's own time, measured with the profile on requests
sent alone to the idle engine (`_calibration.measure_frontend`: vLLM's TTFT minus its engine core's queue
and prefill): vLLM stamps TTFT in its frontend, from receiving the request to processing the first token,
while the simulator is an engine core. The simulator alone is printed beside it.
Also printed, not asserted: the same fit scaled in situ (the `speed` fixture,
`llmcap.sim.makespan_fit`) to the median makespan of 3 burst replays of another excerpt, disjoint from
every excerpt an acceptance test replays. The burst measures the engine's speed when saturated;
the column shows how much of an error a single speed factor explains (on 2026-12-01: in 1 of 3
sessions it brought light and knee within ~30%; in the other two the engine ran the rate replays
slower than the bursts a minute before, and the factor made light and knee worse).

Also printed: the engine's speed on two of the profile's own cells (`_calibration.probe_speed`, ~1 s) before
every replay and after the last, against the profile's values, beside each replay's measured / predicted
ITL p50 and prefill: whether the engine runs slower than the profile on the profile's workload (the box's
speed) or only on the replay (what the step model misses).

Rates, from the simulator (profile fit, the engine's own config), not guessed: its service capacity
λ_cap = the excerpt's requests / makespan when all of them arrive in a burst (offered at
`BURST_RATE` req/s, far beyond capacity), then ρ·λ_cap for ρ in `RHO`: light 0.35, near the knee
0.7 (where the simulated TTFT curve bends: queueing has set in but is still bounded), overloaded 1.5.

Each rate is replayed `REPEATS` times with fresh prompt tokens (a repeated prompt would be a prefix-cache
hit), rates interleaved in the outer loop so drift from other jobs on this shared machine spreads over
all rates; a measured statistic is the median over the repeats. TTFT and ITL are the engine's own
(/metrics histograms, 4% buckets; `_calibration` says why not the client's), compared with the
simulator's TTFT over requests and its exact token-weighted ITL distribution; the client's view is
printed beside them (simulator + fitted client overhead, `with_client_latency`).

Asserted: TTFT p50/p90 and ITL p50/p90 within 15% at the light and knee rates; the overloaded rate is
over capacity by both sides, the two lower rates by neither. Over capacity means the queue grows
during the run, by both of:
- TTFT trend: median TTFT of the last quarter of arrivals ≥ `TREND_MIN` × that of the first quarter;
- served rate < `SERVED_MAX` × offered rate (served: requests / (last finish − first arrival),
  offered: requests / arrival span).
Both are read from per-request records: the simulator's and the client's (median over repeats).
"""

from __future__ import annotations

import os
from functools import partial

import numpy as np
import pyarrow as pa
import pytest

from llmcap.perf import CalibratedFit
from llmcap.sim import SimConfig, SimResult, simulate, weighted_quantiles
from llmcap.sim.makespan_fit import makespan
from llmcap.sim.records import with_client_latency
from llmcap.trace import scale_rate
from tests.live._calibration import (
    EXCERPT_REQUESTS, HELD_OUT_SEEDS, PREFILL_HIST, QS, QUEUE_HIST, TAIL_QS, TTFT_HIST, Measured, azure_workload, engine_config,
    measure_replay, probe_speed, profile_probe, shifted_excerpt,
)

pytestmark = pytest.mark.live

N = EXCERPT_REQUESTS
EXCERPT_SEED = 0
assert EXCERPT_SEED in HELD_OUT_SEEDS  # the speed calibration's burst must not replay it
REPEATS = int(os.environ.get("LLMCAP_FIDELITY_REPEATS", "3"))
RHO = {"light": 0.35, "knee": 0.7, "overloaded": 1.5}
BURST_RATE = 1000.0
TOLERANCE = 0.15
TREND_MIN = 2.0
SERVED_MAX = 0.9
PROMPT_SEED0 = 50_000  # replay prompt seeds: every replay its own
# mean TTFT and its split: (table key, the simulator's record column, vLLM's histogram)
MEANS = (("mean_ttft", "ttft_s", TTFT_HIST), ("mean_queue", "queue_s", QUEUE_HIST), ("mean_prefill", "prefill_s", PREFILL_HIST))


def _ttft(records: pa.Table) -> np.ndarray:
    return records.column("ttft_s").to_numpy(zero_copy_only=False).astype(np.float64)


def queue_growth(records: pa.Table) -> tuple[float, float]:
    """(TTFT trend: last-quarter / first-quarter median TTFT by arrival, served / offered rate)."""
    order = np.argsort(records.column("arrival_s").to_numpy(), kind="stable")
    a = records.column("arrival_s").to_numpy()[order]
    t = _ttft(records)[order]
    fin = records.column("finish_s").to_numpy(zero_copy_only=False).astype(np.float64)
    q = a.size // 4
    trend = float(np.median(t[-q:]) / np.median(t[:q]))
    served = a.size / (float(np.nanmax(fin)) - a[0])
    offered = a.size / (a[-1] - a[0])
    return trend, served / offered


def over_capacity(trend: float, served_ratio: float) -> bool:
    return trend >= TREND_MIN and served_ratio < SERVED_MAX


@pytest.fixture(scope="module")
def workload(vllm_engine) -> pa.Table:
    return shifted_excerpt(azure_workload(vllm_engine.kv.max_model_len), EXCERPT_SEED)


@pytest.mark.xfail(
    strict=False,
    reason="known gap (issue 5 open). With the engine core and worker above the API server and client (conftest "
    "ENGINE_CORE_NICE; before it, 10-70% off in every session), eight sessions on 2026-12-01 were 1-35%, 11-54%, 0-76%, "
    "2-147%, 10-49%, 2-45%, 3-40% and 3-80% off at light/knee, the knee's sign changing between sessions; the next six "
    "1-61% and 3-78%. The engine does not reproduce itself that closely: at the knee, the three repeats of one session "
    "gave TTFT p50s spread 2.0x-3.2x (max/min, four sessions, [drift] lines), and on the profile's own cells it ran 0.85x-1.47x "
    "the profile's speed between the replays of one session. Light ITL p90 falls between the decode-only and the "
    "mixed-step modes of the gap distribution, where a small change in the share of mixed steps moves it far. Not "
    "modelled: the API server's time under load (vLLM's mean 'rest' 16-60 ms against ~4 ms alone). The over-capacity "
    "flags agreed in all sessions but the eighth, where the profile ran slow, the rates came from a capacity too low and "
    "the engine served the 'overloaded' one (served/offered 0.93). The test still runs and prints the table.",
)
def test_simulator_matches_the_engine_at_three_rates(vllm_engine, calibration, speed, workload):
    config = SimConfig(engine=engine_config(vllm_engine))
    model = calibration.fit
    print(f"\n[fidelity] speed calibration (printed, not asserted): {speed.describe()}")

    def sim(rate: float, m: CalibratedFit = model) -> SimResult:
        return simulate(scale_rate(workload, rate), m, config)

    cap = N / makespan(sim(BURST_RATE).records)
    rates = {name: rho * cap for name, rho in RHO.items()}
    isl, osl = workload.column("isl").to_numpy(), workload.column("osl").to_numpy()
    print(f"[fidelity] Azure conv excerpt: {N} requests from seed {EXCERPT_SEED}, ISL mean {isl.mean():.0f} "
          f"(max {isl.max()}), OSL mean {osl.mean():.1f}; simulated capacity λ_cap {cap:.2f} req/s; rates "
          + ", ".join(f"{k} {v:.2f}" for k, v in rates.items()) + f"; load average {os.getloadavg()}")

    # ---- predictions: the profile's fit (asserted) and the burst-scaled one (printed)
    frontend = calibration.frontend.rest_s

    def predict(m: CalibratedFit) -> dict[str, dict]:
        out = {}
        for name, rate in rates.items():
            r = sim(rate, m)
            assert r.records.column("status").to_pylist() == ["ok"] * N
            t = _ttft(r.records)
            seen = _ttft(with_client_latency(r.records, frontend))  # as vLLM's frontend stamps it
            itl = weighted_quantiles(r.itl_values, r.itl_weights, QS)
            tail = weighted_quantiles(r.itl_values, r.itl_weights, TAIL_QS)
            client = _ttft(with_client_latency(r.records, calibration.client_overhead_s))
            trend, served = queue_growth(r.records)
            out[name] = {"ttft_p50": float(np.percentile(seen, 50)), "ttft_p90": float(np.percentile(seen, 90)),
                         "sim_ttft_p50": float(np.percentile(t, 50)), "sim_ttft_p90": float(np.percentile(t, 90)),
                         "itl_p50": float(itl[0]), "itl_p90": float(itl[1]), "itl_tail": tail,
                         **{key: float(np.nanmean(r.records.column(col).to_numpy(zero_copy_only=False).astype(np.float64)))
                            for key, col, _ in MEANS},
                         "cli_ttft_p50": float(np.percentile(client, 50)), "cli_ttft_p90": float(np.percentile(client, 90)),
                         "trend": trend, "served": served}
        return out

    pred, scaled = predict(model), predict(speed.fit)

    # ---- measurements: repeats outside, rates inside
    runs: dict[str, list[Measured]] = {name: [] for name in rates}
    probe = partial(probe_speed, vllm_engine.base_url, vllm_engine.model, vllm_engine.max_num_batched_tokens)
    probes, order = [probe()], []  # the engine's speed on two profile cells, before every replay and after the last
    for rep in range(REPEATS):
        for k, (name, rate) in enumerate(rates.items()):
            m = measure_replay(vllm_engine.base_url, vllm_engine.model, scale_rate(workload, rate),
                               seed=PROMPT_SEED0 + 10 * rep + k)
            status = m.replay.requests.column("status").to_pylist()
            assert status == ["ok"] * N, f"{name} rep {rep}: {[s for s in status if s != 'ok'][:5]}"
            assert m.engine_requests == N and m.engine_gaps == int(osl.sum()) - N, (m.engine_requests, m.engine_gaps)
            runs[name].append(m)
            probes.append(probe())
            order.append((name, rep))
    meas: dict[str, dict] = {}
    for name, ms in runs.items():
        growth = [queue_growth(m.replay.requests) for m in ms]
        cli_t = [_ttft(m.replay.requests) for m in ms]
        meas[name] = {
            "ttft_p50": float(np.median([m.engine_ttft[0] for m in ms])),
            "ttft_p90": float(np.median([m.engine_ttft[1] for m in ms])),
            "itl_p50": float(np.median([m.engine_itl[0] for m in ms])),
            "itl_p90": float(np.median([m.engine_itl[1] for m in ms])),
            "itl_tail": np.median([m.engine_itl_tail for m in ms], axis=0),
            "cli_ttft_p50": float(np.median([np.percentile(t, 50) for t in cli_t])),
            "cli_ttft_p90": float(np.median([np.percentile(t, 90) for t in cli_t])),
            "cli_itl_p50": float(np.median([np.percentile(m.replay.itls, 50) for m in ms])),
            "cli_itl_p90": float(np.median([np.percentile(m.replay.itls, 90) for m in ms])),
            "trend": float(np.median([g[0] for g in growth])),
            "served": float(np.median([g[1] for g in growth])),
            "late_ms": float(max(m.replay.lateness_s.max() for m in ms) * 1e3),
            **{key: float(np.median([m.engine_means[hist] for m in ms])) for key, _, hist in MEANS},
        }

    # ---- the table
    print(f"[fidelity] frontend (measured with the profile, requests alone): {calibration.frontend.describe()}")
    print(f"[fidelity] predicted = simulator (calibrated LinearStepModel; engine config "
          f"{config.engine.num_blocks} blocks x {config.engine.block_size}, max_num_seqs {config.engine.max_num_seqs}, "
          f"max_num_batched_tokens {config.engine.max_num_batched_tokens}, prefix caching {config.engine.enable_prefix_caching}), "
          f"TTFT + the API server's {frontend * 1e3:.1f} ms (vLLM stamps TTFT in its frontend); sim alone = without it; "
          f"burst-scaled = the fit x {speed.info.factor:.3f}; measured = engine /metrics histograms, median of {REPEATS} replays; client = "
          f"the client's records (predicted: simulator + {calibration.client_overhead_s * 1e3:.1f} ms fitted client overhead)")
    print(f"{'rate':<11} {'req/s':>6} {'metric':<9} {'predicted ms':>12} {'measured ms':>12} {'error':>7}   "
          f"{'sim alone':>9} {'error':>7}   {'burst-scaled':>12} {'error':>7}   {'client pred':>11} {'client meas':>11}")
    errors: dict[str, dict[str, float]] = {}
    for name, rate in rates.items():
        p, m, ps = pred[name], meas[name], scaled[name]
        errors[name] = {}
        for metric in ("ttft_p50", "ttft_p90", "itl_p50", "itl_p90"):
            err = p[metric] / m[metric] - 1
            errors[name][metric] = err
            cli_p = p.get(f"cli_{metric}", p[metric])  # ITL: a constant latency leaves gaps alone
            alone = p.get(f"sim_{metric}", p[metric])
            print(f"{name:<11} {rate:>6.2f} {metric:<9} {p[metric] * 1e3:>12.2f} {m[metric] * 1e3:>12.2f} {err:>+7.1%}   "
                  f"{alone * 1e3:>9.2f} {alone / m[metric] - 1:>+7.1%}   {ps[metric] * 1e3:>12.2f} {ps[metric] / m[metric] - 1:>+7.1%}   "
                  f"{cli_p * 1e3:>11.2f} {m[f'cli_{metric}'] * 1e3:>11.2f}")
        print(f"{'':<11} {'':>6} over capacity: predicted {over_capacity(p['trend'], p['served'])} (TTFT trend "
              f"{p['trend']:.2f}, served/offered {p['served']:.2f}); measured {over_capacity(m['trend'], m['served'])} "
              f"(trend {m['trend']:.2f}, served/offered {m['served']:.2f}); max send lateness {m['late_ms']:.0f} ms")
        print(f"{'':<11} {'':>6} means, predicted / measured ms: TTFT {(p['mean_ttft'] + frontend) * 1e3:.1f} / "
              f"{m['mean_ttft'] * 1e3:.1f} = queue {p['mean_queue'] * 1e3:.1f} / {m['mean_queue'] * 1e3:.1f} + prefill "
              f"{p['mean_prefill'] * 1e3:.1f} / {m['mean_prefill'] * 1e3:.1f} + rest {frontend * 1e3:.1f} / "
              f"{(m['mean_ttft'] - m['mean_queue'] - m['mean_prefill']) * 1e3:.1f}")
        print(f"{'':<11} {'':>6} ITL around p90, predicted / measured ms: "
              + ", ".join(f"p{q * 100:.0f} {a * 1e3:.1f} / {b * 1e3:.1f}" for q, a, b in zip(TAIL_QS, p["itl_tail"], m["itl_tail"])))
    print("[fidelity] means: the simulator's queue runs from arrival; vLLM's from when its engine core takes the request "
          "in, at the end of the step in progress. That wait is in the simulator's queue and in vLLM's rest, with the API "
          "server's own time (tests/live/_calibration.py QUEUE_HIST); the predicted rest is that time alone.")
    print(f"[fidelity] load average after: {os.getloadavg()}")
    # Drift: is the engine slower than the profile on the profile's own cells when a replay is (box speed),
    # or only on the replay (something the step model misses)?
    ref = profile_probe(calibration)
    print(f"[drift] the engine now / in the profile on its cells (TTFT of 1024 alone {ref.ttft_s * 1e3:.1f} ms, decode step "
          f"of 4 x 1024 {ref.step_s * 1e3:.2f} ms), mean of the probes before and after each replay; the replay measured / "
          "predicted")
    for j, (name, rep) in enumerate(order):
        m, p = runs[name][rep], pred[name]
        t_r, s_r = (np.mean(x) for x in zip(probes[j].ratio(ref), probes[j + 1].ratio(ref)))
        print(f"[drift] {name:<10} rep {rep}: probe TTFT x{t_r:.2f}, step x{s_r:.2f}; replay ITL p50 "
              f"x{m.engine_itl[0] / p['itl_p50']:.2f}, mean prefill x{m.engine_means[PREFILL_HIST] / p['mean_prefill']:.2f}, "
              f"TTFT p50 x{m.engine_ttft[0] / p['ttft_p50']:.2f}")

    bad = [f"{name} {metric} {err:+.1%}" for name in ("light", "knee") for metric, err in errors[name].items()
           if abs(err) > TOLERANCE]
    assert not bad, f"simulator off by more than {TOLERANCE:.0%}: {bad}"
    for name in ("light", "knee"):
        assert not over_capacity(pred[name]["trend"], pred[name]["served"]), f"simulator flags {name} as over capacity"
        assert not over_capacity(meas[name]["trend"], meas[name]["served"]), f"engine flagged {name} as over capacity"
    assert over_capacity(pred["overloaded"]["trend"], pred["overloaded"]["served"]), pred["overloaded"]
    assert over_capacity(meas["overloaded"]["trend"], meas["overloaded"]["served"]), meas["overloaded"]
