"""The simulator against the real vLLM CPU engine, judged against the engine's own repeatability.

Workload: an excerpt of `EXCERPT_REQUESTS` consecutive requests of the Azure 2023 conversation trace
(`_calibration.azure_workload`: OSL / 8, ISL clipped to the engine's max_model_len), rate-scaled.
Rates come from the simulator (profile fit, the engine's own config): its service capacity
λ_cap = the excerpt's requests / makespan when all of them arrive at once, then ρ·λ_cap for ρ in `RHO`:
two sub-knee loads (0.3, 0.5) and one overload (1.5). A rate replays the excerpt's first
rate × `SPAN_S` requests (at least `MIN_REQUESTS`, at most all): a slow engine means fewer requests
per replay, not a run that never ends.

Each sub-knee rate is replayed `REPEATS` times (3; the rule needs at least 3), the overload `OVERLOAD_REPEATS` times, rates
interleaved in the outer loop, every replay with fresh prompt tokens (no prefix-cache hits between
replays). A speed probe runs before every replay and after the last: two of the profile's own cells
measured again (`_calibration.probe_speed`): the TTFT of a 1024-token prompt alone and a 4-sequence decode
step. In-situ calibration: the engine ran each replay at a speed known only to within its readings around
it: the profile's own and the probes before and after it, each a prefill and a decode factor against the
profile (`_calibration.speed_band`). A probe lasts a second and a replay half a minute, so neither probe
alone describes the replay. Each repeat's prediction is therefore a band: the simulator with the profile's prefill terms and
decode terms (per-step overhead included) scaled by the fastest readings, and by the slowest
(`CalibratedFit.scaled_by_phase`). The band's width, printed per row, is what the check cannot resolve on
the day; the unscaled predictions are printed beside. TTFT and ITL are the engine's own (/metrics
histograms, 4% buckets; `_calibration` says why not the client's); predicted TTFT includes the API
server's own time measured with the profile.

At the light rate most decode steps are a lone sequence's, between idle periods. Measured on this engine
(engine-side /metrics sums around requests sent alone, two sessions): the lone decode step does not depend on
how long the engine idled before (0, 0.3, 1 s: 3.9, 4.4, 3.5 ms mean over 64 steps, ±0.3 ms), but it drifts
within a session by 2x or more over minutes (probe readings 2.2-8.5 ms where the 4-sequence step read 4.4-6.7 ms),
while other processes share the cores. The one repeatable part, a first decode step after a
prefill 1.0-1.6 ms slower (once per request), moves the light rate's ITL p90 by under 4%. So the lone step is
a reading per repeat, not a term of the step model: the band's decode readings include the probes'
lone-sequence decode step (the 1024-token prompt's own gaps) as well (`speed_band(..., lone=True)`).

The rule (llmcap.reconcile.repeatability, per rate and metric: TTFT p50/p90, ITL p50/p90, every row judged):
each repeat's prediction is the point of its band nearest to what it measured (`judge_band`); pass where
that is within 15% of the median of the repeats; where the repeats themselves spread by more than 15%
(IQR/median of measured/predicted), inside the repeats' range also passes.

Over capacity: the queue grows during the run, by both of
- TTFT trend: median TTFT of the last quarter of arrivals ≥ `TREND_MIN` × that of the first quarter;
- served rate < `SERVED_MAX` × offered rate (served: requests / (last finish − first arrival),
  offered: requests / arrival span),
read from per-request records (the simulator's, and the client's). The engine's verdict is the majority
of its repeats, the simulator's that of its predictions at both ends of every band; they must agree at
every rate, and the overload must be over capacity.

The table (per rate and metric: predicted, each repeat, median, spread, error, verdict) is written under
.work/live-fidelity/ and to MLflow before anything is asserted (tests/live/_fidelity_table.py).
"""

from __future__ import annotations

import os
from functools import partial

import numpy as np
import pyarrow as pa
import pytest

from llmcap.perf import CalibratedFit
from llmcap.reconcile.repeatability import judge_band, majority
from llmcap.sim import SimConfig, simulate, weighted_quantiles
from llmcap.sim.makespan_fit import makespan
from llmcap.sim.records import with_client_latency
from llmcap.trace import scale_rate
from tests.live._calibration import (
    EXCERPT_REQUESTS,
    PREFILL_HIST,
    QS,
    QUEUE_HIST,
    TTFT_HIST,
    Measured,
    SpeedProbe,
    azure_workload,
    engine_config,
    measure_replay,
    probe_speed,
    profile_probe,
    shifted_excerpt,
    speed_band,
)
from tests.live._fidelity_table import FidelityRow, write_fidelity_table

pytestmark = pytest.mark.live

N = EXCERPT_REQUESTS
EXCERPT_SEED = 0
REPEATS = int(os.environ.get("LLMCAP_FIDELITY_REPEATS", "3"))
OVERLOAD_REPEATS = 3
RHO = {"light": 0.3, "moderate": 0.5, "overloaded": 1.5}
SUB_KNEE = ("light", "moderate")
LONE_DECODE = ("light",)  # rates whose decode steps are mostly a lone sequence's after idle (module docstring)
METRICS = ("ttft_p50", "ttft_p90", "itl_p50", "itl_p90")
BURST_RATE = 1000.0
SPAN_S = 30.0
MIN_REQUESTS = 40
TREND_MIN = 2.0
SERVED_MAX = 0.9
PROMPT_SEED0 = 50_000  # replay prompt seeds: every replay its own
MEANS = (("mean_queue", "queue_s", QUEUE_HIST), ("mean_prefill", "prefill_s", PREFILL_HIST))


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


def over_capacity(records: pa.Table) -> bool:
    trend, served_ratio = queue_growth(records)
    return trend >= TREND_MIN and served_ratio < SERVED_MAX


@pytest.fixture(scope="module")
def workload(vllm_engine) -> pa.Table:
    return shifted_excerpt(azure_workload(vllm_engine.kv.max_model_len), EXCERPT_SEED)


def test_simulator_matches_the_engine_within_its_repeatability(vllm_engine, calibration, workload):
    config = SimConfig(engine=engine_config(vllm_engine))
    frontend = calibration.frontend.rest_s

    def part(rate: float) -> pa.Table:
        return scale_rate(workload.slice(0, int(np.clip(round(rate * SPAN_S), MIN_REQUESTS, N))), rate)

    def sim(rate: float, m: CalibratedFit) -> dict:
        r = simulate(part(rate), m, config)
        assert set(r.records.column("status").to_pylist()) == {"ok"}
        seen = _ttft(with_client_latency(r.records, frontend))  # as vLLM's frontend stamps it
        itl = weighted_quantiles(r.itl_values, r.itl_weights, QS)
        return {
            "ttft_p50": float(np.percentile(seen, 50)),
            "ttft_p90": float(np.percentile(seen, 90)),
            "itl_p50": float(itl[0]),
            "itl_p90": float(itl[1]),
            "over": over_capacity(r.records),
            **{
                key: float(np.nanmean(r.records.column(col).to_numpy(zero_copy_only=False).astype(np.float64)))
                for key, col, _ in MEANS
            },
        }

    cap = N / makespan(simulate(scale_rate(workload, BURST_RATE), calibration.fit, config).records)
    rates = {name: rho * cap for name, rho in RHO.items()}
    isl, osl = workload.column("isl").to_numpy(), workload.column("osl").to_numpy()
    print(
        f"\n[fidelity] Azure conv excerpt: {N} requests, ISL mean {isl.mean():.0f} (max {isl.max()}), OSL mean "
        f"{osl.mean():.1f}; simulated capacity λ_cap {cap:.2f} req/s; rates "
        + ", ".join(f"{k} {v:.2f} ({part(v).num_rows} requests)" for k, v in rates.items())
        + f"; load average {os.getloadavg()}"
    )
    unscaled = {name: sim(rate, calibration.fit) for name, rate in rates.items()}

    # ---- measurements: attempts outside, rates inside; a speed probe before every replay and after the last.
    ref = profile_probe(calibration)
    probe = partial(probe_speed, vllm_engine.base_url, vllm_engine.model, vllm_engine.max_num_batched_tokens)
    runs: dict[str, list[tuple[Measured, SpeedProbe, SpeedProbe]]] = {name: [] for name in rates}
    wanted = {name: REPEATS if name in SUB_KNEE else OVERLOAD_REPEATS for name in rates}
    before = probe()
    for attempt in range(max(wanted.values())):
        for k, (name, rate) in enumerate(rates.items()):
            if len(runs[name]) >= wanted[name]:
                continue
            sent = part(rate)
            m = measure_replay(vllm_engine.base_url, vllm_engine.model, sent, seed=PROMPT_SEED0 + 10 * attempt + k)
            status = m.replay.requests.column("status").to_pylist()
            assert status == ["ok"] * sent.num_rows, f"{name} attempt {attempt}: {[s for s in status if s != 'ok'][:5]}"
            tokens = int(sent.column("osl").to_numpy().sum())
            assert (m.engine_requests, m.engine_gaps) == (sent.num_rows, tokens - sent.num_rows), (
                m.engine_requests,
                m.engine_gaps,
            )
            after = probe()
            runs[name].append((m, before, after))
            before = after

    # ---- predictions per repeat (the fit at the fastest and the slowest readings around it), and the verdicts
    rows: list[FidelityRow] = []
    flags: dict[str, tuple[bool, bool]] = {}  # name -> (simulator, engine) over capacity, majority
    bands = {name: [speed_band(ref, b, a, lone=name in LONE_DECODE) for _, b, a in rs] for name, rs in runs.items()}
    print(
        "[fidelity] speed readings around each repeat, prefill/decode/lone decode against the profile (before → after): "
        + "; ".join(
            f"{name} "
            + ", ".join(
                f"{b.ratio(ref)[0]:.2f}/{b.ratio(ref)[1]:.2f}/{b.lone_ratio(ref):.2f} → "
                f"{a.ratio(ref)[0]:.2f}/{a.ratio(ref)[1]:.2f}/{a.lone_ratio(ref):.2f}"
                for _, b, a in rs
            )
            for name, rs in runs.items()
        )
    )
    for name, rs in runs.items():
        fast = [sim(rates[name], calibration.fit.scaled_by_phase(*lo)) for lo, _ in bands[name]]
        slow = [sim(rates[name], calibration.fit.scaled_by_phase(*hi)) for _, hi in bands[name]]
        measured = {
            "ttft_p50": [m.engine_ttft[0] for m, _, _ in rs],
            "ttft_p90": [m.engine_ttft[1] for m, _, _ in rs],
            "itl_p50": [m.engine_itl[0] for m, _, _ in rs],
            "itl_p90": [m.engine_itl[1] for m, _, _ in rs],
        }
        case = f"{name} ρ={RHO[name]} ({rates[name]:.2f} req/s)"
        if name in SUB_KNEE:
            for metric in METRICS:
                ends = np.array([[f[metric] for f in fast], [s[metric] for s in slow]])
                rows.append(
                    FidelityRow(
                        case,
                        metric,
                        judge_band(ends.min(axis=0), ends.max(axis=0), measured[metric]),
                        unscaled[name][metric],
                    )
                )
        flags[name] = (
            majority([p["over"] for p in fast + slow]),
            majority([over_capacity(m.replay.requests) for m, _, _ in rs]),
        )
        growth = [queue_growth(m.replay.requests) for m, _, _ in rs]
        print(
            f"[fidelity] {case}: over capacity simulator {flags[name][0]}, engine {flags[name][1]} (repeats: TTFT trend "
            + ", ".join(f"{t:.2f}" for t, _ in growth)
            + "; served/offered "
            + ", ".join(f"{s:.2f}" for _, s in growth)
            + f"); max send lateness {max(m.replay.lateness_s.max() for m, _, _ in rs) * 1e3:.0f} ms"
        )
        print(
            f"[fidelity] {case}: means predicted (fastest-slowest) / measured ms (median of repeats): "
            + ", ".join(
                f"{key} {np.median([p[key] for p in fast]) * 1e3:.1f}-{np.median([p[key] for p in slow]) * 1e3:.1f} / "
                f"{np.median([m.engine_means[hist] for m, _, _ in rs]) * 1e3:.1f}"
                for key, _, hist in MEANS
            )
            + f"; vLLM TTFT mean {np.median([m.engine_means[TTFT_HIST] for m, _, _ in rs]) * 1e3:.1f}"
        )
    write_fidelity_table(
        "sim_fidelity",
        rows,
        {
            "excerpt_requests": N,
            "requests_per_rate": {k: part(v).num_rows for k, v in rates.items()},
            "capacity_req_s": cap,
            "rates": rates,
            "repeats": REPEATS,
            "overload_repeats": OVERLOAD_REPEATS,
            "speed_band": {name: [{"fastest": lo, "slowest": hi} for lo, hi in bs] for name, bs in bands.items()},
            "over_capacity": {name: {"simulator": s, "engine": e} for name, (s, e) in flags.items()},
            "frontend_s": frontend,
            "load_average": os.getloadavg(),
            "engine_version": vllm_engine.version,
        },
    )

    missed = [f"{r.case} {r.metric}: {r.verdict.reason}" for r in rows if not r.verdict.passed]
    assert not missed, "simulator outside the engine's repeat envelope:\n" + "\n".join(missed)
    assert all(sim_flag == engine_flag for sim_flag, engine_flag in flags.values()), (
        f"over-capacity flags disagree: {flags}"
    )
    assert flags["overloaded"] == (True, True) and not any(flags[name][1] for name in SUB_KNEE), flags
